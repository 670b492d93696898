"""Where two values of one arm stop being one computation (stage 3, from the recorded op graph).

When a script compares two of its own values and their float64 replays differ beyond both
rounding spreads, the two are different functions, not one quantity rounded twice.  What a
maintainer needs next is *where* they part: the ops of each value's cone that have no
counterpart in the other's.  A counterpart is the same op, on counterpart inputs, with the
same constants; structure is compared bottom-up, so a shared input (the same leaf, or the
same op applied to it on both sides) cancels out and only the ops that differ remain.

Two readings follow from those ops, each a fact of the graph rather than a guess about the
script: ops in the same order on both sides that differ only in a constant (a typo'd
coefficient, `correction=1` against `correction=0`), and the well-known pairings that compute
different statistics under similar names (an unbiased `var`/`std` against a normalization
layer's biased one). And before any of that, whether the two are two computations of one
quantity at all: a value computed later may start from what the earlier one's computation
left (`carried_state`: a training step between two calls, an argument written in place).
"""
from __future__ import annotations

import ast
import hashlib
import json
import math
from typing import Any

from triage.arms.graph import OpGraph
from triage.numerics.constants import NAMED_CONSTANTS
from triage.numerics.literals import literal, to_dtype

MAX_LISTED = 6
FLOATING = ("float", "bfloat", "complex")  # the dtype names of floating values
# Normalization kernels that divide the variance by n (biased), where `x.var()`/`x.std()`
# divide by n - 1 unless told otherwise.
BIASED_NORMS = ("native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
                "native_group_norm", "instance_norm", "rms_norm", "_fused_rms_norm")
VARIANCE_OPS = ("var", "std", "var_mean", "std_mean")
BOOKKEEPING = {"detach", "alias", "view", "_unsafe_view", "expand", "clone", "contiguous", "t", "transpose",
               "permute", "reshape", "squeeze", "unsqueeze", "ones_like", "zeros_like", "lift_fresh", "_to_copy",
               "copy_", "slice", "select", "as_strided", "new_ones", "new_zeros", "empty_like", "view_as_real",
               "view_as_complex", "real", "imag"}
TORCH_NAMESPACES = {"aten", "prims", "quantized", "_quantized", "torchvision", "inductor", "higher_order"}


def part_ways(graph: OpGraph, node_a: str, node_b: str, source: str | None = None) -> dict[str, Any] | None:
    """The ops computing `node_a` with no counterpart among those computing `node_b`, and
    the other way round (execution order, at most MAX_LISTED each), with what they tell
    (`source`, the script's text: which of them its own `autograd.Function` backward ran)."""
    cone_a, cone_b = graph.cone(node_a), graph.cone(node_b)
    if not cone_a and not cone_b:
        return None
    carried = carried_state(graph, node_a, node_b)
    keys: dict[str, str] = {}
    keys_a = {_key(graph, op, keys) for op in cone_a}
    keys_b = {_key(graph, op, keys) for op in cone_b}
    only_a = [op for op in graph.ordered(cone_a) if keys[op] not in keys_b and not _bookkeeping(graph, op)]
    only_b = [op for op in graph.ordered(cone_b) if keys[op] not in keys_a and not _bookkeeping(graph, op)]
    if not only_a and not only_b:
        return None
    # One side over the whole batch, the other per slice: said after the hints, with what the
    # accuracy note makes of it where the float64 values agree and where they do not
    # (`classify.wording.parting_text`).
    batched = _batched_hint(graph, only_a, only_b)
    # Ops both sides call, each on inputs the other's call does not have (attention on a
    # padded batch and on each sequence alone): no counterpart, yet not absent either.
    targets_a, targets_b = ([str(graph.by_name[op].get("target")) for op in side
                             if _op_name(graph.by_name[op]) not in SLICE_GLUE] for side in (only_a, only_b))
    called_b = set(targets_b)
    on_both = [t for t in dict.fromkeys(targets_a) if t in called_b]
    return {"carried": carried, "only_a": [_describe(graph, op) for op in only_a[:MAX_LISTED]], "only_a_count": len(only_a),
            "only_b": [_describe(graph, op) for op in only_b[:MAX_LISTED]], "only_b_count": len(only_b),
            "constant_a": _constant(graph, cone_a), "constant_b": _constant(graph, cone_b),
            "batched": batched, "on_both": on_both[:MAX_LISTED],
            "running_sums": [dict(found, side=side) for side, ops in (("a", only_a), ("b", only_b))
                             for found in [_running_sum(graph, ops)] if found is not None],
            "round_trip_a": _round_trip(graph, only_a), "round_trip_b": _round_trip(graph, only_b),
            "precisions": _precisions(graph, only_a, only_b),
            "integer_cast": _integer_cast(graph, [op for op in graph.ordered(cone_a) if keys[op] not in keys_b]
                                          + [op for op in graph.ordered(cone_b) if keys[op] not in keys_a]),
            "hints": (_batch_norm_modes(graph, only_a, only_b)
                      + _constants(graph, only_a, only_b) + _one_step_apart(graph, cone_a, cone_b, keys, node_a, node_b)
                      + _variance_hints(graph, only_a, only_b) + _layout_hint(graph, cone_a, cone_b, only_a, only_b)
                      + _custom_ops(graph, only_a + only_b) + _custom_backwards(graph, only_a + only_b, source)
                      )[:3 if batched else 4]}


