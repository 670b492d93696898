"""The framing spoken over the pipes between triage and a warm arm worker.

A message is one JSON line (the header) followed by the raw bytes of the arrays it lists in
``header["arrays"]`` (``{"name", "dtype", "shape", "nbytes"}`` each, numpy dtype names), in
order.  JSON and raw bytes only: the parent never unpickles anything a worker sends.  This
module imports numpy but not torch, so triage's own process can use it.
"""
from __future__ import annotations

import json
import math
from typing import Any, BinaryIO

import numpy as np

MAX_HEADER_BYTES = 64 << 20
MAX_ARRAY_BYTES = 2 << 30  # all the arrays of one message together
MAX_ARRAYS = 100000
NUMERIC_KINDS = "biufc"  # no object, string or record arrays


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


def receive(stream: BinaryIO,
            max_array_bytes: int = MAX_ARRAY_BYTES) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """One message; `WireError` for anything malformed, before more than `max_array_bytes` of
    array data is read (the other side may be hostile: a process the script left could reach a
    warm worker)."""
    line = stream.readline(MAX_HEADER_BYTES)
    if not line:
        raise WireError("the pipe closed")
    if not line.endswith(b"\n"):
        raise WireError("a message header was too long or cut off")
    try:
        header = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise WireError(f"a malformed message header: {str(e)[:200]}") from None
    if not isinstance(header, dict):
        raise WireError("a message header that is not an object")
    specs = header.get("arrays", [])
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise WireError("a message header whose arrays are not a list")
    arrays = {}
    left = max_array_bytes
    for spec in specs:
        name, dtype, shape = _array_spec(spec)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > left:
            raise WireError(f"array {name[:80]!r} of {nbytes} bytes is over the {max_array_bytes} bytes a message "
                            "may carry")
        left -= nbytes
        arrays[name] = np.frombuffer(_read_exact(stream, nbytes), dtype=dtype).reshape(shape)
    return header, arrays


def _array_spec(spec: Any) -> tuple[str, np.dtype, list[int]]:
    """(name, dtype, shape) of one listed array, checked: a numeric dtype, a shape of
    non-negative ints, and an `nbytes` that agrees with them."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("dtype"), str):
        raise WireError("an array without a name and a dtype")
    try:
        dtype = np.dtype(spec["dtype"])
    except (TypeError, ValueError):
        raise WireError(f"array {spec['name'][:80]!r} has an unknown dtype") from None
    if dtype.kind not in NUMERIC_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise WireError(f"array {spec['name'][:80]!r} is not numeric ({dtype})")
    shape = spec.get("shape")
    if (not isinstance(shape, list) or len(shape) > 64
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise WireError(f"array {spec['name'][:80]!r} has no valid shape")
    if spec.get("nbytes") != math.prod(shape) * dtype.itemsize:
        raise WireError(f"array {spec['name'][:80]!r} does not hold shape × itemsize bytes")
    return spec["name"], dtype, shape


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            raise WireError("the pipe closed in the middle of a message")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
