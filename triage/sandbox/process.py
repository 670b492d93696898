"""Starting and watching one process that runs issue code (the parent's side).

The reporter's script may crash, hang, segfault, exhaust memory or disk, fork without end,
print megabytes, or lie on the control pipe.  `SandboxedProcess` starts it inside the jail
(`jail.py`) when the machine allows, else in its own session; `run_isolated` watches it:

- one deadline that only triage sets: each phase the worker announces (script started,
  script done, …) may move it, but only once per phase, in order, and never past the sum of
  the allowances triage granted up front;
- memory and tasks: where the machine gives a cgroup (sandbox/cgroups.py), the kernel holds
  both — memory.max counts shared memory, tmpfs and memfd pages once, pids.max counts
  threads — and the sandbox is started inside it.  Without one, the whole process tree is
  polled (every descendant, whatever its process group or session): tasks (threads) are
  counted, and memory is the summed resident size, confirmed by the proportional share
  (smaps_rollup's Pss, which counts a copy-on-write page shared by a fork pool once) before
  the sandbox is killed for it (with a cgroup, the group's charge is read instead);
- the scratch directory's size and its number of files are measured: past either ceiling
  the sandbox is killed;
- the tree's CPU time is sampled: a tree killed at its deadline after using no CPU for most
  of its run was waiting (a deadlock), not computing, and its outcome says for how long;
- the control pipe is read in bounded lines; an overlong line or a flood is dropped, not kept;
- after the worker says "done", it gets a second to exit; whatever holds it then (a thread,
  an atexit handler of the script) is killed and the result is kept.

Nothing the child does makes `run_isolated` raise.
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from triage.sandbox import forkservers
from triage.sandbox import jail as jails
from triage.sandbox.cgroups import JobCgroup
from triage.sandbox.proctable import descendants, process_table

POLL_S = 0.05
DISK_POLL_S = 1.0
MAX_CONTROL_LINE = 1 << 20  # bytes; the worker's largest message (a streamed observable) is far smaller
MAX_CONTROL_BYTES = 64 << 20  # all messages of one run, kept or not
MAX_MESSAGES = 20000
# JSON values kept from the control pipe in all (as untrusted.json_values counts them): 64 MiB of `[],` in
# lines of a megabyte would otherwise be 22 million lists held in triage's own process. The
# worker's messages (phases, streamed observables) hold a few dozen each.
MAX_CONTROL_VALUES = 1_000_000
MAX_DISK_ENTRIES = 200_000
MAX_TASKS = 512  # processes and their threads, of one sandbox at once
CONFINE_ENV = "TRIAGE_CONFINE"  # the worker's rules for confining itself (sandbox/confine.py)


@dataclass
class Limits:
    timeout_s: float  # from the start until the first phase that grants more time
    memory_bytes: int
    output_bytes: int
    # (phase, seconds from its arrival), in the order the worker announces them.  A phase
    # moves the deadline once, only after the phases before it; the total is capped.
    phases: tuple[tuple[str, float], ...] = ()
    linger_s: float = 1.0  # after "done": time to exit before the rest is killed
    max_processes: int = MAX_TASKS
    disk_bytes: int = 8 << 30  # scratch directory and shared writable directories together


@dataclass
class ProcessOutcome:
    exit_code: int | None
    signal: str | None
    timed_out: bool
    memory_exceeded: bool
    elapsed_s: float
    stdout: str
    stderr: str
    output_dropped: int
    messages: list[dict[str, Any]]
    peak_rss_bytes: int
    limit_exceeded: str | None = None  # "processes", "disk" or "files": killed for that
    # Timed out: how long the process tree had used less than IDLE_CPU of one core before it
    # was killed (`idle_tail`) — asleep, waiting, not computing.
    idle_s: float = 0.0


class OutputCapture:
    """Drains a pipe, keeping the first and last `cap/2` bytes."""

    def __init__(self, stream: Any, cap: int) -> None:
        self.stream, self.half = stream, max(cap // 2, 1024)
        self.head = bytearray()
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_size = 0
        self.dropped = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
            if not chunk:
                break
            room = self.half - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail.append(chunk)
                self.tail_size += len(chunk)
                while self.tail_size - len(self.tail[0]) >= self.half:
                    self.dropped += len(self.tail[0])
                    self.tail_size -= len(self.tail[0])
                    self.tail.popleft()

    def text(self) -> str:
        self.thread.join(timeout=2)
        tail = b"".join(self.tail)
        if self.tail_size > self.half:
            cut = self.tail_size - self.half
            self.dropped += cut
            tail = tail[cut:]
        middle = f"\n[… triage dropped {self.dropped} bytes of output …]\n".encode() if self.dropped else b""
        return (bytes(self.head) + middle + tail).decode("utf-8", errors="replace")


# bubblewrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that
# started the process ends, not the process: every sandbox is started from this one thread,
# which lives as long as triage does (a pool thread that returns would kill its workers).
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="triage-spawn")


class SandboxedProcess:
    """One process running issue code: in the jail where `isolation` allows, else in a
    session of its own; forked from the run's fork server (sandbox/zygote.py) where one is
    running and isolates it alike.  `kill()` ends it and everything it started.  `imports`:
    what the process will import that a fork server may have loaded for it ("torch", or
    "compile" for dynamo and inductor as well)."""

    def __init__(self, argv: list[str], *, jail: jails.Confinement, env: dict[str, str],
                 isolation: jails.Isolation, pass_fds: tuple[int, ...] = (),
                 stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE, imports: str = "torch",
                 cgroup: JobCgroup | None = None) -> None:
        """`cgroup`: the group the process runs in from its first instruction (sandbox/cgroups.py);
        `kill()` then ends everything in it too."""
        self.cgroup = cgroup
        env = dict(env, **jail.prepare())
        if not isolation.strong:
            # No /tmp of its own outside the jail, and the host's is not writable once confined.
            env["TMPDIR"] = os.path.join(jail.scratch, "tmp")
        env[CONFINE_ENV] = json.dumps(jails.confinement_rules(argv[0] if argv else None, jail, isolation.strong))
        self.namespace_pid: int | None = None  # PID 1 of the sandbox, as the host numbers it
        self.jailed = isolation.strong
        server = forkservers.active(argv[0] if argv else None)
        self.forked = (server is not None and stdout is subprocess.PIPE and stderr is subprocess.PIPE
                       and server.isolation == isolation and server.accepts(argv, jail, env))
        if self.forked:
            self.jailed = True  # the zygote reports a signal death as 128 + signal either way
            self.proc = server.fork(argv, jail, env, pass_fds, imports, cgroup)
            return
        info_r = info_w = None
        if isolation.strong:
            info_r, info_w = os.pipe()
            argv = jails.command(argv, jail, info_w)
            pass_fds = pass_fds + (info_w,)
        if cgroup is not None:
            argv = cgroup.wrap(argv)
        self.proc = _SPAWNER.submit(subprocess.Popen, argv, cwd=jail.workdir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=stdout, stderr=stderr, start_new_session=True, pass_fds=pass_fds).result()
        if info_w is not None:
            os.close(info_w)
            threading.Thread(target=self._read_info, args=(info_r,), daemon=True).start()

    def _read_info(self, fd: int) -> None:
        # bubblewrap writes {"child-pid": N} once the namespace exists, then closes the pipe.
        with os.fdopen(fd, "rb") as f:
            try:
                self.namespace_pid = int(json.loads(f.read(4096) or b"{}").get("child-pid"))
            except (ValueError, TypeError, AttributeError):
                pass

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def exit_status(self) -> int | None:
        """The child's status as Popen reports it (negative: the signal that ended it).
        bubblewrap and the fork server pass a signal death on as status 128 + signal; it is
        turned back."""
        code = self.proc.returncode
        if self.jailed and code is not None and code > 128 and (code - 128) in signal.valid_signals():
            return -(code - 128)
        return code

    def kill(self) -> None:
        """SIGKILL the sandbox: PID 1 of its namespace (the kernel then kills every process
        in it), and the session triage started it in; a forked one: the forked child and all
        under it (its namespace's PID 1 among them); and whatever is left in its cgroup."""
        if self.cgroup is not None:
            self.cgroup.kill()
        if self.forked:
            # Once the zygote has reaped the child its pid may be another process's: no sweep
            # then.  Before that, the tree first (in process mode nothing ties the job to the
            # child: a job that outlived it would be reparented out of reach), then the child.
            if self.proc.pid is not None and not self.proc.exited.is_set():
                for pid in descendants(self.proc.pid, process_table())[0]:
                    _signal(pid)
            self.proc.cancel()
            return
        if self.namespace_pid:
            _signal(self.namespace_pid)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in descendants(self.proc.pid, process_table())[0]:
            _signal(pid)

    def tree(self) -> tuple[list[int], int, int, float]:
        """(pids, resident bytes, number of tasks — threads included, CPU seconds used) of the
        whole tree under this process."""
        if self.proc.pid is None:
            return [], 0, 0, 0.0
        table = process_table()
        pids, rss = descendants(self.proc.pid, table)
        return pids, rss, sum(table[pid].threads for pid in pids), sum(table[pid].cpu_s for pid in pids)

    def proportional_memory(self) -> int:
        """The tree's proportional set size: each shared page divided among its sharers."""
        if self.proc.pid is None:
            return 0
        total = 0
        for pid in descendants(self.proc.pid, process_table())[0]:
            try:
                with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                    total += next((int(line.split()[1]) * 1024 for line in f if line.startswith(b"Pss:")), 0)
            except (OSError, ValueError, IndexError):
                continue
        return total


def run_isolated(argv: list[str], *, jail: jails.Confinement, env: dict[str, str], limits: Limits,
                 isolation: jails.Isolation | None = None, imports: str = "torch",
                 on_message: Callable[[dict[str, Any]], None] | None = None) -> ProcessOutcome:
    """Run `argv` confined to `jail`; messages the child writes as JSON lines to fd
    TRIAGE_CONTROL_FD are collected (and passed to `on_message`).  Never raises for anything
    the child does."""
    isolation = isolation or jails.isolation()
    cgroup = JobCgroup.create("job", memory_bytes=limits.memory_bytes, max_tasks=limits.max_processes)
    try:
        return _run_watched(argv, jail, env, limits, isolation, imports, on_message, cgroup)
    finally:
        if cgroup is not None:
            cgroup.remove()


def _run_watched(argv: list[str], jail: jails.Confinement, env: dict[str, str], limits: Limits,
                 isolation: jails.Isolation, imports: str, on_message: Callable[[dict[str, Any]], None] | None,
                 cgroup: JobCgroup | None) -> ProcessOutcome:
    read_fd, write_fd = os.pipe()
    env = dict(env, TRIAGE_CONTROL_FD=str(write_fd))
    start = time.monotonic()
    child = SandboxedProcess(argv, jail=jail, env=env, isolation=isolation, pass_fds=(write_fd,), imports=imports,
                             cgroup=cgroup)
    os.close(write_fd)
    out, err = OutputCapture(child.proc.stdout, limits.output_bytes), OutputCapture(child.proc.stderr, limits.output_bytes)
    control = ControlChannel(read_fd, limits, start, on_message)
    timed_out = memory_exceeded = False
    exceeded: str | None = None
    peak = 0
    next_disk = start + DISK_POLL_S
    cpu_samples = [(start, 0.0)]  # (time, the tree's CPU seconds), every DISK_POLL_S
    while True:
        # Waiting on the process, not sleeping: its exit is seen at once, not at the next poll.
        try:
            child.proc.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        pids, rss, tasks, cpu = child.tree()
        now = time.monotonic()
        if cgroup is not None and cgroup.limit_hit() == "memory":
            # The kernel killed one of its processes at memory.max: the arm is over its limit.
            peak = max(peak, cgroup.memory_bytes())
            memory_exceeded = True
            break
        if rss > limits.memory_bytes:
            if cgroup is not None and cgroup.holds_memory_of(pids):
                # The kernel holds memory.max over the whole tree, counting a page once whoever
                # shares it: the group's charge is the tree's memory (a fork pool's proportional
                # share walks every mapped page: 0.4 s for 9 processes over 700 MB, a core's
                # worth at this poll's rate).
                rss = cgroup.memory_bytes()
            else:
                # Resident pages count a page shared by many processes once per process: a
                # fork pool reading one tensor is not over the limit until its proportional
                # share is. A process outside the group (one that moved itself out) is not
                # held by the kernel: this share decides, as without a group.
                rss = child.proportional_memory()
                if rss > limits.memory_bytes:
                    peak = max(peak, rss)
                    memory_exceeded = True
                    break
        peak = max(peak, rss)
        if tasks > limits.max_processes:
            exceeded = "processes"
            break
        if now >= next_disk:
            next_disk = now + DISK_POLL_S
            cpu_samples.append((now, max(cpu, cpu_samples[-1][1])))
            used, entries = disk_usage_and_entries([jail.scratch, *jail.writable, *jail.mounts.values()],
                                                   limits.disk_bytes)
            if entries > MAX_DISK_ENTRIES:
                exceeded = "files"
                break
            if used > limits.disk_bytes:
                exceeded = "disk"
                break
        if now > control.deadline:
            timed_out = not control.done
            cpu_samples.append((now, max(cpu, cpu_samples[-1][1])))
            break
    child.kill()
    child.proc.wait()
    control.thread.join(timeout=2)
    if cgroup is not None:
        # The kernel held the limits: an allocation past memory.max was OOM-killed, a fork or
        # thread past pids.max refused — either way the arm is over its ceiling.
        hit = cgroup.limit_hit()
        memory_exceeded = memory_exceeded or hit == "memory"
        if hit == "tasks" and exceeded is None:
            exceeded = "processes"
        peak = max(peak, cgroup.peak_memory_bytes())
    code = child.exit_status()
    sig = signal.Signals(-code).name if code is not None and code < 0 and -code in signal.valid_signals() else None
    stdout, stderr = out.text(), err.text()
    return ProcessOutcome(
        exit_code=code, signal=sig, timed_out=timed_out, memory_exceeded=memory_exceeded,
        elapsed_s=time.monotonic() - start, stdout=stdout, stderr=stderr,
        output_dropped=out.dropped + err.dropped, messages=control.messages, peak_rss_bytes=peak,
        limit_exceeded=exceeded, idle_s=idle_tail(cpu_samples) if timed_out else 0.0,
    )


# A tree using less than this share of one core is asleep: a pool's handler threads and a
# polling wait use a few milliseconds a second, a computation all of it.
IDLE_CPU = 0.02


def idle_tail(samples: list[tuple[float, float]]) -> float:
    """How long the tree had used less than IDLE_CPU of one core in every interval between
    `samples` ((time, CPU seconds used so far), in order) when the last was taken."""
    since = samples[-1][0]
    for (at, cpu), (later, more) in zip(reversed(samples[:-1]), reversed(samples[1:]), strict=True):
        if more - cpu >= IDLE_CPU * (later - at):
            break
        since = at
    return samples[-1][0] - since


class ControlChannel:
    """The worker's JSON-lines control pipe, read in bounded lines; it owns the deadline."""

    def __init__(self, fd: int, limits: Limits, start: float,
                 on_message: Callable[[dict[str, Any]], None] | None) -> None:
        self.limits, self.on_message = limits, on_message
        self.order = [name for name, _ in limits.phases]
        self.allowance = dict(limits.phases)
        self.hard_deadline = start + limits.timeout_s + sum(self.allowance.values())
        self.deadline = start + limits.timeout_s
        self.last_phase = -1
        self.done = False
        self.messages: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._read, args=(fd,), daemon=True)
        self.thread.start()

    def _read(self, fd: int) -> None:
        total = values = 0
        with os.fdopen(fd, "rb") as f:
            while True:
                raw = f.readline(MAX_CONTROL_LINE + 1)
                if not raw:
                    return
                total += len(raw)
                if len(raw) > MAX_CONTROL_LINE:
                    while raw and not raw.endswith(b"\n"):  # skip the rest of the overlong line
                        raw = f.readline(MAX_CONTROL_LINE)
                    continue
                if total > MAX_CONTROL_BYTES or len(self.messages) >= MAX_MESSAGES:
                    continue
                # untrusted.json_values's count, here without importing numpy (whose threads
                # would start before a worker confines itself)
                values += raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
                if values > MAX_CONTROL_VALUES:
                    continue
                try:
                    message = json.loads(raw)
                except (ValueError, RecursionError):
                    message = None
                if not isinstance(message, dict):
                    continue
                self.messages.append(message)
                self._phase(message.get("phase"))
                if self.on_message is not None:
                    self.on_message(message)

    def _phase(self, phase: Any) -> None:
        now = time.monotonic()
        if phase == "done":
            # Believed only after the last announced phase: a script that writes "done" on
            # every descriptor while it still runs does not cut its own arm short.
            if self.last_phase == len(self.order) - 1:
                self.done = True
                self.deadline = min(self.deadline, now + self.limits.linger_s)
            return
        if not isinstance(phase, str) or phase not in self.allowance:
            return
        index = self.order.index(phase)
        if index <= self.last_phase:
            return  # each phase once, in order: a repeated announcement buys no time
        self.last_phase = index
        self.deadline = min(now + self.allowance[phase], self.hard_deadline)


def _signal(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def disk_usage(roots: list[str], stop_at: int) -> int:
    """Bytes under `roots` (allocated blocks, links not followed); stops counting early past
    `stop_at` or past MAX_DISK_ENTRIES entries (which counts as over)."""
    used, entries = disk_usage_and_entries(roots, stop_at)
    return stop_at + 1 if entries > MAX_DISK_ENTRIES else used


def disk_usage_and_entries(roots: list[str], stop_at: int) -> tuple[int, int]:
    """(bytes, entries) under `roots` (allocated blocks, links not followed); stops counting
    early past `stop_at` bytes or MAX_DISK_ENTRIES entries."""
    total, entries = 0, 0
    stack = list(roots)
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    entries += 1
                    if entries > MAX_DISK_ENTRIES:
                        return total, entries
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
        if total > stop_at:
            return total, entries
    return total, entries


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