# Additions chained at one line, each adding a term to the last one's result (`total += x` in
# a Python loop), from which a running total is named: from a few hundred terms on, a
# bfloat16 total's spacing outgrows a term of its typical size.
RUNNING_SUM_TERMS = 64
ADDITIONS = ("add", "add_", "sub", "sub_")


def _running_sum(graph: OpGraph, ops: list[str]) -> dict[str, Any] | None:
    """The longest chain among `ops` of additions at one line whose first operand is the
    previous one's result (an accumulator a loop adds to): {"line", "terms", "dtype"}; None
    below RUNNING_SUM_TERMS terms."""
    chosen = set(ops)
    chained: dict[Any, int] = {}
    dtypes: dict[Any, str] = {}
    for op in ops:
        node = graph.by_name[op]
        first = (node.get("args") or [None])[0]
        source = graph.op_of(first["node"]) if isinstance(first, dict) and isinstance(first.get("node"), str) else None
        if _op_name(node) in ADDITIONS and source in chosen and graph.by_name[source].get("target") == node.get("target"):
            chained[node.get("line")] = chained.get(node.get("line"), 0) + 1
            dtypes[node.get("line")] = str(node.get("dtype", ""))
    if not chained:
        return None
    line, count = max(chained.items(), key=lambda kv: kv[1])
    return {"line": line, "terms": count + 1, "dtype": dtypes[line]} if count + 1 >= RUNNING_SUM_TERMS else None

def carried_state(graph: OpGraph, node_a: str, node_b: str) -> dict[str, Any] | None:
    """Whether the side computed later starts from what the earlier one's computation left,
    so the two are no two computations of one quantity: the earlier value is among the later
    one's inputs (a training step between two calls of a model: `backward` and an optimizer's
    `step` on the first output), or a tensor both read was written in place by the same code
    once for each side (a function that writes its argument, called twice on one tensor:
    the second call starts from the first one's writes). {"later": "a" | "b", "via": "value" |
    "in-place", "lines": the script lines of the ops carrying it, "op": the in-place op}; None."""
    op_a, op_b = graph.op_of(node_a), graph.op_of(node_b)
    if op_a is None or op_b is None or op_a == op_b:
        return None
    later = "b" if graph.position[op_b] > graph.position[op_a] else "a"
    first_op, later_op = (op_a, op_b) if later == "b" else (op_b, op_a)
    cone_first, cone_later = graph.cone(first_op), graph.cone(later_op)
    if first_op in cone_later:
        carrying = {first_op}
        for op in graph.ordered(cone_later - cone_first):
            if any(graph.op_of(r) in carrying for r in graph.reads[op]):
                carrying.add(op)
        # Through state the first side read, written in place (an optimizer's step on the
        # weights): a value checked against one computed from it directly (a round trip,
        # `ifft(fft(y))` against `y`) is no state carried.
        read_first = {r for op in cone_first for r in graph.reads[op]} | set(cone_first)
        if any(_writes_in_place(graph, op) and _written_root(graph, op) in read_first for op in carrying):
            # The later side's own ops (its call's line) are not what lies between the two.
            lines = sorted({graph.by_name[op].get("line") for op in carrying - {first_op}}
                           - {None, graph.by_name[later_op].get("line")})
            return {"later": later, "via": "value", "lines": lines[:MAX_LISTED], "op": None}
    first_writes = {op for op in cone_first if _writes_in_place(graph, op)}
    own_writes = [op for op in graph.ordered(cone_later - cone_first) if _writes_in_place(graph, op)]
    for shared in graph.ordered(first_writes & cone_later):
        line, root = graph.by_name[shared].get("line"), _written_root(graph, shared)
        again = next((op for op in own_writes if _written_root(graph, op) == root
                      and graph.by_name[op].get("line") == line and graph.by_name[op].get("target")
                      == graph.by_name[shared].get("target")), None)
        if again is not None and isinstance(line, int):
            return {"later": later, "via": "in-place", "lines": [line], "op": _op_name(graph.by_name[shared])}
    return None


