"""Where an arm's value falls in its own rounding spread: inside, in the directed envelope,
or outside (a Monte Carlo test on one statistic per tensor)."""
from __future__ import annotations

import numpy as np

from triage import policy
from triage.judge.describe import FINITE_WHERE_NONE, strip
from triage.judge.spread import RoundingSpread
from triage.model import ArmRun, Judgement, Observable

ALPHA = policy.ALPHA


def deviation_stat(value: np.ndarray, ref: np.ndarray, sigma: np.ndarray,
                   noise: np.ndarray | None = None, slack: np.ndarray | float = 0.0) -> tuple[float, int | None]:
    """T = max over elements finite in both of |value − ref| / σ (the worker's samples were
    scored the same way), and the element where it is reached. Elements in `noise`
    (computational zeros: the spread is as wide as the value) are left out: every value is
    consistent with a spread that keeps no digit, so none can be "outside" it. The samples'
    statistics include them, which only makes the test more conservative. Where σ is 0, a
    value within `slack` (`policy.spacing`) of the reference scores 0, one past it inf."""
    both = np.isfinite(value) & np.isfinite(ref)
    if noise is not None:
        both = both & ~noise.reshape(both.shape)
    if not both.any():
        return 0.0, None
    with np.errstate(divide="ignore", invalid="ignore"):  # inf - inf where both are infinite: left out by `both`
        dev = np.abs(value - ref)
        ratio = np.where(sigma > 0, dev / np.where(sigma > 0, sigma, 1.0), np.where(dev > slack, np.inf, 0.0))
    ratio = np.where(both, ratio, -1.0)
    i = int(np.argmax(ratio))
    return float(ratio.reshape(-1)[i]), i


def unmoved_count(value: np.ndarray, ref: np.ndarray, sigma: np.ndarray, noise: np.ndarray | None = None,
                  slack: np.ndarray | float = 0.0) -> int:
    """Elements finite in both (and not in `noise`) where the value is past `slack` from the
    reference and no sample moves (σ 0): each makes T infinite; their count orders two infinite
    statistics."""
    both = np.isfinite(value) & np.isfinite(ref)
    if noise is not None:
        both = both & ~noise.reshape(both.shape)
    with np.errstate(invalid="ignore"):
        return int(((sigma == 0) & (np.abs(value - ref) > slack) & both).sum())


def exceeding(spread: RoundingSpread, t: float, unmoved: int) -> int:
    """The samples that score at least as far out as a value of statistic `t` (`policy.exceeding`)."""
    return policy.exceeding(spread.sample_stats, spread.sample_unmoved, t, unmoved)


