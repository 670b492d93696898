"""PyTorch's numerical accuracy policy, as the verdicts cite it.

Sections are those of ``docs/source/notes/numerical_accuracy.rst``; tolerances are
``torch.testing.assert_close``'s defaults; the float64-relative rule is dynamo's accuracy
check (``torch._dynamo.utils.same`` with ``fp64_ref``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NOTE_URL = "https://docs.pytorch.org/docs/stable/notes/numerical_accuracy.html"


@dataclass(frozen=True)
class Section:
    title: str
    anchor: str
    quote: str

    @property
    def url(self) -> str:
        return f"{NOTE_URL}#{self.anchor}" if self.anchor else NOTE_URL


GENERAL = Section(
    "Numerical accuracy (introduction)", "",
    "PyTorch is not guaranteed to produce bitwise identical results for floating point computations "
    "that are mathematically identical. […] CPU and GPU results can be different even for "
    "bitwise-identical inputs and even after controlling for the sources of randomness.")
BATCHED = Section(
    "Batched computations or slice computations", "batched-computations-or-slice-computations",
    "The mathematical libraries that we are calling, and PyTorch internal implementations of operations can "
    "produce slightly different results in this case, compared to non-batched computations.")
EXTREMAL = Section(
    "Extremal values", "extremal-values",
    "When inputs contain large values such that intermediate results may overflow the range of the "
    "used datatype, the end result may overflow too, even though it is representable in the original datatype.")
LINALG = Section(
    "Linear algebra (torch.linalg): Extremal values in linalg", "extremal-values-in-linalg",
    "If provided with ill-conditioned inputs, the result of these functions may vary when using the "
    "same inputs on different devices or when using different backends.")
TF32 = Section(
    "TensorFloat-32 (TF32) on Nvidia Ampere (and later) devices",
    "tensorfloat-32-tf32-on-nvidia-ampere-and-later-devices",
    "When an operation is performed using TF32 tensor cores, only the first 10 bits of the input mantissa are read.")
REDUCED_PRECISION = Section(
    "Reduced Precision Reduction for FP16 and BF16 GEMMs", "reduced-precision-reduction-for-fp16-and-bf16-gemms",
    "Certain GPU architectures […] allow a few truncations of the intermediate accumulation results to the reduced precision.")
NONE = Section("none: the accuracy note does not cover this outcome", "", "")

# assert_close defaults: dtype -> (rtol, atol)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}
# Mantissa bits (with the implicit bit) and the largest finite value, per floating dtype.
FLOAT_FORMATS: dict[str, tuple[int, float]] = {
    "float16": (11, 65504.0),
    "bfloat16": (8, 3.3895313892515355e38),
    "float32": (24, 3.4028234663852886e38),
    "float64": (53, 1.7976931348623157e308),
    "complex64": (24, 3.4028234663852886e38),
    "complex128": (53, 1.7976931348623157e308),
}
# The smallest normal value per floating dtype: below it, down to 0, the values are spaced
# evenly (the subnormals), by 2**(1 - bits) of it.
MIN_NORMAL: dict[str, float] = {
    "float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126, "float64": 2.0 ** -1022,
    "complex64": 2.0 ** -126, "complex128": 2.0 ** -1022,
}
DYNAMO_TOL = 1e-3


def half_ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """Half the spacing of `dtype`'s values at each of `values`: the most the arm's own final
    rounding moves a value there. Below the smallest normal the spacing is the subnormals',
    so at 0 it is half the smallest subnormal (for float32 2**-150), not 1's half ulp."""
    bits, _ = FLOAT_FORMATS.get(dtype, (53, math.inf))
    _, exp = np.frexp(np.maximum(np.abs(values), MIN_NORMAL.get(dtype, 2.0 ** -1022)))
    return np.asarray(np.ldexp(1.0, exp - bits - 1))  # an array for a 0-d one too (NumPy returns a scalar)


