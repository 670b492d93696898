"""Stage 3: align the arms' observables and measure every difference against float64.

The output names one headline `Divergence`, found in this order:
1. **arms** – the first aligned observable whose bits differ between two arms;
2. **claim** – a comparison the script makes itself that fails (``allclose`` false,
   ``assert_close`` raising), or two values of one arm that compute the same float64 quantity
   (same reference) yet differ: fp16 vs fp32, eager vs compiled in one process;
3. **reference** – a value whose finiteness differs from its float64 reference, or that is
   farther from it than dynamo's 1e-3 (one arm alone, or arms that agree with each other).
"""
from __future__ import annotations

import ast
import math
import re
from typing import Any

import numpy as np

from triage import policy
from triage.model import ArmRun, Comparison, Divergence, Judgement, Observable, Side, compared_runs, find_side
from triage.numerics.errors import nonfinite_mismatch, ulp
from triage.operands import COMPARISON_SYMBOLS, checked_operand, compared_expressions
from triage.worker.protocol import DIFFERENCE_CLAIMS

SUMMARY_VALUES = 4


def compare(runs: list[ArmRun], source: str | None = None) -> Comparison:
    """`source`: the script's text, to name the values it compares by its own expressions."""
    completed = compared_runs(runs)
    if source:
        for run in completed:
            name_from_source(run, source)
    aligned, alignment_note = _align(completed)
    leaves_identical, leaves_note = _leaves(completed)
    candidates: list[Divergence] = []
    if len(completed) >= 2:
        a = completed[0]
        for b in completed[1:]:
            for i in range(aligned):
                if _bits(a.observables[i]) != _bits(b.observables[i]):
                    candidates.append(pair_divergence("arms", a, a.observables[i], b, b.observables[i]))
    claims: list[dict[str, Any]] = []
    claim_divs: list[Divergence] = []
    measured: list[Divergence] = []  # the script's error measures within tolerance (below)
    for run in completed:
        pairs = _claim_pairs(run) + (_compared_in_source(run, source) if source else [])
        for x, y, how in pairs + _printed_side_by_side(run, pairs):
            d = pair_divergence("claim", run, x, run, y)
            d.how = how
            d.claim_tolerance = (x.claim or {}).get("tolerance")
            d.fails_asked = _fails(x, y, d.claim_tolerance)
            d.distinct_draws = _distinct_draws(run, x, y)
            if x.name and y.name and how not in ("implicit", "repeat", "rerun", "printed"):
                d.observable_label = f"{x.name} vs {y.name} (`{how}`)"
            claims.append({"arm": run.spec, "how": how, "a": x.shown, "b": y.shown, "line": x.line,
                           "holds": (x.claim or {}).get("holds"), "bitwise_equal": d.bitwise_equal,
                           "within_tolerance": d.within_tolerance,
                           "a_agrees_with_reference": d.a.agrees_with_reference,
                           "b_agrees_with_reference": d.b.agrees_with_reference if d.b else None})
            # Equal values held in two dtypes (the same 1024 in float32 and bfloat16) are one value.
            same_values = (d.max_abs_diff == 0 and d.nonfinite_mismatch == 0 and d.bit_difference is None
                           and (x.fingerprint or {}).get("dtype") != (y.fingerprint or {}).get("dtype"))
            if not d.bitwise_equal and not same_values and (
                    how in ("implicit", "repeat", "rerun", "printed") or how in COMPARISON_SYMBOLS.values()
                    # An error measure within the dtype's tolerance (a solve's tiny residual)
                    # is what the script expected, not what it reports.
                    or how in DIFFERENCE_CLAIMS and not d.within_tolerance
                    or (x.claim or {}).get("holds") is False):
                claim_divs.append(d)
            elif not d.bitwise_equal and not same_values and how in DIFFERENCE_CLAIMS:
                measured.append(d)
    # Against float64 alone only when there is no second arm: where arms agree with each other,
    # the reporter's divergence did not reproduce, and float64 findings are notes, not verdicts.
    reference_divs = []
    for run in completed if len(completed) == 1 else []:
        # The readback of the script's own error measure is judged as the claim it measures
        # (its two operands, each in its own spread), not as one more value against float64:
        # a maximum of absolute differences whose float64 value is 0 keeps no digit to judge.
        measures = _measures(run)
        for o in run.observables[:MAX_SINGLE]:
            if o.index in measures:
                continue
            side = side_of(run, o)
            if side.agrees_with_reference is False or _not_inside_own_spread(run, o):
                reference_divs.append(_single(run, o, side))
    # An error measure within the dtype's tolerance is the divergence only where nothing else
    # diverges: a solve's tiny residual must not hide the error the script reports, but where
    # the script's one complaint is that eager and compiled differ at all (a compiled loop of
    # module calls, inside one arm), that difference is what to judge.
    ordered = candidates + claim_divs + reference_divs or measured
    judged = ordered[:MAX_JUDGED]
    for d in judged:
        d.judgements = _judgements(completed, d)
    # A check of the script's that fails on every arm is what it reports, whatever the arms
    # differ by besides (an eager-only arm fails it too: the arms' difference is not its cause).
    # (A comparison the script asserts, `assert i32.item() == i16.item()`, fails where its
    # AssertionError is raised: Python's `==` of two numbers leaves no record of its own.)
    failing = [{(x["line"], x["how"]) for x in claims if x["arm"] == run.spec and (
                x["holds"] is False or x["holds"] is None and x["how"] in COMPARISON_SYMBOLS.values()
                and (run.exception or {}).get("claim") and (run.exception or {}).get("line") == x["line"])}
               for run in completed]
    everywhere = set.intersection(*failing) if failing else set()
    checked = {(run.spec, o.index) for run in completed for o in run.observables
               if o.kind == "readback" and checked_operand(o.label)}
    headline = min(range(len(judged)), key=lambda i: _headline_rank(judged[i], i, everywhere, checked)) \
        if judged else None
    if headline is not None and judged[headline].source == "claim" and judged[headline].how != "repeat":
        # The script compares two calls of one module on one input: the pair of calls knows why
        # they differ (the module's mode, its state, a setting), the comparison does not.
        same = _values_of(completed, judged[headline])
        headline = next((i for i, d in enumerate(judged) if d.how == "repeat" and _values_of(completed, d) == same),
                        headline)
    if headline is not None:
        judged[headline].paths, judged[headline].computed_at = _paths(completed, judged[headline], source)
    shown = _values_of(completed, judged[headline]) if headline is not None else set()
    conditioning = [dict(c, arm=r.spec) for r in completed for c in r.conditioning]
    return Comparison(
        arms=runs, aligned=aligned, alignment_note=alignment_note,
        leaves_identical=leaves_identical, leaves_note=leaves_note,
        divergence=judged[headline] if headline is not None else None, divergences=len(ordered),
        claims=claims, conditioning=conditioning,
        others=[d for i, d in enumerate(judged) if i != headline and not _values_of(completed, d) <= shown],
    )