def _writes_in_place(graph: OpGraph, op: str) -> bool:
    """An aten op that writes its first argument (`sub_`, `mul_`; not a `__dunder__`)."""
    name = _op_name(graph.by_name[op])
    return name.endswith("_") and not name.endswith("__") and bool(_refs(graph.by_name[op].get("args", [])[:1]))


def _written_root(graph: OpGraph, op: str) -> str | None:
    """The tensor an in-place op writes, as the value it had before any in-place op wrote it."""
    for _ in range(len(graph.nodes)):
        refs = _refs(graph.by_name[op].get("args", [])[:1])
        if not refs:
            return None
        op = refs[0]
        if op not in graph.reads or not _writes_in_place(graph, op):
            return op
    return None


def _layout_hint(graph: OpGraph, cone_a: frozenset[str], cone_b: frozenset[str], only_a: list[str],
                 only_b: list[str]) -> list[str]:
    """The same ops, with the same constants, on both sides, where one side's inputs come
    through a copy into another memory format (`x.to(memory_format=torch.channels_last)`):
    the layout picks the kernel, and with it the order of its additions."""
    if not only_a or [_step_key(graph.by_name[o]) for o in only_a] != [_step_key(graph.by_name[o]) for o in only_b]:
        return []
    copies = [op for cone, other in ((cone_a, cone_b), (cone_b, cone_a)) for op in graph.ordered(cone - other)
              if _memory_format(graph.by_name[op]) not in (None, "preserve_format", "contiguous_format")]
    if not copies:
        return []
    node = graph.by_name[copies[0]]
    ops = ", ".join(dict.fromkeys(f"`{graph.by_name[o].get('target')}`" for o in only_a))
    return [f"Both sides run the same ops ({ops}), but one side's inputs come through a copy into "
            f"torch.{_memory_format(node)} memory format (`{node.get('target')}` at line {node.get('line')}): the "
            "layout selects the kernel, and with it the order of its additions"]


def _memory_format(node: dict[str, Any]) -> str | None:
    value = ((node.get("kwargs") or {}).get("dict") or {}).get("memory_format")
    return value.get("memory_format") if isinstance(value, dict) else None


# What takes a batch apart and puts it back together around a per-slice computation.
SLICE_GLUE = {"stack", "cat", "unbind", "split", "split_with_sizes", "chunk", "narrow", "index_select", "squeeze_",
              "unsqueeze_", "select", "slice", "squeeze", "unsqueeze"}


def _batched_hint(graph: OpGraph, only_a: list[str], only_b: list[str]) -> str:
    """One side computes once over a whole batch, the other once per slice and joins the
    slices (`x @ W.T` against `torch.stack([x[i] @ W.T for i …])`, or a module's fused fast
    path on the batch against its composite path on each sample): the accuracy note's
    'Batched computations or slice computations' section, which promises no bitwise agreement
    ("PyTorch internal implementations of operations can produce slightly different results").
    Empty where the two sides are not that."""
    def computing(ops: list[str]) -> list[str]:
        return [n for n in (_op_name(graph.by_name[op]) for op in ops) if n not in SLICE_GLUE]

    def target(ops: list[str], name: str) -> str:
        return next(str(graph.by_name[x].get("target")) for x in ops if _op_name(graph.by_name[x]) == name
                    ).rsplit(".", 1)[0]

    def listed(names: list[str]) -> str:
        return ", ".join(f"`{target(only_a + only_b, n)}`" for n in names[:3]) + (", …" if len(names) > 3 else "")

    note = "then joins them"
    for whole, sliced in ((only_a, only_b), (only_b, only_a)):
        w, s = computing(whole), computing(sliced)
        joins = [op for op in sliced if _op_name(graph.by_name[op]) in ("stack", "cat")]
        if not w or not joins:
            continue
        if len(set(s)) == 1 and set(w) <= set(s) and len(s) >= 2 * len(w):
            return (f"One side computes `{target(sliced, s[0])}` over the whole batch, the other {len(s)} times, one "
                    f"slice each, {note}")
        # Another implementation per slice: the same ops once for each value the join joins.
        joined = len(_join_inputs(graph, joins[-1]))
        counts = {n: s.count(n) for n in s}
        whole_ops = list(dict.fromkeys(w))
        if joined >= 2 and len(w) <= len(s) // joined and all(c % joined == 0 for c in counts.values()):
            return (f"One side computes {listed(whole_ops)} over the whole batch, the other {len(s) // joined} ops per "
                    f"slice ({listed(list(counts))}) for each of {joined} slices, {note}")
    return ""


