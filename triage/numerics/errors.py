"""How far one array is from another, in numpy alone: the divergence kind the minimizer
preserves, the errors the localization table shows, units in the last place, nonfinite masks.

Importable on both sides of the jail (the warm worker measures its localization errors with
`value_errors`; compare, classify and the minimizer use the rest in triage's own process), so
no torch and no pipeline stage: numpy, the dtype table in `triage.policy` and the
`DivergenceKind` record.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from triage import policy
from triage.model import DivergenceKind


def divergence_kind(a: np.ndarray, b: np.ndarray, dtype: str) -> DivergenceKind | None:
    """How arm B's value differs from arm A's (None: bitwise equal).  The minimizer's
    predicate and the localization table both use this one definition."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return DivergenceKind("mismatch", "shape or dtype")
    if a.tobytes() == b.tobytes():
        return None
    if a.dtype.kind in "fc":
        wide = np.complex128 if a.dtype.kind == "c" else np.float64
        a64, b64 = a.astype(wide), b.astype(wide)
        pattern = set()
        for side, x, y in (("a", a64, b64), ("b", b64, a64)):
            odd = ~np.isfinite(x) & ~_same_nonfinite(x, y)
            if odd.any():
                for name, test in (("nan", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
                    if a.dtype.kind == "c" and name != "nan":
                        continue
                    if (odd & test(x)).any():
                        pattern.add(f"{side}:{name}")
                if a.dtype.kind == "c" and not (odd & np.isnan(x)).any():
                    pattern.add(f"{side}:inf")
        if pattern:
            return DivergenceKind("nonfinite", ",".join(sorted(pattern)))
        rtol, atol = policy.tolerance(dtype)
        within = np.allclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True)
        return DivergenceKind("rounding" if within else "mismatch")
    return DivergenceKind("mismatch")


def value_errors(reference: np.ndarray, value: np.ndarray, dtype: str) -> dict[str, Any]:
    """How far `value` is from `reference`: max abs difference, max ulps (in the dtype), the
    count of nonfinite mismatches, and the divergence kind."""
    kind = divergence_kind(reference, value, dtype)
    out: dict[str, Any] = {"kind": kind.kind if kind else "equal", "detail": kind.detail if kind else "",
                           "max_abs": 0.0, "max_ulps": 0.0, "nonfinite": 0}
    if kind is None or reference.shape != value.shape or reference.dtype.kind not in "fc":
        if kind is not None and reference.shape == value.shape and reference.dtype.kind in "iub":
            out["max_abs"] = float(np.abs(reference.astype(np.float64) - value.astype(np.float64)).max())
        return out
    wide = np.complex128 if reference.dtype.kind == "c" else np.float64
    r, v = reference.astype(wide), value.astype(wide)
    out["nonfinite"] = int(nonfinite_mismatch(r, v).sum())
    both = np.isfinite(r) & np.isfinite(v)
    if both.any():
        err = np.abs(r[both] - v[both])
        out["max_abs"] = float(err.max())
        out["max_ulps"] = float((err / ulp(r[both], dtype)).max())
    return out


def _same_nonfinite(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.iscomplexobj(x):
        return ~np.isfinite(y)
    return (np.isnan(x) & np.isnan(y)) | (np.isposinf(x) & np.isposinf(y)) | (np.isneginf(x) & np.isneginf(y))


def nonfinite_mismatch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elements where one side is NaN, +inf or -inf and the other is not the same (complex:
    where one side is finite and the other is not)."""
    if np.iscomplexobj(a) or np.iscomplexobj(b):
        return np.isfinite(a) != np.isfinite(b)
    return (np.isnan(a) != np.isnan(b)) | (np.isposinf(a) != np.isposinf(b)) | (np.isneginf(a) != np.isneginf(b))


def ulp(ref: np.ndarray, dtype: str) -> np.ndarray:
    """One unit in the last place of `dtype` at each element's magnitude (at zero, that of 1)."""
    bits, _ = policy.FLOAT_FORMATS.get(dtype, (24, 0.0))
    mag = np.abs(np.real(ref)).astype(np.float64)
    _, exp = np.frexp(np.where(mag > 0, mag, 1.0))
    return np.maximum(np.ldexp(1.0, exp - bits), np.ldexp(1.0, -1074))
