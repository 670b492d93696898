"""Torch releases as arms (`cpu/compile@2.15.0`) and as a sweep dimension (`--torch`):
sandbox/torch_envs.py builds one cached environment per release with venv + pip.

The end-to-end tests build a real environment of torch 2.13.0 (the release this project
pins: pip takes it from the local wheel its configuration points at, or from the index) in
a cache folder of their own, once per session, and run arms with its interpreter beside
triage's own.  Two installations of the same build are two environments: which interpreter
an arm ran is read from what the script printed (its `sys.prefix`), never from the numbers.
A divergence between them is made on purpose with the fault knob."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_triage, sweep_environment
from triage.arms.run import worker_python
from triage.arms.spec import ArmSpecError, parse_arm, parse_arms
from triage.minimize.standalone import script_style
from triage.model import ArmSpec
from triage.report.data import validate_report
from triage.sandbox import isolation, torch_envs
from triage.sandbox.torch_envs import TorchEnvError, release_version
from triage.sandbox.zygote import CONFINABLE_MACHINES, ZYGOTE_MODULE
from triage.settings import RunSettings
from triage.sweep.buckets import _pair_kind

# Under pytest-xdist (--dist loadgroup): the built torch environment (a session fixture: a pip install)
# is built once, on the one worker that runs this module.
pytestmark = pytest.mark.xdist_group("torch-env")

RELEASE = "2.13.0"
# Prints which installation ran it, then computes something the fault knob can change.
WHERE = """\
import sys
import torch

print("prefix:", sys.prefix)
print("cmdline:", open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode().strip())
x = torch.linspace(1.5, 3.0, 64, dtype=torch.float32)
y = torch.acosh(x) * 2.0
print(float(y.sum()))
"""


@pytest.mark.parametrize("text, version", [("2.15.0", "2.15.0"), (" 2.16.0RC1 ", "2.16.0rc1"),
                                           ("2.14.1+cpu", "2.14.1+cpu"), ("2.13.0.post1", "2.13.0.post1"),
                                           ("\u200b2.15.0", "2.15.0")])  # copied from a comment's `cpu@\u200b2.15.0`
def test_release_versions_accepted(text, version):
    assert release_version(text) == version


@pytest.mark.parametrize("text", ["", "2", "../2.15.0", "2.15.0/../../x", ">=2.15", "2.15.0 --index-url=http://x",
                                  "2.15.0;rm", "latest", "-e .", "2.15.*"])
def test_release_versions_refused(text):
    with pytest.raises(TorchEnvError, match="is not a torch release version"):
        release_version(text)


@pytest.mark.parametrize("text", ["2.3.1", "1.13.0", "0.0.1"])
def test_releases_older_than_the_worker_supports_are_refused(text):
    with pytest.raises(TorchEnvError, match=f"torch {text} is older than triage's worker supports"):
        release_version(text)


def test_arm_suffix_round_trips():
    arm = parse_arm("cpu/compile=aot_eager/threads=1@2.15.0")
    assert (arm.device, arm.mode, arm.backend, arm.knobs, arm.torch) == (
        "cpu", "compile", "aot_eager", (("threads", "1"),), "2.15.0")
    assert arm.spec == "cpu/compile=aot_eager/threads=1@2.15.0"
    assert parse_arm(arm.spec) == arm
    assert arm.to_job()["spec"] == arm.spec  # the worker needs no more: it runs in the release's interpreter
    assert parse_arm("cpu").torch is None and parse_arm("cpu").spec == "cpu"
    assert [a.spec for a in parse_arms("cpu/compile,cpu/compile@2.15.0")] == ["cpu/compile", "cpu/compile@2.15.0"]


@pytest.mark.parametrize("text, message", [("cpu@", "'' is not a torch release"),
                                           ("cpu@../../etc", "'../../etc' is not a torch release"),
                                           ("cpu/compile@2.15.0@2.16.0", "is not a torch release")])
def test_bad_arm_suffix_is_a_clear_error(text, message):
    with pytest.raises(ArmSpecError, match=message):
        parse_arm(text)


def test_an_unprepared_release_is_refused_not_run_on_triages_torch():
    assert worker_python(ArmSpec("cpu"), RunSettings()) == sys.executable
    with pytest.raises(ValueError, match="torch 2.15.0 was not prepared"):
        worker_python(ArmSpec("cpu", torch="2.15.0"), RunSettings())
    prepared = RunSettings(interpreters={"2.15.0": "/envs/2.15.0/bin/python"})
    assert worker_python(ArmSpec("cpu", torch="2.15.0"), prepared) == "/envs/2.15.0/bin/python"


def test_release_pairs_are_their_own_kind():
    assert _pair_kind("cpu/compile", "cpu/compile@2.15.0") == "torch-vs-2.15.0"
    assert _pair_kind("cpu@2.13.0", "cpu/compile@2.15.0") == "2.13.0-vs-2.15.0+eager-vs-compile"
    assert _pair_kind("cpu/compile@2.15.0", "cpu/compile@2.15.0") == "repeat"


def test_the_verdict_names_each_arms_release_where_they_differ():
    """The summary says which release each arm ran (from its own collect_env), where they differ."""
    from triage.classify.wording import releases_sentence
    from triage.model import ArmRun, Comparison

    def run(spec, version):
        return ArmRun(spec=spec, device="cpu", mode="compile", status="ok",
                      environment=f"PyTorch version: {version}\nIs debug build: False\n")

    def comparison(*runs):
        return Comparison(arms=list(runs), aligned=1, alignment_note=None, leaves_identical=True, leaves_note=None,
                          divergence=None, divergences=0, claims=[], conditioning=[])

    two = comparison(run("cpu/compile", "2.13.0+cpu"), run("cpu/compile@2.15.0", "2.15.0+cu132"))
    assert releases_sentence(two) == " Torch releases: `cpu/compile` ran 2.13.0+cpu, `cpu/compile@2.15.0` ran 2.15.0+cu132."
    one = comparison(run("cpu/compile", "2.13.0+cpu"), run("cpu/compile@2.13.0", "2.13.0+cpu"))
    assert releases_sentence(one) == ""


def test_a_minimal_script_for_two_releases_is_plain():
    """One process cannot hold two torch releases: the script computes once, and the
    verification runs it on each release."""
    assert script_style(ArmSpec("cpu"), ArmSpec("cpu", mode="compile")) == ("compile", [])
    assert script_style(ArmSpec("cpu"), ArmSpec("cpu", mode="compile", torch="2.15.0")) == ("plain", [])


def test_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    """pip's failure is the message; no environment, no half-built folder is left."""
    def failing_step(argv, what, timeout_s):
        if "pip" in argv:
            raise TorchEnvError(f"{what} failed: ERROR: No matching distribution found for torch==9.9.9")
        return real_step(argv, what, timeout_s)

    real_step = torch_envs._step
    monkeypatch.setattr(torch_envs, "_step", failing_step)
    with pytest.raises(TorchEnvError, match="pip install torch==9.9.9 failed: .*No matching distribution"):
        torch_envs.torch_env("9.9.9", str(tmp_path))
    assert sorted(p.name for p in (tmp_path / "torch-envs").iterdir()) == ["9.9.9.lock"]