def judge_value(value: np.ndarray, spread: RoundingSpread, arm: str, observable: int, label: str,
                line: int | None, zeros_exempt: bool = True) -> Judgement:
    """Judge one value (an arm's, or an ablated run's) against a rounding spread.
    `zeros_exempt`: computational zeros cannot be outside (an arm's own value there is as
    noisy as the spread); False for a value from elsewhere (a reporter's), which can be far
    beyond the noise of a computation that keeps no digit."""
    v = np.asarray(value)
    v = np.stack([v.real, v.imag], axis=-1).astype(np.float64) if np.iscomplexobj(v) else v.astype(np.float64)
    j = Judgement(arm=arm, observable=observable, label=label, line=line, dtype=spread.precision or spread.dtype,
                  status="judged", samples=spread.samples, numel=int(v.size),
                  stored=spread.dtype if spread.precision and spread.precision != spread.dtype else None)
    if v.shape != spread.reference.shape:
        j.status, j.reason = "not-judged", "the value's shape differs from the simulated one"
        return j
    j.digits = spread.digits()
    zeros = spread.computational_zeros()
    j.zeros = int(zeros.sum())
    j.computational_zero = bool(zeros.all()) and v.size > 0
    j.wide = spread.wide()
    j.fewest_digits = spread.fewest_digits()
    j.poorly_determined = spread.poorly_determined()
    j.unmeasured = list(spread.unmeasured)
    j.nonfinite, offending = _nonfinite(v, spread)
    noise = zeros if zeros_exempt else None
    slack = policy.spacing(spread.reference, spread.dtype)
    t, at = deviation_stat(v, spread.reference, spread.sigma, noise, slack)
    j.statistic = t
    j.p = (1 + exceeding(spread, t, unmoved_count(v, spread.reference, spread.sigma, noise, slack))) \
        / (spread.samples + 1)
    finite_stats = spread.sample_stats[np.isfinite(spread.sample_stats)]
    j.max_sample_stat = float(finite_stats.max()) if finite_stats.size else None
    flat = lambda a, i: float(np.asarray(a, dtype=np.float64).reshape(-1)[i])  # noqa: E731
    if offending is not None:
        # The value is judged by its non-finite elements: show one of those.
        j.element = offending if v.size > 1 else None
        j.value, j.reference, j.sigma = flat(v, offending), flat(spread.reference, offending), None
    elif at is not None:
        j.element = at if v.size > 1 else None
        j.value, j.reference, j.sigma = flat(v, at), flat(spread.reference, at), flat(spread.sigma, at)
        lo, hi = sorted((flat(spread.down, at), flat(spread.up, at)))
        j.envelope = [min(lo, j.reference), max(hi, j.reference)]
    elif v.size:
        # No element finite on both sides (an exact inf): show the first, with the samples' own scatter.
        j.element = 0 if v.size > 1 else None
        j.value, j.reference, j.sigma = flat(v, 0), flat(spread.reference, 0), flat(spread.sd, 0)
    inside_envelope = _inside_envelope(v, spread)
    if j.nonfinite and j.nonfinite.startswith("outside"):
        j.zone = "outside"
    elif j.p > ALPHA:
        j.zone = "inside"
    elif inside_envelope:
        j.zone = "envelope"
    elif _at_nearest(v, spread, zeros if zeros_exempt else None):
        j.zone, j.nearest = "envelope", True
    else:
        j.zone = "outside"
    j.unstable = _unstable(spread)
    j.ties = [f"`{f['op']}` (line {f['line']})" for f in spread.flips if f.get("ties")]
    if j.zone == "outside" and _rounded_alike(v, spread):
        j.status, j.zone = "not-judged", None
        j.reason = (f"a count or mask of comparisons that rounding decides ({spread.flips[0]['op']} differs in "
                    f"{spread.flips[0]['replays']} of {spread.flips[0]['of']} replays): the replays round the compared "
                    "values independently, which round-to-nearest does not, so its spread is no measure of the arm's")
    j.strip = strip(j)
    return j


def judge_observable(run: ArmRun, o: Observable) -> Judgement:
    """An arm's own value against its own spread (or why it cannot be judged)."""
    spread = RoundingSpread.of(o)
    if spread is None or o.value is None:
        why = (o.rounding or {}).get("reason") or _why_not(run, o)
        return Judgement(arm=run.spec, observable=o.index, label=o.shown, line=o.line,
                         dtype=(o.fingerprint or {}).get("dtype", "?"), status="not-judged", reason=why)
    return judge_value(o.value, spread, run.spec, o.index, o.shown, o.line)


# Comparisons whose count of True values round-to-nearest keeps low (nearly equal values
# round alike: their difference) or high (their equality).
DIFFERENCES_FLIP = {"aten.ne", "aten.logical_xor"}
EQUALITIES_FLIP = {"aten.eq", "aten.isclose"}


def _rounded_alike(v: np.ndarray, spread: RoundingSpread) -> bool:
    """A count or mask of comparisons that rounding decides, outside its spread on the side
    round-to-nearest takes: the random replays round the two compared values independently,
    so they part where round-to-nearest rounds nearly equal values alike (bfloat16 outputs of
    two formulas 6e-5 apart: 1,536 differ on the arm, tens of thousands in every replay). That
    side says nothing of the arithmetic, which the compared values themselves are judged on;
    the other (every element differing, where rounding parts a few) still does."""
    if not spread.flips or spread.dtype.startswith(("float", "bfloat", "complex")):
        return False
    ops = {f["op"] for f in spread.flips}
    fewer = float(np.nansum(v)) < float(np.nansum(spread.mean))
    return bool(ops & DIFFERENCES_FLIP) and fewer or bool(ops & EQUALITIES_FLIP) and not fewer


def _why_not(run: ArmRun, o: Observable) -> str:
    if o.value is None:
        return "its value was not kept (over the value budget)"
    if (o.reference or {}).get("fingerprint") is None:
        return "it has no float64 reference" + (f" ({o.reference['note']})" if (o.reference or {}).get("note") else "")
    if not (run.rounding or {}).get("samples"):
        return (run.rounding or {}).get("note") or "the rounding simulation did not run"
    return "not simulated"


