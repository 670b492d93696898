"""Stage 5b: the evidence audit — a verdict never contradicts its own evidence.

The ladder (classify/ladder.py) picks the first rung that holds; each rung reads part of the
evidence.  Before a verdict is shown, it is checked against the raw evidence the rungs did
not read: what the arms printed, the script's own checks, the figures its sentences rest on.
Each invariant is one function of (verdict, comparison) returning the conflicts it finds, in
words a maintainer can check against the report.  Any conflict turns the verdict into
**inconclusive** (label `triage review`, exit 0): it says what conflicts, with the evidence,
and what the ladder alone would have said.  A bot that says "I am not sure" costs a
maintainer a look; one that is confidently wrong harms a reporter or hides a bug.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from triage import policy
from triage.compare import unrecorded_inputs
from triage.judge.decide import FINITE_UNDER_SOME
from triage.judge.describe import FINITE_WHERE_NONE
from triage.judge.spread import unstable
from triage.model import ArmRun, Comparison, Judgement, Verdict, compared_runs

# A printed number: what an arm's stdout shows of a value triage may not observe as a tensor
# (a Python float, `max_diff: 1.97`).
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|inf|nan)(?![\w.])")
# Lines whose numbers differ from run to run by nature: timings, sizes, addresses, ids.
UNSTABLE_LINE = re.compile(r"\b(time|times|timing|took|elapsed|seconds?|secs?|ms|us|µs|ns|s/it|it/s|speed|fps|"
                           r"throughput|latency|memory|bytes|[KMG]i?B|pid|port|id|address|0x[0-9a-f]+|date|"
                           r"clock|duration|perf|bench\w*)\b", re.IGNORECASE)
# The script printing the outcome of its own comparison (`reproducible: False`).
FAILED_COMPARISON = re.compile(r"\b(reproduc\w*|determinis\w*|equal\w*|same|identical|match\w*|close|allclose|"
                               r"consistent|agree\w*|ok|pass\w*)\b[^\n]{0,40}?\bFalse\b", re.IGNORECASE)
MAX_PRINTED_LINES = 2000
# How far two sides may lie apart, in units of their combined rounding spread, before "the
# rounding of this computation gives differences this large" is false.
SPREAD_MULTIPLE = 16.0
FRAGILE_MARGIN = policy.FRAGILE_MARGIN
NOISE_MARGIN = policy.NOISE_MARGIN


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What a verdict is checked against: the comparison (the arms' runs, their output, the
    judged divergence) and, where the minimizer ran, its replay of the recorded op graph."""

    comparison: Comparison
    replay: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Conflict:
    invariant: str  # the function that found it
    statement: str  # one sentence, with the evidence


def audit(verdict: Verdict, evidence: Evidence) -> list[Conflict]:
    """Every invariant's conflicts with this verdict (none: it may be shown as it is)."""
    if verdict.kind in ("could-not-run", "inconclusive"):
        return []
    found: list[Conflict] = []
    for invariant in INVARIANTS:
        found += [Conflict(invariant.__name__, text) for text in invariant(verdict, evidence)]
    return found


def inconclusive(verdict: Verdict, conflicts: list[Conflict]) -> Verdict:
    """The verdict withdrawn: what conflicts, and what the ladder alone would have said."""
    said = "; ".join(c.statement for c in conflicts[:3])
    return Verdict(kind="inconclusive", expected=None, policy_section=policy.NONE.title, policy_url=policy.NONE.url,
                   labels=[policy.LABELS["review"]],
                   summary=(f"triage is not sure, and says so rather than guess: the evidence conflicts — {said}. "
                            f"What the verdict ladder alone would say ({verdict.kind}): {verdict.summary}"),
                   evidence=list(dict.fromkeys([f"conflict: {c.statement}" for c in conflicts] + verdict.evidence)),
                   conflicts=[c.statement for c in conflicts], withdrawn=verdict.kind)


# -- invariants ---------------------------------------------------------------------------
def printed_differences_accounted(verdict: Verdict, e: Evidence) -> list[str]:
    """"Nothing diverges" never stands beside printed numbers that differ between the arms,
    or beside the script printing that its own comparison came out False."""
    c = e.comparison
    if verdict.kind != "not-reproduced":
        return []
    runs = _completed(c)
    out = []
    for other in runs[1:]:
        for line_a, line_b in _differing_prints(runs[0].stdout, other.stdout)[:2]:
            out.append(f"`{runs[0].spec}` prints `{line_a}` where `{other.spec}` prints `{line_b}`")
    for run in runs:
        lines = run.stdout.splitlines()[:MAX_PRINTED_LINES]
        said = next((line.strip() for line in lines if FAILED_COMPARISON.search(line)), None)
        if said:
            out.append(f"`{run.spec}` prints `{_short(said)}`: the script's own comparison fails")
    return out


