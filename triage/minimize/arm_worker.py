"""Warm arm workers, the parent's side: one long-lived isolated process per arm.

`ArmWorker.request` sends one request and waits for the answer with a deadline.  A worker
that dies or runs past the deadline is killed (its whole process group) and restarted, with
its setup and loaded state replayed, and the request is answered with ``{"ok": False,
"lost": ...}``, which the minimizer treats as the arm failing that query.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
from typing import Any

import numpy as np

from triage.arms.output import reply_problem
from triage.model import ArmSpec
from triage.sandbox import Confinement, OutputCapture, SandboxedProcess, scrubbed_environment
from triage.sandbox import isolation as isolation_of
from triage.sandbox.caches import inductor_default_dir
from triage.sandbox.cgroups import JobCgroup
from triage.sandbox.process import MAX_TASKS
from triage.untrusted import remove_tree
from triage.worker.wire import WireError, receive, send

GiB = 1 << 30
MAX_RESTARTS = 5
Reply = tuple[dict[str, Any], dict[str, np.ndarray]]


class WorkerFailed(Exception):
    """The worker could not start, or died while being set up; the message says why."""


class ArmWorker:
    def __init__(self, arm: ArmSpec, graph_dir: str, memory_bytes: int, startup_timeout_s: float = 180.0,
                 shared: list[str] | None = None, isolation: str = "auto", compile_dir: str | None = None,
                 python: str | None = None, script_backend: dict[str, str] | None = None,
                 reading: list[str] | None = None) -> None:
        """`shared`: directories the worker may write (values passed between the two arms'
        workers), `reading`: directories it may only read (the other worker's values); it reads
        `graph_dir` and writes its own scratch directory, nothing else, but for `compile_dir`,
        the triage run's compile cache (the arms' own, so a compile arm's worker starts warm).
        `python`: the arm's interpreter (run.worker_python). `script_backend`: {"name",
        "definitions"} of the script's own compile backend, whose code the worker runs."""
        self.arm = arm
        self.script_backend = script_backend
        self.python = python or sys.executable
        self.graph_dir = graph_dir
        self.memory_bytes = memory_bytes
        self.startup_timeout_s = startup_timeout_s
        self.state: list[dict[str, Any]] = []  # requests replayed after a restart (loaded values)
        self.restarts = 0
        self.dead: str | None = None  # set once restarts are exhausted
        self.refused: str | None = None  # why the worker's last reply was refused
        self.proc: subprocess.Popen | None = None
        self.sandboxed: SandboxedProcess | None = None
        self.cgroup: JobCgroup | None = None
        self.isolation = isolation_of(isolation)
        self.workdir = tempfile.mkdtemp(prefix="triage-warm-")
        cache = compile_dir or os.path.join(self.workdir, "compile")
        self.jail = Confinement(scratch=self.workdir, workdir=os.path.join(self.workdir, "work"),
                                readable=[os.path.abspath(graph_dir)] + [os.path.abspath(r) for r in reading or []],
                                writable=list(shared or []) + ([compile_dir] if compile_dir else []),
                                accelerators=arm.device != "cpu")
        self.compile_env = {"TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
        if compile_dir:
            self.jail.mounts.update(inductor_default_dir(scrubbed_environment(), compile_dir))
        try:
            self._start()
        except BaseException:
            self._kill()
            self._release_cgroup()
            remove_tree(self.workdir)
            raise

    # -- process lifecycle ----------------------------------------------------------------
    def _start(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        env = dict(scrubbed_environment(), TRIAGE_REQUEST_FD=str(req_r), TRIAGE_REPLY_FD=str(rep_w),
                   **self.compile_env)
        # Its own cgroup, as an arm has (sandbox/cgroups.py): the graph it replays is the script's.
        self._release_cgroup()
        self.cgroup = JobCgroup.create("warm", memory_bytes=self.memory_bytes, max_tasks=MAX_TASKS)
        self.sandboxed = SandboxedProcess([self.python, "-I", "-m", "triage.worker.serve"], jail=self.jail,
                                          env=env, isolation=self.isolation, pass_fds=(req_r, rep_w),
                                          imports="compile" if self.arm.mode == "compile" else "torch",
                                          cgroup=self.cgroup)
        self.proc = self.sandboxed.proc
        os.close(req_r)
        os.close(rep_w)
        self.requests = os.fdopen(req_w, "wb")
        self.replies: queue.Queue[Reply | None] = queue.Queue()
        self.stdout = OutputCapture(self.proc.stdout, 64 * 1024)
        self.stderr = OutputCapture(self.proc.stderr, 64 * 1024)
        threading.Thread(target=self._read, args=(os.fdopen(rep_r, "rb"), self.replies), daemon=True).start()
        setup = {"arm": self.arm.to_job(), "graph_dir": self.graph_dir, "script_backend": self.script_backend,
                 "address_space_limit": self.memory_bytes + 8 * GiB if self.arm.device == "cpu" else None}
        header, _ = self._exchange(setup, self.startup_timeout_s)
        if not header.get("ok"):
            error = header.get("error") or {}
            reason = header.get("lost") or f"{error.get('type')}: {error.get('message')}"
            self.close()
            raise WorkerFailed(f"the {self.arm.spec} worker could not start: {reason}")
        for request in self.state:
            self._exchange(request, self.startup_timeout_s)

    def _read(self, stream: Any, replies: queue.Queue) -> None:
        """Replies as they come; the first malformed one ends the reading, and the worker is
        then treated as lost (killed and restarted) with `refused` saying why."""
        self.refused = None
        try:
            while True:
                header, arrays = receive(stream)
                self.refused = reply_problem(header)
                if self.refused:
                    break
                replies.put((header, arrays))
        except (WireError, OSError, ValueError):
            pass
        replies.put(None)

    def _exchange(self, header: dict[str, Any], timeout_s: float, arrays: dict[str, np.ndarray] | None = None) -> Reply:
        try:
            send(self.requests, header, arrays)
            reply = self.replies.get(timeout=timeout_s)
        except (BrokenPipeError, OSError):
            reply = None
        except queue.Empty:
            self._kill()
            return {"ok": False, "lost": f"no answer within {timeout_s:.0f} s"}, {}
        if reply is None:
            self._kill()
            return {"ok": False, "lost": self._death()}, {}
        return reply

    def _death(self) -> str:
        if self.refused:
            return f"the worker's reply is not one triage's worker sends ({self.refused})"
        if self.proc:
            self.proc.wait(timeout=10)
        code = self.sandboxed.exit_status() if self.sandboxed else None
        tail = self.stderr.text().strip().splitlines()[-1:] if self.proc else []
        how = f"signal {-code}" if code is not None and code < 0 else f"status {code}"
        if self.cgroup is not None and self.cgroup.limit_hit() == "memory":
            how += f", past its {self.memory_bytes / (1 << 30):.1f} GiB of memory"
        return f"the worker died ({how}){': ' + tail[0][:200] if tail else ''}"

    def _kill(self) -> None:
        if self.sandboxed is not None:
            self.sandboxed.kill()
            self.sandboxed.proc.wait()

    def _release_cgroup(self) -> None:
        """Remove the last process's group, once what it says (an OOM kill) has been read."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None

    # -- requests -------------------------------------------------------------------------
    def request(self, header: dict[str, Any], timeout_s: float, keep_state: bool = False,
                arrays: dict[str, np.ndarray] | None = None) -> Reply:
        """One request (with `arrays`: input overrides); a lost worker is restarted (state
        replayed) before this returns."""
        if self.dead:
            return {"ok": False, "lost": self.dead}, {}
        reply = self._exchange(header, timeout_s, arrays)
        if reply[0].get("lost"):
            self.restarts += 1
            try:
                if self.restarts > MAX_RESTARTS:
                    raise WorkerFailed(f"the {self.arm.spec} worker was lost {self.restarts} times")
                self._start()
            except WorkerFailed as e:
                self.dead = str(e)
        elif keep_state and reply[0].get("ok"):
            self.state.append(header)
        return reply

    def close(self) -> None:
        try:
            self.requests.close()
        except OSError:
            pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        self._release_cgroup()
        # Whatever the worker left there (directories, FIFOs, links) goes, never followed.
        remove_tree(self.workdir)
