"""Reduction passes over a `ReductionProblem`, each a small named function (after
Hypothesis's shrinker and ``torch/_functorch/fx_minifier.py``) taking a known-diverging op set
and returning a smaller or equal one for which the predicate still holds:

``truncate``            keep the shortest prefix, in execution order, that still diverges
``freeze_prefix``       turn the longest run of leading ops into recorded inputs
``keep_one_output``     dead-code removal: keep only the cone of one diverging output
``ddmin``               delta debugging: remove chunks, halving the chunk size
``one_minimal``         no single op can be removed (the final guarantee)
``consolidate_inputs``  pass bitwise-identical inputs as one tensor

Before any reduction, `reliability` measures the divergence over several fresh runs: a flaky
divergence is reported as such rather than minimized into noise.
"""
from __future__ import annotations

from collections.abc import Callable

from triage.minimize.problem import Outcome, ReductionProblem

RELIABILITY_RUNS = 3


Pass = Callable[[ReductionProblem, frozenset], frozenset]


def truncate(p: ReductionProblem, ops: frozenset[str]) -> frozenset[str]:
    order = p.graph.ordered(ops)
    lo, hi = 1, len(order)  # order[:hi] is known to diverge
    while lo < hi:
        mid = (lo + hi) // 2
        if p.diverges(frozenset(order[:mid])):
            hi = mid
        else:
            lo = mid + 1
    return frozenset(order[:hi])


def freeze_prefix(p: ReductionProblem, ops: frozenset[str]) -> frozenset[str]:
    order = p.graph.ordered(ops)
    lo, hi = 0, len(order) - 1  # order[lo:] is known to diverge
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if p.diverges(frozenset(order[mid:])):
            lo = mid
        else:
            hi = mid - 1
    return frozenset(order[lo:])


def keep_one_output(p: ReductionProblem, ops: frozenset[str]) -> frozenset[str]:
    cones = sorted((p.graph.cone(name) & ops for name in p.diverging_outputs(ops)), key=len)
    for cone in cones:
        if len(cone) < len(ops) and p.diverges(frozenset(cone)):
            return frozenset(cone)
    return ops


def ddmin(p: ReductionProblem, ops: frozenset[str]) -> frozenset[str]:
    items = p.graph.ordered(ops)
    n = 2
    while len(items) >= 2:
        size = -(-len(items) // n)
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        for chunk in chunks:  # a chunk alone
            if len(chunk) < len(items) and p.diverges(frozenset(chunk)):
                items, n = chunk, 2
                break
        else:
            for chunk in chunks:  # everything but a chunk
                rest = [x for x in items if x not in chunk]
                if rest and p.diverges(frozenset(rest)):
                    items, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return frozenset(items)


def consolidate_inputs(p: ReductionProblem, ops: frozenset[str], digests: dict[str, str] | None = None) -> frozenset[str]:
    digests = digests or {}
    plan = p.plan(ops)
    first: dict[str, str] = {}
    merge = dict(p.merge)
    for name in plan.inputs:
        d = digests.get(name)
        if d is None:
            continue
        if d in first:
            merge[name] = first[d]
        else:
            first[d] = name
    if merge != p.merge:
        before = p.merge
        p.merge = merge
        if not p.diverges(ops):
            p.merge = before
    return ops


def one_minimal(p: ReductionProblem, ops: frozenset[str]) -> frozenset[str]:
    changed = True
    while changed and len(ops) > 1:
        changed = False
        for op in reversed(p.graph.ordered(ops)):
            smaller = ops - {op}
            if p.diverges(smaller):
                ops, changed = smaller, True
    return ops


PASSES: list[Pass] = [truncate, freeze_prefix, keep_one_output, ddmin, one_minimal]


def reduce(p: ReductionProblem, ops: frozenset[str], digests: dict[str, str] | None = None) -> frozenset[str]:
    """Run the passes until none makes progress (each pass keeps the predicate true)."""
    while True:
        before = ops
        for reduction in PASSES:
            ops = reduction(p, ops)
        if ops == before:
            break
    return consolidate_inputs(p, ops, digests)


def reliability(p: ReductionProblem, ops: frozenset[str], runs: int = RELIABILITY_RUNS) -> tuple[int, list[Outcome]]:
    """How many of `runs` fresh runs of the whole cone show the target kind."""
    plan = p.plan(ops)
    outcomes = [p.run(plan) for _ in range(runs)]
    p.cache[p.cache_key(plan)] = outcomes[-1]
    return sum(p.target in o.kinds.values() for o in outcomes), outcomes
