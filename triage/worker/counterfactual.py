"""One change that makes two compared values one function: where a script's two sides differ
in float64 too (different functions, not rounding), which single argument of one side's ops,
changed, makes that side's float64 value equal the other's.

A maintainer reading "the two sides compute different functions" next asks *where*. The op
graphs part at the hand-written side's ops, but that list does not say which of them is the
mistake when the other side is one library op (`F.gelu`, `torch.cdist`). Each candidate here
is a change a typo or a slip makes, tried by replaying the changed side in float64:

* a constant written to a few digits of a well-known one (0.70711 for 1/√2) → that constant;
* a step by a constant (adding an eps, dividing by a beta) → without it;
* an eps added after a square root → before it (under the root), or the other way round;
* a reduction's `dim` → another dimension; dimensions that several reductions of the side
  share (a hand-written instance norm's mean and variance over (1, 2)) → others, in all;
* a variance's `correction` (or `unbiased`) → the other estimate;
* a flag (`include_self`, `align_corners`, ...) → the other value; a mask's `diagonal` → one
  off, or the other triangle (`tril(x, -1)` for `triu(x, 1)`);
* a step's constant → half or twice it (a Huber loss's linear branch without its ½); a scale
  → its square root or square (1/d for 1/√d); a divisor that counts → one more or less (n − 1);
* a sum or difference of two tensors → the other sign, or without one of its terms; a step
  adding (or subtracting) a number → subtracting (adding) it (a zero point's sign);
* a clamp's whole-number bound → one off (`clamp(q, -128, 128)` for int8's 127);
* a matrix product's or a solver's operand → transposed (`x @ W` where `F.linear` takes
  `x @ W.T`); a complex product's operand → conjugated (`X * X` for `X * X.conj()`);
* a boolean mask (`where`'s condition, `masked_fill`'s mask) → negated (a padding mask passed
  where `scaled_dot_product_attention` wants the positions that take part);
* fused attention's default scale 1/√d → 1 (a hand-written side without the scale);
* a slice's start or end, or those of every slice of the side along one dimension (a bin's
  bounds written once, used for each bin) → one off;
* two tensor operands exchanged, in every repeat of the line (a loop's steps): a
  non-commutative op's own two (`b / a` for `a / b`), or one operand each of two ops of one
  kind on one line (a GRU's update `z * n + (1 - z) * h` for `(1 - z) * n + z * h`).

A change is reported only where the changed side then equals the other in float64 (their gap
falls to float64's noise, AGREE_RTOL, or where the sides read float32 inputs, to a few of their
roundings, and by a thousandfold at least): a fact of the recorded computation, not a guess. The
search runs in the worker, after the float64 reference, on claims whose two float64 values
differ, within BUDGET_S.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx

from triage.numerics.constants import NAMED_CONSTANTS, NEAR_NAMED
from triage.worker.reference import cone, replay_fp64

# Changed, a side agrees with the other where every element is within this relative distance
# of the other side's largest, and its gap fell by GAP_FALL at least: two formulas for one
# function differ by a few float64 roundings (1e-15).
AGREE_RTOL = 1e-12
GAP_FALL = 1e-3
# Where the sides read inputs held at a narrower dtype, the changed side may differ from the
# other by this many of that dtype's roundings (relative), and still after a GAP_FALL fall.
INPUT_ROUNDINGS = 8
# Two claimed-equal values whose float64 values are further apart than this are different
# functions, and worth a search (a constant off in its sixth digit moves a GELU by 1e-6).
APART_RTOL = 1e-10
BUDGET_S = 0.5
MAX_CANDIDATES = 64
# Reductions' `dim` candidates: the dimensions of a value of at most this rank.
MAX_RANK = 4
SCALINGS = {"mul", "div", "add", "sub"}
# The identity operand of a step by a constant: what it becomes without that step.
IDENTITY = {"mul": 1.0, "div": 1.0, "add": 0.0, "sub": 0.0}
VARIANCES = {"var", "std", "var_mean", "std_mean"}
# A sum or difference of two tensors, and the op that has the other sign.
SIGNED = {torch.ops.aten.add.Tensor: torch.ops.aten.sub.Tensor, torch.ops.aten.sub.Tensor: torch.ops.aten.add.Tensor}
# Matrix products and solvers: the operands a transposed slip can reach (`L` where `L.T` is
# meant in a back substitution).
PRODUCTS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "linalg_solve_triangular": (0,),
            "triangular_solve": (1,), "_linalg_solve_ex": (0,), "linalg_solve": (0,), "cholesky_solve": (1,)}
# The ops an operand's rewrite inserts: a transposed slip, an unconjugated one, a mask's sense.
REWRITES = {"transposed": torch.ops.aten.transpose.int, "conjugated": torch.ops.aten.conj_physical.default,
            "negated": torch.ops.aten.logical_not.default}
# Ops that read a boolean mask (its position): one that means the opposite is a slip
# (`scaled_dot_product_attention`'s boolean `attn_mask` is True where a position takes part, a
# `key_padding_mask` or `masked_fill`'s mask where it is dropped). SDPA turns a boolean mask
# into an additive one with `where`.
MASKS = {"where": 0, "masked_fill": 1}
# Fused attention, whose `scale` defaults to 1/√d: a hand-written side without it is a slip.
ATTENTION_PREFIXES = ("_scaled_dot_product", "scaled_dot_product")
# Products of complex values: an operand the slip left unconjugated (`X * X` for `X * X.conj()`).
CONJUGABLE = {"mul": (0, 1), "mm": (0, 1), "bmm": (0, 1), "dot": (0, 1), "mv": (0, 1)}
# Flags a script sets that change the function, not the result's shape, and that every kernel
# checks either way. Others are not tried: `instance_norm`'s use_input_stats=False without
# running statistics reached a native kernel that does not check, and the worker died of SIGSEGV.
FLAGS = {"include_self", "align_corners", "ceil_mode", "count_include_pad", "largest", "upper", "left", "transpose",
         "unitriangular", "log_target", "full", "center", "normalized", "onesided", "descending", "is_causal",
         "forward", "antialias", "accumulate", "right"}
# Index arguments one off of which is a slip: (op, argument) pairs.
SHIFTABLE = {("slice", "start"), ("slice", "end"), ("select", "index"), ("narrow", "start")}
# Ops that clamp to a range, and their bounds: a whole-number bound one off is a slip.
CLAMPS = {"clamp", "clip", "clamp_min", "clamp_max", "hardtanh"}
CLAMP_BOUNDS = {"min", "max", "min_val", "max_val"}
# A mask's triangle and the other one (`tril(x, k)` keeps what `triu(x, -k)` drops, but the diagonal).
TRIANGLES = {"tril": torch.ops.aten.triu.default, "triu": torch.ops.aten.tril.default}
# Ops whose `dim` arranges values rather than computes with them: another one changes the
# shape (the replay then fails) or picks other elements, not a slip of a formula's axis.
LAYOUT_OPS = {"unsqueeze", "squeeze", "select", "slice", "narrow", "transpose", "unbind", "split", "split_with_sizes",
              "chunk", "stack", "cat", "expand", "flatten", "unflatten", "movedim", "diagonal", "index_select",
              "gather", "scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "roll", "flip"}
# A slice's end past any real size ("to the end", sys.maxsize): not an index anyone wrote.
HUGE_INDEX = 1 << 40
# Input tensors of one side tried two at a time as exchanged (`_swapped_inputs`): the first few.
MAX_SWAPPED_INPUTS = 4
# Kinds of change made by rewriting an op (`_applied`), not by setting an argument's value: in
# a line's repeats, each op is rewritten alike (`_each`). A moved eps is tied to its own root.
PER_OP_KINDS = {"sign", "triangle", "dropped", "transposed", "conjugated", "negated"}
# Ops whose two tensor operands a slip may exchange (`_swaps`), and those of them for which
# the order itself matters.
NON_COMMUTATIVE = {"sub", "div", "pow", "atan2", "remainder", "fmod", "mm", "bmm", "matmul"}
EXCHANGEABLE = NON_COMMUTATIVE | {"mul", "add", "maximum", "minimum"}


def one_change(graph: fx.Graph, a: str, b: str, values: dict[str, torch.Tensor],
               deadline: float, native: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The first change to the ops of `a` or of `b` (those not shared with the other side)
    whose float64 replay equals the other side's float64 value (`values`), or None; `b` not
    a node of the graph: a value computed outside torch, and only `a` changes. `deadline`
    is a `time.monotonic()` instant. A side that computes through a kernel with no float64
    version (`native`: the nodes the reference ran at their recorded precision, oneDNN's RNN
    layer) is not searched: a changed shape upstream reaches that kernel unchecked (a
    bidirectional LSTM's `mkldnn_rnn_layer` corrupted the heap)."""
    by_name = {n.name: n for n in graph.nodes}
    gap = _apart(values.get(a), values.get(b))
    # `b` may be a value the script computed outside torch (NumPy), held in `values` alone:
    # only `a`'s ops are then searched, for the change that makes it equal that value.
    outside = b not in by_name
    if a not in by_name or gap is None or gap <= APART_RTOL:
        return None
    orders = {side: cone(graph, [by_name[side]]) if side in by_name else [] for side in (a, b)}
    cones = {side: set(order) for side, order in orders.items()}
    if not outside and any(_random_leaf(n) for n in cones[a] ^ cones[b]):
        return None  # random numbers drawn for one side only: the draws differ, not a formula
    agree = _agreement(cones[a] | cones[b])
    tried = 0
    searchable = {side: side in by_name and not any(n.name in native or _unchecked(n) for n in cones[side])
                  for side in (a, b)}
    for first, (side, other) in enumerate(((a, b), (b, a))):
        if not searchable[side]:
            continue
        own = [n for n in orders[side] if n not in cones[other] and n.op == "call_function"
               and isinstance(n.target, torch._ops.OpOverload)]
        # Half the time for the first side where the other is searched too: a library call's
        # ops (GRUCell's) took it all, and the hand-written side was never searched.
        until = deadline if first or not searchable[other] else time.monotonic() + (deadline - time.monotonic()) / 2
        for node, change in _candidates(own):
            if tried >= MAX_CANDIDATES or time.monotonic() > deadline:
                return None
            if time.monotonic() > until:
                break
            tried += 1
            places = change["places"] if "places" in change else [(node, change.get("position"))]
            with _applied(graph, node, change, places) as stands_for:
                target = stands_for.get(side, side)
                try:
                    replay = replay_fp64(graph, {target}, max(0.0, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - a change the op refuses (a dim it lacks) is no candidate
                    continue
            changed = _gap(replay.values.get(target), values[other])
            if changed is not None and changed <= min(agree, GAP_FALL * gap):
                touched = list(dict.fromkeys(n for n, _ in places))  # an op whose two operands swap is one place
                return {"side": side, "op": _name(node), "line": node.meta.get("line"), "kind": change["kind"],
                        "argument": change["argument"], "was": change["was"], "to": change["to"],
                        "operand": change.get("operand"), "exchanged_with": change.get("exchanged_with"),
                        "named": change.get("named"), "around": change.get("around"),
                        "also": [{"op": _name(n), "line": n.meta.get("line")} for n in touched[1:9]],
                        "places": len(touched), "written": _written_before(node, cones[other]),
                        "residual": float(f"{changed:.2g}") if changed > AGREE_RTOL else None}
    return None


def _agreement(nodes: set[fx.Node]) -> float:
    """How close a changed side must come to the other: float64's noise (AGREE_RTOL), or where
    the two sides read inputs held at a narrower dtype, a few of its roundings (INPUT_ROUNDINGS):
    a trapezoid rule written with h = 0.01 and `torch.trapezoid` over a float32 `linspace`
    read the same points through two representations that differ by float32's rounding."""
    narrowest = AGREE_RTOL
    for n in nodes:
        leaf = n.meta.get("leaf") if n.op == "placeholder" else None
        value = getattr(leaf, "value", None)
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64:
            narrowest = max(narrowest, INPUT_ROUNDINGS * torch.finfo(value.dtype).eps / 2)
    return narrowest


def _written_before(node: fx.Node, other: set[fx.Node]) -> dict[str, Any] | None:
    """An input of the changed op that an in-place op (`logits /= t` inside a helper) wrote
    before this op read it, where the other side reads that write too: the change found
    undoes on one side what the in-place write did to both, and the write is the likelier
    mistake (the side meant the value as it was)."""
    for a in node.all_input_nodes:
        if a.op == "call_function" and isinstance(a.target, torch._ops.OpOverload) \
                and a.target.overloadpacket.__name__.endswith("_") and not a.target.overloadpacket.__name__.startswith("_") \
                and a in other:
            return {"op": _name(a), "line": a.meta.get("line")}
    return None


def _random_leaf(n: fx.Node) -> bool:
    leaf = n.meta.get("leaf") if n.op == "placeholder" else None
    return leaf is not None and leaf.kind == "random"


# Kernels of a backend library that trust their inputs' shapes more than ATen's own do.
UNCHECKED_PREFIXES = ("mkldnn", "_mkldnn", "miopen", "cudnn", "_cudnn", "onednn", "_fused", "fbgemm")


def _unchecked(n: fx.Node) -> bool:
    return n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) \
        and n.target.overloadpacket.__name__.startswith(UNCHECKED_PREFIXES)


def _apart(x: Any, y: Any) -> float | None:
    """`_gap`, or infinitely apart where one of two values of one shape is finite and the other
    is not (an anti-causal mask's fully masked row: NaN where the other side has numbers)."""
    gap = _gap(x, y)
    if gap is not None or not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) \
            or x.shape != y.shape or not x.numel():
        return gap
    finite = [bool(torch.isfinite(t).all()) if t.is_floating_point() or t.is_complex() else None for t in (x, y)]
    return math.inf if True in finite and False in finite else None


