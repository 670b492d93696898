"""The run's fork server (triage/sandbox/zygote.py, triage/worker/zygote.py).

One jailed zygote per triage run imports torch once and forks every worker job.  A forked
job must be confined as a spawned arm is: the end-to-end tests run probe scripts through
`triage run` and check, from inside the arm, that it really was forked (PID 1 of its
namespace is the zygote) and what it sees — its own PID namespace, no capabilities,
`triage-arm` as hostname, only loopback, only its own scratch directory of the host's
temporary folders, nothing it can write outside its scratch — and, from the host, that
nothing it started outlives it.  The fast tests ask a real zygote which jobs it would fork
(`ForkServer.accepts`) and cancel a job that still waits for its imports.

The namespace tests skip, saying why, where this machine has no namespace sandbox (no
bubblewrap or no user namespaces): triage then forks in the process sandbox, which does not
confine a job this way.
"""
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import run_triage
from triage.sandbox import Confinement, SandboxedProcess, isolation
from triage.sandbox.caches import inductor_default_dir
from triage.sandbox.zygote import CONFINABLE_MACHINES, ZYGOTE_MODULE, fork_server

# Under pytest-xdist (--dist loadgroup): one real fork server (a module fixture) serves all the
# module's tests, on one worker.
pytestmark = pytest.mark.xdist_group("fork-server")

# Flags of every e2e run: the arms only, no minimizer, ablation or float64 reference.
ARMS_ONLY = ("--minimal", "-", "--no-minimize", "--no-ablate", "--no-reference", "--quiet")
# A file outside the host's temporary folders that the module's zygote binds read-only.
BOUND = "/etc/passwd"
# Outside the temporary folders and bound nowhere in the zygote's jail.
UNSEEN = "/etc/triage-fork-server-test/unseen"


@pytest.fixture
def forking() -> None:
    """The fork server forks jobs here (in the namespace sandbox, only where a child can drop
    its capabilities); else every job is spawned and there is nothing to test."""
    machine = os.uname().machine
    if isolation().strong and machine not in CONFINABLE_MACHINES:
        pytest.skip(f"the fork server forks no job in the namespace sandbox on {machine}: every job is spawned")


@pytest.fixture
def namespace_sandbox(forking) -> None:
    how = isolation()
    if not how.strong:
        pytest.skip(f"needs the namespace sandbox, which this machine lacks ({how.detail}); "
                    "forked jobs are then confined as the process sandbox confines them")


