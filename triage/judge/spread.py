"""The simulated rounding of one observed value, as the parent reads it: the arrays the
worker shipped plus the figures a reader wants (significant digits, computational zero)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triage import policy
from triage.judge.stats import cnh_penalty_bits, student_t
from triage.model import Observable
from triage.worker.protocol import SPREAD_ARRAYS

# Digits lost to the computation itself (beyond the dtype's own precision) from which the
# spread is called wide: rounding errors amplified a thousandfold, ill-conditioned at this dtype.
WIDE_DIGITS_LOST = 3.0
# Or digits kept below which it is wide whatever the dtype: bfloat16 has 2.4 to lose, so no
# loss of 3 is possible, yet a bfloat16 value that keeps no digit is as ill-conditioned.
WIDE_DIGITS_KEPT = 1.0


def unstable(nonfinite_bits: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Per element of `like`: the replays were finite in some and not in others, or nonfinite
    in different ways (`nonfinite_bits`: 1 finite, 2 +inf, 4 -inf, 8 nan, OR-ed over replays)."""
    bits = np.asarray(nonfinite_bits, np.uint8)
    if bits.size != np.size(like):
        return np.zeros(np.shape(like), bool)
    kinds = (bits & 1).astype(int) + ((bits >> 1) & 1) + ((bits >> 2) & 1) + ((bits >> 3) & 1)
    return (kinds > 1).reshape(np.shape(like))


