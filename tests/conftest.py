import json
import os
import shutil
import site
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
# Real PyTorch issue repros with their meta.json, and the seed articles' scripts (fixtures/README.md).
ISSUES = FIXTURES / "issues"
SEEDS = FIXTURES / "seeds"


# Environment variables of the test process a sweep must not see: a token (the fake GitHub
# needs none), CI's job summary (the sweep would append its report to the real one), and
# Ray's own (RAY_ADDRESS: a cluster to join; RAY_AUTH_MODE and others, which an in-process
# `ray.init` of an earlier test leaves behind).
NOT_PASSED = ("GITHUB_TOKEN", "GH_TOKEN", "GITHUB_STEP_SUMMARY")


def sweep_environment(environ) -> dict[str, str]:
    """The test process's environment as a `triage sweep` subprocess gets it: as from a fresh shell."""
    return {k: v for k, v in environ.items() if k not in NOT_PASSED and not k.startswith("RAY_")}


def run_triage(script, arms, tmp_path, *extra, env=None, timeout=600):
    """Run the real CLI in a subprocess; returns (exit code, report dict or None, comment, output)."""
    report, comment = tmp_path / "report.json", tmp_path / "comment.md"
    argv = [sys.executable, "-m", "triage", "run", str(script), "--json", str(report),
            "--comment", str(comment), *extra]
    if arms is not None:
        argv += ["--arms", arms]
    full_env = dict(os.environ, TRIAGE_TEST_ARMS="1", **(env or {}))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=tmp_path)
    data = json.loads(report.read_text()) if report.exists() else None
    text = comment.read_text() if comment.exists() else None
    return proc.returncode, data, text, proc.stdout + proc.stderr


def run_source(triage, tmp_path, name, source, arms="cpu"):
    """`source` as tmp_path/NAME.py, run with --no-minimize through the `triage` fixture: the
    report (never None)."""
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    code, report, comment, out = triage(script, arms, "--no-minimize")
    assert report is not None, out
    return report


# Whether this torch's inductor, with emulate_precision_casts, rounds fixtures/fp16_intermediate_compile.py's
# float16 intermediates as eager does on the CPU (torch 2.13 does; torch 2.11 keeps them in float32 and
# prints the finite values regardless), so that a test asserts the verdict this torch calls for.
EMULATION_PROBE = """
import torch, torch._inductor.config as config
config.emulate_precision_casts = True
f = lambda h: h * 1000 * 1000 / 1000 / 1000
h = torch.tensor([100.0, 200.0, 300.0], dtype=torch.float16)
print(torch.equal(f(h), torch.compile(f)(h)))
"""


def emulated_casts_round_as_eager(env=None) -> bool:
    """The probe above in a fresh process of this interpreter, with `env` added to its environment and
    a cache of inductor's own (code cached for another CPU capability does not build under this one)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="emulation_probe_") as cache:
        proc = subprocess.run([sys.executable, "-c", EMULATION_PROBE], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, **(env or {})))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()[-1] == "True"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under `--dist loadgroup`, a test marked `xdist_group` must carry its group in its node ID
    (pytest-xdist puts it there; where pytest ignores that, the group is split across workers and
    its shared fixtures are built on each, silently): such a test fails, saying so."""
    if getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("xdist_group") \
            and "@" not in item.nodeid:
        pytest.fail(f"--dist loadgroup does not group this test with pytest {pytest.__version__} (pytest-xdist#1386): "
                    "install the pytest that pyproject.toml's test extra names", pytrace=False)


@pytest.fixture
def triage(tmp_path):
    return lambda script, arms="cpu", *extra, **kw: run_triage(script, arms, tmp_path, *extra, **kw)


# -- an interpreter uid 65534 can run ----------------------------------------------------------
# Tests that run triage as another user (tests/test_hostile.py, tests/test_sweep_sources.py) need
# an interpreter that user can reach. This one may not be: a pyenv or uv Python in root's home
# (mode 700), a venv in a private folder. So the session builds its own, under the world-
# reachable temp folder: the base installation's executable, standard library and shared
# libpython, a venv on it, and this environment's packages (triage included, as installed, not
# as an editable link into a checkout that may be private too). Files are hard-linked where the
# file system allows (seconds, no space), copied where not; nothing of the original is changed.
NOBODY = 65534