def _at_nearest(v: np.ndarray, spread: RoundingSpread, exempt: np.ndarray | None) -> bool:
    """The value lies within the random replays' spread taken around the replay that rounds
    every op to nearest, as the arm does: its distance from that replay, in σ, is one the
    samples reach from float64. Rounding to nearest can be biased where random rounding is
    not (a loop's `t = t + h` drops the same part of an ulp at every step: 13 ulps in 200,
    all one way, where random rounding walks 4), and a value that replay reproduces is that
    bias, not another computation: a wrong formula or kernel misses it as far as float64."""
    centre = spread.centre
    # A count or mask of comparisons is no arithmetic to be biased (`_rounded_alike`).
    if centre is None or np.shape(centre) != np.shape(v) or not np.isfinite(centre).all() \
            or not spread.dtype.startswith(("float", "bfloat", "complex")):
        return False
    slack = policy.spacing(centre, spread.dtype)
    t, _ = deviation_stat(v, centre, spread.sigma, exempt, slack)
    return (1 + exceeding(spread, t, unmoved_count(v, centre, spread.sigma, exempt, slack))) / (spread.samples + 1) \
        > ALPHA


def _nonfinite(v: np.ndarray, spread: RoundingSpread) -> tuple[str | None, int | None]:
    """How the arm's nonfinite values relate to the replays' (None: no nonfinite anywhere),
    and the first (flat) element no rounding of the computation explains."""
    bits = spread.nonfinite.astype(np.uint8)
    ref = spread.reference
    seen = {"+inf": (bits & 2) > 0, "-inf": (bits & 4) > 0, "nan": (bits & 8) > 0}
    reached = {"+inf": seen["+inf"] | np.isposinf(ref), "-inf": seen["-inf"] | np.isneginf(ref),
               "nan": seen["nan"] | np.isnan(ref)}
    own = {"+inf": np.isposinf(v), "-inf": np.isneginf(v), "nan": np.isnan(v)}
    for kind, mask in own.items():
        bad = mask & ~reached[kind]
        if bad.any():
            return (f"outside: {int(bad.sum())} element(s) {kind} where no rounding of this computation gives {kind}",
                    int(np.flatnonzero(bad.reshape(-1))[0]))
    # Only a replay makes a finite value possible: a finite float64 value whose every rounding
    # at the arm's precision overflows was not what the program asked for.
    bad = np.isfinite(v) & ((bits & 1) == 0)
    if bad.any():
        return (f"outside: {int(bad.sum())} element(s) {FINITE_WHERE_NONE}",
                int(np.flatnonzero(bad.reshape(-1))[0]))
    if any(m.any() for m in own.values()):
        return "inside: the same non-finite values occur under this computation's own rounding", None
    if any(m.any() for m in reached.values()):
        return "inside: finite, as some roundings of this computation are", None
    return None, None


def _inside_envelope(v: np.ndarray, spread: RoundingSpread) -> bool:
    """Every finite element within the directed replays (and the reference), widened by half
    a unit in the last place for the arm's own final rounding."""
    lo = np.minimum(np.minimum(spread.up, spread.down), spread.reference)
    hi = np.maximum(np.maximum(spread.up, spread.down), spread.reference)
    both = np.isfinite(v) & np.isfinite(lo) & np.isfinite(hi)
    if not both.any():
        return True
    half_ulp = policy.half_ulp(v, spread.dtype)
    return bool(((v >= lo - half_ulp) & (v <= hi + half_ulp))[both].all())


# The judgement's line for elements some replays make finite and others not (a singular
# matrix's logdet): they keep no digit, which the ill-conditioned verdict says in its own words.
FINITE_UNDER_SOME = "element(s) are finite under some roundings and not under others"


def _unstable(spread: RoundingSpread) -> list[str]:
    out = [f"`{f['op']}` (line {f['line']}) decides otherwise than the replay rounded to nearest in "
           f"{f['replays']} of {f['of']} replays" for f in spread.flips]
    n = spread.unstable_nonfinite()
    if n:
        out.append(f"{n} {FINITE_UNDER_SOME}")
    return out
