"""The third hostile-input review (56 cases: the fork server, the compile cache, the jail's
limits), each attack made on purpose here so that it stays stopped on any machine.

- One probe script tries every way out the review found, from inside an arm, and prints
  what happened; it runs forked from the fork server (`triage run`), spawned in bubblewrap
  (`run_arm` with no fork server) and in the process sandbox, where only the kernel's
  confinement (Landlock, seccomp) stands between it and the host.
- The limits: memory no process maps (memfd, System V shared memory), a fork pool sharing
  one tensor (not over the limit), a thread bomb (tasks, not processes), a file flood.
- The compile cache: the folders triage mounts are its own, checked before each mount,
  replaced when a script left anything else there, bounded in size; the fork server warms
  up from a cache of its own.

Where a mechanism is missing on this machine (no bubblewrap, no Landlock, no cgroup) the
tests that need it skip and say which; what triage reports then is tested in
test_sandbox.py.  Cases that are not about the sandbox (bounded inputs, issue bodies, lost
values) are in test_hostile3_inputs.py.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import run_triage
from triage.arms.run import _arm_run, run_arm
from triage.arms.spec import parse_arm
from triage.model import Repro
from triage.sandbox import caches, cgroups, confine, isolation
from triage.sandbox.jail import host_directory
from triage.sandbox.process import MAX_DISK_ENTRIES, ProcessOutcome, disk_usage_and_entries
from triage.settings import RunSettings

ARMS_ONLY = ("--minimal", "-", "--no-minimize", "--no-ablate", "--no-reference", "--quiet")
GiB = 1 << 30

# Each attack prints "NAME ok" when it got through and "NAME refused ERRNO/EXC" when not.
PROBE = textwrap.dedent("""\
    import ctypes, errno, json, os, socket
    import torch
    OUTSIDE, ABSTRACT = {outside!r}, {abstract!r}
    libc = ctypes.CDLL(None, use_errno=True)
    got = {{}}

    def attempt(name, action):
        try:
            result = action()
        except OSError as e:
            got[name] = "refused " + errno.errorcode.get(e.errno, str(e.errno))
            return
        except Exception as e:
            got[name] = "refused " + type(e).__name__
            return
        got[name] = "ok" if result in (None, 0) or not isinstance(result, int) else \\
            "refused " + errno.errorcode.get(ctypes.get_errno(), "?")

    def write(path):
        with open(path, "w") as f:
            f.write("written by an arm")

    def call(number, *args):
        return libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])

    attempt("write outside the scratch", lambda: write(os.path.join(OUTSIDE, "from-the-arm")))
    attempt("list outside the scratch", lambda: os.listdir(OUTSIDE))
    attempt("file in /dev", lambda: write("/dev/triage-h3"))
    attempt("/proc/1/cwd/..", lambda: os.listdir("/proc/1/cwd/.."))
    attempt("write via /proc/1/cwd", lambda: write("/proc/1/cwd/../triage-h3"))
    attempt("PID 1's memory", lambda: open("/proc/1/mem", "rb").read(1))
    attempt("PID 1's descriptors", lambda: [os.readlink("/proc/1/fd/" + fd) for fd in os.listdir("/proc/1/fd")])
    attempt("ptrace PID 1", lambda: libc.ptrace(0x4206, 1, 0, 0))  # PTRACE_SEIZE
    attempt("user namespace", lambda: libc.unshare(0x10000000))
    attempt("mount namespace", lambda: libc.unshare(0x00020000))
    attempt("keyring", lambda: call(250, 0, -4, 0))  # keyctl(KEYCTL_GET_KEYRING_ID, @u); x86-64 number
    attempt("bpf", lambda: call(321, 0, 0, 0))  # x86-64 number
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    attempt("write beside the compile cache", lambda: write(os.path.join(os.path.dirname(cache), "default-link")))
    attempt("replace the compile cache", lambda: os.rename(cache, cache + ".old"))

    def abstract():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(ABSTRACT)
    attempt("host's abstract socket", abstract)
    # What the arm may still do: write its scratch, /tmp, /dev/null; start threads; compute.
    attempt("own /tmp", lambda: write(os.path.join(os.environ["TMPDIR"], "mine")))
    attempt("/dev/null", lambda: write("/dev/null"))
    print("PROBE " + json.dumps(got))
    print(torch.ones(3).sum())