def _join_inputs(graph: OpGraph, op: str) -> list[Any]:
    """The values a `stack`/`cat` call joins (its first argument's list)."""
    args = graph.by_name[op].get("args") or []
    return args[0] if args and isinstance(args[0], list) else []


def _constant(graph: OpGraph, cone: frozenset[str]) -> bool:
    """A value no op computes: data the script wrote down (`torch.tensor([1.0, 3.0])`)."""
    return all(_bookkeeping(graph, op) for op in cone)


def _bookkeeping(graph: OpGraph, op: str) -> bool:
    """Ops that move or relabel values without computing (views, detach, copies, autograd's
    seed): listing them would bury the ops that compute."""
    return _op_name(graph.by_name[op]) in BOOKKEEPING


def _custom_ops(graph: OpGraph, ops: list[str]) -> list[str]:
    """Ops outside PyTorch's own namespaces: the script's (or a library's) torch.library ops,
    whose kernel and registered gradient are code PyTorch does not test."""
    seen = []
    for op in ops:
        target = str(graph.by_name[op].get("target", ""))
        namespace = target.split(".")[0]
        if namespace not in TORCH_NAMESPACES and target not in seen:
            seen.append(target)
    return [f"`{t}` is a custom op (`torch.library`): its kernel and its registered autograd formula are the "
            "script's own code, the first place to look" for t in seen[:1]]


def _custom_backwards(graph: OpGraph, ops: list[str], source: str | None) -> list[str]:
    """The script's own `torch.autograd.Function` whose `backward` ran parting ops: a gradient
    written by hand, which no PyTorch test checks against its forward (a dropped factor, the
    derivative of another function). Named with the lines it ran, which an op list in
    execution order puts after the forward's."""
    if not source:
        return []
    lines = {graph.by_name[op].get("line") for op in ops}
    for name, first, last in custom_backwards(source):
        ran = sorted(x for x in lines if isinstance(x, int) and first <= x <= last)
        if ran:
            where = f"line {ran[0]}" if len(ran) == 1 else f"lines {', '.join(map(str, ran))}"
            return [f"`{name}.backward` (lines {first}–{last}) is the gradient the script wrote by hand for its "
                    f"`autograd.Function`, and it computes parting ops at {where}: the first place to look"]
    return []