@pytest.fixture
def short_dir():
    """A folder with a short path: a sweep's Ray puts its Unix sockets under its TMPDIR."""
    path = Path(tempfile.mkdtemp(prefix="te-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_an_unreadable_build_record_means_build_again(tmp_path):
    assert torch_envs._marker(tmp_path) is None
    for text in ("{", "[]", '{"purelib": 3, "build": "x"}', '{"build": "x"}'):
        (tmp_path / torch_envs.MARKER).write_text(text)
        assert torch_envs._marker(tmp_path) is None, text
    (tmp_path / torch_envs.MARKER).write_text('{"purelib": "lib/python3.11/site-packages", "build": "2.15.0"}')
    assert torch_envs._marker(tmp_path) == {"purelib": "lib/python3.11/site-packages", "build": "2.15.0"}


# -- a real environment --------------------------------------------------------------------

@pytest.fixture(scope="session")
def env_cache(tmp_path_factory):
    """A triage cache holding a built environment of torch RELEASE."""
    cache = tmp_path_factory.mktemp("triage-cache")
    lines: list[str] = []
    env = torch_envs.torch_env(RELEASE, str(cache), log=lines.append)
    assert lines and lines[0].startswith(f"installing torch {RELEASE} into {cache}/torch-envs/{RELEASE}")
    return cache, env


@pytest.mark.slow
def test_environment_is_a_real_installation_with_this_triage(env_cache):
    cache, env = env_cache
    folder = cache / "torch-envs" / RELEASE
    assert env.python == str(folder / "bin" / "python") and not env.running
    marker = json.loads((folder / torch_envs.MARKER).read_text())
    assert marker["installed"].split("+")[0] == RELEASE and env.build.startswith(marker["installed"])
    assert not list(folder.parent.glob(".*.building"))
    probe = subprocess.run([env.python, "-I", "-c", "import sys, torch, triage.worker.session, triage; "
                            "print(sys.prefix); print(torch.__version__); print(triage.__file__)"],
                           capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert probe[0] == str(folder)
    assert probe[1] == marker["installed"]
    assert probe[2] == str(folder / "triage-worker" / torch_envs.package_digest() / "triage" / "__init__.py")
    # The copy is this triage's package, byte for byte.
    copy = folder / "triage-worker" / torch_envs.package_digest() / "triage"
    ours = Path(torch_envs._package_dir())
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*.py")) == \
        sorted(str(p.relative_to(ours)) for p in ours.rglob("*.py") if "__pycache__" not in p.parts)
    assert all((copy / p.relative_to(ours)).read_bytes() == p.read_bytes() for p in ours.rglob("*.py")
               if "__pycache__" not in p.parts)


@pytest.mark.slow
def test_a_built_environment_is_reused_and_a_new_triage_gets_its_own_copy(env_cache, monkeypatch):
    cache, env = env_cache
    folder = cache / "torch-envs" / RELEASE
    monkeypatch.setattr(torch_envs, "_step", lambda *a: pytest.fail(f"ran {a[1]} for a built environment"))
    assert torch_envs.torch_env(RELEASE, str(cache)) == env
    old = torch_envs.package_digest()
    monkeypatch.setattr(torch_envs, "package_digest", lambda: "0123456789abcdef")
    torch_envs.torch_env(RELEASE, str(cache))
    pth = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / torch_envs.PTH
    assert pth.read_text().strip() == str(folder / "triage-worker" / "0123456789abcdef")
    # The older copy stays for arms that started with it (removed after a day unused).
    assert (folder / "triage-worker" / old / "triage" / "__init__.py").is_file()
    monkeypatch.setattr(torch_envs, "package_digest", lambda: old)
    torch_envs.torch_env(RELEASE, str(cache))
    assert pth.read_text().strip() == str(folder / "triage-worker" / old)
    # A copy changed after it was made (an arm under the process sandbox runs as this user) is
    # replaced, not run: here an extension module that would be imported before session.py.
    planted = folder / "triage-worker" / old / "triage" / "worker" / "session.cpython-311-x86_64-linux-gnu.so"
    planted.write_bytes(b"\x7fELF")
    torch_envs.torch_env(RELEASE, str(cache))
    assert not planted.exists() and torch_envs._digest_of(folder / "triage-worker" / old / "triage") == old


@pytest.mark.slow
def test_an_arm_on_another_release_runs_that_installation(env_cache, tmp_path):
    """`cpu` runs triage's interpreter, `cpu/fault=…@2.13.0` the environment's, each in its
    sandbox; the fault makes the divergence, judged as between any two arms."""
    cache, env = env_cache
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    code, report, comment, out = run_triage(script, f"cpu,cpu/fault=acosh@{RELEASE}", tmp_path,
                                            "--no-minimize", env={"TRIAGE_CACHE_DIR": str(cache)})
    assert code == 0, out
    specs = [a["spec"] for a in report["arms"]]
    assert specs == ["cpu", f"cpu/fault=acosh@{RELEASE}"]
    prefixes = [next(line for line in a["stdout"].splitlines() if line.startswith("prefix:")) for a in report["arms"]]
    assert prefixes == [f"prefix: {sys.prefix}", f"prefix: {cache}/torch-envs/{RELEASE}"]
    # Each arm forked from the fork server of its own interpreter (where this machine forks
    # jobs at all): a forked job's command line is its zygote's.
    if not isolation().strong or os.uname().machine in CONFINABLE_MACHINES:
        cmdlines = [next(line for line in a["stdout"].splitlines() if line.startswith("cmdline:"))
                    for a in report["arms"]]
        assert cmdlines == [f"cmdline: {sys.executable} -I -m {ZYGOTE_MODULE}",
                            f"cmdline: {env.python} -I -m {ZYGOTE_MODULE}"]
    assert report["verdict"]["kind"] == "likely-bug", report["verdict"]["summary"]
    assert f"`cpu/fault=acosh@{RELEASE}`" in report["verdict"]["summary"]
    assert validate_report(report) == []  # what `triage post` accepts: arm specs with a release
    # The comment names the release; every "@" in it carries a zero-width space (no mention).
    assert f"cpu/fault=acosh@\u200b{RELEASE}" in comment
    assert all(a["status"] == "ok" for a in report["arms"])


TAMPER = """\
import os, torch, triage
for path in (triage.__file__, torch.__file__, os.path.join(os.path.dirname(triage.__file__), "worker", "x.so")):
    try:
        with open(path, "a") as f:
            f.write("# changed by the repro\\n")
        print("WROTE", path)
    except OSError as e:
        print("REFUSED", path, e.errno)
print(torch.ones(3).sum().item())
"""


@pytest.mark.slow
def test_an_arm_cannot_change_its_release_environment(env_cache, tmp_path):
    """The environment is mounted read-only in the arm's jail: neither the triage copy nor the
    release's torch can be changed for later runs (docs/security.md)."""
    if not isolation().strong:
        pytest.skip("needs the namespace sandbox: under the process sandbox an arm runs as this user, and only "
                    "the worker copy's digest check (test above) guards the environment")
    cache, env = env_cache
    folder = cache / "torch-envs" / RELEASE
    torch_init = next(folder.glob("lib/python*/site-packages/torch/__init__.py"))
    before = torch_init.read_bytes()
    script = tmp_path / "tamper.py"
    script.write_text(TAMPER)
    code, report, _, out = run_triage(script, f"cpu@{RELEASE}", tmp_path, "--no-minimize",
                                      env={"TRIAGE_CACHE_DIR": str(cache)})
    assert code == 0, out
    stdout = report["arms"][0]["stdout"]
    assert "WROTE" not in stdout and stdout.count("REFUSED") == 3, stdout
    assert torch_init.read_bytes() == before
    assert torch_envs._digest_of(folder / "triage-worker" / torch_envs.package_digest() / "triage") == \
        torch_envs.package_digest()


@pytest.mark.slow
def test_the_minimizer_and_the_verification_run_each_arm_on_its_release(env_cache, tmp_path):
    """The minimizer's warm workers replay arm A's graph in each arm's interpreter; the minimal
    script is verified by fresh runs on both arms, the second in the environment."""
    cache, _ = env_cache
    code, report, _, out = run_triage(FIXTURES / "matmul_chain.py", f"cpu,cpu/fault=mm@{RELEASE}", tmp_path,
                                      "--no-ablate", env={"TRIAGE_CACHE_DIR": str(cache)})
    assert code == 0, out
    minimal = report["minimal"]
    assert minimal["ops"] == ["aten.mm"] and minimal["verified"], minimal
    assert minimal["verification"].startswith(f"fresh runs on cpu and cpu/fault=mm@{RELEASE} show it")
    assert "torch.compile" not in (tmp_path / "minimal.py").read_text()  # plain: one release per process


@pytest.mark.slow
def test_a_release_pip_cannot_install_stops_the_run_before_any_arm(tmp_path):
    """No such release on the index (or no index reachable): exit 5, pip's reason, no arm run."""
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    code, report, _, out = run_triage(script, "cpu,cpu@2.99.0", tmp_path,
                                      env={"TRIAGE_CACHE_DIR": str(tmp_path / "cache")})
    assert code == 5 and report is None, out
    assert "a requested arm cannot run here: its torch release could not be installed: pip install torch==2.99.0 " \
           "failed:" in out and "Traceback" not in out
    assert sorted(p.name for p in (tmp_path / "cache" / "torch-envs").iterdir()) == ["2.99.0.lock"]


@pytest.mark.slow
def test_an_unknown_release_is_a_clear_error_before_any_arm(tmp_path):
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    code, report, _, out = run_triage(script, "cpu,cpu@2.13.0..1", tmp_path)
    assert code == 2 and report is None
    assert "'2.13.0..1' is not a torch release version" in out and "Traceback" not in out


@pytest.mark.slow
def test_sweep_runs_every_item_on_the_release_and_keys_results_by_its_build(env_cache, short_dir):
    cache, env = env_cache
    tmp_path = short_dir
    src = tmp_path / "src"
    src.mkdir()
    (src / "where.py").write_text(WHERE)
    (src / "fp16_overflow.py").write_text((FIXTURES / "fp16_overflow.py").read_text())
    argv = [sys.executable, "-m", "triage", "sweep", "src", "--torch", RELEASE, "--arms", "cpu", "--no-minimize",
            "--timeout", "60", "--num-cpus", "2"]
    environ = dict(sweep_environment(os.environ), TRIAGE_CACHE_DIR=str(cache), TMPDIR=str(tmp_path))
    done = subprocess.run(argv, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"2 items on torch {env.build} (2 run now, 0 already stored)" in done.stderr
    rows = sqlite3.connect(tmp_path / "triage-sweep" / "results.sqlite").execute(
        "select key, torch_build, arms, report from results order by key").fetchall()
    assert [(k, b, a) for k, b, a, _ in rows] == [("fp16_overflow.py", env.build, "cpu"), ("where.py", env.build, "cpu")]
    where = json.loads(rows[1][3])
    assert [a["spec"] for a in where["arms"]] == [f"cpu@{RELEASE}"]
    assert f"prefix: {cache}/torch-envs/{RELEASE}" in where["arms"][0]["stdout"]
    summary = json.loads((tmp_path / "triage-sweep" / "sweep.json").read_text())
    assert summary["torch_builds"] == [env.build]
    again = subprocess.run(argv, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=600)
    assert "(0 run now, 2 already stored)" in again.stderr, again.stderr


def test_sweep_torch_option_is_checked(tmp_path):
    done = subprocess.run([sys.executable, "-m", "triage", "sweep", "src", "--torch", "2.15.0,../x"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--torch: '../x' is not a torch release version" in done.stderr