def name_from_source(run: ArmRun, source: str) -> None:
    """Claim operands and readbacks named by the script's own expressions (`mine`, not
    `torch.testing.assert_close operand 1`), where its source says so unambiguously."""
    from triage.operands import (
        as_receiver,
        assigned_readback,
        library_check_operands,
        operand_names,
        readback_name,
        spelled_on_line,
    )

    for o in run.observables:
        if o.kind == "claim" and o.claim and o.claim.get("operand") in (0, 1):
            names = operand_names(source, o.line, str(o.claim.get("func", "")))
            checked = library_check_operands(source, o.line, str(o.claim.get("func", ""))) if not names else None
            if names:
                o.name = f"`{names[o.claim['operand']]}`"
            elif checked:
                o.library_check, shown = checked
                o.name = shown[o.claim["operand"]]
        elif o.kind == "readback" and (checked := checked_operand(o.label)):
            symbol, operand = checked
            names = operand_names(source, o.line, symbol)
            if names and operand < len(names):
                o.name = f"`{names[operand]}`"
        elif o.kind == "readback":
            spelled = spelled_on_line(source, o.line, o.expression)
            name = None if spelled else readback_name(source, o.line, o.label)
            if spelled:
                o.name = f"`{spelled}`"
            elif name:
                o.name = f"`{as_receiver(name)}{o.label}`" if o.label.startswith(".") else f"`{name}`"
            elif assigned := assigned_readback(source, o.line, o.label):
                o.name = f"`{assigned}`"


def _values_of(runs: list[ArmRun], d: Divergence) -> set[tuple]:
    """(arm, op-graph node) of each side: two observables of one tensor are one value."""
    out = set()
    for s in (d.a, d.b):
        found = find_side(runs, s)
        out.add((s.arm, found[1].node or f"observable{found[1].index}") if found is not None else (None, None))
    return out


def _paths(runs: list[ArmRun], d: Divergence,
           source: str | None) -> tuple[dict[str, Any] | None, tuple[int | None, int | None] | None]:
    """Where a claim's two sides part in the arm's op graph, and the script's line of the op
    computing each side (None without a graph)."""
    if d.source != "claim" or d.b is None:
        return None, None
    found = [find_side(runs, s) for s in (d.a, d.b)]
    if None in found or not found[0][0].graph_dir or found[0][0] is not found[1][0]:
        return None, None
    run = found[0][0]
    nodes = [o.node for _, o in found]
    if None in nodes:
        return None, None
    from triage.arms.graph import OpGraph
    from triage.paths import part_ways
    from triage.untrusted import UntrustedOutput

    try:
        graph = OpGraph(run.graph_dir)
        if any(n not in graph.by_name for n in nodes):
            return None, None
        lines = tuple(graph.by_name[n].get("line") for n in nodes)
        computed_at = (lines[0], lines[1]) if all(isinstance(x, int) for x in lines) else None
        return part_ways(graph, nodes[0], nodes[1], source), computed_at
    except (UntrustedOutput, OSError, KeyError, ValueError):
        return None, None  # an unreadable graph loses this detail, never the comparison


# What the script itself is about ranks first: its own checks, then what it prints, then
# module/compiled outputs, then names left at exit.
KIND_RANK = {"claim": 0, "readback": 1, "call": 2, "final": 3}
MAX_JUDGED = 16


