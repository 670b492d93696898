"""Secrets and environment: what reaches a process that runs issue code, and what triage keeps.

An arm gets an allow-list of variables (never anything named like a secret).  triage's own
process drops every secret-looking variable at start (`scrub_own_secrets`) and blanks it in
the environment block the kernel shows as `/proc/<pid>/environ`; a token the posting step
needs is taken once (`take_secret`) or read from a file when posting (`read_secret_file`).
"""
from __future__ import annotations

import os
import re

# Variables passed through to the child, by exact name or prefix.  Everything else is dropped.
# ATEN_CPU_CAPABILITY picks the CPU kernels (default, avx2, avx512): a divergence between two
# CPUs is reproduced on one by setting it, so the arms must see it.
ALLOWED_NAMES = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
                 "LD_LIBRARY_PATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "CUBLAS_WORKSPACE_CONFIG",
                 "ATEN_CPU_CAPABILITY"}
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "OMP_",
                    "MKL_", "KMP_", "CUDNN_", "NCCL_", "HIP_", "ROCM_", "TRIAGE_TEST_")
SECRET_PATTERN = re.compile(r"TOKEN|SECRET|KEY|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)


def scrubbed_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items()
           if not SECRET_PATTERN.search(k) and (k in ALLOWED_NAMES or k.startswith(ALLOWED_PREFIXES))}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def take_secret(name: str) -> str | None:
    """Read a secret from the environment and keep it from every other process: drop it from
    `os.environ` (no child inherits it), blank it in this process's original environment
    block (which `/proc/<pid>/environ` shows even after `del os.environ[...]`), and mark the
    process non-dumpable (no ptrace, no /proc/<pid>/mem) for a non-root user."""
    value = os.environ.pop(name, None)
    if value is not None:
        _blank_initial_environment(name)
        _set_non_dumpable()
    return value


def scrub_own_secrets(keep: tuple[str, ...] = ()) -> dict[str, str]:
    """At start: take every secret-looking variable out of this process's environment; the
    ones named in `keep` are returned (for the posting step), the others are gone."""
    kept = {}
    for name in [k for k in os.environ if SECRET_PATTERN.search(k)]:
        value = take_secret(name)
        if name in keep and value:
            kept[name] = value
    return kept


def read_secret_file(path: str, max_bytes: int = 4096) -> str:
    """A token from a file (or /dev/fd/N), read only when it is used; surrounding space dropped."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} is larger than {max_bytes} bytes; not a token")
    return data.decode("utf-8", errors="strict").strip()


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