def failed_check_reported(verdict: Verdict, e: Evidence) -> list[str]:
    """A check of the script's that failed is never reported as "every comparison holds"."""
    c = e.comparison
    if verdict.kind != "not-reproduced":
        return []
    failed = [r for r in _completed(c) if r.exception and r.exception.get("claim")]
    if not failed or "check fails" in verdict.summary:
        return []
    run = failed[0]
    note = run.exit_note or f"the script's own check failed ({run.exception.get('type')} at line {run.exception.get('line')})"
    return [f"on `{run.spec}` {note}, although every value triage observed agrees with its float64 reference — "
            "which runs the same kernels, so a kernel wrong in every precision agrees with itself"]


def rounding_explains_difference(verdict: Verdict, e: Evidence) -> list[str]:
    """A verdict that calls a difference rounding holds numerically: the two sides lie no
    farther apart than their rounding spreads reach."""
    c = e.comparison
    d = c.divergence
    if verdict.kind not in ("expected-rounding", "expected-ill-conditioned") or d is None or d.b is None:
        return []
    if d.within_tolerance or d.bit_difference is not None or not _all_inside(d.judgements, 2):
        return []
    found = c.find(d.a), c.find(d.b)
    if None in found:
        return []
    (_, oa), (_, ob) = found
    if oa.value is None or ob.value is None or not oa.spread or not ob.spread:
        return []
    sa, sb = oa.spread.get("sig"), ob.spread.get("sig")
    if sa is None or sb is None or not (oa.value.shape == ob.value.shape == sa.shape == sb.shape):
        return []
    va, vb = oa.value.astype(np.float64), ob.value.astype(np.float64)
    width = np.sqrt(sa.astype(np.float64) ** 2 + sb.astype(np.float64) ** 2)
    # An element some roundings make non-finite has no width its finite replays could bound.
    bounded = ~unstable(oa.spread.get("nf", ()), sa) & ~unstable(ob.spread.get("nf", ()), sb)
    both = np.isfinite(va) & np.isfinite(vb) & np.isfinite(width) & bounded
    gap = np.abs(va - vb)
    # Two roundings at the coarser precision either side was computed in: a value computed in
    # bfloat16 and read as float32 (`out.float()` under autocast) rounds at bfloat16's 2^-8,
    # which its samples' spread misses where they all round to the same neighbour.
    u = max(policy.unit_roundoff(j.dtype) for j in d.judgements)
    # Rounding every op up, then down, reaches as far as the directed replays part: a value
    # clamped where a cancellation's sign falls (sqrt(max(0, ‖a‖² + ‖b‖² − 2a·b)) at points far
    # from the origin) keeps most samples at 0 and a σ of its distance to it, while its
    # roundings give anything from 0 to several units.
    reach = directed_reach(oa.spread, va.shape) + directed_reach(ob.spread, va.shape)
    beyond = both & (gap > SPREAD_MULTIPLE * width + 2 * u * np.abs(va)) & (gap > reach)
    if not beyond.any():
        return []
    i = int(np.flatnonzero(beyond)[np.argmax(gap[beyond])])
    return [f"{d.a.label} and {d.b.label} differ by {gap.flat[i]:.3g} at element {i}, where their rounding spreads "
            f"reach only ±{float(sa.flat[i]):.2g} and ±{float(sb.flat[i]):.2g}: rounding of these computations "
            "does not give a difference this large"]


def directed_reach(spread: dict, shape: tuple) -> np.ndarray:
    """Per element, how far apart the directed replays (all up, all down) land; 0 where not
    recorded."""
    up, down = spread.get("up"), spread.get("dn")
    if up is None or down is None or np.shape(up) != shape or np.shape(down) != shape:
        return np.zeros(shape)
    return np.nan_to_num(np.abs(np.asarray(up, np.float64) - np.asarray(down, np.float64)), nan=0.0, posinf=0.0)


