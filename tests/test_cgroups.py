"""triage/sandbox/cgroups.py: a job's cgroup counts what RSS polling missed (memfd and tmpfs
pages, threads) and counts shared pages once; kill() and remove() leave nothing behind.

The tests that need a real cgroup skip where `support()` gives none (a v2 machine whose
cgroup holds processes, a non-root user without a delegated subtree), saying why; on the
root VMs CI runs on (cgroup v1) they run.  Sizes stay small: other work shares the machine."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from triage.sandbox import cgroups
from triage.sandbox.cgroups import JobCgroup

MIB = 1 << 20
SUPPORT = cgroups.support()
needs_cgroup = pytest.mark.skipif(SUPPORT.kind == "none", reason=f"no cgroup for jobs here: {SUPPORT.detail}")


@pytest.fixture
def make_group():
    made: list[JobCgroup] = []

    def make(name: str = "test", *, memory_bytes: int = 1 << 30, max_tasks: int = 256) -> JobCgroup:
        group = JobCgroup.create(name, memory_bytes=memory_bytes, max_tasks=max_tasks)
        assert group is not None, SUPPORT.detail
        made.append(group)
        return group

    yield make
    for group in made:
        group.remove()


def run_in(group: JobCgroup, code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(group.wrap([sys.executable, "-c", code]), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def gone(pid: int) -> bool:
    """No such process, or only a zombie left for its parent (PID 1 here) to reap."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


MEMFD = """
import os
fd = os.memfd_create("fill")
chunk = b"x" * (1 << 20)
for _ in range({mib}):
    os.write(fd, chunk)
print("filled", flush=True)
"""

TMPFS = """
chunk = b"x" * (1 << 20)
with open({path!r}, "wb") as f:
    for _ in range({mib}):
        f.write(chunk)
        f.flush()
print("filled", flush=True)
"""

# 200 MiB of private memory, touched, then 6 forks that read every page and sleep: summed
# RSS counts those pages 7 times, the memory cgroup once.  Prints the summed RSS it saw.
SHARED = """
import mmap, os, sys, time
size = 200 << 20
m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for _ in range(200):
    m.write(b"x" * (1 << 20))
kids = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        ok = sum(m[i] for i in range(0, size, 4096)) == ord("x") * (size // 4096)
        time.sleep(1)
        os._exit(0 if ok else 1)
    kids.append(pid)
time.sleep(0.5)
def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
print(sum(rss(p) for p in [os.getpid(), *kids]), flush=True)
sys.exit(any(os.waitpid(p, 0)[1] for p in kids))
"""

THREADS = """
import threading
stop = threading.Event()
started = 0
try:
    for _ in range({n}):
        threading.Thread(target=stop.wait).start()
        started += 1
except RuntimeError as e:
    print("refused:", e, flush=True)
stop.set()
print("started", started, flush=True)
"""

# The child forks; that fork leaves its session (setsid) and forks again, then exits: the
# grandchild is an orphan in a session of its own, out of reach of killpg and of a tree walk.
# It prints its pid and the grandchild's once the middle one is reaped.
DETACHED = """
import os, time
r, w = os.pipe()
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode() + b"\\n")
        time.sleep(60)
    os._exit(0)
os.waitpid(middle, 0)  # gone, not just about to go, when the pids are printed
print(os.getpid(), os.read(r, 64).decode().strip(), flush=True)
time.sleep(60)
"""


@needs_cgroup
def test_support_names_memory_and_pids():
    assert SUPPORT.kind in ("v1", "v2")
    assert "memory" in SUPPORT.detail and "pids" in SUPPORT.detail, SUPPORT.detail
    assert cgroups.support() is SUPPORT  # probed once