def _processes_with(marker: str) -> list[int]:
    """Host pids whose command line or name holds `marker` (a zombie's holds nothing)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if (marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
                    or marker in Path(f"/proc/{pid}/comm").read_text()):
                found.append(int(pid))
        except OSError:
            continue
    return found


def _none_left(marker: str, grace_s: float = 5.0) -> list[int]:
    """Wait up to `grace_s` for every process with `marker` to be gone; kill and return those
    that are not (the kernel tears a PID namespace down asynchronously)."""
    deadline = time.monotonic() + grace_s
    while (left := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def _arm_lines(report: dict, prefix: str) -> list[dict]:
    """The JSON each arm printed on its `prefix` line, in arm order."""
    found = []
    for arm in report["arms"]:
        lines = [line for line in arm["stdout"].splitlines() if line.startswith(prefix)]
        assert len(lines) == 1, (arm["status"], arm["failure"], arm["stdout"][-2000:], arm["stderr"][-2000:])
        found.append(json.loads(lines[0][len(prefix):]))
    return found


# -- end to end: what a forked arm sees ------------------------------------------------------

PROBE = textwrap.dedent("""\
    import json, os, socket, sys, time, uuid

    SENTINEL, SCRIPT_DIR, TRIAGE_DIR = {sentinel!r}, {script_dir!r}, {triage_dir!r}
    token = uuid.uuid4().hex
    scratch = os.path.dirname(os.getcwd())  # the worker runs in SCRATCH/work
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    seen = {{
        "pid1": open("/proc/1/cmdline", "rb").read().replace(b"\\0", b" ").decode(),
        "pid": os.getpid(),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "caps": {{k: int(status[k], 16) for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")}},
        "no_new_privs": int(status["NoNewPrivs"]),
        "hostname": socket.gethostname(),
        "interfaces": sorted(name for _, name in socket.if_nameindex()),
        "scratch": scratch,
        "sentinel_visible": os.path.exists(SENTINEL),
        "token": token,
    }}
    # Its loopback is up, as bubblewrap leaves a spawned arm's: a script can talk to itself.
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname(), timeout=5) as client:
            client.sendall(b"ping")
            seen["loopback"] = server.accept()[0].recv(4).decode()
    # Files only this arm should ever see: in its /tmp and in its HOME.
    for folder in ("/tmp", os.path.expanduser("~")):
        with open(os.path.join(folder, "fork-probe-" + token), "w") as f:
            f.write(token)
    seen["written_at"] = time.time()
    time.sleep(3)  # the sibling arm, run at the same time, writes its own meanwhile
    seen["listed_at"] = time.time()
    seen["tmp"] = sorted(os.listdir("/tmp"))
    seen["scratch_parent"] = sorted(os.listdir(os.path.dirname(scratch)))
    seen["home"] = sorted(os.listdir(os.path.expanduser("~")))
    # Writes outside the scratch directory: these must fail (one that does not is undone).
    refused = {{}}
    for path in ("/fork-probe-" + token, "/usr/fork-probe-" + token, "/etc/fork-probe-" + token,
                 os.path.join(sys.prefix, "fork-probe-" + token)):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as e:
            refused[path] = e.errno
        else:
            os.unlink(path)
            refused[path] = "written"
    refused["triage package"] = "writable" if os.access(TRIAGE_DIR, os.W_OK) else "read-only"
    seen["refused"] = refused
    # Host paths that only look writable here (they are the arm's own copies, in its scratch):
    # the host must not see these writes.
    for path in (SENTINEL, os.path.join(SCRIPT_DIR, "escaped-" + token)):
        try:
            with open(path, "w") as f:
                f.write("arm")
        except OSError:
            pass
    print("PROBE " + json.dumps(seen))
""")


@pytest.mark.slow
def test_two_concurrent_forked_arms_see_only_their_own_namespace(tmp_path, namespace_sandbox):
    import triage

    fd, sentinel = tempfile.mkstemp(prefix="triage-fork-sentinel-")
    os.write(fd, b"host")
    os.close(fd)
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(sentinel=sentinel, script_dir=str(tmp_path),
                                   triage_dir=os.path.dirname(os.path.abspath(triage.__file__))))
    try:
        code, report, _, out = run_triage(script, "cpu,cpu/threads=1", tmp_path, *ARMS_ONLY, "--jobs", "2")
        host_copy = Path(sentinel).read_text()
    finally:
        os.unlink(sentinel)
    assert report is not None, out
    arms = _arm_lines(report, "PROBE ")
    leaked = [path for arm in arms for folder in {"/tmp", tempfile.gettempdir(), os.path.expanduser("~")}
              if os.path.exists(path := os.path.join(folder, "fork-probe-" + arm["token"]))]
    for path in leaked:
        os.unlink(path)
    assert not leaked, "files an arm wrote in its /tmp or HOME are on the host"
    assert host_copy == "host", "an arm wrote the host's file in /tmp"
    assert not list(tmp_path.glob("escaped-*")), "an arm wrote beside the script on the host"

    # Both ran at once: each wrote its files before the other listed its folders.
    a, b = arms
    assert a["written_at"] < b["listed_at"] and b["written_at"] < a["listed_at"], "the arms did not overlap"
    assert a["scratch"] != b["scratch"]
    for arm, sibling in ((a, b), (b, a)):
        # Forked from the zygote: PID 1 of its namespace is a copy of it, the worker PID 2.
        assert ZYGOTE_MODULE in arm["pid1"] and arm["pid"] == 2, arm["pid1"]
        # Its own PID namespace: PID 1, the worker, nothing of the host's or the sibling's.
        assert {1, 2} <= set(arm["pids"]) and max(arm["pids"]) <= 10, arm["pids"]
        assert arm["caps"] == {"CapEff": 0, "CapPrm": 0, "CapBnd": 0, "CapAmb": 0}
        assert arm["no_new_privs"] == 1
        assert arm["hostname"] == "triage-arm"
        assert arm["interfaces"] == ["lo"]
        assert arm["loopback"] == "ping"
        # Of the host's temporary folders: its own scratch directory only.
        assert not arm["sentinel_visible"]
        scratches = [e for e in arm["scratch_parent"] if e.startswith("triage-arm-")]
        assert scratches == [os.path.basename(arm["scratch"])], arm["scratch_parent"]
        assert not [e for e in arm["tmp"] if e.startswith(("triage-zygote-", "triage-fork-sentinel-"))], arm["tmp"]
        mine, theirs = "fork-probe-" + arm["token"], "fork-probe-" + sibling["token"]
        assert mine in arm["tmp"] and theirs not in arm["tmp"], arm["tmp"]
        assert mine in arm["home"] and theirs not in arm["home"], arm["home"]
        assert all(isinstance(v, int) for k, v in arm["refused"].items() if k != "triage package"), arm["refused"]
        assert arm["refused"]["triage package"] == "read-only"
    assert code == 0, out


LEFTOVERS = textwrap.dedent("""\
    import os, subprocess, sys, time

    MARKER = {marker!r}
    SLEEP = [sys.executable, "-c", "import time; time.sleep(300)", MARKER]
    quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.Popen(SLEEP, start_new_session=True, **quiet)           # a session of its own
    subprocess.Popen(SLEEP, start_new_session=True, close_fds=False)  # holding triage's pipes
    if os.fork() == 0:                                                 # double fork + setsid
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, SLEEP)
        os._exit(0)

    def running():
        found = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                found += MARKER.encode() in open(f"/proc/{{pid}}/cmdline", "rb").read()
            except OSError:
                pass
        return found

    deadline = time.monotonic() + 10
    while running() < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    print("LEFT", running(), open("/proc/1/cmdline", "rb").read().replace(b"\\0", b" ").decode())