@dataclass(frozen=True)
class NobodyPython:
    """A Python that uid 65534 can run, with this triage, torch and the rest importable."""

    python: str  # the executable to run
    triage: Path  # the triage package it imports (a copy of this checkout's)
    env: dict[str, str] = field(default_factory=dict)  # what its processes need added to their environment

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with this interpreter's own variables put first (LD_LIBRARY_PATH for a shared libpython)."""
        return _prepended(self.env, base)


def _prepended(paths: dict[str, str], base: dict[str, str]) -> dict[str, str]:
    """`base` with each of `paths` put before what `base` already holds under that name."""
    env = dict(base)
    for name, value in paths.items():
        env[name] = value + (os.pathsep + env[name] if env.get(name) else "")
    return env


def _world_can_use(mode: int) -> bool:
    """Whether "other" may read the file (and execute it, where its owner may)."""
    return bool(mode & stat.S_IROTH) and (not mode & stat.S_IXUSR or bool(mode & stat.S_IXOTH))


def _place(src: str, dst: str) -> None:
    """`src` at `dst`, readable by everyone: a hard link where the file already is (a link shares
    the original's mode, which must not change), else a copy whose mode is then widened."""
    mode = os.stat(src).st_mode
    if _world_can_use(mode):
        try:
            os.link(src, dst)
            return
        except OSError:  # another file system, or links refused: copy
            pass
    shutil.copy2(src, dst)
    os.chmod(dst, stat.S_IMODE(mode) | stat.S_IROTH | (stat.S_IXOTH if mode & stat.S_IXUSR else 0))


def _place_tree(src: Path, dst: Path, skip: Callable[[Path], bool] = lambda p: False) -> None:
    """The tree at `src` placed at `dst` (see `_place`); folders made 0755; relative links kept
    as links, absolute ones (which may point into the private folder) placed as what they name;
    entries `skip` refuses (given the source path) and those already at `dst` left out."""
    dst.mkdir(parents=True, exist_ok=True)
    os.chmod(dst, 0o755)
    for entry in os.scandir(src):
        source, target = Path(entry.path), dst / entry.name
        if skip(source) or os.path.lexists(target):
            continue
        if entry.is_symlink() and not os.path.isabs(os.readlink(source)):
            os.symlink(os.readlink(source), target)
        elif entry.is_dir():
            _place_tree(source.resolve(), target, skip)
        elif entry.is_file():
            _place(os.path.realpath(source), str(target))


def _build_nobody_python(root: Path) -> NobodyPython:
    """The interpreter of `NobodyPython`, built under `root` (a folder uid 65534 can reach)."""
    import triage
    import triage.templates

    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base_prefix = Path(sys.base_prefix)
    base = root / "base"
    # The executable and the standard library, at the places relative to each other that
    # Python's start-up looks for (bin/pythonX.Y finds its prefix from lib/pythonX.Y/os.py).
    (base / "bin").mkdir(parents=True)
    _place(os.path.realpath(getattr(sys, "_base_executable", sys.executable)), str(base / "bin" / version))
    for kind in ("stdlib", "platstdlib"):
        lib = Path(sysconfig.get_paths()[kind])
        inside = lib.relative_to(base_prefix) if lib.is_relative_to(base_prefix) else Path("lib") / version
        _place_tree(lib, base / inside, skip=lambda p, lib=lib: p.parent == lib and p.name in
                    ("site-packages", "dist-packages", "test"))
    env = {}
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        # A shared build finds libpython by an absolute RUNPATH into the private folder: the copy
        # is found first through LD_LIBRARY_PATH (which triage passes on to its arms).
        libdir = sysconfig.get_config_var("LIBDIR")
        soname = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
        _place(os.path.realpath(os.path.join(libdir, soname)), str(base / "lib" / soname))
        env["LD_LIBRARY_PATH"] = str(base / "lib")
    venv = root / "venv"
    made = subprocess.run([str(base / "bin" / version), "-m", "venv", "--without-pip", str(venv)],
                          capture_output=True, text=True, timeout=300, env=_prepended(env, dict(os.environ)), check=False)
    assert made.returncode == 0, f"could not make a venv on the copied interpreter: {made.stderr[-2000:]}"
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, timeout=60, check=True,
                             env=_prepended(env, dict(os.environ))).stdout.strip()
    packages = Path(purelib)
    # This environment's packages; an editable triage's finder (which maps `triage` to the
    # checkout) is left out, and triage is placed as a package instead.
    for folder in site.getsitepackages():
        if os.path.isdir(folder):
            _place_tree(Path(folder), packages,
                        skip=lambda p: p.name.startswith("__editable__") and "triage" in p.name)
    source = Path(triage.__file__).parent
    if not (packages / "triage").exists():
        _place_tree(source, packages / "triage")
    templates = Path(triage.templates.__file__).parent
    if not (packages / "triage" / "templates").exists():
        _place_tree(templates, packages / "triage" / "templates")
    return NobodyPython(python, packages / "triage", env)