""")
MUST_REFUSE = ("write outside the scratch", "list outside the scratch", "file in /dev", "/proc/1/cwd/..",
               "write via /proc/1/cwd", "PID 1's memory", "ptrace PID 1", "user namespace", "mount namespace",
               "replace the compile cache", "host's abstract socket")
X86_ONLY = ("keyring", "bpf")  # syscall numbers in the probe
MUST_ALLOW = ("own /tmp", "/dev/null")


def _needs_landlock() -> None:
    if not confine.landlock_abi():
        pytest.skip("this kernel has no Landlock: the process sandbox cannot confine a job's files")


def _needs_namespaces() -> None:
    how = isolation()
    if not how.strong:
        pytest.skip(f"needs the namespace sandbox, which this machine lacks ({how.detail})")


@pytest.fixture
def host_world(tmp_path):
    """A host folder no arm may reach, and an abstract socket of the host listening."""
    outside = tmp_path / "host-folder"
    outside.mkdir()
    (outside / "secret").write_text("host data")
    name = "\0triage-h3-" + uuid.uuid4().hex
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(name)
    server.listen(5)
    yield outside, name
    server.close()


def _probe_script(tmp_path: Path, outside: Path, abstract: str) -> Path:
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(outside=str(outside), abstract=abstract))
    return script


def _results(stdout: str) -> dict[str, str]:
    lines = [line for line in stdout.splitlines() if line.startswith("PROBE ")]
    assert len(lines) == 1, stdout[-3000:]
    return json.loads(lines[0][len("PROBE "):])


def _check(got: dict[str, str], outside: Path, cache: Path, process_sandbox: bool = False) -> None:
    """What the probe got through, and what the host shows: the folder outside untouched, the
    compile cache's own folder holding what triage made there only (inside the jail, the
    path may exist in the arm's own /tmp, where writing it is harmless)."""
    refuse = list(MUST_REFUSE)
    if process_sandbox:
        # No mount namespace: PID 1 is the host's init (its memory and cwd already out of
        # reach of an unprivileged user, and denied by Landlock to root), /dev is the host's.
        refuse = [name for name in refuse if name != "replace the compile cache"]
    if os.uname().machine == "x86_64" and confine.available().seccomp:
        refuse += X86_ONLY
    got_through = {name: got.get(name) for name in refuse if not str(got.get(name)).startswith("refused")}
    assert not got_through, json.dumps(got)
    assert all(got.get(name) == "ok" for name in MUST_ALLOW), json.dumps(got)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    for holder in (cache / "compile").iterdir():
        assert sorted(p.name for p in holder.iterdir()) <= ["default", "inductor"], list(holder.iterdir())


@pytest.mark.slow
def test_a_forked_arm_reaches_nothing_outside_its_scratch(tmp_path, host_world):
    _needs_namespaces()
    outside, abstract = host_world
    code, report, _, output = run_triage(_probe_script(tmp_path, outside, abstract), "cpu,cpu/threads=2",
                                         tmp_path, *ARMS_ONLY, env={"TRIAGE_CACHE_DIR": str(tmp_path / "cache")})
    assert report is not None, output
    for arm in report["arms"]:
        assert arm["status"] == "ok", (arm["failure"], arm["stderr"][-2000:])
        _check(_results(arm["stdout"]), outside, tmp_path / "cache")
    # The report names what held.
    assert "Landlock" in report["isolation"]["detail"] or not confine.landlock_abi()


@pytest.mark.slow
def test_a_spawned_arm_reaches_nothing_outside_its_scratch(tmp_path, host_world):
    """No fork server running: the worker is spawned in bubblewrap."""
    _needs_namespaces()
    outside, abstract = host_world
    script = _probe_script(tmp_path, outside, abstract)
    repro = Repro(path=str(script), name=script.name, source=script.read_text())
    options = RunSettings(reference=False, export_graphs=False, cache_dir=str(tmp_path / "cache"))
    run = run_arm(repro, parse_arm("cpu"), options, 4 * GiB)
    assert run.status == "ok", (run.failure, run.stderr[-2000:])
    _check(_results(run.stdout), outside, tmp_path / "cache")


