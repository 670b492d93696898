"""Running untrusted code in an isolated subprocess (the parent's side).

The reporter's script may crash, hang, segfault, exhaust memory or print megabytes.  The child
gets a scrubbed environment (no tokens), no stdin, its own process group and a temporary
working directory; the parent enforces a wall-clock deadline and a memory ceiling (resident
memory of the whole process group, polled), keeps only the head and tail of each output
stream, and kills the whole group when anything runs over.
"""
from __future__ import annotations

import collections
import getpass
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

# Variables passed through to the child, by exact name or prefix.  Everything else is dropped.
# ATEN_CPU_CAPABILITY picks the CPU kernels (default, avx2, avx512): a divergence between two
# CPUs is reproduced on one by setting it, so the arms must see it.
ALLOWED_NAMES = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
                 "LD_LIBRARY_PATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "CUBLAS_WORKSPACE_CONFIG",
                 "ATEN_CPU_CAPABILITY"}
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "OMP_",
                    "MKL_", "KMP_", "CUDNN_", "NCCL_", "HIP_", "ROCM_", "TRIAGE_TEST_")
SECRET_PATTERN = re.compile(r"TOKEN|SECRET|KEY|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
POLL_S = 0.05


def scrubbed_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    base = dict(os.environ if base is None else base)
    env = {}
    for k, v in base.items():
        if SECRET_PATTERN.search(k):
            continue
        if k in ALLOWED_NAMES or k.startswith(ALLOWED_PREFIXES):
            env[k] = v
    capability = env.get("ATEN_CPU_CAPABILITY")
    if capability and "TORCHINDUCTOR_CACHE_DIR" not in env:
        # Inductor's cache key leaves the CPU capability out (torch 2.13): code cached under
        # AVX-512 fails to compile under `default`, a crash of the compile arm that is not the
        # script's. Each capability gets its own cache.
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(),
                                                      f"torchinductor_{getpass.getuser()}_{capability}")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def take_secret(name: str) -> str | None:
    """Read a secret from the environment and keep it from the repro, which runs as the same
    user: drop it from `os.environ` (no child inherits it), blank it in this process's original
    environment block (which `/proc/<pid>/environ` shows even after `del os.environ[...]`),
    and mark the process non-dumpable (no ptrace, no /proc/<pid>/mem) for a non-root user.
    Root can still read any process's memory; `triage issue --post` warns when run as root."""
    value = os.environ.pop(name, None)
    if value is not None:
        _blank_initial_environment(name)
        _set_non_dumpable()
    return value


def _blank_initial_environment(name: str) -> None:
    try:
        import ctypes

        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        env_start, env_end = int(fields[47]), int(fields[48])  # stat fields 50 and 51
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
        prefix = name.encode() + b"="
        offset = 0
        while (offset := block.find(prefix, offset)) != -1:
            if offset == 0 or block[offset - 1] == 0:
                end = block.find(b"\0", offset)
                end = len(block) if end == -1 else end
                if env_start + end <= env_end:
                    ctypes.memset(env_start + offset, 0, end - offset)
            offset += len(prefix)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux: no /proc to read it from
        pass


def _set_non_dumpable() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_dumpable = 4
        libc.prctl(pr_set_dumpable, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclass
class Limits:
    timeout_s: float
    memory_bytes: int
    output_bytes: int
    grace_after: dict[str, float] = field(default_factory=dict)  # control phase -> extra seconds


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


def run_isolated(argv: list[str], *, cwd: str, env: dict[str, str], limits: Limits,
                 on_message: Callable[[dict[str, Any]], None] | None = None) -> ProcessOutcome:
    """Run `argv` isolated; messages the child writes as JSON lines to fd TRIAGE_CONTROL_FD
    are collected (and passed to `on_message`).  Never raises for anything the child does."""
    read_fd, write_fd = os.pipe()
    env = dict(env, TRIAGE_CONTROL_FD=str(write_fd))
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, pass_fds=(write_fd,))
    os.close(write_fd)
    out, err = OutputCapture(proc.stdout, limits.output_bytes), OutputCapture(proc.stderr, limits.output_bytes)
    messages: list[dict[str, Any]] = []
    deadline = [start + limits.timeout_s]

    def read_control() -> None:
        with os.fdopen(read_fd, "rb") as f:
            for raw in f:
                if len(messages) > 20000:
                    continue
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(msg, dict):
                    continue
                messages.append(msg)
                extra = limits.grace_after.get(str(msg.get("phase")))
                if extra:
                    deadline[0] = time.monotonic() + extra
                if on_message is not None:
                    on_message(msg)

    control = threading.Thread(target=read_control, daemon=True)
    control.start()
    timed_out = memory_exceeded = False
    peak = 0
    while proc.poll() is None:
        time.sleep(POLL_S)
        rss = _group_rss(proc.pid)
        peak = max(peak, rss)
        if rss > limits.memory_bytes:
            memory_exceeded = True
            break
        if time.monotonic() > deadline[0]:
            timed_out = True
            break
    kill_group(proc.pid)
    proc.wait()
    control.join(timeout=2)
    code = proc.returncode
    sig = signal.Signals(-code).name if code is not None and code < 0 else None
    stdout, stderr = out.text(), err.text()
    return ProcessOutcome(
        exit_code=code, signal=sig, timed_out=timed_out, memory_exceeded=memory_exceeded,
        elapsed_s=time.monotonic() - start, stdout=stdout, stderr=stderr,
        output_dropped=out.dropped + err.dropped, messages=messages, peak_rss_bytes=peak,
    )


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _group_rss(pgid: int) -> int:
    """Resident bytes of every process in the group (the script's own children included)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[2]) != pgid:  # field 5 (pgrp), counted after the command name
                continue
            total += int(fields[21]) * _PAGE  # field 24 (rss, in pages)
        except (OSError, ValueError, IndexError):
            continue
    return total


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