def _gap(x: Any, y: Any) -> float | None:
    """max |x − y| relative to max |y|, of two finite float64 (or complex128) values of one
    shape, integer ones (indices, counts: a `bucketize` without `right=True`) read as float64;
    None otherwise."""
    x, y = (t.double() if isinstance(t, torch.Tensor) and not (t.is_floating_point() or t.is_complex())
            and t.dtype != torch.bool else t for t in (x, y))
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape \
            or not all(t.is_floating_point() or t.is_complex() for t in (x, y)) or not x.numel() \
            or not bool(torch.isfinite(x).all()) or not bool(torch.isfinite(y).all()):
        return None
    scale = float(y.abs().max())
    return float((x - y).abs().max()) / scale if scale else None


def _candidates(nodes: list[fx.Node]) -> Iterator[tuple[fx.Node, dict[str, Any]]]:
    """Each change to try, the likeliest slips first: named constants, steps by a constant,
    an eps moved across a square root, a variance's estimate, a reduction's dimension, then
    the dimensions several reductions share."""
    scalars, steps, moves, estimates, dims, flags, signs, transposes, drops, shifts, factors, opposites, bounds = (
        [] for _ in range(13))
    roots = [n for n in nodes if n.target.overloadpacket.__name__ in ROOTS]
    for n in nodes:
        name = n.target.overloadpacket.__name__.rstrip("_")
        root = _around(n)
        if root is not None:
            # `argument`: where the number goes, before the root (inside it) or after it.
            moves.append((n, {"kind": "moved", "position": 1, "argument": "before" if root is n.args[0] else "after",
                              "was": n.args[1], "to": n.args[1], "around": _name(root), "root": root}))
        elif _adds_number(n):  # `(x - m) / sqrt(v) + eps`: the eps a step or more after the root
            moves += [(n, {"kind": "moved", "position": 1, "argument": "before", "was": n.args[1], "to": n.args[1],
                           "around": _name(r), "root": r}) for r in roots if _upstream_of(r, n)]
        for position, argument, value in _arguments(n):
            if argument == "dim":
                if name not in LAYOUT_OPS:
                    dims += [(n, change) for change in _dims(position, value)]
            elif argument in ("correction", "unbiased") and name in VARIANCES:
                flipped = (not value) if argument == "unbiased" else (0 if value not in (0, 0.0) else 1)
                estimates.append((n, {"kind": "argument", "position": position, "argument": argument,
                                      "was": value, "to": flipped}))
            elif isinstance(value, bool) and argument in FLAGS:
                flags.append((n, {"kind": "argument", "position": position, "argument": argument,
                                  "was": value, "to": not value}))
            elif argument == "diagonal" and name in ("tril", "triu") and isinstance(value, int):
                flags += [(n, {"kind": "argument", "position": position, "argument": argument, "was": value,
                               "to": value + step}) for step in (1, -1)]
                flags.append((n, {"kind": "triangle", "position": position, "argument": argument, "was": value,
                                  "to": -value, "triangle": TRIANGLES[name]}))
            elif name in CLAMPS and argument in CLAMP_BOUNDS and isinstance(value, (int, float)) \
                    and not isinstance(value, bool) and math.isfinite(value) and float(value).is_integer():
                # A quantization range one off (`clamp(q, -128, 128)` for int8's 127).
                bounds += [(n, {"kind": "argument", "position": position, "argument": argument, "was": value,
                                "to": type(value)(value + step)}) for step in (-1, 1)]
            elif (name, argument) in SHIFTABLE and isinstance(value, int) and abs(value) < HUGE_INDEX:
                shifts += [(n, {"kind": "shifted", "position": position, "argument": argument, "was": value,
                                "to": value + step}) for step in (-1, 1)]
            elif isinstance(value, float) and math.isfinite(value) and value:
                named = next(((sign + label, sign_value) for label, c in NAMED_CONSTANTS.items()
                              for sign, sign_value in (("", c), ("-", -c))
                              if sign_value != value and abs(value - sign_value) <= NEAR_NAMED * c), None)
                if named is not None:
                    scalars.append((n, {"kind": "constant", "position": position, "argument": argument,
                                        "was": value, "to": named[1], "named": named[0]}))
            if name in SCALINGS and position == 1 and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and value != IDENTITY[name]:
                steps.append((n, {"kind": "without", "position": position, "argument": argument,
                                  "was": value, "to": IDENTITY[name]}))
                factors += [(n, {"kind": "argument", "position": position, "argument": argument, "was": value,
                                 "to": to}) for to in _slipped_numbers(name, value)]
                if name in ("add", "sub"):  # a zero point added where it is subtracted
                    opposites.append((n, {"kind": "opposite", "position": position, "argument": argument,
                                          "was": value, "to": -value}))
        if n.target in SIGNED and _two_tensors(n):
            signs.append((n, {"kind": "sign", "argument": "other", "was": name, "to": SIGNED[n.target].__name__
                              .split(".")[0], "operand": _producer(n.args[1])}))
            schema = n.target._schema.arguments
            drops += [(n, {"kind": "dropped", "argument": schema[j].name, "was": name, "to": "without", "position": j,
                           "operand": _producer(n.args[j])}) for j in ((1, 0) if name == "add" else (1,))]
        for j in CONJUGABLE.get(name, ()):
            if j < len(n.args) and isinstance(n.args[j], fx.Node) and _complex(n.args[j]):
                transposes.append((n, {"kind": "conjugated", "position": j, "argument": n.target._schema.arguments[j].name,
                                       "was": False, "to": True, "operand": _producer(n.args[j])}))
        for j in PRODUCTS.get(name, ()):
            if j < len(n.args) and isinstance(n.args[j], fx.Node):
                transposes.append((n, {"kind": "transposed", "position": j, "argument": n.target._schema.arguments[j].name,
                                       "was": False, "to": True, "operand": _producer(n.args[j])}))
        j = MASKS.get(name)
        if j is not None and j < len(n.args) and isinstance(n.args[j], fx.Node) \
                and n.args[j].meta.get("dtype") in (torch.bool, None):
            flags.append((n, {"kind": "negated", "position": j, "argument": n.target._schema.arguments[j].name,
                              "was": False, "to": True, "operand": _producer(n.args[j])}))
        if name.startswith(ATTENTION_PREFIXES) and n.kwargs.get("scale") is None \
                and any(a.name == "scale" for a in n.target._schema.arguments):
            # Fused attention scales by 1/√d unless told otherwise: without it, a hand-written
            # side that forgot the scale.
            flags.append((n, {"kind": "argument", "position": "scale", "argument": "scale", "was": "1/√d",
                              "to": 1.0}))
    # Swaps are taken per line, in every repeat at once; two terms of one sum exchanged (a
    # gate on the wrong term) are as likely a slip as a wrong axis, and come before it: each
    # candidate is a float64 replay of the side, and the search has BUDGET_S.
    swaps = _swaps(nodes)
    terms = [c for c in swaps if c[1]["kind"] == "exchanged" and _share_a_reader(c[1]["places"])]
    swaps = [c for c in swaps if c not in terms]
    yield from _per_line(scalars + steps + moves + estimates + terms + dims + _shared_dims(nodes)
                         + _shared_shifts(nodes) + flags + swaps + _swapped_inputs(nodes) + signs + opposites
                         + transposes + factors + drops + shifts + bounds)


