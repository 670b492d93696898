"""A cgroup per job: the kernel's own account of what a job's processes hold.

Polling the process tree's summed RSS and process count (process.py) gets three things wrong
that the kernel gets right:

- pages in a memfd, SysV shared memory or a tmpfs file (/dev/shm) are in no process's RSS
  once unmapped, so a job held 4 GiB under a 1 GiB limit.  A memory cgroup charges shmem,
  tmpfs and memfd pages to the group whose process first faulted them in (a tmpfs file
  stays charged after its writer exits, until it is deleted);
- RSS counts a copy-on-write page once per process that maps it: a fork pool sharing 1.1 GiB
  was "killed for 3 GiB".  A memory cgroup charges each page once;
- a process count misses threads: 4,000 threads passed a 512-process cap.  The pids
  controller counts tasks, i.e. threads, and makes clone() fail past pids.max.

So each job gets a group with `memory` and `pids` limits, and the kernel enforces them: past
the memory limit its OOM killer kills a process of the job (and only of the job); past the
task limit fork/clone fail with EAGAIN (Python: "can't start new thread").

Where: always below the cgroup this process is in (/proc/self/cgroup), never a hierarchy's
root, so whatever limits the machine puts on us still apply above the job's.

- cgroup v1 (one hierarchy per controller, as on the firecracker VMs triage's CI runs on):
  `<memory hierarchy>/<our memory cgroup>/triage-<pid>-<n>-<name>` and the same under the
  pids hierarchy.  v1 has no rule against a group holding both processes and children.
  Where only one of the two controllers is mounted, that one is used (Support.detail says so).
- cgroup v2 (one unified hierarchy, as on GitHub's runners): a cgroup that holds processes
  cannot hand memory/pids to child groups (the "no internal processes" rule), and we are a
  process in ours.  `<our cgroup>/triage-jobs/triage-<pid>-<n>-<name>` works only where our
  cgroup may enable the controllers for its children, i.e. where it is the hierarchy's root
  or the subtree was delegated and the write is allowed; where the kernel refuses (EBUSY:
  our cgroup holds processes; EACCES/EPERM: not delegated to us; EROFS: read-only mount),
  there is no cgroup and Support.detail says why.  triage does not move itself elsewhere
  or ask systemd for a scope: which cgroup triage runs in is the operator's choice.

`support()` probes once, by creating a real group, setting its limits, running a process in
it and removing it again; `JobCgroup.create` returns None where that failed.  No method
raises for an ordinary failure (a group that vanished, a refused write, a process that
already exited): readers return 0 or None, actions do nothing.
"""
from __future__ import annotations

import errno
import itertools
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

CONTROLLERS = ("memory", "pids")
KILL_WAIT_S = 2.0  # kill(): how long to keep killing what a fork left behind
RMDIR_WAIT_S = 1.0  # remove(): a group is busy until its last task has left it
_JOBS_DIR = "triage-jobs"  # v2: the group holding every job group (it must hold no process)
_PREFIX = "triage-"
_STALE = re.compile(r"^triage-(\d+)-")

# Moves the shell into every cgroup.procs named by its arguments, then execs the command:
# the paths and argv come as arguments, never inside the script.  "0" written to
# cgroup.procs means the writer itself (both versions); `echo` is the shell's builtin, so the
# shell is the writer.  126: the command could not be run (as when it is not executable).
_WRAPPER = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo 0 > "$1" || exit 126; shift; n=$((n - 1)); done; '
            'exec "$@"')


@dataclass(frozen=True)
class Support:
    kind: str  # "v2", "v1" or "none"
    detail: str  # one line for the log: what enforces memory/tasks, or why no cgroup could be had
    memory: bool = False  # a job's memory is held by memory.max / limit_in_bytes
    tasks: bool = False  # a job's tasks by pids.max

    def summary(self) -> str:
        """One line for the report, without this machine's paths."""
        if self.kind == "none":
            return "no cgroup"
        held = [name for name, on in (("memory", self.memory), ("tasks", self.tasks)) if on]
        return f"{' and '.join(held)} held by a cgroup ({self.kind})"