def _headline_rank(d: Divergence, order: int, failing_everywhere: set[tuple[int | None, str | None]],
                   checked: set[tuple[str, int]]) -> tuple:
    """A value outside its own rounding spread is never hidden behind one inside it, nor one
    outside a spread with digits behind one outside a spread without (the script's own error
    measure, `(eager - compiled).abs().max()`, is a computational zero on the eager arm's
    replay); then a check of the script's that fails on every arm (`failing_everywhere`, by
    line and comparison) before the arms' differences; a floating value before a boolean or
    integer the script does not check (`checked`: (arm, observable) of the operands of its
    elementwise checks); among equals, the one the script's own check or printed output is about, then
    program order."""
    outside = [j for j in d.judgements if j.zone == "outside"]
    decisive = any(not j.outside_without_digits for j in outside)
    kind = min(KIND_RANK.get(s.kind or "", 4) for s in (d.a, d.b) if s is not None)
    # A boolean or integer the script derives (`torch.isnan(out).any().item()`) says less than
    # the floating values it summarizes; but integers the script's own check compares
    # (`torch.equal(pred32, pred16)` of two argmaxes, top-k indices, or the operands of
    # `(pred32 != pred16).sum().item()`) are what it is about.
    sides = [s for s in (d.a, d.b) if s is not None]
    failing_check = d.source == "claim" and (d.a.line, d.how) in failing_everywhere
    floating = any(_is_float(s.dtype or "") for s in sides) or all(_is_index(s.dtype or "") for s in sides) and (
        kind == KIND_RANK["claim"] or failing_check or all((s.arm, s.observable) in checked for s in sides))
    # (a boolean the failing check reads says less than the floating values behind it, too)
    reported = failing_check and floating
    return (not outside, not decisive, not reported, not floating, kind, order)


MAX_SINGLE = 400


def _not_inside_own_spread(run: ArmRun, o: Observable) -> bool:
    """Close to float64 by the tolerance rule, yet beyond what unbiased rounding of its own
    computation gives (a biased accumulation, or another computation)."""
    if not o.spread:
        return False
    from triage.judge import judge_observable

    return judge_observable(run, o).zone in ("envelope", "outside")


def unrecorded_inputs(c: Comparison, side: Side | Judgement | None) -> int:
    """How many of the values a side's computation continues from were computed where triage
    records no ops (`stale` leaves: a tensor written since its last recorded op, as an
    inductor backward's fused kernels write their buffers): its replay and spread start there,
    from the arm's own values."""
    found = c.find(side)
    if found is None:
        return 0
    run, o = found
    return sum(1 for i in o.ancestors if i < len(run.leaves) and run.leaves[i].get("kind") == "stale")


def _judgements(runs: list[ArmRun], d: Divergence) -> list:
    from triage.judge import judge_observable

    out = []
    sides = [found for found in (find_side(runs, s) for s in (d.a, d.b)) if found is not None]
    for run, o in sides:
        try:
            out.append(judge_observable(run, o))
        except Exception as e:  # noqa: BLE001 - a judge failure loses the judgement, never the report
            out.append(Judgement(arm=run.spec, observable=o.index, label=o.shown, line=o.line,
                                 dtype=(o.fingerprint or {}).get("dtype", "?"), status="not-judged",
                                 reason=f"triage's judge failed on it ({type(e).__name__}: {str(e)[:120]})"))
    if len(sides) == 2:
        _digits_where_differ(out, [o for _, o in sides])
    return out


def _digits_where_differ(judgements: list[Judgement], observables: list[Observable]) -> None:
    """Each judged side's digits at the element where the two values differ most (finite on
    both): a hand-written `log(1 - sigmoid(z))` keeps 7 digits at most elements and 2 where
    z is large, which is where it parts from the builtin. A typical element's digits miss that."""
    from triage.judge import RoundingSpread

    values = [np.asarray(o.value, dtype=np.float64) if o.value is not None and not np.iscomplexobj(o.value)
              else None for o in observables]
    if any(v is None for v in values) or values[0].shape != values[1].shape or values[0].size < 2:
        return
    gap = np.abs(values[0] - values[1])
    gap = np.where(np.isfinite(gap), gap, -1.0)
    k = int(np.argmax(gap))
    if gap.reshape(-1)[k] <= 0:
        return
    for j, o in zip(judgements, observables, strict=True):
        spread = RoundingSpread.of(o) if j.status == "judged" else None
        if spread is None or spread.reference.shape != values[0].shape:
            continue
        digits = float(spread.element_digits().reshape(-1)[k])
        zero = bool(spread.computational_zeros().reshape(-1)[k])
        j.differ_element = k
        j.digits_where_differ = 0.0 if zero or math.isnan(digits) else digits
        j.sigma_where_differ = float(np.asarray(spread.sigma, dtype=np.float64).reshape(-1)[k])
        j.poor_where_differ = zero or (math.isfinite(digits) and digits <= spread.wide_below)


# -- alignment ----------------------------------------------------------------------------
def _key(o: Observable) -> tuple:
    fp = o.fingerprint or {}
    return (o.kind, o.label, tuple(fp.get("shape", ())), fp.get("dtype"))