def _swapped_inputs(nodes: list[fx.Node]) -> list[tuple[fx.Node, dict[str, Any]]]:
    """Two of the script's input tensors of one shape and dtype exchanged wherever the side's
    own ops read them (ImageNet's mean and std folded into a convolution with their roles
    swapped, over two lines): a pair at a time, the fewest uses first."""
    own = set(nodes)
    uses: dict[fx.Node, list[tuple[fx.Node, int]]] = {}
    for n in nodes:
        for j, a in enumerate(n.args):
            if isinstance(a, fx.Node) and a not in own:  # a leaf, or a value both sides read
                uses.setdefault(a, []).append((n, j))
    inputs = sorted(uses, key=lambda a: len(uses[a]))[:MAX_SWAPPED_INPUTS]
    found = []
    for a, b in itertools.combinations(inputs, 2):
        if _shape(a) is None or _shape(a) != _shape(b) or _dtype(a) != _dtype(b):
            continue
        places = uses[a] + uses[b]
        found.append((places[0][0], {"kind": "inputs", "argument": "inputs", "was": "", "to": "",
                                     "places": places, "values": [b] * len(uses[a]) + [a] * len(uses[b]),
                                     "operand": _made_where(a), "exchanged_with": _made_where(b)}))
    return found


def _made_where(n: fx.Node) -> dict[str, Any]:
    """An input tensor as the explanation names it: the op that made it, and its line."""
    if n.op != "placeholder":
        name = _name(n) if isinstance(n.target, torch._ops.OpOverload) else str(n.target)
        # `torch.tensor([...])` records as lift_fresh: the script wrote torch.tensor.
        return {"op": "torch.tensor" if name in ("aten.lift_fresh", "aten.lift_fresh_copy") else name,
                "line": n.meta.get("line")}
    made = n.meta["leaf"]
    return {"op": f"torch.{made.op}" if made.op else "an input", "line": made.line}