@dataclass(frozen=True)
class _Layout:
    """Where job groups go: the parent directory of each controller's group (v2: one)."""
    kind: str  # "v1" or "v2"
    memory: str | None  # parent directory whose children get the memory controller
    pids: str | None  # likewise for pids


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _own_dir(mount_root: str, mountpoint: str, path: str) -> str | None:
    """Our cgroup's directory through this mount, or None where the mount shows only a
    subtree without it (a container's bind mount of some other group)."""
    root = mount_root.rstrip("/")
    if path != mount_root and not path.startswith(root + "/"):
        return None
    return os.path.join(mountpoint, path[len(root):].lstrip("/")).rstrip("/") or "/"


def hierarchies(mountinfo: str, proc_cgroup: str) -> tuple[str | None, dict[str, str]]:
    """(our cgroup's directory in the cgroup2 hierarchy or None, {v1 controller: our cgroup's
    directory in its hierarchy} for memory and pids), from /proc/self/mountinfo and
    /proc/self/cgroup.  Pure: the caller reads the files."""
    paths: dict[str, str] = {}  # "" (v2) or controller name -> our path in that hierarchy
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                paths[ctrl] = parts[2]
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, mountpoint = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2" and v2 is None and "" in paths:
            v2 = _own_dir(root, mountpoint, paths[""])
        elif tail[0] == "cgroup":
            for ctrl in set(tail[2].split(",")) & set(CONTROLLERS) & set(paths):
                own = _own_dir(root, mountpoint, paths[ctrl])
                if own is not None:
                    v1.setdefault(ctrl, own)
    return v2, v1


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, text: str) -> None:
    """Raises OSError; callers that must not raise catch it."""
    # Mode "w": on cgroupfs a missing file cannot be created, so this fails like O_WRONLY would.
    with open(path, "w") as f:
        f.write(text)


def _field(text: str | None, key: str) -> int:
    """The number after `key` in a "key value" per line file (memory.events, pids.events)."""
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


def _int(text: str | None) -> int:
    try:
        return int((text or "").strip())
    except ValueError:
        return 0


def _why(err: OSError) -> str:
    return errno.errorcode.get(err.errno or 0, "error") + f" ({err.strerror or err})"


def _v2_layout(own: str) -> tuple[_Layout | None, str]:
    """Enable memory and pids for `<own>/triage-jobs`'s children; (layout, "") or (None, why)."""
    available = (_read(os.path.join(own, "cgroup.controllers")) or "").split()
    wanted = [c for c in CONTROLLERS if c in available]
    if not wanted:
        return None, (f"cgroup v2: neither memory nor pids is available to {own} "
                      f"(cgroup.controllers: {' '.join(available) or 'empty'}): not delegated to this cgroup")
    enable = " ".join("+" + c for c in wanted)
    jobs = os.path.join(own, _JOBS_DIR)
    step = f"enabling {enable} in {own}/cgroup.subtree_control"
    try:
        if set(wanted) - set((_read(os.path.join(own, "cgroup.subtree_control")) or "").split()):
            _write(os.path.join(own, "cgroup.subtree_control"), enable)
        step = f"creating {jobs}"
        os.makedirs(jobs, exist_ok=True)
        step = f"enabling {enable} in {jobs}/cgroup.subtree_control"
        _write(os.path.join(jobs, "cgroup.subtree_control"), enable)
    except OSError as e:
        hint = {errno.EBUSY: ": the cgroup holds processes (v2's no-internal-processes rule); run triage "
                             "in a cgroup of its own whose subtree is delegated to it",
                errno.EACCES: ": the subtree is not delegated to this user",
                errno.EPERM: ": the subtree is not delegated to this user",
                errno.EROFS: ": the cgroup filesystem is mounted read-only"}.get(e.errno or 0, "")
        return None, f"cgroup v2: {step} failed, {_why(e)}{hint}"
    return _Layout("v2", jobs if "memory" in wanted else None, jobs if "pids" in wanted else None), ""