@needs_cgroup
def test_wrapped_and_added_processes_are_in_the_group(make_group):
    group = make_group("../odd name$")
    name = os.path.basename(group.dirs[0])
    assert all(os.path.basename(d) == name for d in group.dirs)
    assert name.startswith(f"triage-{os.getpid()}-") and name.endswith("-.._odd_name_"), name
    out = subprocess.run(group.wrap(["cat", "/proc/self/cgroup"]), capture_output=True, text=True, check=True).stdout
    assert sum(line.endswith("/" + name) for line in out.splitlines()) == len(group.dirs), out

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        group.add(sleeper.pid)
        with open(f"/proc/{sleeper.pid}/cgroup") as f:
            assert sum(line.endswith("/" + name) for line in f.read().splitlines()) == len(group.dirs)
        assert group.pids() == {sleeper.pid}
        assert group.tasks() == 1
        # The watcher trusts the group's charge only for a tree wholly inside it.
        assert group.holds_memory_of([sleeper.pid])
        assert not group.holds_memory_of([sleeper.pid, os.getpid()])
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_cgroup
def test_memfd_past_the_limit_is_oom_killed(make_group):
    small = make_group("memfd-small", memory_bytes=128 * MIB)
    proc = run_in(small, MEMFD.format(mib=300))
    assert proc.returncode == -9 and "filled" not in proc.stdout, proc
    assert small.limit_hit() == "memory"

    large = make_group("memfd-large", memory_bytes=1 << 30)
    proc = run_in(large, MEMFD.format(mib=300))
    assert proc.returncode == 0 and "filled" in proc.stdout, proc
    assert large.limit_hit() is None
    assert large.peak_memory_bytes() >= 300 * MIB


@needs_cgroup
def test_tmpfs_file_past_the_limit_is_oom_killed(make_group, tmp_path):
    shm = "/dev/shm"
    with open("/proc/mounts") as f:
        if not any(line.split()[1:3] == [shm, "tmpfs"] for line in f):
            pytest.skip(f"{shm} is not a tmpfs here")
    path = os.path.join(shm, f"triage-test-{os.getpid()}-{tmp_path.name}")
    try:
        small = make_group("tmpfs-small", memory_bytes=128 * MIB)
        proc = run_in(small, TMPFS.format(path=path, mib=300))
        assert proc.returncode == -9 and "filled" not in proc.stdout, proc
        assert small.limit_hit() == "memory"
        os.unlink(path)  # the file outlives its writer, and its pages stay charged

        large = make_group("tmpfs-large", memory_bytes=1 << 30)
        proc = run_in(large, TMPFS.format(path=path, mib=300))
        assert proc.returncode == 0 and "filled" in proc.stdout, proc
        assert large.limit_hit() is None
        assert large.memory_bytes() >= 300 * MIB  # still charged: no process holds it, the file does
    finally:
        if os.path.exists(path):
            os.unlink(path)


@needs_cgroup
def test_shared_pages_count_once(make_group):
    group = make_group("shared", memory_bytes=400 * MIB)
    proc = run_in(group, SHARED)
    assert proc.returncode == 0, proc
    summed_rss = int(proc.stdout.split()[0])
    assert summed_rss > 1200 * MIB  # what polling RSS saw, and would have killed for
    assert group.limit_hit() is None
    assert 200 * MIB <= group.peak_memory_bytes() < 400 * MIB, group.peak_memory_bytes()


@needs_cgroup
def test_threads_count_as_tasks(make_group):
    capped = make_group("threads-capped", max_tasks=64)
    proc = run_in(capped, THREADS.format(n=300))
    assert proc.returncode == 0, proc
    assert "refused: can't start new thread" in proc.stdout, proc.stdout
    assert capped.limit_hit() == "tasks"

    roomy = make_group("threads-roomy", max_tasks=64)
    proc = run_in(roomy, THREADS.format(n=50))
    assert proc.returncode == 0 and "refused" not in proc.stdout and "started 50" in proc.stdout, proc
    assert roomy.limit_hit() is None
    assert roomy.tasks() == 0


@needs_cgroup
def test_kill_reaches_a_detached_grandchild(make_group):
    group = make_group("detached")
    proc = subprocess.Popen(group.wrap([sys.executable, "-c", DETACHED]), stdout=subprocess.PIPE, text=True)
    try:
        child, grandchild = map(int, proc.stdout.readline().split())
        assert child == proc.pid  # the wrapper exec'd the job
        assert group.pids() == {child, grandchild}
        group.kill()
        assert proc.wait(timeout=5) == -9
        assert gone(grandchild)
        # Listed no more; pids.current may still count zombies until PID 1 reaps them.
        assert group.pids() == set()
        group.remove()
        assert not any(os.path.exists(d) for d in group.dirs)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@needs_cgroup
def test_remove_kills_and_leaves_no_directory():
    group = JobCgroup.create("remove", memory_bytes=256 * MIB, max_tasks=16)
    assert group is not None
    with group:
        proc = subprocess.Popen(group.wrap(["sleep", "30"]))
        deadline = time.monotonic() + 5
        while group.pids() != {proc.pid} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(os.path.isdir(d) for d in group.dirs)
    assert proc.wait(timeout=5) == -9
    assert not any(os.path.exists(d) for d in group.dirs)
    group.remove()  # again, on a vanished group: nothing, no error
    assert group.memory_bytes() == 0 and group.tasks() == 0 and group.limit_hit() is None
    group.add(os.getpid())  # into a vanished group: nothing, and we stay where we are
    assert JobCgroup.create("x", memory_bytes=-5, max_tasks=16) is None  # the kernel refuses: no group