@pytest.mark.slow
def test_in_the_process_sandbox_the_kernel_confines_the_arm(tmp_path, host_world):
    """Without namespaces, Landlock and seccomp alone: no write or read outside the scratch,
    no TCP, no signal or abstract socket outside the arm, no ptrace."""
    _needs_landlock()
    outside, abstract = host_world
    listener = socket.create_server(("127.0.0.1", 0))
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(outside=str(outside), abstract=abstract).replace(
        'print("PROBE "', textwrap.dedent(f"""\
            def tcp():
                socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), timeout=2).close()
            attempt("TCP to the host", tcp)
            attempt("signal the host", lambda: os.kill({os.getpid()}, 0))
            attempt("the host's environment", lambda: open("/proc/{os.getpid()}/environ", "rb").read())
            print("PROBE \"""")))
    try:
        code, report, _, output = run_triage(script, "cpu", tmp_path, *ARMS_ONLY, "--isolation", "process",
                                             env={"TRIAGE_CACHE_DIR": str(tmp_path / "cache")})
    finally:
        listener.close()
    assert report is not None, output
    arm = report["arms"][0]
    assert arm["status"] == "ok", (arm["failure"], arm["stderr"][-2000:])
    got = _results(arm["stdout"])
    _check(got, outside, tmp_path / "cache", process_sandbox=True)
    extra = ["the host's environment"] + (["TCP to the host"] if confine.landlock_abi() >= 4 else []) \
        + (["signal the host"] if confine.landlock_abi() >= 6 else [])
    assert all(got[name].startswith("refused") for name in extra), json.dumps(got)
    assert "Landlock" in report["isolation"]["detail"]


# -- limits the kernel holds --------------------------------------------------------------------

def _needs_cgroup(what: str) -> None:
    support = cgroups.support()
    if not getattr(support, what):
        pytest.skip(f"no cgroup holds {what} here ({support.detail}): polled instead, which cannot see "
                    "memory no process maps")


UNMAPPED_MEMORY = textwrap.dedent("""\
    import ctypes, os, torch
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.memfd_create("ballast")
    chunk = b"x" * (64 << 20)
    for _ in range(24):  # 1.5 GiB in a memfd no process maps
        os.write(fd, chunk)
    shm = libc.shmget(0, ctypes.c_size_t(256 << 20), 0o1600)  # IPC_PRIVATE, IPC_CREAT
    print("HELD", shm)
    print(torch.ones(2))
""")


@pytest.mark.slow
def test_memory_no_process_maps_counts_against_the_limit(tmp_path):
    _needs_cgroup("memory")
    script = tmp_path / "memfd.py"
    script.write_text(UNMAPPED_MEMORY)
    code, report, _, output = run_triage(script, "cpu", tmp_path, *ARMS_ONLY, "--memory", "1G")
    assert report is not None, output
    arm = report["arms"][0]
    assert arm["status"] == "crashed" and "memory" in arm["failure"], (arm["status"], arm["failure"])


SHARED_POOL = textwrap.dedent("""\
    import os, time
    import numpy as np
    # 600 MiB, touched, then read by 4 forks (numpy: neither triage's observer, which would
    # keep a copy of a torch tensor, nor OpenMP's pool, which does not survive a fork).
    shared = np.ones(600 << 20, dtype=np.uint8)
    children = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            total = int(shared[:: 1 << 12].sum())  # maps every page of it
            time.sleep(1.5)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    print("POOL DONE", int(shared[::4096].sum()))
""")


@pytest.mark.slow
def test_a_fork_pool_sharing_one_tensor_is_not_over_the_limit(tmp_path):
    """Five processes map the same 600 MiB: 3 GiB of resident pages, 0.6 GiB of memory."""
    script = tmp_path / "pool.py"
    script.write_text(SHARED_POOL)
    code, report, _, output = run_triage(script, "cpu", tmp_path, *ARMS_ONLY, "--memory", "2G", "--timeout", "60")
    assert report is not None, output
    arm = report["arms"][0]
    assert arm["status"] == "ok", (arm["failure"], arm["stdout"][-500:])
    assert "POOL DONE" in arm["stdout"]


THREAD_BOMB = textwrap.dedent("""\
    import threading, time, torch
    stop = threading.Event()
    started = 0
    try:
        for _ in range(2000):
            threading.Thread(target=stop.wait, daemon=True).start()
            started += 1
    except RuntimeError as e:
        print("REFUSED", started, e)
    time.sleep(2)  # a poll sees them all
    print("THREADS", started)
    stop.set()
""")