def _dtype(n: fx.Node) -> torch.dtype | None:
    """A node's value's dtype (a leaf's, from its value)."""
    leaf = n.meta.get("leaf")
    return n.meta.get("dtype") or (leaf.value.dtype if leaf is not None else None)


def _per_line(candidates: list[tuple[fx.Node, dict[str, Any]]]) -> list[tuple[fx.Node, dict[str, Any]]]:
    """A change to an argument of an op that its line computes more than once (a loop's body)
    made in every repeat at once, as one candidate in place of one per repeat: a constant
    written wrong in a loop is wrong in each step, and changed in one step alone, the two
    sides still differ (a 20-step loop's 20 single changes also used up the search's budget)."""
    grouped: dict[tuple, list[fx.Node]] = {}
    for node, change in candidates:
        key = _repeat_key(node, change)
        if key is not None:
            grouped.setdefault(key, []).append(node)
    found, done = [], set()
    for node, change in candidates:
        key = _repeat_key(node, change)
        if key is None or len(grouped[key]) == 1:
            found.append((node, change))
        elif key not in done:
            done.add(key)
            repeats = grouped[key]
            found.append((node, dict(change, places=[(n, change.get("position")) for n in repeats],
                                     **({"repeats": repeats} if change["kind"] in PER_OP_KINDS else {}))))
    return found