def finite_claim_consistent(verdict: Verdict, e: Evidence) -> list[str]:
    """"Finite where every rounding is not" contradicts no "finite under some roundings" note
    on the same value."""
    c = e.comparison
    d = c.divergence
    if d is None or verdict.kind != "nonfinite-flip" or verdict.expected is not False:
        return []  # only that verdict rests on "finite where every rounding is not"
    out = []
    for j in d.judgements:
        # Only a finite arm value is contradicted: an arm's +inf where the replays give finite
        # values and -inf (a singular matrix's logdet) is still a value no rounding gives.
        some = [u for u in j.unstable if u.endswith(FINITE_UNDER_SOME)]
        if (j.nonfinite or "").endswith(FINITE_WHERE_NONE) and some:
            out.append(f"`{j.arm}` {j.label} is said to be finite where every rounding of its computation is not, "
                       f"but the same simulation shows {some[0]}")
    return out


def outside_is_meaningful(verdict: Verdict, e: Evidence) -> list[str]:
    """"Outside its own rounding spread" needs a value with digits to be outside of (or, beside
    a spread with none, a value beyond its noise by NOISE_MARGIN), and a margin over the
    simulated roundings that triage's own seed would not undo."""
    c = e.comparison
    d = c.divergence
    if d is None or verdict.expected is not False or verdict.kind not in ("likely-bug", "nonfinite-flip"):
        return []
    out = []
    for j in d.judgements:
        if j.zone != "outside" or j.nonfinite:
            continue
        if j.outside_without_digits:
            out.append(f"`{j.arm}` {j.label} is called outside its rounding spread, but that spread keeps "
                       f"{'no' if j.computational_zero else f'{j.digits:.1f}'} significant digit(s): every digit of "
                       "it is rounding noise, so no value is outside it")
        elif (j.statistic is not None and j.max_sample_stat and j.statistic != float("inf")
              and j.statistic <= FRAGILE_MARGIN * j.max_sample_stat):
            out.append(f"`{j.arm}` {j.label} is {j.statistic:.3g}σ from float64 where the {j.samples} simulated "
                       f"roundings reach {j.max_sample_stat:.3g}σ: within {FRAGILE_MARGIN:g}× of the largest sample, "
                       "closer than the simulation's model of each op's error is exact (and a decision triage's "
                       "own seed can move)")
    return out


def replay_shows_the_divergence(verdict: Verdict, e: Evidence) -> list[str]:
    """A verdict that blames one arm's computation rests on the op graph the arms recorded:
    where the minimizer replayed that graph on both arms and saw no divergence at all, the
    difference came from something the graph does not hold (the script's own code acting on
    one arm — a dispatch mode, a branch on its environment), not from the ops it blames."""
    d, replay = e.comparison.divergence, e.replay
    if (d is None or d.source != "arms" or verdict.expected is not False or not replay
            or replay.get("hits") or replay.get("failed") or replay.get("script_backend")):
        return []
    a, b = replay.get("arms") or ("?", "?")
    seen = ", ".join(replay.get("seen") or []) or "bitwise-equal values"
    return [f"the recorded op graph, replayed on `{a}` and `{b}`, showed {seen} in every one of {replay.get('runs')} "
            "runs: the ops the arms recorded do not make this difference, so something the graph does not hold "
            "(the script's own code acting on one arm) does"]


def blame_rests_on_a_measurement(verdict: Verdict, e: Evidence) -> list[str]:
    """"Neither rounding nor an ill-conditioned input explains it" needs something that
    measured rounding: a float64 reference for some side, or a rounding judgement.  Without
    either (`--no-reference`, an arm that could not replay), two sides beyond the dtype's
    tolerance say only that they differ."""
    d = e.comparison.divergence
    if d is None or verdict.expected is not False or verdict.kind != "likely-bug":
        return []
    sides = [s for s in (d.a, d.b) if s is not None]
    if any(s.agrees_with_reference is not None for s in sides) or any(j.status == "judged" for j in d.judgements):
        return []
    return [f"{' and '.join(f'`{s.arm}`' for s in sides)} differ beyond {d.dtype} tolerance, but no float64 reference "
            "and no rounding simulation measured either side, so nothing says which, if either, computes the "
            "wrong thing (re-run without `--no-reference`)"]