def _align(runs: list[ArmRun]) -> tuple[int, str | None]:
    if len(runs) < 2:
        return (len(runs[0].observables) if runs else 0), None
    a = runs[0]
    aligned = len(a.observables)
    note = None
    for b in runs[1:]:
        n = min(len(a.observables), len(b.observables))
        i = next((i for i in range(n) if _key(a.observables[i]) != _key(b.observables[i])), n)
        if i < aligned:
            aligned = i
        if i < n:
            x, y = a.observables[i], b.observables[i]
            # A compiled function's module calls run inside its one compiled call, where the
            # eager arm sees each of them: another shape of run, not another path.
            why = ("the compile arm runs module calls inside one compiled call" if
                   {x.label.startswith("compiled "), y.label.startswith("compiled ")} == {True, False}
                   else "value-dependent control flow?")
            note = (f"alignment broke at observable {i + 1}: {a.spec} saw {x.label} (line {x.line}), "
                    f"{b.spec} saw {y.label} (line {y.line}); {why}")
        elif len(a.observables) != len(b.observables):
            note = f"{a.spec} recorded {len(a.observables)} observables, {b.spec} {len(b.observables)}"
    return aligned, note


def _leaves(runs: list[ArmRun]) -> tuple[bool | None, str | None]:
    """Whether every arm started from the same leaf values. Only leaves some observed value
    reads count (`torch.empty` storage that nn.Linear's init overwrites in place differs between
    processes and matters to nothing), and leaves pair by identity, not position: a compiled
    region's parameters are the eager module's parameters, wherever they sit in the list."""
    if len(runs) < 2:
        return None, None
    a = runs[0]
    read_a = _read_leaves(a)
    for b in runs[1:]:
        for x, y, differs in pair_leaves(read_a, _read_leaves(b)):
            if differs:
                return False, (f"{x['kind']} leaf `{x.get('op') or 'data'}` at line {x.get('line')} "
                               f"({'×'.join(map(str, _shape(x)))} {_leaf_bits(x)[1]}) holds different bytes on "
                               f"{a.spec} (sha256 {_leaf_bits(x)[2]}) and {b.spec} (sha256 {_leaf_bits(y)[2]})")
    return True, None


def _read_leaves(run: ArmRun) -> list[dict[str, Any]]:
    read = {i for o in run.observables for i in o.ancestors}
    return [leaf for leaf in run.leaves if leaf["index"] in read]


def pair_leaves(xs: list[dict[str, Any]], ys: list[dict[str, Any]]) -> list[tuple[dict, dict | None, bool]]:
    """Pair two sides' leaves by what they are: first by identical bytes (shape, dtype,
    hash), then what is left by creation site (kind, op, line, shape, dtype), in order of
    appearance. (x, y, differs): differs only for a site pair whose bytes differ; a leaf
    with no partner (a recording detail, such as a compiled region's transposed copy of a
    weight) is paired with None and differs from nothing."""
    by_bits: dict[tuple, list[int]] = {}
    for j, y in enumerate(ys):
        by_bits.setdefault(_leaf_bits(y), []).append(j)
    taken: set[int] = set()
    pairs: list[tuple[dict, dict | None, bool]] = []
    pending = []
    for x in xs:
        j = next((j for j in by_bits.get(_leaf_bits(x), []) if j not in taken), None)
        if j is not None:
            taken.add(j)
            pairs.append((x, ys[j], False))
        else:
            pending.append(x)
    for x in pending:
        j = next((j for j, y in enumerate(ys) if j not in taken and _site(y) == _site(x)), None)
        if j is not None:
            taken.add(j)
        pairs.append((x, ys[j] if j is not None else None, j is not None))
    return pairs


def _site(leaf: dict[str, Any]) -> tuple:
    bits = _leaf_bits(leaf)
    return leaf.get("kind"), leaf.get("op"), leaf.get("line"), bits[0], bits[1]


def _shape(leaf: dict[str, Any]) -> list:
    return (leaf.get("fingerprint") or {}).get("shape") or []


def _leaf_bits(leaf: dict[str, Any]) -> tuple:
    fp = leaf.get("fingerprint") or {}
    return tuple(fp.get("shape") or ()), fp.get("dtype"), fp.get("sha256")


def _bits(o: Observable) -> tuple:
    fp = o.fingerprint or {}
    return fp.get("shape"), fp.get("dtype"), fp.get("sha256")


# -- claims -------------------------------------------------------------------------------
def _measures(run: ArmRun) -> set[int]:
    """The observables that read back the script's own error measures of two values."""
    return {o.claim["measure"] for o in run.observables
            if o.kind == "claim" and o.claim and o.claim.get("measure") is not None}