def _repeat_key(node: fx.Node, change: dict[str, Any]) -> tuple | None:
    """What makes two candidates one change to one line's repeats: the line, the op, and the
    argument changed from one value to another; None for a change that is not an argument's
    value set in place (moves, signs, rewrites) or that spans places of its own."""
    if change["kind"] == "moved" or "places" in change or node.meta.get("line") is None:
        return None
    try:
        return (node.meta["line"], node.target, change["kind"], change.get("position"), repr(change["was"]),
                repr(change["to"]))
    except Exception:  # noqa: BLE001 - a value with no repr: that candidate alone
        return None


def _swaps(nodes: list[fx.Node]) -> list[tuple[fx.Node, dict[str, Any]]]:
    """Two tensor operands exchanged, in every repeat of their line at once (the steps of a
    loop): a non-commutative op's own two, or one operand each of the two ops of one kind a
    line computes per repeat (a gate applied to the wrong term)."""
    found: list[tuple[fx.Node, dict[str, Any]]] = []
    by_line: dict[tuple[Any, Any], list[fx.Node]] = {}
    for n in nodes:
        if n.meta.get("line") is not None and n.target.overloadpacket.__name__ in EXCHANGEABLE:
            by_line.setdefault((n.meta["line"], n.target), []).append(n)
    for (_, target), ops in by_line.items():
        name = target.overloadpacket.__name__.rstrip("_")
        schema = target._schema.arguments
        if name in NON_COMMUTATIVE and all(_two_operands(n) for n in ops):
            found.append((ops[0], {"kind": "swapped", "argument": f"{schema[0].name}↔{schema[1].name}", "was": name,
                                   "to": name,
                                   "places": [(n, j) for n in ops for j in (0, 1)],
                                   "values": [v for n in ops for v in (n.args[1], n.args[0])]}))
        if len(ops) % 2 or not all(_two_operands(n) for n in ops):
            continue
        pairs = list(zip(ops[0::2], ops[1::2], strict=True))
        for i, j in ((0, 0), (1, 1), (0, 1), (1, 0)):
            found.append((ops[0], {"kind": "exchanged", "argument": f"{schema[i].name}↔{schema[j].name}",
                                   "was": name, "to": name,
                                   "places": [(x, i) for x, _ in pairs] + [(y, j) for _, y in pairs],
                                   "values": [y.args[j] for _, y in pairs] + [x.args[i] for x, _ in pairs],
                                   "operand": _producer(pairs[0][0].args[i]),
                                   "exchanged_with": _producer(pairs[0][1].args[j])}))
    return found


