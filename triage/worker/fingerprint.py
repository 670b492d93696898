"""Fingerprints and numpy copies of tensors (inside the worker)."""
from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import torch

SAMPLE_SIZE = 6


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _plain_cpu(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_quantized:
        t = t.dequantize()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.resolve_conj().resolve_neg().contiguous()


def fingerprint(t: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype, a hash of the exact bits, nonfinite counts and a few summary figures."""
    cpu = _plain_cpu(t)
    raw = cpu.reshape(-1).view(torch.uint8) if cpu.numel() else torch.empty(0, dtype=torch.uint8)
    fp: dict[str, Any] = {
        "shape": list(cpu.shape),
        "dtype": dtype_name(t.dtype),
        "numel": cpu.numel(),
        "sha256": hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:24],
        "nan": 0,
        "posinf": 0,
        "neginf": 0,
        "min": None,
        "max": None,
        "norm": None,
        "sample": [],
    }
    if cpu.numel() == 0:
        return fp
    if cpu.is_floating_point() and cpu.numel() <= SMALL_VALUE:
        return _small_float_figures(cpu, fp)
    if cpu.is_floating_point() or cpu.is_complex():
        wide = cpu.to(torch.complex128 if cpu.is_complex() else torch.float64)
        fp["nan"] = int(torch.isnan(wide).sum())
        if not cpu.is_complex():
            fp["posinf"] = int(torch.isposinf(wide).sum())
            fp["neginf"] = int(torch.isneginf(wide).sum())
            finite = wide[torch.isfinite(wide)]
            if finite.numel():
                fp["min"] = float(finite.min())
                fp["max"] = float(finite.max())
                fp["norm"] = float(torch.linalg.vector_norm(finite))
        fp["sample"] = [_jsonable(v) for v in wide.reshape(-1)[:SAMPLE_SIZE].tolist()]
    elif cpu.dtype == torch.bool:
        fp["sample"] = [bool(v) for v in cpu.reshape(-1)[:SAMPLE_SIZE].tolist()]
    else:
        wide = cpu.to(torch.float64)
        fp["min"] = float(wide.min())
        fp["max"] = float(wide.max())
        fp["sample"] = [int(v) for v in cpu.reshape(-1)[:SAMPLE_SIZE].tolist()]
    return fp


# A real floating value of at most this many elements is summarised from its Python floats:
# a dozen tensor ops cost 0.2 ms, and a script that makes 100,000 one-element tensors makes
# as many leaves to fingerprint (20 s, past the allowance after the script).
SMALL_VALUE = 64


def _small_float_figures(cpu: torch.Tensor, fp: dict[str, Any]) -> dict[str, Any]:
    """`fingerprint`'s figures of a small real floating tensor, from its exact Python floats
    (the norm summed in another order than torch's: it may differ in its last bit)."""
    values = cpu.reshape(-1).tolist()
    finite = [v for v in values if math.isfinite(v)]
    fp["nan"] = sum(1 for v in values if v != v)
    fp["posinf"] = sum(1 for v in values if v == math.inf)
    fp["neginf"] = sum(1 for v in values if v == -math.inf)
    if finite:
        fp["min"], fp["max"] = min(finite), max(finite)
        fp["norm"] = math.sqrt(sum(v * v for v in finite))
    fp["sample"] = [_jsonable(v) for v in values[:SAMPLE_SIZE]]
    return fp


def readable_fingerprint(t: torch.Tensor) -> tuple[dict[str, Any] | None, str | None]:
    """`fingerprint(t)` and None, or None and why `t` cannot be read: a meta tensor has a
    shape and a dtype but no data, and a tensor subclass may raise anything when read. One
    such value costs the arm that value, never the others (nor the arm itself)."""
    try:
        if t.is_meta:
            return None, "a meta tensor: it has a shape and a dtype but no data to compare"
        return fingerprint(t), None
    except Exception as e:  # noqa: BLE001 - whatever reading the script's tensor raises
        return None, f"cannot be read ({type(e).__name__})"


def _jsonable(v: Any) -> Any:
    if isinstance(v, complex):
        return [_jsonable(v.real), _jsonable(v.imag)]
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def to_numpy(t: torch.Tensor) -> np.ndarray | None:
    """An exact numpy copy (bfloat16 widened to float32, which is exact); None if impossible."""
    try:
        cpu = _plain_cpu(t)
    except Exception:  # noqa: BLE001 - a meta tensor, or a subclass that raises anything
        return None
    if cpu.dtype == torch.bfloat16:
        cpu = cpu.float()
    elif cpu.dtype == torch.complex32:
        cpu = cpu.to(torch.complex64)
    try:
        # A copy: numpy() shares the tensor's memory, and the script may update it in place
        # later (an optimizer's step counter), which would rewrite the value observed now.
        return cpu.numpy().copy()
    except Exception:  # noqa: BLE001 - a dtype numpy has no counterpart for
        return None