@dataclass
class RoundingSpread:
    dtype: str  # the value's dtype on the arm
    samples: int
    sample_stats: np.ndarray  # T of each sample (leave-one-out)
    reference: np.ndarray  # the unperturbed float64 value
    sigma: np.ndarray  # RMS deviation of the samples from the reference
    up: np.ndarray  # the directed replays
    down: np.ndarray
    mean: np.ndarray
    sd: np.ndarray
    nonfinite: np.ndarray  # uint8 bits per element over the random replays: 1 finite, 2 +inf, 4 -inf, 8 nan
    flips: list[dict[str, Any]] = field(default_factory=list)
    precision: str | None = None  # the least precise dtype the computation ran in
    unmeasured: list[str] = field(default_factory=list)  # library ops modelled by the conservative bound
    centre: np.ndarray | None = None  # the replay rounding every op to nearest, as the arm does
    # Of each sample, its elements off the reference where no other sample is (an infinite T_k's
    # weight, `exceeding`); None where the worker did not say (every infinite T_k then counts).
    sample_unmoved: np.ndarray | None = None
    # Per-element figures, each a few passes over the arrays (a million-element value: tens of
    # ms each), computed once: the judge and the ladder ask for them many times.
    _figures: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _once(self, name: str, compute: Any) -> Any:
        if name not in self._figures:
            self._figures[name] = compute()
        return self._figures[name]

    @classmethod
    def of(cls, o: Observable) -> RoundingSpread | None:
        """The spread of an arm's observed value, or None where it has none (read once per value)."""
        read_from = (o.spread, o.reference_value, o.rounding)
        if o.spread_reading is None or any(a is not b for a, b in zip(o.spread_reading[0], read_from, strict=True)):
            o.spread_reading = (read_from, cls._read(o))
        return o.spread_reading[1]

    @classmethod
    def _read(cls, o: Observable) -> RoundingSpread | None:
        r, s = o.rounding or {}, o.spread or {}
        # The to-nearest replay ("ct") is optional: a spread without it is judged as before it was kept.
        if r.get("status") != "judged" or o.reference_value is None \
                or not all(k in s for k in SPREAD_ARRAYS if k != "ct"):
            return None
        ref = np.asarray(o.reference_value, dtype=np.complex128 if np.iscomplexobj(o.reference_value) else np.float64)
        if np.iscomplexobj(ref):
            ref = np.stack([ref.real, ref.imag], axis=-1)
        if ref.shape != s["sig"].shape:
            return None
        stats = np.array([float(x) for x in r.get("sample_stats", [])], dtype=np.float64)
        unmoved = r.get("sample_unmoved")
        return cls(dtype=(o.fingerprint or {}).get("dtype", "float32"), samples=int(r.get("samples", 0)),
                   sample_stats=stats, reference=ref, sigma=s["sig"], up=s["up"], down=s["dn"], mean=s["mu"],
                   sd=s["sd"], nonfinite=s["nf"], flips=list(r.get("flips") or []),
                   precision=r.get("precision") or None, unmeasured=list(r.get("unmeasured") or []),
                   centre=s.get("ct"),
                   sample_unmoved=np.array(unmoved, dtype=np.int64) if unmoved and len(unmoved) == len(stats)
                   else None)

    @classmethod
    def of_simulation(cls, spread: Any, reference: np.ndarray, dtype: str) -> RoundingSpread:
        """From the worker's `NodeSpread` directly (in-process use: benchmarks, tests)."""
        arrays = {k: getattr(spread, k).numpy() for k in ("sigma", "up", "down", "mean", "sd", "nonfinite")}
        return cls(dtype=dtype, samples=spread.samples, sample_stats=np.array(spread.sample_stats, dtype=np.float64),
                   reference=np.asarray(reference, dtype=np.float64), sigma=arrays["sigma"], up=arrays["up"],
                   down=arrays["down"], mean=arrays["mean"], sd=arrays["sd"], nonfinite=arrays["nonfinite"],
                   flips=list(spread.flips), precision=spread.precision,
                   centre=spread.centre.numpy() if spread.centre is not None else None,
                   sample_unmoved=np.array(spread.sample_unmoved, dtype=np.int64)
                   if len(spread.sample_unmoved) == len(spread.sample_stats) and spread.sample_stats else None)

    @property
    def dtype_digits(self) -> float:
        """Decimal digits of the precision the value was computed in."""
        bits, _ = policy.FLOAT_FORMATS.get(self.precision or self.dtype, (53, math.inf))
        return bits * math.log10(2)

    def element_digits(self) -> np.ndarray:
        """Significant decimal digits of each element at the arm's precision (CNH estimator,
        capped at the dtype's own); NaN for computational zeros. Where every sample gave the
        same value, the directed replays' distance from it takes the samples' place: random
        rounding can agree by chance (`1 + 1e-10` rounds to 1 in all but a few of 10^6
        float32 roundings) where rounding up does not, and only an exact result (no replay
        moves it) keeps every digit."""
        return self._once("digits", self._element_digits)

    def _element_digits(self) -> np.ndarray:
        envelope = self.envelope_width()
        with np.errstate(divide="ignore", invalid="ignore"):
            sampled = -np.log10(self.sd / np.abs(self.mean)) - cnh_penalty_bits(self.samples) * math.log10(2)
            directed = -np.log10(envelope / np.abs(self.mean))
        digits = np.where(self.sd > 0, sampled, np.where(envelope > 0, directed, self.dtype_digits))
        # No finite sample (inf in every replay): no digits to count.
        digits = np.where(self.finite_samples(), digits, np.nan)
        return np.where(self.computational_zeros(), np.nan, np.minimum(digits, self.dtype_digits))

    def finite_samples(self) -> np.ndarray:
        """Per element: some random replay gave a finite value (the mean and sd are of those)."""
        bits = np.asarray(self.nonfinite, np.uint8)
        if bits.size != np.size(self.sd):
            return np.ones(np.shape(self.sd), bool)
        return (bits & 1).astype(bool).reshape(np.shape(self.sd))

    def envelope_width(self) -> np.ndarray:
        """Per element, how far the directed replays (every rounding up, every rounding down)
        lie from the samples' mean: inf where one of them is not finite."""
        return self._once("envelope", self._envelope_width)

    def _envelope_width(self) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            width = np.maximum(np.abs(np.asarray(self.up, np.float64) - self.mean),
                               np.abs(np.asarray(self.down, np.float64) - self.mean))
        return np.where(np.isnan(width) & np.isfinite(self.mean), np.inf, width)

    def computational_zeros(self) -> np.ndarray:
        """Elements whose simulated mean is indistinguishable from 0 given their own noise
        (CADNA): every digit is rounding noise. An exact 0 (no spread) is not one. So is an
        element that some roundings make finite and others not (the logdet of a singular
        matrix): its finite replays' spread says nothing of how far apart two finite results
        may lie."""
        return self._once("zeros", self._computational_zeros)

    def _computational_zeros(self) -> np.ndarray:
        envelope = self.envelope_width()
        t = student_t(0.975, max(self.samples - 1, 1))
        finite = np.isfinite(self.mean) & np.isfinite(self.sd)
        noise = finite & (self.sd > 0) & (np.abs(self.mean) < t * self.sd / math.sqrt(max(self.samples, 1)))
        # Samples that agree by chance (`element_digits`) on a value the directed replays move
        # by at least its own size: `log(1 + x)` of a tiny x, 0 in the samples, 2^-23 rounded up.
        absorbed = (finite & self.finite_samples() & (self.sd == 0) & (envelope > 0)
                    & (np.abs(self.mean) <= envelope))
        return noise | absorbed | self.unstable_elements()

    def unstable_elements(self) -> np.ndarray:
        """Elements that some replays make finite and others not, or nonfinite differently."""
        return self._once("unstable", lambda: unstable(self.nonfinite, self.sd))

    def digits(self) -> float | None:
        """Significant digits of a typical element (the median over the elements that are not
        computational zeros): one near-zero output of a matmul does not make a model
        ill-conditioned."""
        d = self._finite_digits()
        return self._once("median", lambda: float(max(np.median(d), 0.0)) if d.size else None)

    def fewest_digits(self) -> float | None:
        d = self._finite_digits()
        return float(max(d.min(), 0.0)) if d.size else None

    def _finite_digits(self) -> np.ndarray:
        return self._once("finite digits", lambda: self.element_digits()[np.isfinite(self.element_digits())])

    def wide(self) -> bool:
        """The computation itself loses most of the precision: ill-conditioned at this dtype."""
        d = self.digits()
        all_zero = bool(self.computational_zeros().all()) and self.sd.size > 0
        return all_zero or (d is not None and d <= self.wide_below)

    def poorly_determined(self) -> int:
        """Elements whose computation loses most of the dtype's digits (computational zeros
        included): an eigenvector pair of close eigenvalues in an otherwise accurate result."""
        d = self.element_digits()
        return int(self.computational_zeros().sum() + (np.isfinite(d) & (d <= self.wide_below)).sum())

    @property
    def wide_below(self) -> float:
        """Significant digits at or below which a value is ill-conditioned at its precision."""
        return max(self.dtype_digits - WIDE_DIGITS_LOST, WIDE_DIGITS_KEPT)

    def unstable_nonfinite(self) -> int:
        """How many elements some replays make finite and others not, or nonfinite differently."""
        return int(self.unstable_elements().sum())