def custom_backwards(source: str) -> list[tuple[str, int, int]]:
    """(class, first line, last line) of each `backward` of a class deriving from
    `torch.autograd.Function` (as `Function`, `autograd.Function` or `torch.autograd.Function`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if not any(ast.unparse(base).split(".")[-1] == "Function" and "autograd" in ast.unparse(base)
                   or ast.unparse(base) == "Function" for base in cls.bases):
            continue
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == "backward":
                found.append((cls.name, item.lineno, item.end_lineno or item.lineno))
    return found


def _key(graph: OpGraph, name: str, keys: dict[str, str]) -> str:
    """A structural hash: the op's target, its constants, and its inputs' keys (a leaf is
    itself).  Iterative, since a long chain would exhaust Python's recursion."""
    stack = [name]
    while stack:
        current = stack[-1]
        if current in keys:
            stack.pop()
            continue
        node = graph.by_name[current]
        if node["op"] == "getitem":
            deps = [node["of"]]
        elif node["op"] == "call":
            deps = _refs(node["args"]) + _refs(node["kwargs"])
        else:
            keys[current] = "leaf:" + current
            stack.pop()
            continue
        missing = [d for d in deps if d not in keys and d in graph.by_name]
        if missing:
            stack.extend(missing)
            continue
        if node["op"] == "getitem":
            text = f"item:{keys.get(node['of'], node['of'])}:{node.get('index')}"
        else:
            text = json.dumps([node["target"], _shape(node["args"], keys), _shape(node["kwargs"], keys)],
                              sort_keys=True, default=str)
        keys[current] = hashlib.sha256(text.encode()).hexdigest()[:24]
        stack.pop()
    return keys[name]


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        if set(value) == {"node"}:
            return [value["node"]]
        return [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


def _shape(value: Any, keys: dict[str, str]) -> Any:
    """The argument with each node reference replaced by that node's key."""
    if isinstance(value, dict):
        if set(value) == {"node"}:
            return {"node": keys.get(value["node"], value["node"])}
        return {k: _shape(v, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v, keys) for v in value]
    return value


def _op_name(node: dict[str, Any]) -> str:
    """`aten.var.correction` -> `var`."""
    return str(node.get("target", "")).split(".")[1] if "." in str(node.get("target", "")) else str(node.get("target"))


def _constants_of(node: dict[str, Any]) -> dict[str, Any]:
    """The op's non-tensor arguments, by position and keyword."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(node.get("args") or []):
        if not _refs(arg):
            out[f"arg{i}"] = arg
    for k, v in ((node.get("kwargs") or {}).get("dict") or {}).items():
        if not _refs(v):
            out[k] = v
    return out


def _describe(graph: OpGraph, op: str) -> dict[str, Any]:
    node = graph.by_name[op]
    return {"op": str(node.get("target")), "line": node.get("line"),
            "constants": {k: v[:100] if isinstance(v, str) else v for k, v in list(_constants_of(node).items())[:16]
                          if isinstance(v, (int, float, str, bool))}}


def _constants(graph: OpGraph, only_a: list[str], only_b: list[str]) -> list[str]:
    """The same ops in the same order on both sides, differing only in a constant: a product
    by c and a quotient by 1/c are one scaling, a sum with c and a difference with -c one
    shift (`x / 1.4142` beside `x * 0.7071067811865476`, the second 1/√2)."""
    if not only_a or len(only_a) != len(only_b):
        return []
    steps = [[_step(graph.by_name[x]) for x in side] for side in (only_a, only_b)]
    if [kind for kind, _, _ in steps[0]] != [kind for kind, _, _ in steps[1]]:
        return []
    hints = []
    for (kind, cx, x), (_, cy, y) in zip(*steps, strict=True):
        if kind in SCALINGS:
            if not math.isclose(cx, cy, rel_tol=1e-12):
                verb = SCALINGS[kind]
                hints.append(f"`{x['target']}` {_applies(x, verb)} at line {x.get('line')} where `{y['target']}` "
                             f"{_applies(y, verb)} at line {y.get('line')}: one formula but for this constant, "
                             f"relatively {abs(cx - cy) / max(abs(cx), abs(cy)):.2g} apart")
            continue
        for k in sorted(set(cx) | set(cy)):
            if cx.get(k) != cy.get(k) and not _maybe_same_dims(cx.get(k), cy.get(k)):
                hints.append(f"`{x['target']}` takes the constant {cx.get(k)!r} at line {x.get('line')} where the "
                             f"other side has {cy.get(k)!r} (line {y.get('line')})")
    return hints[:3]


def _one_step_apart(graph: OpGraph, cone_a: frozenset[str], cone_b: frozenset[str], keys: dict[str, str],
                    node_a: str, node_b: str) -> list[str]:
    """Two chains of ops (each computes from the one before), from the same inputs, one step
    apart: the same steps but one that only one side takes (a `/ beta` left out, a bias added
    on one side only), or the same steps in another order (an eps added before `sqrt` on one
    side, after it on the other). A step is an op with its constants, a scaling or shift by
    its multiplier or addend whichever op spells it (`_step`)."""
    sides = []
    for cone, other, end in ((cone_a, cone_b, node_a), (cone_b, cone_a, node_b)):
        other_keys = {keys[op] for op in other}
        differing = {op for op in cone if keys[op] not in other_keys}
        chain = [op for op in graph.ordered(differing) if not _bookkeeping(graph, op)]
        if any(chain[i - 1] not in _computed_from(graph, chain[i]) for i in range(1, len(chain))):
            return []
        # What the differing ops read from outside themselves, by what it is (its key); a side
        # with no differing op is itself the other side's input.
        reads = {op: {keys.get(r, r) for r in graph.reads[op] if graph.op_of(r) not in differing}
                 for op in differing}
        sides.append((chain, reads, set().union(*reads.values()) if differing else {_key(graph, end, keys)}))
    (chain_a, reads_a, inputs_a), (chain_b, reads_b, inputs_b) = sides
    steps_a = [_step_key(graph.by_name[op]) for op in chain_a]
    steps_b = [_step_key(graph.by_name[op]) for op in chain_b]
    if len(steps_a) == len(steps_b):
        if inputs_a != inputs_b or steps_a == steps_b or sorted(steps_a) != sorted(steps_b):
            return []
        first = next(i for i in range(len(steps_a)) if steps_a[i] != steps_b[i])
        last = max(i for i in range(len(steps_a)) if steps_a[i] != steps_b[i])
        window_a, window_b = chain_a[first:last + 1], chain_b[first:last + 1]
        return [f"The same steps in another order: one side {_steps_text(graph, window_a)} (line "
                f"{graph.by_name[window_a[0]].get('line')}), the other {_steps_text(graph, window_b)} (line "
                f"{graph.by_name[window_b[0]].get('line')})"]
    (longer, reads, steps_long), (inputs_short, steps_short) = \
        ((chain_a, reads_a, steps_a), (inputs_b, steps_b)) if len(steps_a) > len(steps_b) \
        else ((chain_b, reads_b, steps_b), (inputs_a, steps_a))
    if len(steps_long) != len(steps_short) + 1:
        return []
    extra = next((i for i in range(len(steps_long)) if steps_long[:i] + steps_long[i + 1:] == steps_short), None)
    if extra is None:
        return []
    # Without the extra step, the next one reads what it read: one of its inputs (the value a
    # bias is added to) where it comes first, its predecessor in the chain otherwise. Its
    # other inputs (the bias) are its own; the rest must read what the shorter side reads.
    rest = set().union(*(r for op, r in reads.items() if op != longer[extra]))
    if not any(rest | through == inputs_short for through in [set()] + [{r} for r in reads[longer[extra]]]):
        return []
    node = graph.by_name[longer[extra]]
    return [f"{_steps_text(graph, [longer[extra]])} at line {node.get('line')} is a step the other side does not "
            "take; otherwise both sides take the same steps in the same order"]


# Significand bits of the floating dtypes, to order two sides' precisions.
SIGNIFICAND_BITS = {"float64": 53, "complex128": 53, "float32": 24, "complex64": 24, "float16": 11, "complex32": 11,
                    "bfloat16": 8}


def _precisions(graph: OpGraph, only_a: list[str], only_b: list[str]) -> dict[str, str] | None:
    """The same steps in the same order on both sides, each step of one side at most as
    precise as its counterpart on the other and one less precise (`f(x)` against
    `f(x.double()).float()`; a bfloat16 `cumsum` divided by float32 counts against the same
    in float64): {"a": a's least precise dtype, "b": b's}."""
    if not only_a or [_step_key(graph.by_name[x]) for x in only_a] != [_step_key(graph.by_name[x]) for x in only_b]:
        return None
    # The floating steps' dtypes: a mask or an index the steps make along the way (quantile's
    # `isnan`, `sort`'s indices) is a bool or an integer on both sides.
    pairs = [(da, db) for da, db in ((_dtype_of(graph, x), _dtype_of(graph, y)) for x, y in zip(only_a, only_b, strict=True))
             if isinstance(da, str) and da.startswith(FLOATING) and isinstance(db, str) and db.startswith(FLOATING)]
    if not pairs or any(d not in SIGNIFICAND_BITS for pair in pairs for d in pair):
        return None
    bits = [(SIGNIFICAND_BITS[da], SIGNIFICAND_BITS[db]) for da, db in pairs]
    if not (all(x <= y for x, y in bits) or all(x >= y for x, y in bits)) or all(x == y for x, y in bits):
        return None
    least_a, least_b = (min((p[i] for p in pairs), key=SIGNIFICAND_BITS.__getitem__) for i in (0, 1))
    return {"a": least_a, "b": least_b} if least_a != least_b else None


def _dtype_of(graph: OpGraph, op: str) -> str | None:
    """The op's dtype; of an op with several outputs (`topk`'s values and indices), its first
    floating one's."""
    own = graph.by_name[op].get("dtype")
    if own is not None:
        return own
    return next((d for d in (graph.by_name[i].get("dtype") for i in graph.items.get(op, []))
                 if isinstance(d, str) and d.startswith(FLOATING)), None)