@pytest.mark.slow
def test_threads_count_against_the_task_ceiling(tmp_path):
    script = tmp_path / "threads.py"
    script.write_text(THREAD_BOMB)
    code, report, _, output = run_triage(script, "cpu", tmp_path, *ARMS_ONLY)
    assert report is not None, output
    arm = report["arms"][0]
    assert arm["status"] == "crashed" and "threads" in arm["failure"], (arm["status"], arm["failure"],
                                                                      arm["stdout"][-300:])


def test_a_flood_of_empty_files_is_named_as_files_not_bytes(tmp_path):
    """Counted as entries, not bytes, and the arm's failure says files (it said "8 GiB")."""
    for i in range(50):
        (tmp_path / f"f{i}").touch()
    used, entries = disk_usage_and_entries([str(tmp_path)], 1 << 30)
    assert entries == 50 and used < 1 << 20
    outcome = ProcessOutcome(exit_code=None, signal="SIGKILL", timed_out=False, memory_exceeded=False,
                             elapsed_s=1.0, stdout="", stderr="", output_dropped=0, messages=[],
                             peak_rss_bytes=0, limit_exceeded="files")
    run = _arm_run(parse_arm("cpu"), outcome, tmp_path, RunSettings(), 4 * GiB)
    assert run.status == "crashed"
    assert f"{MAX_DISK_ENTRIES:,} files" in run.failure and "GiB" not in run.failure, run.failure


@pytest.mark.parametrize("idle_s", [0.0, 280.0])
def test_a_timeout_says_whether_the_script_was_waiting_or_computing(tmp_path, idle_s):
    """A forked pool whose workers use the OpenMP threads of their parent deadlocks (hostile
    case 051, on torch 2.13 with GNU OpenMP): "raise it with --timeout" would send the reporter
    after a limit that ends nothing, so an arm asleep for most of its run says so."""
    outcome = ProcessOutcome(exit_code=None, signal="SIGKILL", timed_out=True, memory_exceeded=False,
                             elapsed_s=300.0, stdout="", stderr="", output_dropped=0, messages=[],
                             peak_rss_bytes=0, idle_s=idle_s)
    run = _arm_run(parse_arm("cpu"), outcome, tmp_path, RunSettings(timeout_s=300), 4 * GiB)
    assert run.status == "timeout"
    if idle_s:
        assert "under 2% of a core for the last 280 s" in run.failure and "raise it" not in run.failure, run.failure
    else:
        assert run.failure.endswith("(raise it with --timeout)"), run.failure


# -- the compile cache ---------------------------------------------------------------------------

@pytest.mark.parametrize("left", ["link to a host folder", "dangling link", "file"])
def test_what_a_script_left_in_place_of_a_mounted_folder_is_replaced(tmp_path, left):
    cache_dir = tmp_path / "cache"
    compiled = caches.compile_cache("print(1)\n", str(cache_dir))
    host = tmp_path / "host"
    host.mkdir()
    default = Path(compiled).parent / "default"
    if default.exists():
        default.rmdir()
    if left == "link to a host folder":
        default.symlink_to(host)
    elif left == "dangling link":
        default.symlink_to(tmp_path / "nowhere")
    else:
        default.write_text("x")
    (mounted,) = caches.inductor_default_dir({"USER": "someone"}, compiled).values()
    assert mounted == str(default) and default.is_dir() and not default.is_symlink()
    assert host_directory(mounted) == os.path.realpath(mounted)
    assert list(host.iterdir()) == []


def test_no_mounted_folder_lies_inside_one_an_arm_can_write(tmp_path):
    """An arm writes TORCHINDUCTOR_CACHE_DIR and inductor's default folder: neither holds the
    other, and their common parent is not writable by any arm."""
    compiled = caches.compile_cache("print(2)\n", str(tmp_path / "cache"))
    (default,) = caches.inductor_default_dir({"USER": "someone"}, compiled).values()
    assert os.path.dirname(compiled) == os.path.dirname(default)
    assert not default.startswith(compiled + "/") and not compiled.startswith(default + "/")


def test_a_link_is_never_given_to_the_mount(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OSError, match="not a directory"):
        host_directory(str(tmp_path / "link"))
    # A link above the folder (a HOME behind a link) is resolved, not refused.
    (real / "sub").mkdir()
    assert host_directory(str(tmp_path / "link" / "sub")) == str(real / "sub")


