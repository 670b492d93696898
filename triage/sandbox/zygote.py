"""The run's fork server, the parent's side: processes forked with torch already imported.

`fork_server(...)` starts one zygote (triage/worker/zygote.py) per triage run, in a jail of
its own, and makes it the way `SandboxedProcess` starts the worker entry points
(`python -I -m triage.worker JOB`, `python -I -m triage.worker.serve`) for the rest of the
run.  A child is forked only where that gives the same isolation a spawned process has:

- the job's environment is the one the zygote was started with (a variable torch reads at
  import would otherwise be ignored), apart from HOME, TMPDIR and the descriptor numbers;
- no accelerator (CUDA must not be initialised before a fork; such arms are spawned);
- every path the job sees exists in the zygote's view, which the child narrows to the job's
  own (see the zygote's module docstring): its scratch directory and those it shares live in
  the host's temporary folders or are the run's compile cache, its readable files are there
  or were bound when the zygote started.

Anything else is spawned as before.  `ForkedProcess` stands in for the `subprocess.Popen` of a
spawned one: the same poll/wait/stdout/stderr/pid, its exit status reported by the zygote
(a signal death as 128 + signal, as bubblewrap reports it), its pid the host's.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from triage.sandbox import forkservers
from triage.sandbox import jail as jails
from triage.sandbox.caches import copy_plain_tree
from triage.sandbox.cgroups import JobCgroup
from triage.sandbox.confine import SYS_CAPSET
from triage.sandbox.process import SandboxedProcess
from triage.sandbox.proctable import descendants, process_table
from triage.untrusted import remove_tree
from triage.worker.protocol import ENTRY_POINTS, FIRST_JOB_FD, STAGE, WARM_UP_FOLDER

ZYGOTE_MODULE = "triage.worker.zygote"
ENTRY_MODULES = tuple(ENTRY_POINTS)  # what a job may ask the fork server to run
PER_JOB_ENV = ("HOME", "TMPDIR", "TRIAGE_CONFINE")
CONFINABLE_MACHINES = tuple(SYS_CAPSET)  # where a forked child can drop its capabilities
PID_WAIT_S = 5.0



class ForkedProcess:
    """A job the zygote forked, as `subprocess.Popen` shows a process: the parts of that
    interface the sandbox uses."""

    def __init__(self, server: ForkServer, job: str, stdout: Any, stderr: Any) -> None:
        self.server, self.job = server, job
        self.stdout, self.stderr = stdout, stderr
        self.pid: int | None = None  # the host's pid of the forked child, once known
        self.returncode: int | None = None
        self.started = threading.Event()
        self.exited = threading.Event()
        self.hold: tuple[int, JobCgroup] | None = None  # the write end of its hold, and its group
        self.hold_lock = threading.Lock()

    def release_hold(self) -> None:
        with self.hold_lock:
            if self.hold is not None:
                os.close(self.hold[0])
                self.hold = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"fork server job {self.job}", timeout or 0)
        return self.returncode

    def cancel(self) -> None:
        """Kill it: the zygote drops the job if it is still waiting for its imports, else
        SIGKILLs the forked child (whose namespace's PID 1 dies with it)."""
        if not self.exited.is_set():
            self.server._send({"cancel": self.job})

    def _exit(self, code: int) -> None:
        self.release_hold()
        self.returncode = code
        self.started.set()
        self.exited.set()


class ForkServer:
    """One zygote: start it, ask it for children, end it (and every child) with `close`."""

    def __init__(self, *, env: dict[str, str], isolation: jails.Isolation, writable: list[str],
                 mounts: dict[str, str], readable: list[str], compile: bool, python: str | None = None,
                 warm_cache: str | None = None) -> None:
        """`python`: the interpreter it runs and forks jobs of (another torch release's
        environment, sandbox/torch_envs.py); None: triage's own.  `warm_cache`: where the
        warm-up's probe libraries are kept between runs (caches.warm_up_cache): copied into
        the zygote's HOME before it starts and back after it ends, never mounted."""
        self.python = python or sys.executable
        self.env = dict(env)
        self.isolation = isolation
        self.hidden = sorted({"/tmp", os.path.realpath(tempfile.gettempdir())})
        self.writable = [os.path.realpath(p) for p in writable]
        self.mounts = dict(mounts)
        self.readable = [os.path.abspath(p) for p in readable]
        self.root = tempfile.mkdtemp(prefix="triage-zygote-")
        self.warm_cache = warm_cache if compile else None
        # worker/zygote.py _own_compile_cache: the warm-up's folder in the zygote's HOME.
        self.warm_dir = os.path.join(self.root, "home", WARM_UP_FOLDER)
        if self.warm_cache:
            copy_plain_tree(self.warm_cache, self.warm_dir)
        self.jobs: dict[str, ForkedProcess] = {}
        self.ready: set[str] = set()
        self.counter = itertools.count()
        self.lock = threading.Lock()
        self.closed = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        jail = jails.Confinement(scratch=self.root, workdir=os.path.join(self.root, "work"),
                                 # the mounts' host folders too: a job's view binds them from there
                                 writable=[*self.hidden, *self.writable, *self.mounts.values()],
                                 readable=[p for p in self.readable if not self._under_hidden(p)],
                                 mounts=dict(self.mounts), directories=[STAGE], host_proc=True)
        try:
            self.process = SandboxedProcess(
                [self.python, "-I", "-m", ZYGOTE_MODULE, *(["compile"] if compile else [])], jail=jail, isolation=isolation,
                env=dict(self.env, TRIAGE_ZYGOTE_FD=str(theirs.fileno())), pass_fds=(theirs.fileno(),),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            remove_tree(self.root)
            raise
        finally:
            theirs.close()
        threading.Thread(target=self._read, daemon=True, name="triage-zygote").start()

    # -- what may be forked ------------------------------------------------------------------
    def accepts(self, argv: list[str], jail: jails.Confinement, env: dict[str, str]) -> bool:
        if self.closed or self.process.proc.poll() is not None or jail.accelerators or jail.host_proc \
                or jail.directories:
            return False
        if len(argv) < 4 or argv[:3] != [self.python, "-I", "-m"] or argv[3] not in ENTRY_MODULES:
            return False
        if _comparable(env) != _comparable(self.env):
            return False
        if not self.isolation.strong:
            return True
        if os.uname().machine not in CONFINABLE_MACHINES:  # the child could not drop its capabilities
            return False
        hosts = [jail.scratch, *jail.writable, *jail.mounts.values(), *jail.readable]
        return self._under_hidden(jail.scratch) and all(self._visible(p) for p in hosts)

    def _own_python(self) -> str | None:
        return None if self.python == sys.executable else self.python

    def _under_hidden(self, path: str) -> bool:
        return _within(path, self.hidden)

    def _visible(self, path: str) -> bool:
        return _within(path, [*self.hidden, *self.writable, *self.mounts.values(), *self.readable])

    # -- forking -----------------------------------------------------------------------------
    def fork(self, argv: list[str], jail: jails.Confinement, env: dict[str, str],
             pass_fds: tuple[int, ...], needs: str, cgroup: JobCgroup | None = None) -> ForkedProcess:
        """Ask for a child running `argv`; its stdout and stderr are pipes to this process.
        With a `cgroup`, the child waits on a pipe (the "hold") until this process has moved it
        into the group, so that everything it starts is charged there."""
        job = str(next(self.counter))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        renumbered = {str(fd): str(FIRST_JOB_FD + i) for i, fd in enumerate(pass_fds)}
        child_env = {k: (renumbered.get(v, v) if k.endswith("_FD") else v) for k, v in env.items()}
        # Host paths checked as for bubblewrap (jail.host_directory): the child's bind follows links.
        view = [[jails.host_directory(jail.scratch), jail.scratch, True]]
        view += [[jails.host_directory(p), p, True] for p in jail.writable]
        view += [[jails.host_directory(host), inside, True] for inside, host in jail.mounts.items()]
        view += [[jails.host_path(p), p, False] for p in jail.readable]
        # The installation itself, where it lives in a temporary folder (a checkout in /tmp).
        view += [[p, p, False] for p in jails.interpreter_paths(self._own_python()) if self._under_hidden(p)]
        request = {"job": job, "module": argv[3], "args": argv[4:], "env": child_env, "cwd": jail.workdir,
                   "scratch": jail.scratch, "view": view, "hidden": self.hidden,
                   "namespace": self.isolation.strong, "needs": needs if needs in ("torch", "compile") else "torch",
                   "hold": cgroup is not None}
        child = ForkedProcess(self, job, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
        held: list[int] = []
        if cgroup is not None:
            hold_r, hold_w = os.pipe()
            child.hold = (hold_w, cgroup)
            held = [hold_r]
        with self.lock:
            self.jobs[job] = child
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode()], [out_w, err_w, *held, *pass_fds])
        except OSError as e:
            child._exit(71)
            os.write(err_w, f"triage's fork server is gone ({e})\n".encode())
        finally:
            for fd in (out_w, err_w, *held):
                os.close(fd)
        return child

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.send(json.dumps(message).encode())
        except OSError:
            pass

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            try:
                message = json.loads(data)
            except ValueError:
                continue
            if "ready" in message:
                self.ready.add(message["ready"])
                continue
            with self.lock:
                child = self.jobs.get(str(message.get("job")))
            if child is None:
                continue
            if "pid" in message:  # found off this thread, which every other job's messages wait on
                threading.Thread(target=self._resolve, args=(child, int(message["pid"])), daemon=True).start()
            elif "status" in message:
                with self.lock:
                    self.jobs.pop(child.job, None)
                child._exit(int(message["status"]))
        with self.lock:
            orphans, self.jobs = list(self.jobs.values()), {}
        for child in orphans:  # the zygote died: its children died with its namespace
            child._exit(128 + 9)

    def _resolve(self, child: ForkedProcess, pid: int) -> None:
        child.pid = self._host_pid(pid, child)
        with child.hold_lock:
            if child.hold is not None:
                hold_w, cgroup = child.hold
                # Released only once it is in its group; a child that cannot be placed is let
                # go without the byte, and exits before running anything.
                if child.pid is not None:
                    cgroup.add(child.pid)
                    if child.pid in cgroup.pids():
                        os.write(hold_w, b"1")
        child.release_hold()
        child.started.set()

    def _host_pid(self, pid: int, child: ForkedProcess) -> int | None:
        """The host's pid of the zygote's child `pid` (numbered in the zygote's namespace)."""
        if not self.isolation.strong:
            return pid
        deadline = time.monotonic() + PID_WAIT_S
        while time.monotonic() < deadline and not child.exited.is_set():
            for candidate in descendants(self.process.pid, process_table())[0]:
                try:
                    with open(f"/proc/{candidate}/status") as f:
                        ns = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
                except OSError:
                    continue
                # Numbered here and in the zygote's namespace: its own child, not a grandchild.
                if len(ns) == 2 and int(ns[1]) == pid:
                    return candidate
            time.sleep(0.01)
        return None

    def close(self) -> None:
        """End the zygote; its children (and theirs) end with its namespace."""
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        self.process.kill()
        try:
            self.process.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.warm_cache and "compile" in self.ready:
            copy_plain_tree(self.warm_dir, self.warm_cache)
        remove_tree(self.root)


def _within(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots)


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_JOB_ENV and not k.endswith("_FD")}


@contextlib.contextmanager
def fork_server(*, env: dict[str, str], isolation: jails.Isolation, writable: list[str], mounts: dict[str, str],
                readable: list[str], compile: bool, python: str | None = None,
                warm_cache: str | None = None) -> Iterator[ForkServer]:
    """Within the block, `SandboxedProcess` forks the worker entry points of interpreter
    `python` from this zygote wherever that isolates them as a spawned process would."""
    server = ForkServer(env=env, isolation=isolation, writable=writable, mounts=mounts, readable=readable,
                        compile=compile, python=python, warm_cache=warm_cache)
    forkservers.register(server)
    try:
        yield server
    finally:
        forkservers.unregister(server)
        server.close()