def _computed_from(graph: OpGraph, op: str) -> set[str]:
    """The computing ops `op` reads, through views and copies (`_bookkeeping`)."""
    found: set[str] = set()
    stack = list(graph.reads[op])
    while stack:
        producer = graph.op_of(stack.pop())
        if producer is None or producer in found:
            continue
        if _bookkeeping(graph, producer):
            stack.extend(graph.reads[producer])
        else:
            found.add(producer)
    return found


def _step_key(node: dict[str, Any]) -> str:
    kind, value, _ = _step(node)
    return json.dumps([kind, value], sort_keys=True, default=str)


def _steps_text(graph: OpGraph, ops: list[str]) -> str:
    """'adds 1e-05 then `aten.sqrt.default`'."""
    said = []
    for op in ops:
        node = graph.by_name[op]
        kind = _step(node)[0]
        said.append(f"`{node['target']}` {_applies(node, SCALINGS[kind])}" if kind in SCALINGS
                    else f"`{node['target']}`")
    return " then ".join(said)


def _maybe_same_dims(x: Any, y: Any) -> bool:
    """Two dimension arguments that may name the same dimensions: -1 and 2 of a 3-d value
    (the graph does not hold the rank that would tell)."""
    def dims(v: Any) -> list[int] | None:
        v = [v] if isinstance(v, int) and not isinstance(v, bool) else v
        return v if isinstance(v, list) and v and all(isinstance(d, int) and not isinstance(d, bool) for d in v) else None

    dx, dy = dims(x), dims(y)
    return dx is not None and dy is not None and len(dx) == len(dy) and any((a < 0) != (b < 0) for a, b in zip(dx, dy, strict=True))