def _layout(mountinfo: str, proc_cgroup: str) -> tuple[_Layout | None, str]:
    v2, v1 = hierarchies(mountinfo, proc_cgroup)
    # A controller is bound to one hierarchy only: where v1 has memory or pids, v2 has neither
    # (a hybrid machine's /sys/fs/cgroup/unified holds none of them).
    if v1:
        return _Layout("v1", v1.get("memory"), v1.get("pids")), ""
    if v2 is not None:
        return _v2_layout(v2)
    return None, "no cgroup hierarchy with the memory or pids controller is mounted where this process can see it"


_SEQ = itertools.count()


class JobCgroup:
    """One job's cgroup (v1: one group per controller hierarchy).  Create with `create`;
    start the job through `wrap` (or `add` a running process); `remove` when done."""

    def __init__(self, layout: _Layout, memory_dir: str | None, pids_dir: str | None) -> None:
        self.kind = layout.kind
        self._memory, self._pids = memory_dir, pids_dir
        self.dirs: tuple[str, ...] = tuple(dict.fromkeys(d for d in (memory_dir, pids_dir) if d))
        self.procs_files: tuple[str, ...] = tuple(os.path.join(d, "cgroup.procs") for d in self.dirs)
        self._peak_seen = 0

    @classmethod
    def create(cls, name: str, *, memory_bytes: int, max_tasks: int) -> JobCgroup | None:
        """A new group with these limits, or None where this machine gives none (see support())
        or creating this one failed."""
        layout = _probe()[1]
        return None if layout is None else cls._create(layout, name, memory_bytes, max_tasks)[0]

    @classmethod
    def _create(cls, layout: _Layout, name: str, memory_bytes: int, max_tasks: int) -> tuple[JobCgroup | None, str]:
        """(group, "") or (None, why)."""
        base = f"{_PREFIX}{os.getpid()}-{next(_SEQ)}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:64]}"
        group = cls(layout, layout.memory and os.path.join(layout.memory, base),
                    layout.pids and os.path.join(layout.pids, base))
        made: list[str] = []
        try:
            for d in group.dirs:
                os.mkdir(d)
                made.append(d)
            group._limit(memory_bytes, max_tasks)
        except OSError as e:
            for d in made:
                _rmdir(d)
            return None, f"cgroup {layout.kind}: setting up {e.filename or base} failed, {_why(e)}"
        return group, ""

    def _limit(self, memory_bytes: int, max_tasks: int) -> None:
        if self._memory:
            if self.kind == "v2":
                _write(os.path.join(self._memory, "memory.max"), str(memory_bytes))
                # Swap would let a job hold more than the limit; absent where swap accounting is off.
                if os.path.exists(swap := os.path.join(self._memory, "memory.swap.max")):
                    _write(swap, "0")
            else:
                # memsw (memory + swap) may not be below limit_in_bytes: set that first.
                _write(os.path.join(self._memory, "memory.limit_in_bytes"), str(memory_bytes))
                if os.path.exists(memsw := os.path.join(self._memory, "memory.memsw.limit_in_bytes")):
                    _write(memsw, str(memory_bytes))
        if self._pids:
            _write(os.path.join(self._pids, "pids.max"), str(max_tasks))

    def wrap(self, argv: list[str]) -> list[str]:
        """An argv that moves itself into this group, then execs `argv`: the job and all it
        forks are charged from its first instruction.  Exit status 126 where the move failed
        (the group vanished): the job never ran outside its group."""
        return ["/bin/sh", "-c", _WRAPPER, "sh", str(len(self.procs_files)), *self.procs_files, *argv]

    def add(self, pid: int) -> None:
        """Move a running process (all its threads) into this group; what it allocated before
        stays charged where it was.  Nothing happens where it exited or the group is gone."""
        for path in self.procs_files:
            try:
                _write(path, str(pid))
            except OSError:
                pass

    def holds_memory_of(self, pids: list[int]) -> bool:
        """Whether every one of `pids` is in the group's memory controller, so the kernel holds
        their memory to its limit (a process that left the group, or a zombie, is not)."""
        if not self._memory:
            return False
        return _procs(os.path.join(self._memory, "cgroup.procs")).issuperset(pids)

    def memory_bytes(self) -> int:
        """Memory charged to the group now (0 without a memory controller)."""
        if not self._memory:
            return 0
        name = "memory.current" if self.kind == "v2" else "memory.usage_in_bytes"
        now = _int(_read(os.path.join(self._memory, name)))
        self._peak_seen = max(self._peak_seen, now)
        return now

    def peak_memory_bytes(self) -> int:
        """The most the group was charged: the kernel's high-water mark (v2 memory.peak, from
        Linux 5.19; v1 memory.max_usage_in_bytes), else the most `memory_bytes` saw."""
        if not self._memory:
            return 0
        name = "memory.peak" if self.kind == "v2" else "memory.max_usage_in_bytes"
        return max(_int(_read(os.path.join(self._memory, name))), self.memory_bytes())

    def tasks(self) -> int:
        """Tasks (threads) in the group now: pids.current (which counts exited tasks until
        they are reaped), else the lines of its thread list."""
        if self._pids:
            return _int(_read(os.path.join(self._pids, "pids.current")))
        threads = "cgroup.threads" if self.kind == "v2" else "tasks"
        return len((_read(os.path.join(self.dirs[0], threads)) or "").split()) if self.dirs else 0

    def limit_hit(self) -> str | None:
        """"memory" where the kernel's OOM killer killed a process of this group, "tasks" where
        a fork or thread was refused at pids.max, else None; memory first, as the graver.

        Only an OOM kill counts for memory.  Reaching the limit is not itself a failure: the
        kernel reclaims page cache there and the job goes on, and v1's memory.failcnt (v2's
        memory.events "max") counts such harmless hits as well; nor is failcnt reliable: on
        Linux 6.18 (the VM this was written on) memory.failcnt and memory.memsw.failcnt both
        stayed 0 through an OOM kill.  v1 has oom_kill in memory.oom_control from Linux 4.13;
        on older kernels this reports no memory hit, and the job's SIGKILL is what shows."""
        if self._memory:
            name = "memory.events" if self.kind == "v2" else "memory.oom_control"
            if _field(_read(os.path.join(self._memory, name)), "oom_kill") > 0:
                return "memory"
        if self._pids and _field(_read(os.path.join(self._pids, "pids.events")), "max") > 0:
            return "tasks"
        return None

    def pids(self) -> set[int]:
        """The processes in the group now (exited ones that wait to be reaped are not listed)."""
        return set().union(*(_procs(path) for path in self.procs_files))

    def kill(self) -> None:
        """SIGKILL every process in the group and wait, at most KILL_WAIT_S, until it is empty.

        v2's cgroup.kill (Linux 5.14) kills the whole group at once, forks in flight included.
        Otherwise each listed pid is killed, over and over until none is left: a process that
        forks meanwhile puts its child in the group too, where the next round finds it.  (Only
        a process that exits and is reaped between the listing and the kill could leave its pid
        to another process in that instant; v1 offers no atomic kill.)"""
        if self.kind == "v2" and self.dirs and os.path.exists(kill := os.path.join(self.dirs[0], "cgroup.kill")):
            try:
                _write(kill, "1")
            except OSError:
                pass
        deadline = time.monotonic() + KILL_WAIT_S
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:  # exited meanwhile
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill what is in the group, then remove it (retrying while the dying leave it)."""
        self.kill()
        for d in self.dirs:
            _rmdir(d)

    def __enter__(self) -> JobCgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _procs(path: str) -> set[int]:
    """The pids a `cgroup.procs` file lists; never 0 (os.kill(0, …) would signal triage's own
    process group)."""
    return {int(p) for p in (_read(path) or "").split() if p.isdigit() and int(p) > 0}


def _rmdir(path: str) -> bool:
    """Remove a cgroup directory; True once it is gone.  EBUSY while tasks are still leaving."""
    deadline = time.monotonic() + RMDIR_WAIT_S
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        pass
    return True


def _prune(layout: _Layout) -> int:
    removed = 0
    for parent in dict.fromkeys(d for d in (layout.memory, layout.pids) if d):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            m = _STALE.match(name)
            path = os.path.join(parent, name)
            # Only empty groups: processes left in one belong to whoever still runs them.
            if m and not _alive(int(m[1])) and not (_read(os.path.join(path, "cgroup.procs")) or "").split():
                removed += _rmdir(path)
    return removed


def prune_stale() -> int:
    """Remove the empty job groups left by triage processes that died before removing them
    (their creator's pid, in the name, is no longer alive); the number removed."""
    layout = _probe()[1]
    return 0 if layout is None else _prune(layout)


def _try(layout: _Layout) -> str:
    """Create a group, run a process in it, remove it: "" where all worked, else why not."""
    group, why = JobCgroup._create(layout, "probe", 64 << 20, 16)
    if group is None:
        return why
    try:
        proc = subprocess.run(group.wrap(["/bin/sh", "-c", ":"]), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=10)
        why = "" if proc.returncode == 0 else (proc.stderr.decode(errors="replace").strip().splitlines()
                                               or [f"exit status {proc.returncode}"])[-1]
    except (OSError, subprocess.SubprocessError) as e:
        why = str(e)
    group.remove()
    return why and f"cgroup {layout.kind}: a process could not join {', '.join(group.dirs)}: {why}"


def _describe(layout: _Layout) -> str:
    parts = []
    if layout.memory:
        if layout.kind == "v2":
            limit = "memory.max"
        else:
            # A child group has memsw where its parent has: where swap accounting is on.
            memsw = os.path.exists(os.path.join(layout.memory, "memory.memsw.limit_in_bytes"))
            limit = "memory.limit_in_bytes" + (" and memsw" if memsw else " (no memsw: swap not capped)")
        parts.append(f"memory by {limit} (shmem, tmpfs, memfd included; shared pages once) under {layout.memory}")
    else:
        parts.append("no memory controller: memory is not capped by a cgroup")
    if layout.pids:
        parts.append(f"tasks (threads) by pids.max under {layout.pids}")
    else:
        parts.append("no pids controller: tasks are not capped by a cgroup")
    return f"cgroup {layout.kind}: " + "; ".join(parts)


_lock = threading.Lock()
_probed: tuple[Support, _Layout | None] | None = None


def probe(mountinfo: str, proc_cgroup: str) -> tuple[Support, _Layout | None]:
    """What `support()` reports, for these /proc/self/mountinfo and /proc/self/cgroup texts."""
    layout, why = _layout(mountinfo, proc_cgroup)
    if layout is not None:
        _prune(layout)
        why = _try(layout)
    if layout is None or why:
        return Support("none", why), None
    return Support(layout.kind, _describe(layout), memory=bool(layout.memory), tasks=bool(layout.pids)), layout


def _probe() -> tuple[Support, _Layout | None]:
    global _probed
    with _lock:
        if _probed is None:
            _probed = probe(_read("/proc/self/mountinfo") or "", _read("/proc/self/cgroup") or "")
        return _probed


def support() -> Support:
    """Whether jobs get a cgroup here, and which (probed once per process, with a real group)."""
    return _probe()[0]
