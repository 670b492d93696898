"""The minimizer's one abstraction: `ReductionProblem` (after shrinkray's ``problem.py``).

A recorded op graph, two warm arm workers, the `DivergenceKind` to preserve, and a cached
predicate `diverges(ops)`: run the candidate op set on *both* arms and hold when some output
differs between them with exactly that kind (same nonfinite pattern, same exception type,
beyond vs within tolerance).  Never one arm's output alone: arm A is run every time too.
Results are cached by the candidate's plan hash, so the passes (`triage.minimize.passes`) may ask freely.
"""
from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field

import numpy as np

from triage.compare import divergence_kind
from triage.minimize.graph import OpGraph, Plan
from triage.model import DivergenceKind
from triage.minimize.warm import ArmWorker


@dataclass
class Outcome:
    """One query's answer: the kind each output shows (None: bitwise equal)."""

    kinds: dict[str, DivergenceKind | None]
    failure: str | None = None  # why neither arm could answer


@dataclass
class ReductionProblem:
    graph: OpGraph
    a: ArmWorker
    b: ArmWorker
    target: DivergenceKind
    query_timeout_s: float = 120.0
    queries: int = 0
    cache: dict[str, Outcome] = field(default_factory=dict)
    merge: dict[str, str] = field(default_factory=dict)  # inputs passed as another (consolidated)
    deadline: float = float("inf")

    def plan(self, ops: frozenset[str], outputs: list[str] | None = None) -> Plan:
        return self.graph.plan(ops, outputs=outputs, merge=self.merge)

    def run(self, plan: Plan, upcast: list[str] | None = None) -> Outcome:
        """Both arms, concurrently; uncached (reliability runs and ablations use this directly).
        Ops in `upcast` are computed in float64 on both arms."""
        self.queries += 1
        request = dict(plan.request(cmd="run"), upcast=upcast or [])
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            fa = pool.submit(self.a.request, request, self.query_timeout_s)
            fb = pool.submit(self.b.request, request, self.query_timeout_s)
            (ha, va), (hb, vb) = fa.result(), fb.result()
        return judge(ha, va, hb, vb)

    def outcome(self, ops: frozenset[str]) -> Outcome:
        plan = self.plan(ops)
        hit = self.cache.get(plan.key)
        if hit is None:
            hit = self.cache[plan.key] = self.run(plan)
        return hit

    def diverges(self, ops: frozenset[str]) -> bool:
        if not ops or time.monotonic() > self.deadline:
            return False
        return self.target in self.outcome(ops).kinds.values()

    def diverging_outputs(self, ops: frozenset[str]) -> list[str]:
        return [name for name, kind in self.outcome(ops).kinds.items() if kind == self.target]


def judge(ha: dict, va: dict[str, np.ndarray], hb: dict, vb: dict[str, np.ndarray]) -> Outcome:
    if not ha.get("ok") or not hb.get("ok"):
        if not ha.get("ok") and not hb.get("ok"):
            return Outcome({}, failure=_error(ha))
        side, failed = ("a", ha) if not ha.get("ok") else ("b", hb)
        return Outcome({"(exception)": DivergenceKind("raises", f"{side}:{_error_type(failed)}")})
    dtypes = {o["name"]: o["dtype"] for o in ha.get("outputs", [])}
    kinds: dict[str, DivergenceKind | None] = {}
    for name, dtype in dtypes.items():
        if name in va and name in vb:
            kinds[name] = divergence_kind(va[name], vb[name], dtype)
    return Outcome(kinds)


def _error(h: dict) -> str:
    if h.get("lost"):
        return h["lost"]
    e = h.get("error") or {}
    return f"{e.get('type')}: {e.get('message', '')[:300]}"


def _error_type(h: dict) -> str:
    return "WorkerLost" if h.get("lost") else (h.get("error") or {}).get("type", "?")