def _claim_pairs(run: ArmRun) -> list[tuple[Observable, Observable, str]]:
    pairs: list[tuple[Observable, Observable, str]] = []
    operands: dict[int, dict[int, Observable]] = {}
    for o in run.observables:
        if o.kind == "claim" and o.claim:
            operands.setdefault(o.claim["id"], {})[o.claim["operand"]] = o
    measures = _measures(run)
    for ops in operands.values():
        if 0 in ops and 1 in ops:
            pairs.append((ops[0], ops[1], ops[0].claim["func"]))
    # Repeated calls: one module, same weights, bit-identical inputs, called again — and a
    # different answer (dropout left on, batch statistics, a setting changed in between).
    repeated: set[int] = set()
    calls: dict[tuple, Observable] = {}
    for o in run.observables:
        m = o.module
        if o.kind != "call" or not m or not m.get("inputs") or None in m["inputs"]:
            continue
        output = o.label.partition(" output ")[2]
        key = (m["instance"], tuple(m["inputs"]), m.get("weights_version"), output)
        first = calls.setdefault(key, o)
        if first is not o and _bits(first) != _bits(o):
            pairs.append((first, o, "repeat"))
            repeated.add(o.index)
    pairs += _reruns(run)
    # Implicit claims: two observed values with the same float64 value but different bits
    # are the same quantity computed two ways (fp16 vs fp32, eager vs compiled, cpu vs "gpu").
    seen: dict[tuple, Observable] = {}
    for o in run.observables[:400]:
        if o.index in repeated:
            continue
        ref = (o.reference or {}).get("fingerprint")
        if o.kind not in ("readback", "call") or not ref or not o.fingerprint:
            continue
        if o.index in measures and ref.get("min") == 0 and ref.get("max") == 0 \
                and not (ref.get("nan") or ref.get("posinf") or ref.get("neginf")):
            # Every error measure of two equal values is 0 in float64: two measures (a GRU's
            # output and its hidden state) are no one quantity.  Two values that are 0 (the
            # determinant of a singular matrix in float32 and in float64) may be.
            continue
        key = (tuple(ref["shape"]), ref["sha256"])
        first = seen.get(key)
        if first is None:
            seen[key] = o
        elif _bits(first)[2] != _bits(o)[2] and first.fingerprint["dtype"] != "bool":
            pairs.append((first, o, "implicit"))
    return pairs


# Words that name which version of one quantity a value is: its precision, device, backend,
# or whose implementation (`lp_ref` and `lp_low`, `out_cpu` and `out_gpu`, `builtin` and
# `manual`, `y32` and `y64`, `run1` and `run2`). Two values whose names differ only by such
# words are one quantity computed two ways; `loss` and `acc`, `x.min()` and `x.max()` are not.
VERSION_WORDS = frozenset({
    "ref", "reference", "expected", "actual", "out", "output", "res", "result", "golden", "baseline",
    "mine", "my", "theirs", "manual", "naive", "builtin", "native", "custom", "np", "numpy", "torch",
    "cpu", "gpu", "cuda", "mps", "xpu", "eager", "compiled", "compile", "jit", "inductor",
    "fp16", "fp32", "fp64", "bf16", "f16", "f32", "f64", "half", "float", "double", "single", "low", "high",
    "lo", "hi", "16", "32", "64", "1", "2",
})


# Module names a call is spelled through (`F.softmax`, `torch.linalg.norm`): the function's
# own name is what the value is, not where it was imported from.
MODULE_NAMES = frozenset({"torch", "F", "nn", "functional", "np", "numpy", "math", "special", "linalg", "fft"})