@needs_cgroup
def test_prune_stale_removes_only_groups_of_dead_creators(make_group):
    parents = {os.path.dirname(d) for d in make_group("prune").dirs}
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = [os.path.join(p, f"triage-{dead.pid}-0-stale") for p in parents]
    alive = [os.path.join(p, f"triage-{os.getpid()}-0-alive") for p in parents]
    for d in stale + alive:
        os.mkdir(d)
    try:
        assert cgroups.prune_stale() >= len(stale)  # more where a crashed triage left some
        assert not any(os.path.exists(d) for d in stale)
        assert all(os.path.isdir(d) for d in alive)
    finally:
        for d in stale + alive:
            if os.path.exists(d):
                os.rmdir(d)


# The discovery logic, on texts as /proc/self/mountinfo and /proc/self/cgroup give them.

HYBRID_MOUNTS = """\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
32 30 0:28 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
33 30 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = "8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"


def test_hierarchies_v1_hybrid():
    v2, v1 = cgroups.hierarchies(HYBRID_MOUNTS, HYBRID_CGROUP)
    assert v2 == "/sys/fs/cgroup/unified"
    assert v1 == {"memory": "/sys/fs/cgroup/memory/process_api/abc", "pids": "/sys/fs/cgroup/pids"}


def test_hierarchies_container_views():
    # A v1 container whose mounts show only its own subtree (root /docker/x), co-mounted
    # controllers, a path with a space (escaped as \\040), and a mount that shows another subtree.
    mounts = ("40 30 0:27 /docker/x /sys/fs/cgroup/memory,pids rw - cgroup cgroup rw,memory,pids\n"
              "41 30 0:28 /other /mnt/other\\040dir rw - cgroup cgroup rw,cpu\n")
    v2, v1 = cgroups.hierarchies(mounts, "5:memory,pids:/docker/x/a b\n1:cpu:/docker/x\n")
    assert v2 is None
    assert v1 == {"memory": "/sys/fs/cgroup/memory,pids/a b", "pids": "/sys/fs/cgroup/memory,pids/a b"}
    mounts = "40 30 0:27 /docker/y /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    assert cgroups.hierarchies(mounts, "4:memory:/docker/x\n") == (None, {})


def fake_v2(tmp_path, controllers: str) -> tuple[str, str, str]:
    """A directory tree shaped like a v2 hierarchy (regular files: no kernel rules apply)."""
    own = tmp_path / "cg" / "user.slice" / "job"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text(controllers + "\n")
    (own / "cgroup.subtree_control").write_text("")
    mounts = f"50 1 0:30 / {tmp_path / 'cg'} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    return mounts, "0::/user.slice/job\n", str(own)


def test_v2_enables_controllers_for_a_jobs_group(tmp_path):
    mounts, proc_cgroup, own = fake_v2(tmp_path, "cpu io memory pids")
    jobs = os.path.join(own, "triage-jobs")
    support, layout = cgroups.probe(mounts, proc_cgroup)
    assert support.kind == "v2", support
    assert "memory.max" in support.detail and "pids.max" in support.detail and jobs in support.detail
    for d in (own, jobs):
        assert open(os.path.join(d, "cgroup.subtree_control")).read() == "+memory +pids"
    group, why = JobCgroup._create(layout, "job", 300 * MIB, 32)
    assert group is not None, why
    assert group.dirs == (os.path.join(jobs, os.path.basename(group.dirs[0])),)
    assert open(os.path.join(group.dirs[0], "memory.max")).read() == str(300 * MIB)
    assert open(os.path.join(group.dirs[0], "pids.max")).read() == "32"
    assert group.wrap(["python", "x.py"])[-2:] == ["python", "x.py"]


def test_v2_without_delegated_controllers_says_why(tmp_path):
    mounts, proc_cgroup, own = fake_v2(tmp_path, "cpu io")
    support, layout = cgroups.probe(mounts, proc_cgroup)
    assert (support.kind, layout) == ("none", None)
    assert own in support.detail and "not delegated" in support.detail
    assert not os.path.exists(os.path.join(own, "triage-jobs"))