def spacing(values: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of `dtype`'s values at each of `values` (a complex dtype's parts'): where no
    simulated replay moves a value, one that far from it is still a rounding of it (PyTorch
    promises no correctly rounded kernel), and only a value past it is infinitely far. 0 for a
    discrete dtype."""
    if discrete(dtype):
        return np.zeros(np.shape(values))
    return 2 * half_ulp(values, "float16" if dtype == "complex32" else dtype)


def exceeding(stats: Sequence[float], unmoved: Sequence[int] | None, t: float, t_unmoved: int) -> int:
    """How many samples score at least as far out as a value of statistic `t`, the worker's
    early stop and the judge's p-value alike: an infinite score is compared by its count of
    elements off the reference where no other replay is (`unmoved`, where given). A sample
    alone off at one exact element scores inf; against a value off at hundreds of such
    elements it is not as far out (a float16 product 1 % off was 'inside' beside such a sample)."""
    if not math.isinf(t) or unmoved is None or len(unmoved) != len(stats):
        return sum(1 for x in stats if x >= t)
    return sum(1 for x, u in zip(stats, unmoved, strict=True) if math.isinf(x) and u >= t_unmoved)


def unit_roundoff(dtype: str) -> float:
    """2**-p for the dtype's p-bit significand (an unknown dtype: float32's)."""
    bits, _ = FLOAT_FORMATS.get(dtype, (24, 0.0))
    return 2.0 ** -bits


def discrete(dtype: str) -> bool:
    """An integer or boolean dtype: its values are counts, indices and decisions, which rounding
    moves from one value to another rather than by an error."""
    return dtype.startswith(("int", "uint", "bool"))


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, (0.0, 0.0))


def reference_tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol): how far from float64 a value may be and still 'agree with the reference'.
    Relative: dynamo's 1e-3, room for a computation's accumulated rounding. Absolute: the
    dtype's `assert_close` atol, not dynamo's 1e-3 — a float32 0 where float64 says -1e-4 has
    no correct digit, and a 1e-3 floor would call every value under 1e-3 in magnitude right."""
    rtol, atol = TOLERANCES.get(dtype, (DYNAMO_TOL, DYNAMO_TOL))
    return max(DYNAMO_TOL, rtol), atol


def rmse_multiplier(dtype: str, numel: int) -> float:
    return 3.0 if dtype in ("float16", "bfloat16") or numel < 1000 else 2.0


LABELS = {
    "numerical": "module: numerical-stability",
    "nonfinite": "module: NaNs and Infs",
    "tf32": "module: tf32",
    "silent": "module: correctness (silent)",
    "review": "triage review",
    "repro": "needs reproduction",
    "linalg": "module: linear algebra",
    "random": "module: random",
    "reproducibility": "module: numerical-reproducibility",
    "compile": "oncall: pt2",
    "gpu_confirmation": "needs GPU confirmation",
}


# A library kernel no measurement covers (`triage calibrate`) is taken to be within this many
# units of roundoff of its correctly rounded result, and the verdict names it.
UNMEASURED_U = 16.0
# The Monte Carlo test of "inside its own rounding spread": p > ALPHA is inside.
ALPHA = 0.05
# An "outside" decision whose statistic is within this factor of the largest simulated
# rounding is not evidence of another computation: the simulation's model of each op's error
# is measured on a finite set of inputs, and the largest of K samples is itself a noisy tail
# estimate that triage's own seed moves. The worker samples such a value, and one up to 1.5×
# past the margin, further (up to 199 replays: `rounding.FRAGILE_SAMPLED`); the audit still
# withholds a bug verdict. Real formula and compiler bugs sit orders of magnitude out.
FRAGILE_MARGIN = 4.0
# A spread that keeps no significant digit (a computational zero: the difference of two
# roundings of one quantity) says every value within its noise is as good as another, so none
# there is "outside" it. A value farther out than this many times the largest simulated
# rounding is not within that noise: no error in the model of any op's rounding is two orders
# of magnitude large, and a different computation (a backend that multiplies in bfloat16:
# 2¹⁶ times float32's unit roundoff) is.
NOISE_MARGIN = 100.0

# How many times the textbook backward-stable bound a correct linalg kernel may be off its
# exact answer (constants of the bounds, pivot growth, a blocked algorithm's extra terms)
# before its answer counts as another one (`triage.worker.independent`).
INDEPENDENT_SAFETY = 64.0
