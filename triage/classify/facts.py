"""Stage 5's readings of the comparison that both the ladder and its wording need: which torch
an arm ran, the arms' working precision, cancellation sites and conditioning notes upstream of a
divergence, the script's own exact-equality checks, which recorded value a check's operand is.
"""
from __future__ import annotations

import ast
import re
from typing import Any

import numpy as np

from triage.model import (
    ArmRun,
    Comparison,
    Divergence,
    Observable,
)
from triage.worker.claims import check_parts


def torch_of(run: ArmRun) -> str:
    """The torch version the arm's collect_env names, else its spec's release, else "this"."""
    from triage.extract import parse_environment

    found = parse_environment(run.environment).get("PyTorch version") if run.environment else None
    return found or (run.spec.partition("@")[2] or "the running release")


# What CUDA says when a script addresses a device this machine does not have: an index past
# its GPUs (`cuda:1`, `set_device(1)`) or a CUDA_VISIBLE_DEVICES the script set to hide them.
MISSING_DEVICE = re.compile(
    r"invalid device (?:id|ordinal)|No CUDA GPUs are available|device >= 0 && device < num_gpus", re.IGNORECASE)


def lacks_device(run: ArmRun) -> bool:
    """An accelerator arm that failed because the script addressed a device this machine does
    not have: the arm could not run here, which says nothing of the numbers (never a crash)."""
    e = run.exception or {}
    return run.status == "raised" and run.device != "cpu" and bool(MISSING_DEVICE.search(e.get("message", "")))


COMPILED_NOTHING = ("the script never calls `torch.compile` (or nothing it compiles ran), so this arm ran it "
                    "eagerly: it compiled nothing, and tested nothing of the compiler")


def compiled_nothing(run: ArmRun) -> bool:
    """A compile arm that ran to the end without compiling anything: the eager program again,
    which is not the comparison its spec asks for (the arm compiles what the script compiles)."""
    return run.mode == "compile" and run.completed and bool(run.graph) and run.graph.get("compiled_graphs") == 0


def precision_of(comparison: Comparison | None) -> str:
    d = comparison.divergence if comparison else None
    return d.dtype if d else "working-precision"


def cancellation_sites(c: Comparison, d: Divergence) -> list[dict[str, Any]]:
    """The ops upstream of the sides that lose the most digits (found by the rounding
    simulation's unperturbed replay): additions and subtractions that cancel or absorb an
    operand, and functions ill-conditioned at their inputs (kind "amplifies")."""
    sites = []
    for s in (d.a, d.b):
        found = c.find(s)
        sites += ((found[1].rounding or {}).get("cancellations") or []) if found else []
    return sites


def written_sites(c: Comparison, d: Divergence) -> list[dict[str, Any]]:
    """The cancellation sites of the script's own additions and subtractions: a function
    found ill-conditioned at its inputs is the less direct figure. It names the cause of a
    side's lost digits, but no cancellation, and elements in its tail alone are no sign the
    comparison is ill-conditioned."""
    return [site for site in cancellation_sites(c, d) if site.get("kind") != "amplifies"]


MASKING = re.compile(r"\bwhere\s*\(|\bmasked_(?:fill|scatter|select)_?\s*\(")


def masks(source: str) -> bool:
    """Whether the script selects between branches by a mask (`torch.where`, `masked_fill`):
    the calls whose dropped branch autograd still differentiates."""
    return bool(MASKING.search(source))


def site_key(leaf: dict[str, Any]) -> tuple:
    return leaf.get("op"), leaf.get("line"), tuple((leaf.get("fingerprint") or {}).get("shape") or ())


def state_key(leaf: dict[str, Any]) -> tuple:
    seed = leaf.get("seed") or {}
    return seed.get("line"), seed.get("value"), seed.get("draws")


