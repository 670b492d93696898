"""Judgements in words and in one line of text: what a reader of the comment sees."""
from __future__ import annotations

import math

from triage import policy
from triage.model import Judgement

# The judgement's nonfinite line for finite elements of the arm where every replay gave a
# nonfinite value (`decide._nonfinite`).
FINITE_WHERE_NONE = "finite where every rounding of this computation is not"

STRIP_WIDTH = 41  # characters between the strip's ends; the reference sits in the middle


def strip(j: Judgement) -> str:
    """Where the arm's value falls against the float64 value (``│``): ``═`` as far as the
    rounding samples reach, ±T·σ with T the largest sample's statistic (the farthest any
    sample's farthest element lies, in σ of its element: a value of many elements has some
    several σ out in every rounding), ±2σ where no sample statistic was kept; ``[ ]`` the
    directed envelope; ``▲`` the arm (``«``/``»`` past the edge). The line spans ±4σ, or
    1.5 times that reach where it is wider."""
    if (j.value is None or j.reference is None or not j.sigma or not math.isfinite(j.value)
            or not math.isfinite(j.reference) or not math.isfinite(j.sigma)):
        return ""
    reach = j.max_sample_stat if j.max_sample_stat is not None and 0 < j.max_sample_stat < math.inf else 2.0
    half = STRIP_WIDTH // 2
    scale = max(4.0, 1.5 * reach) * j.sigma / half  # value units per character

    def pos(x: float) -> int:
        return half + int(round((x - j.reference) / scale)) if math.isfinite(x) else -1

    cells = ["─"] * STRIP_WIDTH
    for i in range(max(0, pos(j.reference - reach * j.sigma)), min(STRIP_WIDTH, pos(j.reference + reach * j.sigma) + 1)):
        cells[i] = "═"
    if j.envelope:
        for x, mark in ((j.envelope[0], "["), (j.envelope[1], "]")):
            if 0 <= pos(x) < STRIP_WIDTH:
                cells[pos(x)] = mark
    cells[half] = "│"
    where = pos(j.value)
    arm = "«" if where < 0 else "»" if where >= STRIP_WIDTH else "▲"
    line = "".join(cells)
    if arm == "▲":
        marker = " " * where + "▲"
    elif arm == "«":
        marker = "«"
    else:
        marker = " " * (STRIP_WIDTH - 1) + "»"
    return f"{line}\n{marker} {j.arm}"


def spread_text(j: Judgement) -> str:
    """'±3.1e-07 (6.2 significant digits at float32)' or 'a computational zero at float16'."""
    if j.status != "judged":
        return f"not judged: {j.reason}"
    width = f"±{j.sigma:.2g}" if j.sigma is not None and math.isfinite(j.sigma) else "spread"
    if policy.discrete(j.dtype) and j.envelope and j.sigma is not None:
        seen = j.envelope + ([j.reference] if j.reference is not None else [])
        low, high = min(seen), max(seen)
        return ("the same in every rounding (a discrete result)" if not j.sigma and low == high else
                f"{low:g} to {high:g} across roundings (a discrete result: rounding changes which one it takes)")
    if j.computational_zero and j.value is not None and not math.isfinite(j.value):
        # A nonfinite value inside: the replays reach it in some roundings and a finite value in
        # others (no scatter to quote, "±0" read as certainty).
        return (f"no digit at {j.precision_text}: some roundings of this computation give {j.value:g}, others a finite "
                "value")
    if j.computational_zero:
        return f"{width}: a computational zero at {j.precision_text} (every digit is rounding noise)"
    if j.digits is None and j.value is not None and not math.isfinite(j.value):
        return f"{j.value:g} in every rounding of this computation at {j.precision_text}"
    if j.digits is None and (j.nonfinite or "").endswith(FINITE_WHERE_NONE):
        return f"nonfinite in every rounding of this computation at {j.precision_text}"
    digits = f"{j.digits:.1f} significant digits" if j.digits is not None else "no significant digit"
    zeros = (f"; {j.zeros} of {j.numel} elements keep no significant digit, their rounding noise as large as "
             "themselves") if j.zeros else ""
    return f"{width} ({digits} at {j.precision_text}{zeros})"