class _AsComputed(ast.NodeTransformer):
    """Calls without their keyword arguments, functions without their module prefixes."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        node.keywords = []
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        root = node.value
        while isinstance(root, ast.Attribute) and root.attr in MODULE_NAMES:
            root = root.value
        if isinstance(root, ast.Name) and root.id in MODULE_NAMES:
            return ast.Name(id=node.attr, ctx=node.ctx)
        return node


def _as_computed(expression: str) -> str:
    """An expression with its calls' keyword arguments and module prefixes left out:
    `F.softmax(scores, dim=-1)[2]` is `softmax(scores)[2]`, beside `my_softmax(scores)[2]`."""
    try:
        return ast.unparse(_AsComputed().visit(ast.parse(expression, mode="eval")))
    except (SyntaxError, ValueError, RecursionError):
        return expression


def _words(name: str) -> list[str]:
    """The words of a value's name as the script spells it (`_as_computed`): its identifiers
    split at underscores and at letter-digit boundaries, lower case (`lp_ref.item()`: lp, ref,
    item); a number of its own (an index, an argument: `out[1]`) is a word no version word
    matches."""
    words = []
    for token in re.findall(r"[A-Za-z_][A-Za-z0-9_]*|[0-9.]+", _as_computed(name.strip("`"))):
        if token[0].isdigit() or token[0] == ".":
            words.append(f"[{token}]")
        else:
            words += [w.lower() for w in re.findall(r"[A-Za-z]+|[0-9]+", token)]
    return words


def _printed_side_by_side(run: ArmRun, paired: list[tuple[Observable, Observable, str]]
                          ) -> list[tuple[Observable, Observable, str]]:
    """Two values the script reads back on one line or two consecutive lines, of one shape,
    whose names differ only by the version they are (`VERSION_WORDS`): what a reporter prints
    to show that they disagree, without comparing them in code. Values already paired, or
    read back as an error measure, are not."""
    taken = {o.index for x, y, _ in paired for o in (x, y)} | _measures(run)
    shown = [o for o in run.observables if o.kind == "readback" and o.name and o.line is not None
             and o.index not in taken and o.fingerprint and o.reference
             and (str(o.fingerprint.get("dtype", "")).startswith(("float", "bfloat", "complex")))]
    pairs = []
    for x, y in zip(shown, shown[1:], strict=False):  # each with the next
        if y.line - x.line not in (0, 1) or x.fingerprint.get("shape") != y.fingerprint.get("shape"):
            continue
        wx, wy = _words(x.name), _words(y.name)
        stem_x = [w for w in wx if w not in VERSION_WORDS]
        stem_y = [w for w in wy if w not in VERSION_WORDS]
        versions_x, versions_y = set(wx) - set(stem_x), set(wy) - set(stem_y)
        # Names that differ only by version words (`y` and `y_ref` too); two values whose
        # names are entirely version words (`out`, `ref`) have empty stems, and are a pair.
        if stem_x == stem_y and versions_x != versions_y and (stem_x or versions_x and versions_y):
            pairs.append((x, y, "printed"))
    return pairs


def _compared_in_source(run: ArmRun, source: str) -> list[tuple[Observable, Observable, str]]:
    """Two readbacks the script compares as Python numbers (`e32.item() == e64.item()`): the
    one-operator comparisons of a line whose two sides are spelled as two values read back
    there (`Observable.expression`, checked against the source by `name_from_source`)."""
    by_line: dict[int, dict[str, Observable]] = {}
    for o in run.observables:
        if o.kind == "readback" and o.line is not None and o.name and o.expression and o.name == f"`{o.expression}`":
            by_line.setdefault(o.line, {}).setdefault(o.expression, o)
    pairs = []
    for line, spelled in by_line.items():
        if len(spelled) < 2:
            continue
        for left, right, symbol in compared_expressions(source, line):
            if left in spelled and right in spelled and left != right:
                pairs.append((spelled[left], spelled[right], symbol))
    return pairs


def _reruns(run: ArmRun) -> list[tuple[Observable, Observable, str]]:
    """One computation run twice inside the script: a function called from two top-level
    lines (`run1 = train(...)`, `run2 = train(...)`) whose last value at one line of it, read
    back, differs between the two calls although both read the same inputs and weights — and
    each call drew random numbers of its own (a shuffling DataLoader, dropout, an unseeded
    generator).  Calls on different inputs are different computations and pair with nothing."""
    drawn_in = {leaf.get("call_line") for leaf in run.leaves if leaf.get("kind") == "random"}
    last: dict[tuple, dict[int, Observable]] = {}
    for o in run.observables:
        if o.kind != "readback" or o.call_line is None or o.call_line == o.line or not o.fingerprint:
            continue
        key = (o.line, o.label, tuple(o.fingerprint.get("shape") or ()), o.fingerprint.get("dtype"))
        last.setdefault(key, {})[o.call_line] = o
    pairs = []
    for calls in last.values():
        lines = sorted(calls)
        for first_line, later_line in zip(lines, lines[1:], strict=False):
            x, y = calls[first_line], calls[later_line]
            if (_inputs_of(run, x) == _inputs_of(run, y) and _bits(x) != _bits(y)
                    and {first_line, later_line} <= drawn_in):
                pairs.append((x, y, "rerun"))
    return pairs[:MAX_RERUNS]


MAX_RERUNS = 8


def _inputs_of(run: ArmRun, o: Observable) -> set[tuple]:
    """The leaves a value reads, by what they hold: each call's own `torch.zeros(4)` at one
    line is the same input, whichever leaf recorded it."""
    return {(leaf.get("kind"), leaf.get("op"), leaf.get("line")) + _leaf_bits(leaf)
            for i in o.ancestors if i < len(run.leaves) for leaf in (run.leaves[i],)}


# -- measurements -------------------------------------------------------------------------
def side_of(run: ArmRun, o: Observable) -> Side:
    """One observed value measured against its float64 reference."""
    fp = o.fingerprint or {}
    dtype = fp.get("dtype", "?")
    ref_fp = (o.reference or {}).get("fingerprint")
    side = Side(arm=run.spec, observable=o.index, label=o.shown, line=o.line, dtype=dtype,
                summary=summarize(fp), reference_summary=summarize(ref_fp) if ref_fp else None, kind=o.kind)
    if ref_fp is None:
        return side
    v, r = o.value, o.reference_value
    if v is None or r is None or v.shape != r.shape or not _is_float(dtype):
        side.nonfinite_vs_reference = sum(abs(fp.get(k, 0) - ref_fp.get(k, 0)) for k in ("nan", "posinf", "neginf"))
        if v is not None and r is not None and v.shape == r.shape and not _is_float(dtype):
            side.agrees_with_reference = bool(np.array_equal(v.astype(np.float64), np.round(r)))
        elif side.nonfinite_vs_reference:
            side.agrees_with_reference = False
        return side
    v64, r64 = v.astype(np.complex128 if np.iscomplexobj(v) else np.float64), r
    mismatch = nonfinite_mismatch(v64, r64)
    side.nonfinite_vs_reference = int(mismatch.sum())
    bits, largest = policy.FLOAT_FORMATS.get(dtype, (53, math.inf))
    # Past largest + half an ulp, the correctly rounded value *is* inf.
    threshold = largest * (1 + 2.0 ** -bits)
    side.overflow_to_inf = int((np.isinf(v64) & np.isfinite(r64) & (np.abs(r64) >= threshold)).sum())
    both = np.isfinite(v64) & np.isfinite(r64)
    if both.any():
        err = np.abs(v64[both] - r64[both])
        side.max_abs_error = float(err.max())
        with np.errstate(over="ignore"):  # an error at a zero reference is relatively infinite
            side.max_rel_error = float((err / np.maximum(np.abs(r64[both]), np.finfo(np.float64).tiny)).max())
            side.max_ulps = float((err / ulp(r64[both], dtype)).max())
        side.rmse = float(np.sqrt(np.mean(err.astype(np.float64) ** 2)))
    rtol, atol = policy.reference_tolerance(dtype)
    # inf where float64 lies beyond the dtype's range is the correctly rounded answer.
    rounded_ok = np.where(np.isinf(v64) & np.isfinite(r64) & (np.abs(r64) >= threshold), v64, r64) \
        if side.overflow_to_inf else r64
    side.agrees_with_reference = side.nonfinite_vs_reference == side.overflow_to_inf and bool(
        np.allclose(v64, rounded_ok, rtol=rtol, atol=atol, equal_nan=True))
    return side


def _single(run: ArmRun, o: Observable, side: Side) -> Divergence:
    fp = o.fingerprint or {}
    rtol, atol = policy.reference_tolerance(side.dtype)
    return Divergence(
        source="reference", observable_label=o.shown, line=o.line, a=side, b=None,
        dtype=side.dtype, bitwise_equal=False, within_tolerance=False,
        rtol=rtol, atol=atol,
        max_abs_diff=side.max_abs_error, nonfinite_mismatch=side.nonfinite_vs_reference,
        numel=fp.get("numel", 0), ancestors=_ancestors(run, o, None, None),
    )


def _fails(x: Observable, y: Observable, tolerance: dict[str, float] | None) -> bool | None:
    """Whether two values of one shape fail a check's rtol and atol, as `assert_close` and
    `allclose` test them (|x − y| ≤ atol + rtol·|y|, nan equal to nan); None without a
    tolerance or values to test."""
    if not tolerance or x.value is None or y.value is None or x.value.shape != y.value.shape:
        return None
    kind = np.complex128 if np.iscomplexobj(x.value) or np.iscomplexobj(y.value) else np.float64
    return not np.allclose(x.value.astype(kind), y.value.astype(kind), rtol=tolerance["rtol"],
                           atol=tolerance["atol"], equal_nan=True)


def pair_divergence(source: str, ra: ArmRun, x: Observable, rb: ArmRun, y: Observable) -> Divergence:
    """Two observed values (two arms', or two of one arm's) measured against each other."""
    sa, sb = side_of(ra, x), side_of(rb, y)
    fa, fb = x.fingerprint or {}, y.fingerprint or {}
    dtypes = [fa.get("dtype", "?"), fb.get("dtype", "?")]
    # Comparing two dtypes (fp16 vs fp32): the looser tolerance applies.
    dtype = max(dtypes, key=lambda d: policy.tolerance(d)[0])
    rtol, atol = policy.tolerance(dtype)
    d = Divergence(source=source, observable_label=x.shown if x.shown == y.shown else f"{x.shown} vs {y.shown}",
                   line=x.line, a=sa, b=sb, dtype=dtype, bitwise_equal=_bits(x)[2] == _bits(y)[2] and fa.get("dtype") == fb.get("dtype"),
                   within_tolerance=False, rtol=rtol, atol=atol, max_abs_diff=None,
                   nonfinite_mismatch=0, numel=fa.get("numel", 0),
                   ancestors=_ancestors(ra, x, rb, y))
    if x.value is not None and y.value is not None and x.value.shape == y.value.shape:
        kind = np.complex128 if np.iscomplexobj(x.value) or np.iscomplexobj(y.value) else np.float64
        a64, b64 = x.value.astype(kind), y.value.astype(kind)
        d.nonfinite_mismatch = int(nonfinite_mismatch(a64, b64).sum())
        both = np.isfinite(a64) & np.isfinite(b64)
        d.max_abs_diff = float(np.abs(a64[both] - b64[both]).max()) if both.any() else None
        d.differing = int((~((a64 == b64) | (np.isnan(a64) & np.isnan(b64)))).sum())
        d.within_tolerance = d.nonfinite_mismatch == 0 and bool(np.allclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True))
        if d.within_tolerance and both.any() and not np.allclose(a64[both], b64[both], rtol=rtol, atol=0.0):
            # Said only where a typical element is below atol, so that atol swamps the values
            # themselves (1 - cos(x) of tiny x); near-zero elements among O(1) ones are what
            # atol is for.
            scale = np.maximum(np.abs(a64[both]), np.abs(b64[both]))
            if float(np.median(scale)) < atol:
                d.hidden_by_atol = float((np.abs(a64[both] - b64[both]) / np.where(scale > 0, scale, 1.0)).max())
        if not d.bitwise_equal and d.nonfinite_mismatch == 0 and not d.max_abs_diff:
            d.bit_difference = _equal_values_bit_difference(a64, b64)
        if d.nonfinite_mismatch == 0:
            d.fp64_rule = _fp64_rule(sa, sb, dtype, d.numel)
    else:
        d.nonfinite_mismatch = sum(abs(fa.get(k, 0) - fb.get(k, 0)) for k in ("nan", "posinf", "neginf"))
    return d


def _equal_values_bit_difference(a: np.ndarray, b: np.ndarray) -> str | None:
    """Why two arrays with equal values have different bits: the sign of a zero, or the sign
    or payload of a NaN (None: the values are not equal after all)."""
    if np.iscomplexobj(a) or np.iscomplexobj(b):
        return None
    zeros = (a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b))
    if zeros.any():
        return "signed-zero"
    if (np.isnan(a) & np.isnan(b)).any():
        return "nan-bits"
    return None


def _fp64_rule(a: Side, b: Side, dtype: str, numel: int) -> str | None:
    """Dynamo's accuracy rule, applied both ways: neither side is m× farther from float64."""
    if a.rmse is None or b.rmse is None:
        return None
    m = policy.rmse_multiplier(dtype, numel)
    tol = policy.DYNAMO_TOL
    worse, better = (a, b) if a.rmse >= b.rmse else (b, a)
    passes = worse.rmse <= m * better.rmse + tol / 10
    verb = "≤" if passes else ">"
    return (f"{'pass' if passes else 'fail'}: RMSE({worse.arm} {worse.label}, fp64) = {worse.rmse:.3g} {verb} "
            f"{m:g}·RMSE({better.arm} {better.label}, fp64) + {tol}/10 = {m * better.rmse + tol / 10:.3g}")