def equality_checks(source: str, line: int) -> list[tuple[str, float, bool]]:
    """(expression, literal, True for ==) of each `expr == number` / `expr != number` on `line`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or node.lineno != line or len(node.ops) != 1:
            continue
        if not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            continue
        left, right = node.left, node.comparators[0]
        for expr, other in ((left, right), (right, left)):
            literal = _number(other)
            text = ast.get_source_segment(source, expr)
            if literal is not None and text and _number(expr) is None:
                out.append((text, literal, isinstance(node.ops[0], ast.Eq)))
    return out


# A comparison's sense with its operands swapped (`1e-3 > err` is `err < 1e-3`), and negated
# (an `if err > tol: raise` passes where `err <= tol`).
SWAPPED = {ast.Lt: ">", ast.LtE: ">=", ast.Gt: "<", ast.GtE: "<="}
SENSE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def threshold_checks(source: str, line: int) -> list[tuple[str, float, str]]:
    """(measure, bound, the sense that passes) of each `measure < bound` (<=, >, >=, either
    way round) the script's check at `line` tests: the assert's test there (each part of an
    `and`), or the `if` test around a `raise`/`sys.exit` there, negated (the `if` names the
    failure). A bound is a number, or a name last assigned a number before the check
    (`tol = 1e-6`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for test, negated in _check_tests(tree, line):
        parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and not negated \
            else [test]
        for node in parts:
            if not isinstance(node, ast.Compare) or len(node.ops) != 1 or type(node.ops[0]) not in SENSE:
                continue
            op, left, right = type(node.ops[0]), node.left, node.comparators[0]
            for measure, other, sense in ((left, right, SENSE[op]), (right, left, SWAPPED[op])):
                bound = _number(other)
                if bound is None and isinstance(other, ast.Name):
                    at = assigned_at(source, other.id, line)
                    bound = next((_number(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                                  and n.lineno == at), None) if at is not None else None
                text = ast.get_source_segment(source, measure)
                if bound is not None and text and _number(measure) is None:
                    out.append((text, bound, NEGATED[sense] if negated else sense))
    return out


def _check_tests(tree: ast.AST, line: int) -> list[tuple[ast.AST, bool]]:
    """The tests of the script's check at `line` (`check_parts`), each with whether it names
    the failure (an `if` around a `raise`/`sys.exit`: True) rather than what passes (an
    assert's, an `if`'s whose `else` fails: False)."""
    return [(part, kind == "if") for kind, part in check_parts(tree, line) if kind != "call"]


def holds(value: float, sense: str, bound: float) -> bool:
    """Whether `value sense bound` (a `threshold_checks` comparison) holds."""
    return {"<": value < bound, "<=": value <= bound, ">": value > bound, ">=": value >= bound}[sense]


def assigned_at(source: str, name: str, line: int) -> int | None:
    """The line of the last plain assignment `name = ...` before `line` (`re = z.item()`
    before `assert re == 0.0`), or None."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    lines = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assign) and node.lineno < line
             and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name]
    return max(lines, default=None)


# How a script reads a tensor's length: `len(x)`, `x.numel()`, `x.nelement()`, `x.shape`,
# `x.size()` (and an index or a comparison of either).
LENGTH_METHODS = {"numel", "nelement", "size"}


def length_checks(source: str, line: int) -> list[str]:
    """The expressions whose length (or shape) the script's check at `line` reads: the
    assert's test there, or the `if` test around a `sys.exit`/`raise` there, or the plain
    assignment a name in either comes from (`n = len(grid)` before `assert n == 3`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    for test, _ in _check_tests(tree, line):
        found += _lengths_read(source, test)
        for name in {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}:
            at = assigned_at(source, name, line)
            assigned = next((node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                             and node.lineno == at), None) if at is not None else None
            if assigned is not None:
                found += _lengths_read(source, assigned)
    return list(dict.fromkeys(found))


def names_at(source: str, line: int) -> list[str]:
    """The plain names the statement at `line` reads."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    statements = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)
                  and node.lineno <= line <= (node.end_lineno or node.lineno)
                  and not isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef,
                                            ast.ClassDef, ast.AsyncFunctionDef))]
    return list(dict.fromkeys(n.id for stmt in statements for n in ast.walk(stmt)
                              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)))


def _lengths_read(source: str, expr: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(expr):
        of = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and node.args:
            of = node.args[0]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LENGTH_METHODS:
            of = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr == "shape":
            of = node.value
        text = ast.get_source_segment(source, of) if of is not None else None
        if text:
            out.append(text)
    return out


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


# -- helpers ------------------------------------------------------------------------------
def notes_upstream(c: Comparison, d: Divergence) -> list[dict[str, Any]]:
    """The conditioning notes of the ops each side's value depends on, tagged with the arm."""
    notes = []
    for side, s in enumerate((d.a, d.b)):
        found = c.find(s)
        if found is None:
            continue
        run, o = found
        notes += [dict(run.conditioning[i], arm=run.spec, side=side) for i in o.conditioning
                  if i < len(run.conditioning)]
    return notes


def flush_notes(c: Comparison) -> list[dict[str, Any]]:
    """The notes of the compared arms whose script turned on flush-to-zero: a setting of the
    whole run from that line on, named whichever value diverges."""
    return [dict(note, arm=run.spec) for run in c.arms for note in run.conditioning
            if note.get("kind") == "flush-to-zero"]


def reduced_matmul_notes(c: Comparison) -> list[dict[str, Any]]:
    """The notes of the compared arms where the CPU's oneDNN computed float32 matmuls from
    bfloat16 inputs, as the script's float32 matmul precision asked (worker/opgraph.py)."""
    return [dict(note, arm=run.spec) for run in c.arms for note in run.conditioning
            if note.get("kind") == "reduced-matmul-precision"]


def nonfinite_side(d: Divergence) -> int | None:
    """The side (0: d.a, 1: d.b) non-finite where its float64 reference is not, if any: what
    explains a non-finite flip is upstream of it (two calls of one line can differ)."""
    return next((i for i, s in enumerate((d.a, d.b)) if s is not None and s.nonfinite_vs_reference), None)


def singular_upstream(c: Comparison, d: Divergence, side: int | None = None) -> dict[str, Any] | None:
    """The note that explains most: a singular matrix more than a cancelling sum, both more
    than nothing; the notes of side `side` (0: d.a, 1: d.b) first where it is given."""
    def group(n: dict[str, Any]) -> tuple:
        return side is not None and n["side"] != side, not n.get("singular"), "figure" in n

    ranked = [n for n in sorted(notes_upstream(c, d), key=group) if n.get("singular") or n.get("ill_conditioned")]
    first = next(iter(ranked), None)
    if first is None or _relative_error(first) is None:
        return first
    # Of the notes with a condition number in the first one's group, the one whose figure
    # leaves the fewest digits at its dtype, cond·ε: a bias gradient's sum over a batch that
    # BatchNorm makes cancel (4.6e8 in float32) before a forward matmul's 2e4.
    alike = [n for n in ranked if group(n) == group(first) and _relative_error(n) is not None]
    return max(alike, key=_relative_error)


def _relative_error(note: dict[str, Any]) -> float | None:
    """cond·ε of a note with both: the relative error its figure allows at its dtype."""
    cond, eps = note.get("cond"), note.get("eps")
    return cond * eps if isinstance(cond, (int, float)) and isinstance(eps, (int, float)) else None


def range_note(note: dict[str, Any]) -> bool:
    """A conditioning note about the dtype's range (a value or an intermediate past its
    largest value, or below its smallest normal one): the accuracy note's extremal values."""
    kind = str(note.get("kind", ""))
    return "overflow" in kind or "underflow" in kind


def matrix_upstream(c: Comparison, d: Divergence) -> bool:
    return any((n.get("singular") or n.get("ill_conditioned")) and
               ("figure" not in n or str(n.get("kind", "")).startswith("close-")) for n in notes_upstream(c, d))


def settings_between(run: ArmRun | None, d: Divergence) -> tuple[list[dict[str, Any]], int, int] | None:
    """The script's own numerics-setting calls (`knob_calls`: `torch.set_num_threads`, oneDNN's
    switch, TF32 …) on the lines after the earlier of a claim's two values is computed and up
    to the later one, with the lines of the ops computing each (`computed_at`); None where
    there is no such call or no line to place the values by."""
    if run is None or not run.knob_calls or d.computed_at is None:
        return None
    line_a, line_b = d.computed_at
    if line_a is None or line_b is None or line_a == line_b:
        return None
    first, last = sorted((line_a, line_b))
    calls: dict[tuple[str, int], dict[str, Any]] = {}
    for call in run.knob_calls:
        # One line's first call of a setter: a `with …flags(…):` sets and restores on its own
        # line, and the restore comes after the block.
        if first < call["line"] <= last:
            calls.setdefault((call["setter"], call["line"]), call)
    return (list(calls.values()), line_a, line_b) if calls else None


def recorded_operand(run: ArmRun, value: np.ndarray, name: str | None = None
                     ) -> tuple[Observable, int, int | None] | None:
    """The recorded floating value a failing check's operand is (`ArmRun.check_operands`), its
    sign and, for one number taken from a read-back array, its flat index: the last
    observable holding the same numbers bit for bit (`t = x.sum().item()`, `t = (a @
    b).numpy()`), or their negation (`h = -(p * p.log()).sum().item()`); else the one element
    of one read-back value that equals a number (`for got, want in zip(t.tolist(), values):
    assert got == want`), where no other element of any read-back value does. The script
    stopped at the check, so every observable was made before it. Each with a float64
    reference and a spread; None for a value the script made outside torch (NumPy, Python
    arithmetic on read-back numbers). Of several holding the same numbers, the one the script
    spells as the operand's `name` (`q_floor.tolist()`, not another value equal to it)."""
    judged = [o for o in run.observables if o.value is not None and o.reference_value is not None and o.spread
              and np.asarray(o.value).dtype.kind in "fiu"]
    spelled = [o for o in judged if name is not None and o.name == f"`{name}`"]
    for o in [*reversed(spelled), *reversed(judged)]:
        held = np.asarray(o.value).astype(np.float64)
        if held.shape != value.shape:
            continue
        for sign in (1, -1):
            if np.array_equal(sign * held, value, equal_nan=True):
                return o, sign, None
    if value.shape or not np.isfinite(value):
        return None
    # By recorded node (one value read back twice, `.tolist()` and at exit, is one value), the
    # first observable of it: the read-back the check took its number from.
    found: dict[str | None, tuple[Observable, int, int]] = {}
    for o in [o for o in judged if o.kind == "readback"]:  # a number the script read back, as it took it
        held = np.asarray(o.value).astype(np.float64).reshape(-1)
        for sign in (1, -1):
            at = np.flatnonzero(sign * held == value)
            if at.size > 1 or (at.size and o.node in found and found[o.node][1:] != (sign, int(at[0]))):
                return None  # the number appears twice: which element it is, is not known
            if at.size:
                found.setdefault(o.node, (o, sign, int(at[0])))
    return next(iter(found.values())) if len(found) == 1 else None


def reduced_counts(run: ArmRun, o: Observable) -> set[int]:
    """How many elements a reduction of one of `o`'s inputs may have reduced: each input's
    element count, each dimension, each run of adjacent dimensions."""
    counts = set()
    for leaf in run.leaves:
        shape = (leaf.get("fingerprint") or {}).get("shape") if leaf.get("index") in o.ancestors else None
        if not isinstance(shape, list) or not all(isinstance(n, int) for n in shape):
            continue
        for i in range(len(shape)):
            for j in range(i + 1, len(shape) + 1):
                counts.add(int(np.prod(shape[i:j])))
    return counts