# The DFT ops' `normalization` argument: 0 scales by nothing, 1 by 1/√n, 2 by 1/n. A forward
# transform's `norm=` "backward" (the default), "ortho", "forward" is 0, 1, 2; an inverse's is
# "forward", "ortho", "backward" (the default).
FORWARD_NORMS = ("backward", "ortho", "forward")
INVERSE_NORMS = ("forward", "ortho", "backward")


def _round_trip(graph: OpGraph, ops: list[str]) -> dict[str, Any] | None:
    """A forward DFT then an inverse one among `ops`, with the power p of the transform length
    n their normalizations leave (the unnormalized pair multiplies by n): the round trip is
    n^p times its input, the identity only for p = 0 (`irfft(rfft(x), norm="forward")`: n)."""
    found: dict[str, dict[str, Any]] = {}
    for op in ops:
        node = graph.by_name[op]
        name, args = _op_name(node), node.get("args") or []
        if len(args) < 3 or not isinstance(args[2], int) or not 0 <= args[2] <= 2:
            continue
        forward = name == "_fft_r2c" or name == "_fft_c2c" and len(args) > 3 and args[3] is True
        inverse = name == "_fft_c2r" or name == "_fft_c2c" and len(args) > 3 and args[3] is False
        if forward and "forward" not in found or inverse and "forward" in found and "inverse" not in found:
            found["forward" if forward else "inverse"] = {
                "op": str(node.get("target")), "line": node.get("line"), "code": args[2],
                "norm": (FORWARD_NORMS if forward else INVERSE_NORMS)[args[2]]}
    if len(found) < 2:
        return None
    return dict(found, power=1 - (found["forward"]["code"] + found["inverse"]["code"]) / 2)


# A scaling or a shift by a constant, whichever op spells it: its multiplier or addend.
SCALINGS = {"scale": "multiplies by", "shift": "adds"}
# What a step by a constant does, by the op that spells it.
STEP_VERBS = {"mul": "multiplies by", "div": "divides by", "add": "adds", "sub": "subtracts"}


def _step(node: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    """(kind, what distinguishes it, the node): a scaling or shift by one number constant, as
    its multiplier or addend (in place or not: `x.add_(eps)` is `x + eps`); any other op by its
    name and constants."""
    name, constants = _op_name(node).rstrip("_"), _constants_of(node)
    c = constants.get("arg1")
    plain = isinstance(c, (int, float)) and not isinstance(c, bool) and set(constants) <= {"arg1", "alpha"}
    alpha = constants.get("alpha", 1)
    if plain and name in ("mul", "div") and c and "alpha" not in constants:
        return "scale", float(c) if name == "mul" else 1 / float(c), node
    if plain and name in ("add", "sub") and isinstance(alpha, (int, float)):
        return "shift", float(c) * alpha * (1 if name == "add" else -1), node
    return str(node.get("target")), constants, node


def _applies(node: dict[str, Any], verb: str) -> str:
    """'divides by 1.4142', 'multiplies by 0.7071067811865476 (1/√2)'."""
    c = _constants_of(node).get("arg1")
    name = next((n for n, v in NAMED_CONSTANTS.items() if math.isclose(abs(float(c)), v, rel_tol=1e-12)), None)
    said = STEP_VERBS.get(_op_name(node).rstrip("_"), verb)
    sign = "-" if float(c) < 0 else ""
    return f"{said} {_written(c)}" + (f" ({sign}{name})" if name else "")


def _written(c: Any) -> str:
    """A constant as the script likely wrote it: a float32 value by its shortest float32
    literal (an eps of 1e-6 held by a float32 op is 9.999999974752427e-07), others as they are."""
    if isinstance(c, float) and c and math.isfinite(c) and to_dtype(c, "float32") == c:
        short = repr(float(literal(c, "float32")))
        if len(short) < len(repr(c)):
            return short
    return repr(c)


def _variance_hints(graph: OpGraph, only_a: list[str], only_b: list[str]) -> list[str]:
    """An unbiased variance on one side, a biased one (a normalization layer, or `var` with
    correction 0) on the other."""
    def unbiased(ops: list[str]) -> dict[str, Any] | None:
        for op in ops:
            node = graph.by_name[op]
            if _op_name(node) in VARIANCE_OPS and _divides_by_n_minus_one(node):
                return node
        return None

    def biased(ops: list[str]) -> dict[str, Any] | None:
        for op in ops:
            node = graph.by_name[op]
            name = _op_name(node)
            kwargs = (node.get("kwargs") or {}).get("dict") or {}
            if name in BIASED_NORMS or (name in VARIANCE_OPS and kwargs.get("correction") in (0, 0.0)):
                return node
        return None

    hints = []
    for ops, others in ((only_a, only_b), (only_b, only_a)):
        u, b = unbiased(ops), biased(others)
        if u is not None and b is not None:
            hints.append(f"`{u['target']}` at line {u.get('line')} is the unbiased estimate (its variance divides "
                         "by n − 1: `x.var()` and `x.std()` default to `correction=1`), while "
                         f"`{b['target']}` at line {b.get('line')} uses the biased variance (divides by n). "
                         "Pass `correction=0` (`unbiased=False`) to compute the same statistic")
    return hints[:1]


# The largest integer up to which every integer is exact in each floating dtype: 2^(bits).
EXACT_INTEGER_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "complex64": 24}
CASTS = ("_to_copy", "to", "copy_", "_to_dtype")