def _share_a_reader(places: list[tuple[fx.Node, Any]]) -> bool:
    """Whether the two ops of an exchange's first repeat feed one op."""
    half = len(places) // 2
    first, second = places[0][0], places[half][0]
    return bool(set(first.users) & set(second.users))


def _two_operands(n: fx.Node) -> bool:
    """Two tensor operands, each of the other's shape, that are not one tensor twice."""
    if len(n.args) < 2 or not all(isinstance(a, fx.Node) for a in n.args[:2]) or n.args[0] is n.args[1]:
        return False
    shapes = [_shape(a) for a in n.args[:2]]
    return None not in shapes and shapes[0] == shapes[1]


def _shape(n: fx.Node) -> tuple[int, ...] | None:
    """The recorded shape of a node's value (a leaf's, from its value)."""
    shape = n.meta.get("value_shape", n.meta.get("shape"))
    if shape is None and n.op == "placeholder":
        shape = getattr(getattr(n.meta.get("leaf"), "value", None), "shape", None)
    return tuple(shape) if shape is not None else None


def _shared_dims(nodes: list[fx.Node]) -> list[tuple[fx.Node, dict[str, Any]]]:
    """Dimensions that more than one op of the side reduces over (a hand-written instance
    norm's mean and variance, both over dim 1): each other choice of as many axes, changed in
    all of them at once."""
    shared: dict[tuple[int, ...], list[tuple[fx.Node, int | str]]] = {}
    for n in nodes:
        if n.target.overloadpacket.__name__ in LAYOUT_OPS:
            continue
        for position, argument, value in _arguments(n):
            if argument == "dim" and isinstance(value, (list, tuple)) and value \
                    and all(isinstance(d, int) and not isinstance(d, bool) for d in value):
                shared.setdefault(tuple(value), []).append((n, position))
    found = []
    for was, places in shared.items():
        if len(places) < 2:
            continue
        for to in itertools.combinations(range(MAX_RANK), len(was)):
            if list(to) != sorted(d % MAX_RANK for d in was):
                found.append((places[0][0], {"kind": "argument", "argument": "dim", "was": list(was), "to": list(to),
                                             "places": places}))
    return found


def _slipped_numbers(name: str, value: float) -> list[float]:
    """What a step's constant may have been meant as: half or twice it (a Huber loss's ½), and
    for a scale, its square root or its square (1/d for 1/√d), and for a divisor that counts,
    one more or one less (n − 1 for n)."""
    found = [value * 0.5, value * 2.0]
    if name in ("mul", "div") and value > 0:
        found += [math.sqrt(value), value * value]
    if name == "div" and float(value).is_integer() and abs(value) >= 2:
        found += [value + 1, value - 1]
    return [v for v in dict.fromkeys(found) if v != value]  # 4: half and root are both 2, one replay


