"""The minimizer's one abstraction: `ReductionProblem` (after shrinkray's ``problem.py``).

A recorded op graph, two warm arm workers, the `DivergenceKind` to preserve, and a cached
predicate `diverges(ops)`: run the candidate op set on *both* arms and hold when some output
differs between them with exactly that kind (same nonfinite pattern, same exception type,
beyond vs within tolerance).  Never one arm's output alone: arm A is run every time too.
Results are cached by the candidate's plan hash, so the passes (`triage.minimize.passes`) may ask freely.

A candidate can also change the data: `overrides` replaces some recorded inputs with other
values (fewer elements, plainer numbers: `triage.minimize.data`); the cache key covers them.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from triage.arms.graph import OpGraph, Plan
from triage.minimize.arm_worker import ArmWorker
from triage.model import DivergenceKind
from triage.numerics.errors import divergence_kind, ulp


@dataclass
class Outcome:
    """One query's answer: the kind each output shows (None: bitwise equal)."""

    kinds: dict[str, DivergenceKind | None]
    failure: str | None = None  # why neither arm could answer
    # per output: its shape and the flat positions where the arms differ (the first few)
    positions: dict[str, tuple[tuple[int, ...], list[int]]] = field(default_factory=dict)
    ulps: dict[str, float] = field(default_factory=dict)  # per floating output: the largest finite difference


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
    overrides: dict[str, np.ndarray] = field(default_factory=dict)  # inputs replaced by reduced data
    # Values arm A made nonfinite where arm B does not (set by localization): never a
    # candidate's input, since a repro fed them would show an input the other arm never saw.
    one_arm_values: frozenset[str] = frozenset()
    # The data passes keep a difference this large (in ulps): 1 ulp of expm1(1.0) is not the
    # cancellation the recorded inputs showed, though both "differ within tolerance".
    min_ulps: float = 0.0
    deadline: float = float("inf")

    def plan(self, ops: frozenset[str], outputs: list[str] | None = None) -> Plan:
        return self.graph.plan(ops, outputs=outputs, merge=self.merge)

    def run(self, plan: Plan, upcast: list[str] | None = None) -> Outcome:
        """Both arms, concurrently; uncached (reliability runs and ablations use this directly).
        Ops in `upcast` are computed in float64 on both arms."""
        self.queries += 1
        request = dict(plan.request(cmd="run"), upcast=upcast or [])
        arrays = self.overrides_for(plan)
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            fa = pool.submit(self.a.request, request, self.query_timeout_s, arrays=arrays)
            fb = pool.submit(self.b.request, request, self.query_timeout_s, arrays=arrays)
            (ha, va), (hb, vb) = fa.result(), fb.result()
        return judge(ha, va, hb, vb)

    def overrides_for(self, plan: Plan) -> dict[str, np.ndarray]:
        return {name: self.overrides[name] for name in plan.inputs if name in self.overrides
                and name not in plan.sources}

    def cache_key(self, plan: Plan) -> str:
        digest = hashlib.sha256(plan.key.encode())
        for name, array in sorted(self.overrides_for(plan).items()):
            digest.update(f"{name}{array.dtype.str}{array.shape}".encode() + np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()[:24]

    def outcome(self, ops: frozenset[str]) -> Outcome:
        return self._outcome(self.plan(ops))

    def _outcome(self, plan: Plan) -> Outcome:
        key = self.cache_key(plan)
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = self.run(plan)
        return hit

    def holds_with(self, ops: frozenset[str], overrides: dict[str, np.ndarray]) -> bool:
        """Does `ops` still diverge the same way with `overrides` in place of the current data?
        They are kept if so, dropped if not."""
        before = self.overrides
        self.overrides = {**before, **overrides}
        if self.diverges(ops):
            return True
        self.overrides = before
        return False

    def diverges(self, ops: frozenset[str]) -> bool:
        if not ops or time.monotonic() > self.deadline:
            return False
        plan = self.plan(ops)
        if self.one_arm_values and not self.one_arm_values.isdisjoint(plan.inputs):
            return False
        outcome = self._outcome(plan)
        return any(kind == self.target and outcome.ulps.get(name, float("inf")) >= self.min_ulps
                   for name, kind in outcome.kinds.items())

    def largest_ulps(self, ops: frozenset[str]) -> float:
        """The largest finite difference, in ulps, among the outputs that diverge the target way."""
        outcome = self.outcome(ops)
        return max((outcome.ulps.get(name, 0.0) for name in self.diverging_outputs(ops)), default=0.0)

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
    positions, ulps = {}, {}
    for name, dtype in dtypes.items():
        if name not in va or name not in vb:
            continue
        a, b = va[name], vb[name]
        kinds[name] = kind = divergence_kind(a, b, dtype)
        if kind is None or a.shape != b.shape:
            continue
        gaps = ulp_gaps(a, b, dtype) if a.dtype.kind == "f" else None
        positions[name] = (a.shape, differing_positions(a, b, kind, gaps))
        if gaps is not None:
            ulps[name] = float(gaps.max()) if gaps.size else 0.0
    return Outcome(kinds, positions=positions, ulps=ulps)


def ulp_gaps(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """|a - b| per element, in ulps of `dtype` at a's magnitude; 0 where either side is nonfinite."""
    both = np.isfinite(a) & np.isfinite(b)
    gaps = np.zeros(a.shape)
    gaps[both] = np.abs(a[both].astype(np.float64) - b[both]) / ulp(a[both], dtype)
    return gaps


POSITIONS_KEPT = 16


def differing_positions(a: np.ndarray, b: np.ndarray, kind: DivergenceKind, gaps: np.ndarray | None) -> list[int]:
    """Flat indices (the first few) where `b` differs from `a` the way `kind` says: nonfinite on
    one side only, else the largest differences first (`gaps`, in ulps, for real floats), the
    elements a reader should look at."""
    x, y = a.reshape(-1), b.reshape(-1)
    if x.dtype.kind not in "fc":
        mask = x != y
    elif kind.kind == "nonfinite":
        mask = (np.isfinite(x) != np.isfinite(y)) | (np.isnan(x) != np.isnan(y))
    else:
        differ = ~((x == y) | (np.isnan(x) & np.isnan(y)))
        if gaps is None:
            with np.errstate(invalid="ignore", over="ignore"):
                gaps = np.nan_to_num(np.abs(x.astype(np.complex128) - y), nan=np.inf)
        order = np.argsort(-gaps.reshape(-1), kind="stable")
        return [int(i) for i in order[differ[order]][:POSITIONS_KEPT]]
    return [int(i) for i in np.flatnonzero(mask)[:POSITIONS_KEPT]]


def _error(h: dict) -> str:
    if h.get("lost"):
        return h["lost"]
    e = h.get("error") or {}
    return f"{e.get('type')}: {e.get('message', '')[:300]}"


def _error_type(h: dict) -> str:
    return "WorkerLost" if h.get("lost") else (h.get("error") or {}).get("type", "?")
