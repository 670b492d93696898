"""Float literals as triage's scripts write them: the shortest decimal that is exactly the value
in its dtype (``5e+22``, not the float32's ``4.999999889098154e+22``).

Used on both sides — by the data passes in triage's own process (a simpler value is one with a
shorter literal) and by the warm worker that writes the script — so numpy only, no torch.
"""
from __future__ import annotations

import numpy as np

# The dtypes whose values round-trip through these functions (bfloat16 computed on float32).
FLOATING = {"float16": np.float16, "bfloat16": np.float32, "float32": np.float32, "float64": np.float64}


def to_dtype(value: float, dtype: str) -> float:
    """`value` rounded to `dtype` (bfloat16: float32's top 16 bits, rounded to nearest even)."""
    if dtype == "bfloat16":
        bits = np.array([value], dtype=np.float32).view(np.uint32)
        if np.isfinite(value):
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)
        return float(bits.view(np.float32)[0])
    with np.errstate(over="ignore"):
        return float(FLOATING[dtype](value))


def held_in(values: np.ndarray, dtype: str) -> bool:
    """Every finite element of the float64 array `values` is a number of the narrower `dtype`
    (a float32 result read into a float64), and there is one; False for a dtype not narrower."""
    finite = values[np.isfinite(values)]
    if dtype not in ("float32", "float16", "bfloat16") or not finite.size:
        return False
    with np.errstate(over="ignore"):
        narrow = finite.astype(np.float16 if dtype == "float16" else np.float32)
    if not np.array_equal(narrow.astype(np.float64), finite):
        return False
    # A bfloat16 number is a float32 whose low 16 bits are zero.
    return dtype != "bfloat16" or not bool((narrow.view(np.uint32) & np.uint32(0xFFFF)).any())


def literal(value: float, dtype: str) -> str:
    """The shortest decimal that gives exactly `value` in `dtype`; nonfinite as ``float("inf")``."""
    if not np.isfinite(value):
        return f'float("{value}")'
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        if to_dtype(float(text), dtype) == value and np.copysign(1, float(text)) == np.copysign(1, value):
            return text
    return repr(value)