def _ancestors(ra: ArmRun, x: Observable, rb: ArmRun | None, y: Observable | None) -> list[dict[str, Any]]:
    """The leaves a diverging value depends on, each paired by identity with the other side's
    (`pair_leaves`) and marked where their bytes differ, with both hashes."""
    xs = [ra.leaves[i] for i in x.ancestors if i < len(ra.leaves)]
    ys = [rb.leaves[i] for i in y.ancestors if i < len(rb.leaves)] if (rb is not None and y is not None) else []
    out = []
    for leaf, other, differs in pair_leaves(xs, ys)[:64]:
        out.append({"index": leaf["index"], "kind": leaf["kind"], "op": leaf.get("op"), "line": leaf.get("line"),
                    "shape": _shape(leaf), "differs": differs, "sha256": _leaf_bits(leaf)[2],
                    "other_index": other["index"] if other else None,
                    "other_sha256": _leaf_bits(other)[2] if other else None})
    return out


# Leaf kinds (worker/opgraph.py) whose values the script determines: a factory's output, data.
DETERMINISTIC_LEAVES = ("factory", "input")


def _distinct_draws(run: ArmRun, x: Observable, y: Observable) -> list[dict[str, Any]]:
    """Within one arm, the random/uninitialized leaves only `x` depends on that have the shape
    of a leaf only `y` depends on that may be a draw too: two draws of one thing
    (`Divergence.distinct_draws`). A leaf the other side made deterministically (a factory's,
    the script's data) is no second draw: `X @ A` against `torch.eye(64)`, A drawn, compares a
    product with the identity. A compiled region's own leaves may be (its `torch.empty`)."""
    only_a = [run.leaves[i] for i in x.ancestors if i not in y.ancestors and i < len(run.leaves)]
    only_b = [run.leaves[i] for i in y.ancestors if i not in x.ancestors and i < len(run.leaves)]
    shapes_b = [(leaf["fingerprint"] or {}).get("shape") for leaf in only_b if leaf["kind"] not in DETERMINISTIC_LEAVES]
    out = []
    for leaf in only_a:
        shape = (leaf["fingerprint"] or {}).get("shape")
        if leaf["kind"] in ("random", "uninitialized") and shape in shapes_b:
            out.append({"index": leaf["index"], "kind": leaf["kind"], "op": leaf.get("op"),
                        "line": leaf.get("line"), "shape": shape, "differs": True})
    return out


