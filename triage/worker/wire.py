"""The framing spoken over the pipes between triage and a warm arm worker.

A message is one JSON line (the header) followed by the raw bytes of the arrays it lists in
``header["arrays"]`` (``{"name", "dtype", "shape", "nbytes"}`` each, numpy dtype names), in
order.  JSON and raw bytes only: the parent never unpickles anything a worker sends.  This
module imports numpy but not torch, so triage's own process can use it.
"""
from __future__ import annotations

import json
from typing import Any, BinaryIO

import numpy as np

MAX_HEADER_BYTES = 64 << 20


class WireError(Exception):
    """The other side closed the pipe or sent something malformed."""


def send(stream: BinaryIO, header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> None:
    contiguous = {name: np.ascontiguousarray(a) for name, a in (arrays or {}).items()}
    specs = [{"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "nbytes": a.nbytes}
             for name, a in contiguous.items()]
    stream.write(json.dumps(dict(header, arrays=specs)).encode() + b"\n")
    for a in contiguous.values():
        stream.write(memoryview(a).cast("B"))
    stream.flush()


def receive(stream: BinaryIO) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    line = stream.readline(MAX_HEADER_BYTES)
    if not line:
        raise WireError("the pipe closed")
    if not line.endswith(b"\n"):
        raise WireError("a message header was too long or cut off")
    try:
        header = json.loads(line)
    except ValueError as e:
        raise WireError(f"a malformed message header: {e}") from None
    if not isinstance(header, dict):
        raise WireError("a message header that is not an object")
    arrays = {}
    for spec in header.get("arrays", []):
        data = _read_exact(stream, int(spec["nbytes"]))
        arrays[spec["name"]] = np.frombuffer(data, dtype=np.dtype(spec["dtype"])).reshape(spec["shape"])
    return header, arrays


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            raise WireError("the pipe closed in the middle of a message")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
