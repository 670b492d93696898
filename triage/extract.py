"""Stage 1: read a reporter's script and check that Python can compile it.

Compiling is safe in triage's own process (nothing runs); it turns a syntax or encoding
error into a could-not-run report without starting any arm.
"""
from __future__ import annotations

from pathlib import Path

from triage.model import Repro

MAX_SOURCE_BYTES = 2 << 20


def extract_repro(path: str | Path) -> Repro:
    p = Path(path).expanduser()
    name = p.name
    try:
        p = p.resolve()
        if p.is_dir():
            return Repro(str(p), name, "", problem=f"{path} is a directory, not a Python script")
        data = p.read_bytes()
    except FileNotFoundError:
        return Repro(str(p), name, "", problem=f"no such file: {path}")
    except OSError as e:
        return Repro(str(p), name, "", problem=f"cannot read {path}: {e.strerror or e}")
    if len(data) > MAX_SOURCE_BYTES:
        return Repro(str(p), name, "", problem=f"{path} is {len(data)} bytes; a repro script is expected to be under {MAX_SOURCE_BYTES >> 20} MiB")
    source = data.decode("utf-8", errors="replace")
    try:
        compile(data, str(p), "exec", dont_inherit=True)
    except SyntaxError as e:
        what = "is not valid UTF-8 (and declares no other encoding)" if "unicode" in str(e.msg).lower() or "utf-8" in str(e.msg).lower() \
            else f"has a syntax error: {e.msg}"
        return Repro(str(p), name, source, problem=f"{name} {what} (line {e.lineno})", problem_line=e.lineno)
    except ValueError as e:  # e.g. null bytes
        return Repro(str(p), name, source, problem=f"{name} cannot be compiled: {e}")
    return Repro(str(p), name, source)