def test_two_runs_of_one_script_may_make_its_compile_cache_at_once(tmp_path, monkeypatch):
    """Two triage runs of the same script (two CI workers, two sweeps) make the same folders:
    each time another run makes the folder between our look and our mkdir."""
    real_mkdir = os.mkdir

    def another_run_first(path, mode=0o777):
        real_mkdir(path, mode)
        real_mkdir(path, mode)

    monkeypatch.setattr(caches.os, "mkdir", another_run_first)
    compiled = caches.compile_cache("print(5)\n", str(tmp_path / "cache"))
    (default,) = caches.inductor_default_dir({"USER": "someone"}, compiled).values()
    monkeypatch.undo()
    assert os.path.isdir(compiled) and os.path.isdir(default)
    assert compiled == caches.compile_cache("print(5)\n", str(tmp_path / "cache"))


def test_a_compile_cache_past_its_bound_does_not_outlive_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(caches, "COMPILE_CACHE_SCRIPT_BYTES", 1 << 20)
    compiled = caches.compile_cache("print(3)\n", str(tmp_path / "cache"))
    with open(os.path.join(compiled, "ballast"), "wb") as f:
        f.write(os.urandom(2 << 20))
    caches.trim_compile_cache(compiled)
    assert not os.path.exists(os.path.dirname(compiled))
    small = caches.compile_cache("print(4)\n", str(tmp_path / "cache"))
    Path(small, "kernel.so").write_bytes(b"x" * 1000)
    caches.trim_compile_cache(small)
    assert Path(small, "kernel.so").exists()


def test_all_compile_caches_together_are_bounded_oldest_first(tmp_path, monkeypatch):
    monkeypatch.setattr(caches, "COMPILE_CACHE_TOTAL_BYTES", 3 << 20)
    made = []
    for i in range(4):
        compiled = caches.compile_cache(f"print({i})\n", str(tmp_path / "cache"))
        Path(compiled, "ballast").write_bytes(os.urandom(1 << 20))
        stamp = time.time() - 3600 + 60 * i  # within the age limit: only the size bound removes one
        os.utime(os.path.dirname(compiled), (stamp, stamp))
        made.append(os.path.dirname(compiled))
    caches.compile_cache("print('new')\n", str(tmp_path / "cache"))
    left = [os.path.exists(p) for p in made]
    assert left[0] is False and left[-1] is True, left


