"""Data reductions: after the op passes, the fewest and plainest input values that still diverge.

The op passes leave a few ops fed with arm A's recorded values: often hundreds of elements
printed to 17 digits, which a reader of a GitHub comment cannot take in.  These passes shrink
the data the way Hypothesis shrinks a test case — each a small named function, each keeping a
candidate only when the `ReductionProblem` predicate still holds (both arms, same
`DivergenceKind`), through `ReductionProblem.holds_with`:

``keep_diverging_elements``  elementwise cones (every input shaped like the diverging output):
                             keep one diverging position, else an aligned block of 2, 4, 8, 16
                             around it (a vectorized kernel), else the diverging positions
``shrink_dimensions``        every input dimension of one size cut to 1, else to either half,
                             repeated while a cut holds (ddmin over slices)
``simplify_values``          each floating value toward 0, 1, -1 and shorter decimals
                             (``5e+22`` rather than ``4.999999889098154e+22``), whole tensors first

A finite divergence must also stay as large: at least a quarter of its recorded size in ulps
(`ReductionProblem.min_ulps`), or ``expm1`` written as ``exp(x) - 1`` would shrink from a
cancellation at tiny x to one ulp at x = 1.  A candidate that an op cannot take (a shape baked
into a view, say) fails on both arms and is simply not kept.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from triage.minimize.problem import POSITIONS_KEPT, ReductionProblem
from triage.numerics.literals import FLOATING, literal, to_dtype

# A finite divergence keeps at least this share of its size in ulps: the reduced repro shows
# the same error, not merely some difference of the same kind.
SEVERITY_KEPT = 4
SIMPLIFIED_ELEMENTS = 64  # beyond this, values are left as they are (too many queries)

Values = dict[str, np.ndarray]


@dataclass
class DataReduction:
    """What the data passes did: input elements before and after, queries and seconds spent."""

    elements_before: int = 0
    elements_after: int = 0
    queries: int = 0
    seconds: float = 0.0
    failure: str | None = None  # why the inputs could not be read (nothing was reduced)


def reduce_data(p: ReductionProblem, ops: frozenset[str], timeout_s: float) -> DataReduction:
    """Shrink the inputs of `ops` in place of arm A's recorded values (kept in `p.overrides`)."""
    started, queries = time.monotonic(), p.queries
    plan = p.plan(ops)
    names = [n for n in plan.inputs if n not in plan.sources]
    header, arrays = p.a.request({"cmd": "inputs", "names": names}, timeout_s)
    if not header.get("ok"):
        return DataReduction(failure=f"{header.get('lost') or header.get('error')}")
    dtypes: dict[str, str] = dict(header.get("dtypes") or {})
    recorded = {n: arrays[n] for n in names if n in arrays}
    before = sum(a.size for a in recorded.values())

    def current() -> Values:
        return {n: p.overrides.get(n, a) for n, a in recorded.items()}

    if p.target.kind in ("rounding", "mismatch"):
        p.min_ulps = p.largest_ulps(ops) / SEVERITY_KEPT
    for reduction in DATA_PASSES:
        reduction(p, ops, current, dtypes)
    return DataReduction(elements_before=before, elements_after=sum(a.size for a in current().values()),
                         queries=p.queries - queries, seconds=round(time.monotonic() - started, 2))


def keep_diverging_elements(p: ReductionProblem, ops: frozenset[str], current: Callable[[], Values],
                            dtypes: dict[str, str]) -> None:
    outcome = p.outcome(ops)
    for name in p.diverging_outputs(ops):
        shape, where = outcome.positions.get(name, ((), []))
        large = {n: a for n, a in current().items() if a.size > 1}
        if not where or not large or any(a.shape != tuple(shape) for a in large.values()):
            continue
        size = int(np.prod(shape))
        first = where[0]
        blocks = [list(range(first - first % w, min(first - first % w + w, size))) for w in (2, 4, 8, 16)]
        for chosen in [where[:1], *blocks, sorted(where[:POSITIONS_KEPT])]:
            if len(chosen) < size and p.holds_with(ops, {n: a.reshape(-1)[chosen] for n, a in large.items()}):
                return


def shrink_dimensions(p: ReductionProblem, ops: frozenset[str], current: Callable[[], Values],
                      dtypes: dict[str, str]) -> None:
    while True:
        sizes = sorted({d for a in current().values() for d in a.shape if d > 1}, reverse=True)
        if not any(_cut_holds(p, ops, current(), size) for size in sizes):
            return


def _cut_holds(p: ReductionProblem, ops: frozenset[str], values: Values, size: int) -> bool:
    """Every dimension of length `size`, in every input, cut to one element, else to either half
    (overlapping by one when `size` is odd, so that every element is in one of them)."""
    half = (size + 1) // 2
    for part in (slice(0, 1), slice(0, half), slice(size - half, size)):
        if part.stop - part.start >= size:
            continue
        candidate = {n: _cut(a, size, part) for n, a in values.items() if size in a.shape}
        if p.holds_with(ops, candidate):
            return True
    return False


def _cut(a: np.ndarray, size: int, part: slice) -> np.ndarray:
    index = tuple(part if d == size else slice(None) for d in a.shape)
    return np.ascontiguousarray(a[index])


def simplify_values(p: ReductionProblem, ops: frozenset[str], current: Callable[[], Values],
                    dtypes: dict[str, str]) -> None:
    for name in list(current()):
        dtype = dtypes.get(name)
        if dtype not in FLOATING or current()[name].size > SIMPLIFIED_ELEMENTS:
            continue
        _simplify_whole(p, ops, name, current()[name], dtype)
        flat = current()[name].reshape(-1)
        for i in range(flat.size):
            for candidate in _simpler(float(flat[i]), dtype):
                changed = current()[name].reshape(-1).copy()
                changed[i] = candidate
                if p.holds_with(ops, {name: changed.reshape(current()[name].shape)}):
                    break


def _simplify_whole(p: ReductionProblem, ops: frozenset[str], name: str, values: np.ndarray, dtype: str) -> None:
    """All of a tensor's values rounded to 1, 2, … significant digits at once (the first that holds)."""
    longest = max((len(literal(float(v), dtype)) for v in values.reshape(-1)), default=0)
    for digits in range(1, 8):
        rounded = np.array([_round(float(v), digits, dtype) for v in values.reshape(-1)],
                           dtype=values.dtype).reshape(values.shape)
        if max((len(literal(float(v), dtype)) for v in rounded.reshape(-1)), default=0) >= longest:
            return
        if p.holds_with(ops, {name: rounded}):
            return


def _simpler(value: float, dtype: str) -> list[float]:
    """Values with a strictly shorter literal than `value`'s, simplest first."""
    if not np.isfinite(value):
        return []
    length = len(literal(value, dtype))
    found: list[float] = []
    for c in [1.0, 0.0, -1.0 if value < 0 else 2.0] + [_round(value, d, dtype) for d in range(1, 8)]:
        if len(literal(c, dtype)) < length and c not in found:
            found.append(c)
    return found


def _round(value: float, digits: int, dtype: str) -> float:
    if not np.isfinite(value):
        return value
    return to_dtype(float(f"{value:.{digits}g}"), dtype)


DATA_PASSES = [keep_diverging_elements, shrink_dimensions, simplify_values]