def rounding_covers_the_computation(verdict: Verdict, e: Evidence) -> list[str]:
    """"Rounding of its own computation" for two values that differ beyond tolerance needs
    each side's computation replayed: a side that continues from values computed where
    triage records no ops (an inductor backward's fused kernels) has a spread of only the ops
    after them, which a wrong value before them would not leave."""
    c = e.comparison
    d = c.divergence
    if d is None or d.b is None or verdict.expected is not True or d.within_tolerance:
        return []
    out = []
    for j in d.judgements:
        n = unrecorded_inputs(c, j) if j.zone in ("inside", "envelope") else 0
        if n:
            run = c.run(j.arm)
            own = run.script_backends if run is not None else []
            backend = (f" — and this arm compiles with the script's own backend `{own[0]['name']}` (line "
                       f"{own[0].get('line')}), whose graph those values come from: the place to look first"
                       if own else "")
            out.append(f"`{j.arm}` {j.label} is called rounding of its own computation, but it continues from {n} "
                       "value(s) computed where triage records no ops (compiled kernels, such as an inductor "
                       "backward's), so its spread covers only what came after them, and the sides differ beyond "
                       f"{d.dtype} tolerance{backend}")
    return out


def compiled_blame_meets_pytorchs_rule(verdict: Verdict, e: Evidence) -> list[str]:
    """A bug blamed on inductor-compiled code needs more than triage's own model of that code:
    its generated kernels add a reduction's terms lane by lane, call their own vectorized
    transcendental functions and lower factories (`linspace`) their own way, each rounding
    validly but otherwise than the eager kernels triage models. Where the compiled side also
    passes PyTorch's own accuracy rule for compiled code (dynamo's float64 rule, which its
    accuracy minifier applies), the two measures disagree. (Not for the script's own backend:
    that is the script's code.)"""
    c = e.comparison
    d = c.divergence
    if d is None or verdict.expected is not False or verdict.kind != "likely-bug" \
            or not (d.fp64_rule or "").startswith("pass"):
        return []
    out = []
    for j in d.judgements:
        run = next((r for r in c.arms if r.spec == j.arm), None)
        if j.zone != "outside" or j.nonfinite or run is None or run.mode != "compile" \
                or any(b.get("name") for b in ((run.graph or {}).get("backends") or [])):
            continue
        far = f"{j.statistic:.3g}σ" if j.statistic is not None and j.statistic != float("inf") else "far"
        out.append(f"`{j.arm}` {j.label} lies outside triage's model of its compiled computation ({far}), yet it "
                   f"passes PyTorch's own accuracy rule for compiled code (dynamo's float64 rule: {d.fp64_rule}); "
                   "inductor's kernels round otherwise than the eager ones triage models (reductions added lane by "
                   "lane, their own vectorized transcendental functions, their own lowering of factories such as "
                   "`linspace`), so this does not show a compiler bug")
    return out


INVARIANTS: tuple[Callable[[Verdict, Evidence], list[str]], ...] = (
    printed_differences_accounted, failed_check_reported, rounding_explains_difference, finite_claim_consistent,
    outside_is_meaningful, replay_shows_the_divergence, blame_rests_on_a_measurement, rounding_covers_the_computation,
    compiled_blame_meets_pytorchs_rule)


# -- helpers ------------------------------------------------------------------------------
def _completed(c: Comparison) -> list[ArmRun]:
    return compared_runs(c.arms)


def _differing_prints(a: str, b: str) -> list[tuple[str, str]]:
    """Lines printed in the same place by both arms, alike but for numbers that differ
    (timings and other run-to-run numbers left out)."""
    out = []
    for x, y in zip(a.splitlines()[:MAX_PRINTED_LINES], b.splitlines()[:MAX_PRINTED_LINES], strict=False):
        if x == y or UNSTABLE_LINE.search(x) or NUMBER.sub("#", x) != NUMBER.sub("#", y):
            continue
        if any(_differs(p, q) for p, q in zip(NUMBER.findall(x), NUMBER.findall(y), strict=False)):
            out.append((_short(x.strip()), _short(y.strip())))
    return out


def _differs(p: str, q: str) -> bool:
    try:
        fp, fq = float(p), float(q)
    except ValueError:
        return p != q
    return not (fp == fq or (fp != fp and fq != fq))


def _short(text: str, limit: int = 120) -> str:
    text = text.replace("`", "'")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _all_inside(js: list[Judgement], n: int) -> bool:
    return len(js) == n and all(j.status == "judged" and j.zone == "inside" for j in js)