def _shared_shifts(nodes: list[fx.Node]) -> list[tuple[fx.Node, dict[str, Any]]]:
    """Every slice of the side along one dimension with its start (or its end) one off, at once:
    a bound written once in a loop over bins (`floor((i + 1) * L / n) + 1`) is off in each."""
    found = []
    slices: dict[tuple[int, int], list[tuple[fx.Node, int, int]]] = {}
    for n in nodes:
        if n.target is torch.ops.aten.slice.Tensor:
            dim = n.args[1] if len(n.args) > 1 else 0
            for position in (2, 3):
                if position < len(n.args) and isinstance(n.args[position], int) \
                        and abs(n.args[position]) < HUGE_INDEX:
                    slices.setdefault((dim, position), []).append((n, position, n.args[position]))
    for (_, position), places in slices.items():
        if len(places) < 2:
            continue
        for step in (-1, 1):
            found.append((places[0][0], {"kind": "shifted", "argument": "start" if position == 2 else "end",
                                         "was": places[0][2], "to": places[0][2] + step, "step": step,
                                         "places": [(n, p) for n, p, _ in places],
                                         "values": [v + step for _, _, v in places]}))
    return found


def _complex(n: fx.Node) -> bool:
    dtype = n.meta.get("dtype")
    if dtype is None and n.op == "placeholder":
        dtype = getattr(getattr(n.meta.get("leaf"), "value", None), "dtype", None)
    return isinstance(dtype, torch.dtype) and dtype.is_complex


def _two_tensors(n: fx.Node) -> bool:
    """A sum or difference of two tensors with no scale on the second (`alpha` 1)."""
    return len(n.args) == 2 and all(isinstance(a, fx.Node) for a in n.args) \
        and n.kwargs.get("alpha", 1) == 1 and n.args[0] is not n.args[1]


