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

from triage.compare import divergence_kind
from triage.minimize.graph import OpGraph, Plan
from triage.model import DivergenceKind
from triage.minimize.warm import ArmWorker


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
        plan = self.plan(ops)
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
        if self.one_arm_values and not self.one_arm_values.isdisjoint(self.plan(ops).inputs):
            return False
        outcome = self.outcome(ops)
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
        if name in va and name in vb:
            kinds[name] = divergence_kind(va[name], vb[name], dtype)
            if kinds[name] is not None and va[name].shape == vb[name].shape:
                positions[name] = (va[name].shape, differing_positions(va[name], vb[name], kinds[name]))
                if va[name].dtype.kind == "f":
                    ulps[name] = largest_ulps(va[name], vb[name])
    return Outcome(kinds, positions=positions, ulps=ulps)


def largest_ulps(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / ulp(a) over the elements finite on both sides (0 when there are none)."""
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.any():
        return 0.0
    x, y = a[finite], b[finite]
    with np.errstate(over="ignore", invalid="ignore"):
        gap = np.abs(x.astype(np.float64) - y.astype(np.float64)) / np.spacing(np.abs(x)).astype(np.float64)
    return float(np.nanmax(gap))


POSITIONS_KEPT = 16


def differing_positions(a: np.ndarray, b: np.ndarray, kind: DivergenceKind) -> list[int]:
    """Flat indices (the first few) where `b` differs from `a` the way `kind` says: nonfinite on
    one side only, beyond tolerance, or merely in its bits."""
    x, y = a.reshape(-1), b.reshape(-1)
    if kind.kind == "nonfinite" and x.dtype.kind in "fc":
        mask = np.isfinite(x) != np.isfinite(y)
        mask |= (np.isnan(x) != np.isnan(y))
    elif x.dtype.kind in "fc":
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            gap = np.abs(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64) - y)
            if x.dtype.kind == "f":
                gap = gap / np.spacing(np.abs(x)).astype(np.float64)  # in ulps, as `largest_ulps`
        differ = ~((x == y) | (np.isnan(x) & np.isnan(y)))
        # The largest differences first: the elements a reader should look at.
        order = np.argsort(-np.nan_to_num(gap, nan=np.inf, posinf=np.inf), kind="stable")
        return [int(i) for i in order[differ[order]][:POSITIONS_KEPT]]
    else:
        mask = x != y
    return [int(i) for i in np.flatnonzero(mask)[:POSITIONS_KEPT]]


def _error(h: dict) -> str:
    if h.get("lost"):
        return h["lost"]
    e = h.get("error") or {}
    return f"{e.get('type')}: {e.get('message', '')[:300]}"


def _error_type(h: dict) -> str:
    return "WorkerLost" if h.get("lost") else (h.get("error") or {}).get("type", "?")