def run_as_nobody(argv: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    """`argv` run as uid and gid 65534 with no other groups (the caller is root)."""
    return subprocess.run(argv, user=NOBODY, group=NOBODY, extra_groups=[], env=env, **kw)


@pytest.fixture(scope="session")
def nobody_python() -> Iterator[NobodyPython]:
    """A `NobodyPython`, built for this session and removed after it. Skipped where the tests
    cannot switch to another user (they do not run as root)."""
    if os.geteuid() != 0:
        pytest.skip("the tests do not run as root, so they cannot switch to uid 65534")
    root = Path(tempfile.mkdtemp(prefix="triage-nobody-python-"))
    try:
        os.chmod(root, 0o755)
        built = _build_nobody_python(root)
        # The interpreter must also start itself again (triage's workers): tried as that user.
        again = ("import subprocess, sys, torch, triage; assert triage.__file__.startswith(sys.argv[1]), triage.__file__; "
                 "subprocess.run([sys.executable, '-c', 'pass'], check=True)")
        done = run_as_nobody([built.python, "-c", again, str(built.triage)], built.environment(dict(os.environ)),
                             capture_output=True, text=True, cwd="/", timeout=300, check=False)
        if done.returncode != 0:
            pytest.fail(f"uid {NOBODY} cannot run the interpreter built for it under {root} (is "
                        f"{tempfile.gettempdir()} reachable by other users?): {done.stderr.strip()[-600:]}",
                        pytrace=False)
        yield built
    finally:
        shutil.rmtree(root, ignore_errors=True)


def recorded(fn, *inputs):
    """Record `fn` eagerly: (graph, {node: float64 reference}, {node: arm dtype}, arm value) of its output."""
    import torch

    from triage.worker.opgraph import OpRecorder
    from triage.worker.reference import replay_fp64

    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        out = fn(*inputs)
    recording = recorder.finish()
    node = recorder.lookup(out)
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    return recording.graph, {node.name: reference}, {node.name: out.dtype}, out


def simulated_spread(fn, *inputs, samples=29, threads=None):
    """Record `fn` eagerly and simulate its rounding: (arm value, RoundingSpread, Simulation)."""
    import torch

    from triage.judge import RoundingSpread
    from triage.worker.rounding import SimulationOptions, simulate_rounding

    graph, wanted, dtypes, out = recorded(fn, *inputs)
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=samples, threads=threads), dtypes)
    (name, reference), = wanted.items()
    spread = sim.spreads[name]
    assert spread.status == "judged", spread.reason
    reference = reference.resolve_conj()
    # A complex value's spread is of its real pairs.
    wide = torch.view_as_real(reference).numpy() if reference.is_complex() else reference.numpy()
    return out, RoundingSpread.of_simulation(spread, wide, str(out.dtype).replace("torch.", "")), sim
