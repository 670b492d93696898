"""Stage 4a: where the divergence starts (CRADLE's distinction: introduced vs propagated).

For every op of the diverging value's cone, arm B's worker compares against arm A's recorded
intermediates (a) the op's output when arm B runs the whole cone — the *end-to-end*
difference — and (b) the op's output when arm B runs it alone from arm A's recorded inputs —
its *local* error.  An op whose end-to-end output differs and whose local error is nonzero
introduces the divergence; one whose local replay agrees bit for bit only propagates it.
Compiled arms replay each op alone through the compiler, so only the first `max_local` ops
that differ end to end get a local replay there.

Localization also tells the reduction which recorded values only arm A made nonfinite
(`ReductionProblem.one_arm_values`): those are never fed to a candidate as inputs.
"""
from __future__ import annotations

from typing import Any

from triage.minimize.problem import ReductionProblem
from triage.model import LocalizedOp

SEVERITY = {"equal": 0, "rounding": 1, "mismatch": 2, "nonfinite": 3, "raises": 4}
REPORTED = 50


def localize(p: ReductionProblem, cone: frozenset[str], compiled: bool, max_local: int = 24,
             timeout_s: float = 600.0) -> tuple[list[LocalizedOp], str | None]:
    """Rows for the ops that differ end to end (first one first, then by local error), or a note."""
    graph = p.graph
    whole = graph.plan(cone, outputs=[n for n in graph.plan(cone).nodes if graph.is_tensor(n)])
    order = graph.ordered(cone)
    local_ops = [] if compiled else order
    rows, note = _request(p, whole, local_ops, timeout_s)
    if note:
        return [], note
    if compiled:
        differing = [op for op in order if _worst(_outputs(graph, op), rows, "end_to_end")["kind"] != "equal"]
        extra, note = _request(p, whole, differing[:max_local], timeout_s, whole_too=False)
        for name, row in extra.items():
            rows.setdefault(name, {}).update(row)
    p.one_arm_values = frozenset(name for name, row in rows.items() if _nonfinite_on_a_only(row.get("end_to_end")))
    found: list[LocalizedOp] = []
    for op in order:
        outputs = _outputs(graph, op)
        e2e = _worst(outputs, rows, "end_to_end")
        local = _worst(outputs, rows, "local") if any("local" in rows.get(o, {}) for o in outputs) else None
        if e2e["kind"] == "equal" and (local is None or local["kind"] == "equal"):
            continue
        role = "introduced" if local is not None and local["kind"] != "equal" else "propagated"
        node = graph.by_name[op]
        found.append(LocalizedOp(node=op, op=graph.op_names([op])[0], line=node.get("line"), role=role,
                                 first=False, end_to_end=e2e, local=local))
    firsts = [r for r in found if r.end_to_end and r.end_to_end["kind"] != "equal"]
    if firsts:
        firsts[0].first = True
    found.sort(key=lambda r: (not r.first, r.role != "introduced", _descending(r.local), _descending(r.end_to_end)))
    return found[:REPORTED], note


def _request(p: ReductionProblem, whole: Any, local_ops: list[str], timeout_s: float,
             whole_too: bool = True) -> tuple[dict[str, dict[str, Any]], str | None]:
    singles = [p.graph.plan(frozenset({op})).request() for op in local_ops]
    request = {"cmd": "localize", "whole": whole.request() if whole_too else dict(whole.request(), outputs=[]),
               "local": singles}
    header, _ = p.b.request(request, timeout_s)
    if not header.get("ok"):
        return {}, f"localization failed on {p.b.arm.spec}: {header.get('lost') or header.get('error')}"
    rows = header["rows"]
    failed = rows.pop("__whole__", None)
    if failed and whole_too:
        return rows, f"{p.b.arm.spec} could not run the whole cone for localization: {failed['error']}"
    return rows, None


def _nonfinite_on_a_only(errors: dict[str, Any] | None) -> bool:
    """Arm A's recorded value holds nonfinite values where arm B's does not (detail ``a:+inf``)."""
    return bool(errors) and errors["kind"] == "nonfinite" and any(
        part.startswith("a:") for part in str(errors.get("detail", "")).split(","))


def _outputs(graph: Any, op: str) -> list[str]:
    return graph.items.get(op) or [op]


def _worst(names: list[str], rows: dict[str, dict[str, Any]], field: str) -> dict[str, Any]:
    found = [rows.get(n, {}).get(field) for n in names]
    found = [f for f in found if f]
    if not found:
        return {"kind": "equal", "detail": "", "max_abs": 0.0, "max_ulps": 0.0, "nonfinite": 0}
    return max(found, key=lambda f: (SEVERITY.get(f["kind"], 0), f.get("max_ulps") or 0.0))


def _descending(errors: dict[str, Any] | None) -> tuple[int, float]:
    if not errors:
        return (0, 0.0)
    return (-SEVERITY.get(errors["kind"], 0), -(errors.get("max_ulps") or 0.0))