def test_the_fork_server_warms_up_in_a_cache_of_its_own(tmp_path, monkeypatch):
    """Inductor's vector-ISA probe libraries are built and dlopened while the zygote warms up:
    never from the run's compile cache (an arm's to write)."""
    from triage.worker import zygote

    seen = {}
    monkeypatch.setenv("HOME", str(tmp_path / "zygote-home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "run-compile-cache"))
    monkeypatch.setattr(zygote, "LEVELS", {"torch": ("json",)})
    monkeypatch.setattr(zygote, "WARM", {"torch": (("os", "getcwd"),)})
    monkeypatch.setattr(os, "getcwd", lambda: seen.setdefault("cache", os.environ["TORCHINDUCTOR_CACHE_DIR"]))
    server = zygote.Zygote.__new__(zygote.Zygote)
    server.levels, server.loaded = ["torch"], []
    server._send = lambda message: None
    list(server._steps())
    assert seen["cache"] == str(tmp_path / "zygote-home" / "inductor-warm-up")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "run-compile-cache")


def test_confinement_is_possible_in_every_job_here_or_the_report_says_what_is_missing():
    detail = isolation().detail
    held = confine.available()
    if held.filesystem:
        assert f"Landlock ABI {held.landlock_abi}" in detail
    else:
        assert "without Landlock" in detail
    assert ("seccomp" in detail) if held.seccomp else ("no seccomp" in detail)
    support = cgroups.support()
    assert (support.summary() in detail) if support.kind != "none" else ("polled" in detail)
    assert "/sys/fs/cgroup" not in detail  # no path of this machine in a public report


def test_the_warm_up_cache_is_copied_as_plain_files_only(tmp_path):
    """The fork server's probe libraries are kept between runs by copying, never by mounting:
    links (to a host file) and anything but regular files are left behind."""
    source, target = tmp_path / "zygote-home", tmp_path / "kept"
    (source / "ab").mkdir(parents=True)
    (source / "ab" / "probe.so").write_bytes(b"\x7fELF")
    (source / "ab" / "link.so").symlink_to("/etc/passwd")
    (source / "linked-folder").symlink_to(tmp_path)
    os.mkfifo(source / "fifo")
    target.mkdir()
    (target / "ab").mkdir()
    (target / "ab" / "probe.so").write_bytes(b"kept")  # already there: not replaced
    caches.copy_plain_tree(str(source), str(target))
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == ["ab", "ab/probe.so"]
    assert (target / "ab" / "probe.so").read_bytes() == b"kept"
    caches.copy_plain_tree(str(source), str(tmp_path / "fresh"))
    assert (tmp_path / "fresh" / "ab" / "probe.so").read_bytes() == b"\x7fELF"


def test_two_runs_of_one_script_at_once_compile_in_two_caches(tmp_path):
    """A second triage run of a script whose compile cache another run holds compiles in a
    private cache, removed at its end (one run loaded a kernel library the other was writing:
    "file too short"); once the first lets go, the next run takes the shared one again."""
    first = caches.claim_compile_cache("print(6)\n", str(tmp_path / "cache"))
    second = caches.claim_compile_cache("print(6)\n", str(tmp_path / "cache"))
    assert second != first and os.path.isdir(second)
    caches.release_compile_cache(second)
    assert not os.path.exists(os.path.dirname(second))
    caches.release_compile_cache(first)
    assert os.path.isdir(first)  # kept for later runs of the script
    assert caches.claim_compile_cache("print(6)\n", str(tmp_path / "cache")) == first
    caches.release_compile_cache(first)


def test_a_pruned_compile_cache_takes_its_lock_file_with_it(tmp_path):
    """Each script's compile cache has a lock file (`claim_compile_cache`); pruning the cache
    left it, one file per script ever compiled, forever. A pruned cache's lock goes too,
    unless a run holds it; a claim checks that the file it locked is still the one named."""
    root = tmp_path / "cache"
    old = caches.claim_compile_cache("print(8)\n", str(root))
    caches.release_compile_cache(old)
    held = caches.claim_compile_cache("print(9)\n", str(root))
    locks = root / "compile-locks"
    assert sorted(p.stem for p in locks.iterdir()) == sorted(Path(c).parent.name for c in (old, held))
    long_ago = time.time() - caches.COMPILE_CACHE_TTL_S - 60
    os.utime(Path(old).parent, (long_ago, long_ago))
    shutil.rmtree(Path(held).parent)  # pruned while a run holds its claim (past the size bound)
    fresh = caches.claim_compile_cache("print(10)\n", str(root))
    assert not Path(old).parent.exists()
    assert sorted(p.stem for p in locks.iterdir()) == sorted(Path(c).parent.name for c in (held, fresh))
    for claim in (held, fresh):
        caches.release_compile_cache(claim)
    assert caches.claim_compile_cache("print(8)\n", str(root)) == old  # made again, with a lock of its own
    assert (locks / (Path(old).parent.name + ".lock")).exists()
    caches.release_compile_cache(old)


def test_a_kernel_library_cut_short_in_the_cache_is_compiled_again(tmp_path):
    """A run killed while its compiler wrote a `.so` leaves it empty, and every later run of
    the script loaded it and crashed its compile arm ("file too short"): the run that claims
    the cache removes such libraries and keeps whole ones."""
    import glob

    import numpy

    first = caches.claim_compile_cache("print(7)\n", str(tmp_path / "cache"))
    caches.release_compile_cache(first)
    whole = Path(sorted(glob.glob(numpy.__path__[0] + "/**/*.so", recursive=True))[0])
    Path(first, "ae").mkdir()
    Path(first, "ae", "whole.main.so").write_bytes(whole.read_bytes())
    Path(first, "ae", "cut.main.so").write_bytes(b"")
    Path(first, "ae", "half.main.so").write_bytes(whole.read_bytes()[:200])
    assert caches.claim_compile_cache("print(7)\n", str(tmp_path / "cache")) == first
    assert sorted(p.name for p in Path(first, "ae").iterdir()) == ["whole.main.so"]
    caches.release_compile_cache(first)