def _is_index(dtype: str) -> bool:
    return dtype in ("int64", "int32", "int16", "int8", "uint8")


def _is_float(dtype: str) -> bool:
    return dtype in policy.FLOAT_FORMATS or dtype in ("float16", "bfloat16", "complex32")


def summarize(fp: dict[str, Any] | None) -> str:
    """A short human rendering of a fingerprint: the first values and the nonfinite counts."""
    if not fp:
        return "?"
    shape = "[" + ", ".join(str(s) for s in fp["shape"]) + "]"
    vals = []
    for v in fp.get("sample", [])[:SUMMARY_VALUES]:
        if isinstance(v, float):
            vals.append(f"{v:.6g}")
        elif isinstance(v, list):
            vals.append(f"{v[0]}+{v[1]}j")
        else:
            vals.append(str(v))
    more = ", …" if fp.get("numel", 0) > SUMMARY_VALUES else ""
    text = f"[{', '.join(vals)}{more}]" if fp["shape"] else (vals[0] if vals else "?")
    flags = [f"{fp[k]} {name}" for k, name in (("nan", "nan"), ("posinf", "+inf"), ("neginf", "-inf")) if fp.get(k)]
    extra = f" ({', '.join(flags)} of {fp['numel']})" if flags and fp["numel"] > 1 else ""
    return f"{text} {fp['dtype']}{shape}{extra}" if fp["shape"] else f"{text} ({fp['dtype']}){extra}"