def _integer_cast(graph: OpGraph, ops: list[str]) -> dict[str, Any] | None:
    """A cast of integers to a floating dtype among the ops one side takes and the other does
    not (`ids.float()`, token ids through float32 features): past 2^24 in float32 (2^11 in
    float16, 2^8 in bfloat16) not every integer is representable, and the cast rounds them.
    {"text", "limit"}: said only where the values compared reach the limit (the classifier
    knows them; a count of 3,000 cast to float32 is exact)."""
    for op in ops:
        node = graph.by_name[op]
        bits = EXACT_INTEGER_BITS.get(str(node.get("dtype")))
        source = next((graph.by_name.get(a) for a in graph.reads.get(op, [])[:1]), None)
        if _op_name(node) not in CASTS or bits is None or source is None \
                or not str(source.get("dtype") or "").startswith(("int", "uint")):
            continue
        return {"limit": 2 ** bits,
                "text": f"`{node['target']}` at line {node.get('line')} converts {source.get('dtype')} values to "
                        f"{node.get('dtype')}, which holds every integer exactly only up to 2^{bits} = {2 ** bits:,}: "
                        "larger ones round to the nearest value it holds (a multiple of 2, then 4, …). Keep "
                        "integers (ids, counts, indices) in an integer dtype, or in float64 up to 2^53"}
    return None


# Batch norm kernels, with the position of their `training` flag (None: eval mode by name).
BATCH_NORMS = {"native_batch_norm": 5, "_native_batch_norm_legit": 5, "_native_batch_norm_legit_no_training": None,
               "cudnn_batch_norm": 5, "miopen_batch_norm": 5}


def _batch_norm_modes(graph: OpGraph, only_a: list[str], only_b: list[str]) -> list[str]:
    """A batch norm in training mode on one side, in eval mode on the other: two functions by
    design, whose outputs differ on the very batch the running statistics come from (the
    running variance is the unbiased estimate, training mode divides by the biased one)."""
    def mode(ops: list[str]) -> dict[bool, dict[str, Any]]:
        found: dict[bool, dict[str, Any]] = {}
        for op in ops:
            node = graph.by_name[op]
            name = _op_name(node)
            if name not in BATCH_NORMS:
                continue
            at, args = BATCH_NORMS[name], node.get("args") or []
            training = False if at is None else args[at] if len(args) > at and isinstance(args[at], bool) else None
            if training is not None:
                found.setdefault(training, node)
        return found

    a, b = mode(only_a), mode(only_b)
    for train_side, eval_side in ((a, b), (b, a)):
        if True in train_side and False in eval_side and False not in train_side and True not in eval_side:
            t, e = train_side[True], eval_side[False]
            return [f"`{t['target']}` at line {t.get('line')} normalizes with the batch's own statistics (training "
                    f"mode) and `{e['target']}` at line {e.get('line')} with the running ones (eval mode): two "
                    "functions by design. Training mode divides by the batch's biased variance (by n), while the "
                    "running variance is updated with the unbiased one (by n − 1), so even on the batch the running "
                    "statistics come from, eval-mode outputs are √((n − 1)/n) times the training-mode ones (n: the "
                    "elements each channel's statistics are taken over; `nn.BatchNorm1d`'s documentation). Call "
                    "both in one mode to compare one function"]
    return []


def _divides_by_n_minus_one(node: dict[str, Any]) -> bool:
    kwargs = (node.get("kwargs") or {}).get("dict") or {}
    if "correction" in kwargs:
        return kwargs["correction"] is None or kwargs["correction"] != 0  # None: torch's default, 1
    if "unbiased" in kwargs:
        return bool(kwargs["unbiased"])
    args = node.get("args") or []
    if len(args) > 2 and isinstance(args[2], bool):  # aten.var.dim(self, dim, unbiased, keepdim)
        return args[2]
    return True