def _producer(n: fx.Node) -> dict[str, Any] | None:
    """The op (and its line) that made an operand, for the explanation; None for an input."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return None
    return {"op": _name(n), "line": n.meta.get("line")}


def _arguments(n: fx.Node) -> Iterator[tuple[int | str, str, Any]]:
    """(position in args, or keyword; the schema's argument name; its value) of each argument
    the call passes that is not a tensor."""
    schema = n.target._schema.arguments
    for i, value in enumerate(n.args):
        if i < len(schema) and not isinstance(value, fx.Node):
            yield i, schema[i].name, value
    for key, value in n.kwargs.items():
        if not isinstance(value, fx.Node):
            yield key, key, value
    # A flag or a mask's diagonal the call leaves at its default (`scatter_reduce`'s
    # include_self=True, `triu`'s diagonal=0) is a choice too.
    for argument in schema[len(n.args):]:
        if argument.name not in n.kwargs and (isinstance(argument.default_value, bool)
                                              or argument.name == "diagonal" and argument.default_value == 0):
            yield argument.name, argument.name, argument.default_value


def _dims(position: int | str, value: Any) -> Iterator[dict[str, Any]]:
    """Another single dimension for a reduction's `dim` (one that means the same one, -1 and
    the last, gives the value back unchanged: it does not agree, and costs a replay)."""
    single = isinstance(value, int) and not isinstance(value, bool)
    if not single and not (isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], int)):
        return
    was = value if single else list(value)
    for d in range(-1, MAX_RANK):
        if d != (value if single else value[0]):
            yield {"kind": "argument", "position": position, "argument": "dim", "was": was, "to": d if single else [d]}


ROOTS = {"sqrt", "rsqrt"}


def _name(n: fx.Node) -> str:
    return f"{n.target.namespace}.{n.target.overloadpacket.__name__}"


def _adds_number(n: fx.Node) -> bool:
    return n.target in (torch.ops.aten.add.Tensor, torch.ops.aten.add.Scalar) and len(n.args) == 2 \
        and isinstance(n.args[0], fx.Node) and isinstance(n.args[1], (int, float)) \
        and not isinstance(n.args[1], bool) and not n.kwargs


def _upstream_of(a: fx.Node, b: fx.Node) -> bool:
    """Whether `b` computes from `a`."""
    seen, stack = set(), list(b.all_input_nodes)
    while stack:
        x = stack.pop()
        if x is a:
            return True
        if x not in seen:
            seen.add(x)
            stack.extend(x.all_input_nodes)
    return False


def _around(n: fx.Node) -> fx.Node | None:
    """The square root an `add` of a number comes right after (`sqrt(v) + eps`) or right before
    (`sqrt(v + eps)`, the add's one reader), or None."""
    if not _adds_number(n):
        return None
    before = n.args[0]
    if before.op == "call_function" and isinstance(before.target, torch._ops.OpOverload) \
            and before.target.overloadpacket.__name__ in ROOTS and len(before.users) == 1:
        return before
    after = next(iter(n.users), None) if len(n.users) == 1 else None
    if after is not None and after.op == "call_function" and isinstance(after.target, torch._ops.OpOverload) \
            and after.target.overloadpacket.__name__ in ROOTS and after.args[0] is n:
        return after
    return None


def _applied(graph: fx.Graph, node: fx.Node, change: dict[str, Any],
             places: list[tuple[fx.Node, Any]]) -> contextlib.AbstractContextManager[dict[str, str]]:
    """The graph with `change` made, restored afterwards; yields {node: the node standing for
    it} where the changed graph computes a node's value elsewhere."""
    kind = change["kind"]
    if change.get("repeats"):
        return _each(graph, change["repeats"], change)
    if kind == "moved":
        return _moved(graph, node, change)
    if kind == "sign":
        return _retargeted(node, SIGNED[node.target])
    if kind == "triangle":
        return _retargeted(node, change["triangle"], places, [change["to"]])
    if kind == "dropped":
        return _bypassed(node, node.args[1 - change["position"]])
    if kind in REWRITES:
        return _rewritten(graph, node, change["position"], kind)
    return _changed(places, change.get("values") or [change["to"]] * len(places))


@contextlib.contextmanager
def _each(graph: fx.Graph, nodes: list[fx.Node], change: dict[str, Any]) -> Iterator[dict[str, str]]:
    """One op rewrite made to each of a line's repeats, undone in reverse."""
    single = {k: v for k, v in change.items() if k not in ("repeats", "places")}
    with contextlib.ExitStack() as stack:
        stands_for: dict[str, str] = {}
        for n in nodes:
            stands_for.update(stack.enter_context(_applied(graph, n, single, [(n, single.get("position"))])))
        yield stands_for


@contextlib.contextmanager
def _retargeted(node: fx.Node, target: Any, places: list[tuple[fx.Node, Any]] = (),
                values: list[Any] = ()) -> Iterator[dict[str, str]]:
    """`node` as a call of `target`, with the arguments at `places` set to `values`."""
    saved = node.target
    node.target = target
    try:
        with _changed(list(places), list(values)):
            yield {}
    finally:
        node.target = saved


@contextlib.contextmanager
def _bypassed(node: fx.Node, kept: fx.Node) -> Iterator[dict[str, str]]:
    """`node`'s readers read `kept` instead (the sum without one of its terms)."""
    saved = [(u, u.args, u.kwargs) for u in list(node.users)]
    for u, _, _ in saved:
        u.replace_input_with(node, kept)
    try:
        yield {node.name: kept.name}
    finally:
        for u, args, kwargs in saved:
            u.args, u.kwargs = args, kwargs


@contextlib.contextmanager
def _rewritten(graph: fx.Graph, node: fx.Node, position: int, kind: str) -> Iterator[dict[str, str]]:
    """`node`'s operand at `position` transposed in its last two dimensions, conjugated or
    (a boolean mask) negated, by a new op."""
    operand = node.args[position]
    with graph.inserting_before(node):
        flipped = graph.call_function(REWRITES[kind], (operand, -2, -1) if kind == "transposed" else (operand,))
    flipped.meta = {k: operand.meta[k] for k in ("dtype", "line") if k in operand.meta}
    saved = node.args
    node.args = node.args[:position] + (flipped,) + node.args[position + 1:]
    try:
        yield {}
    finally:
        node.args = saved
        graph.erase_node(flipped)


@contextlib.contextmanager
def _moved(graph: fx.Graph, add: fx.Node, change: dict[str, Any]) -> Iterator[dict[str, str]]:
    """The graph with `add`'s number moved to the other side of a square root (`change["root"]`),
    restored afterwards: the add itself adds 0, a new add the number. Yields {root: the new
    add} where the root's value is now the new add's (the root being the value compared)."""
    root = change["root"]
    value = add.args[1]
    outside = change["argument"] == "before"  # sqrt(v) + eps, or sqrt(v) ... + eps: the number goes inside
    source = root.args[0] if outside else add.args[0]
    with graph.inserting_before(root) if outside else graph.inserting_after(root):
        moved = graph.call_function(add.target, (source if outside else root, value))
    moved.meta = dict(add.meta)
    saved_root, saved_add = root.args, add.args
    readers = [u for u in root.users if u is not moved] if not outside else []
    try:
        if outside:
            root.args = (moved,) + root.args[1:]
            add.args = (add.args[0], 0)
        else:
            add.args = (source, 0)
            for u in readers:
                u.replace_input_with(root, moved)
        yield {} if outside else {root.name: moved.name}
    finally:
        for u in readers:
            u.replace_input_with(moved, root)
        root.args, add.args = saved_root, saved_add
        graph.erase_node(moved)


@contextlib.contextmanager
def _changed(places: list[tuple[fx.Node, int | str]], values: list[Any]) -> Iterator[dict[str, str]]:
    """Each node's argument at its position (an index into its args, or a keyword) set to its
    value, restored afterwards (every value stands for itself)."""
    saved = [(n, n.args, n.kwargs) for n, _ in places]
    for (n, position), value in zip(places, values, strict=True):
        if isinstance(position, int):
            n.args = n.args[:position] + (value,) + n.args[position + 1:]
        else:
            n.kwargs = dict(n.kwargs, **{position: value})
    try:
        yield {}
    finally:
        for n, args, kwargs in saved:
            n.args, n.kwargs = args, kwargs