""")


@pytest.mark.slow
def test_processes_a_forked_arm_leaves_behind_do_not_outlive_it(tmp_path, namespace_sandbox):
    marker = f"triage-fork-leftover-{uuid.uuid4().hex[:12]}"
    script = tmp_path / "leftovers.py"
    script.write_text(LEFTOVERS.format(marker=marker))
    started = time.monotonic()
    code, report, _, out = run_triage(script, "cpu", tmp_path, *ARMS_ONLY)
    seconds = time.monotonic() - started
    left = _none_left(marker)
    assert code == 0 and report is not None, out
    arm = report["arms"][0]
    assert arm["status"] == "ok", (arm["failure"], arm["stderr"][-2000:])
    line = next((x for x in arm["stdout"].splitlines() if x.startswith("LEFT ")), "")
    assert line.startswith("LEFT 3 ") and ZYGOTE_MODULE in line, arm["stdout"]  # all three ran, forked
    assert seconds < 60, f"triage waited {seconds:.0f} s (on the pipes a leftover held?)"
    assert not left, f"processes outlived the arm: {left}"


HANG = textwrap.dedent("""\
    import ctypes, subprocess, sys, time

    ctypes.CDLL(None).prctl(15, {name!r}.encode(), 0, 0, 0)  # PR_SET_NAME: find this worker from the host
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {name!r}], start_new_session=True)
    print("PID1", open("/proc/1/cmdline", "rb").read().replace(b"\\0", b" ").decode(), flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_a_forked_arm_past_its_timeout_is_killed_with_everything_it_started(tmp_path, namespace_sandbox):
    name = "tfs" + uuid.uuid4().hex[:12]  # a process name holds 15 bytes
    script = tmp_path / "hang.py"
    script.write_text(HANG.format(name=name))
    started = time.monotonic()
    _, report, _, out = run_triage(script, "cpu", tmp_path, *ARMS_ONLY, "--timeout", "3", timeout=120)
    seconds = time.monotonic() - started
    left = _none_left(name)
    assert report is not None, out
    arm = report["arms"][0]
    assert arm["status"] == "timeout", (arm["status"], arm["failure"], arm["stderr"][-2000:])
    assert ZYGOTE_MODULE in arm["stdout"], arm["stdout"]  # it was forked
    assert seconds < 60, f"triage took {seconds:.0f} s to end a 3 s timeout"
    assert not left, f"processes outlived the timed-out arm: {left}"


# -- the fork server itself --------------------------------------------------------------------

@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    """One real fork server for the module (eager imports only), with what it was given."""
    from triage.arms.run import arm_environment

    compiled = str(tmp_path_factory.mktemp("fork-server-cache"))
    env = arm_environment(compiled)
    mounts = inductor_default_dir(env, compiled)
    how = isolation()
    with fork_server(env=env, isolation=how, writable=[compiled], mounts=mounts, readable=[BOUND],
                     compile=False) as server:
        yield SimpleNamespace(server=server, env=env, compiled=compiled, mounts=mounts, isolation=how)


def _worker(*args: str, module: str = "triage.worker") -> list[str]:
    return [sys.executable, "-I", "-m", module, *args]


def _job(zygote, **jail_changes):
    """(argv, jail, env) of a worker job as triage/run.py builds one for an arm."""
    scratch = os.path.join(tempfile.gettempdir(), "triage-arm-fork-server-test")
    jail = Confinement(scratch=scratch, workdir=os.path.join(scratch, "work"),
                       readable=[os.path.join(tempfile.gettempdir(), "some-repro.py")],
                       writable=[zygote.compiled], mounts=dict(zygote.mounts))
    for key, value in jail_changes.items():
        setattr(jail, key, value)
    env = dict(zygote.env, HOME=os.path.join(scratch, "home"), TMPDIR="/tmp", TRIAGE_CONTROL_FD="7")
    return _worker(os.path.join(scratch, "out", "job.json")), jail, env


def test_accepts_a_worker_job_in_the_zygotes_environment(zygote, forking):
    argv, jail, env = _job(zygote)
    assert zygote.server.accepts(argv, jail, env)
    assert zygote.server.accepts(_worker(module="triage.worker.serve"), jail, env)
    # HOME, TMPDIR and descriptor numbers are the job's own.
    other = dict(env, HOME="/tmp/elsewhere/home", TMPDIR="/tmp/elsewhere", TRIAGE_CONTROL_FD="12",
                 TRIAGE_REPLY_FD="13")
    assert zygote.server.accepts(argv, jail, other)


@pytest.mark.parametrize("change", ["added", "changed", "removed"])
def test_refuses_a_job_whose_environment_differs_from_the_zygotes(zygote, change, forking):
    argv, jail, env = _job(zygote)
    assert zygote.server.accepts(argv, jail, env)
    if change == "added":
        env["OMP_NUM_THREADS"] = "1"  # read when torch is imported: the zygote imported it without
    elif change == "changed":
        env["TORCHINDUCTOR_CACHE_DIR"] = env["TORCHINDUCTOR_CACHE_DIR"] + "-other"
    else:
        del env["PATH"]
    assert not zygote.server.accepts(argv, jail, env)


def test_refuses_a_job_with_accelerators(zygote, forking):
    argv, jail, env = _job(zygote)
    assert zygote.server.accepts(argv, jail, env)
    jail.accelerators = True
    assert not zygote.server.accepts(argv, jail, env)


@pytest.mark.parametrize("argv", [
    pytest.param([sys.executable, "-I", "-c", "pass"], id="code"),
    pytest.param(_worker(module="triage.worker.zygote"), id="zygote"),
    pytest.param(_worker(module="triage.cli"), id="other-module"),
    pytest.param(_worker(module="triage.worker.servex"), id="prefix-of-entry"),
    pytest.param([sys.executable, "-m", "triage.worker", "job.json"], id="not-isolated"),
    pytest.param([sys.executable, "-I", "-S", "-m", "triage.worker", "job.json"], id="other-flags"),
    pytest.param(["/bin/python3-other", "-I", "-m", "triage.worker", "job.json"], id="other-interpreter"),
    pytest.param([sys.executable, "-I", "-m"], id="no-module"),
    pytest.param(["sleep", "300"], id="not-python"),
])
def test_refuses_what_is_not_a_worker_entry_point(zygote, argv, forking):
    worker, jail, env = _job(zygote)
    assert zygote.server.accepts(worker, jail, env)
    assert not zygote.server.accepts(argv, jail, env)


def test_refuses_the_zygotes_own_kind_of_jail(zygote, forking):
    assert zygote.server.accepts(*_job(zygote))
    for change in ({"host_proc": True}, {"directories": ["/triage-stage"]}):
        argv, jail, env = _job(zygote, **change)
        assert not zygote.server.accepts(argv, jail, env), change


def test_refuses_a_job_that_reads_a_path_the_zygote_cannot_see(zygote, tmp_path, namespace_sandbox):
    argv, jail, env = _job(zygote)
    server = zygote.server
    assert server.accepts(argv, jail, env)
    # Bound read-only when the zygote started: it may be shown to a child.
    _, bound, _ = _job(zygote, readable=[BOUND])
    assert server.accepts(argv, bound, env)
    # Neither in the temporary folders nor bound in the zygote's jail.
    for change in ({"readable": [UNSEEN]}, {"readable": [BOUND, UNSEEN]}, {"writable": [os.path.dirname(UNSEEN)]},
                   {"mounts": {"/tmp/torchinductor_x": os.path.dirname(UNSEEN)}},
                   {"scratch": "/etc/triage-fork-server-test", "workdir": "/etc/triage-fork-server-test/work"}):
        _, elsewhere, _ = _job(zygote, **change)
        assert not server.accepts(argv, elsewhere, env), change
    # A link in the temporary folder counts where it points.
    link = tmp_path / "link.py"
    link.symlink_to(UNSEEN)
    _, linked, _ = _job(zygote, readable=[str(link)])
    assert not server.accepts(argv, linked, env)


@contextlib.contextmanager
def _compile_server(tmp_path):
    """A fork server that will load inductor, and a job's jail and environment beside it:
    (server, jail, env, isolation)."""
    from triage.arms.run import arm_environment

    compiled = str(tmp_path / "cache")
    os.makedirs(compiled)
    env = arm_environment(compiled)
    how = isolation()
    scratch = tempfile.mkdtemp(prefix="triage-arm-")
    try:
        jail = Confinement(scratch=scratch, workdir=os.path.join(scratch, "work"), writable=[compiled])
        with fork_server(env=env, isolation=how, writable=[compiled], mounts={}, readable=[],
                         compile=True) as server:
            yield server, jail, env, how
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_job_cancelled_while_it_waits_for_its_imports_ends_unforked(tmp_path, forking):
    """A compile job waits for inductor's imports; killed at once, the zygote drops it
    (status 128 + SIGKILL) without ever forking it, and a closed server forks nothing."""
    with _compile_server(tmp_path) as (server, jail, env, how):
        argv = _worker(os.path.join(jail.scratch, "out", "job.json"))
        child = SandboxedProcess(argv, jail=jail, env=env, isolation=how, imports="compile")
        assert child.forked
        started = time.monotonic()
        child.kill()
        assert child.proc.wait(timeout=60) == 128 + signal.SIGKILL
        assert child.exit_status() == -signal.SIGKILL
        assert child.proc.pid is None, "the job was forked before it was cancelled"
        assert time.monotonic() - started < 60
        # Dropped by a live zygote that had not loaded inductor yet, which then goes on:
        # not the status every job gets when the zygote dies.
        assert "compile" not in server.ready
        deadline = time.monotonic() + 60
        while "compile" not in server.ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "compile" in server.ready, "the zygote did not go on importing after the cancel"
        prepared = dict(env, **jail.prepare())
    assert not server.accepts(argv, jail, prepared)


@pytest.mark.slow
def test_a_running_forked_job_past_its_timeout_is_killed(zygote, tmp_path, namespace_sandbox):
    """`run_arm` within the fork server: the arm is forked, runs, is killed at its deadline,
    and neither the worker nor what it started remains."""
    from triage.arms.run import run_arm
    from triage.arms.spec import parse_arm
    from triage.extract import extract_repro
    from triage.settings import RunSettings

    name = "tfs" + uuid.uuid4().hex[:12]
    script = tmp_path / "hang.py"
    script.write_text(HANG.format(name=name))
    options = RunSettings(timeout_s=2, reference=False, export_graphs=False, compile_cache=zygote.compiled)
    started = time.monotonic()
    run = run_arm(extract_repro(script), parse_arm("cpu"), options, 2 << 30)
    seconds = time.monotonic() - started
    left = _none_left(name)
    assert run.status == "timeout", (run.status, run.failure, run.stderr[-2000:])
    assert ZYGOTE_MODULE in run.stdout, run.stdout
    assert seconds < 60
    assert not left, f"processes outlived the timed-out arm: {left}"


def test_an_eager_job_is_forked_while_inductor_still_loads(tmp_path, forking):
    """The zygote reads its socket between two imports (or warm-ups): an eager job asked for
    once torch is in is forked before the compile level is announced, not after it."""
    with _compile_server(tmp_path) as (server, jail, env, how):
        deadline = time.monotonic() + 120
        while "torch" not in server.ready and time.monotonic() < deadline:
            time.sleep(0.001)
        assert "torch" in server.ready and "compile" not in server.ready, server.ready
        child = SandboxedProcess(_worker("--version-probe"), jail=jail, env=env, isolation=how, imports="torch")
        assert child.forked
        while child.proc.pid is None and "compile" not in server.ready and time.monotonic() < deadline:
            time.sleep(0.001)
        forked_first = child.proc.pid is not None and "compile" not in server.ready
        child.kill()
        child.proc.wait(timeout=60)
        assert forked_first, "the eager job waited for the compile level"


WARMED = textwrap.dedent("""\
    import json, torch._inductor.cpu_vec_isa as isa, torch._inductor.codecache as cc
    try:
        cc.torch_key.set(b"")  # refused once the hash is known
        torch_key = False
    except (RuntimeError, AssertionError):  # torch 2.13 raises RuntimeError, torch 2.11 asserts
        torch_key = True
    print("WARMED " + json.dumps({"isa": isa.valid_vec_isa_list.cache_info().currsize, "torch_key": torch_key,
                                  "pid1": open("/proc/1/cmdline", "rb").read().decode(errors="replace")}))
""")


@pytest.mark.slow
def test_a_forked_compile_arm_starts_with_inductors_machine_probes_done(tmp_path, forking):
    """The vector-ISA probes and torch's source hash (about a second of every first compile)
    are worked out once, by the zygote, and every compile arm inherits them."""
    script = tmp_path / "warmed.py"
    script.write_text(WARMED)
    code, report, _, out = run_triage(script, "cpu/compile", tmp_path, *ARMS_ONLY)
    assert report is not None, out
    (arm,) = _arm_lines(report, "WARMED ")
    assert ZYGOTE_MODULE in arm["pid1"] or not isolation().strong, arm["pid1"]
    assert arm["isa"] == 1 and arm["torch_key"], arm
    assert code == 5, out  # the probe compiles nothing: not the comparison a compile arm is for


TEMPORARY_FOLDER = textwrap.dedent("""\
    import os, tempfile, uuid
    import torch
    with tempfile.NamedTemporaryFile() as f:
        f.write(b"x")
        print("TEMPDIR", tempfile.gettempdir() == os.environ["TMPDIR"], os.path.dirname(f.name) == tempfile.gettempdir())
    print(torch.compile(lambda x: x.sin() + 1)(torch.ones(3)))
    # {run}
""")


@pytest.mark.parametrize("how", ["process", "auto"])
def test_a_forked_arms_temporary_files_go_to_its_own_folder(tmp_path, how):
    """Python's `tempfile` keeps the folder it first found, and inductor fixes its precompiled
    headers' folder under it at import: both were the zygote's. A forked arm then wrote its
    temporary files there, where the process sandbox forbids it: a compile arm that loaded the
    kernel an earlier run of the script had cached, and built its header, failed with
    PermissionError, and the report called it a crash of that arm."""
    script = tmp_path / "tmp_folder.py"
    script.write_text(TEMPORARY_FOLDER.format(run=uuid.uuid4().hex))  # a compile cache of its own
    for _ in range(2):  # the first run compiles and caches the kernel, the second loads it
        code, report, _, out = run_triage(script, "cpu/compile", tmp_path, *ARMS_ONLY, "--isolation", how)
        assert report is not None, out
        arm, = report["arms"]
        assert arm["status"] == "ok", (arm["failure"], arm["stderr"][-2000:])
        assert "TEMPDIR True True" in arm["stdout"], arm["stdout"]
