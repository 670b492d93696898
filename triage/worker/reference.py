"""The float64 reference: replay the recorded op graph on the CPU from upcast leaves.

The reference is not a second run of the script (an fp64 ``torch.rand`` draws different
numbers): it starts from bit-identical leaves, upcast exactly, and evaluates every recorded
op in float64 (complex128 for complex), with dtype arguments widened and device arguments
moved to the CPU.  Where an op cannot run that way, the replay tries its decomposition, then
the op at the arm's own precision (marked *approximate*), then gives up on the ops that
depend on it.  Only ancestors of the requested nodes are evaluated.
"""
from __future__ import annotations

import contextlib
import io
import operator
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_map

from triage.worker import arm_choices
from triage.worker.composites import COMPOSITES
from triage.worker.independent import COVERED_OPS, Budget, Check
from triage.worker.modes import TriageDispatchMode
from triage.worker.opgraph import written_positions

# Ops whose meaning depends on the exact dtype: widening their inputs would change the
# question (bit reinterpretation, next representable value).  They run at recorded dtype.
EXACT_OPS = {"view", "frexp", "nextafter", "bitwise_and", "bitwise_or", "bitwise_xor"}


def widen_dtype(d: Any) -> Any:
    if isinstance(d, torch.dtype):
        if d.is_floating_point:
            return torch.float64
        if d.is_complex:
            return torch.complex128
    return d


def widen(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        if t.device.type != "cpu":
            t = t.cpu()
        if t.is_floating_point() and t.dtype != torch.float64:
            return t.to(torch.float64)
        if t.is_complex() and t.dtype != torch.complex128:
            return t.to(torch.complex128)
    return t


def _widen_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in kwargs.items():
        if k == "dtype":
            v = widen_dtype(v)
        elif k == "device" and v is not None:
            v = torch.device("cpu")
        out[k] = v
    return out


def custom_implementation(op: Any) -> Any:
    """The Python code a script's `torch.library.custom_op` runs on the CPU (its CPU kernel,
    else its default implementation), with the script's prints muted (they belong to its run,
    not to a replay); None for any other op, torch's own custom ops (its prims, whose
    decompositions call them back) and one that writes its inputs. Replayed through that code,
    each of its ops computes in float64 (or rounds, in the simulation) where it is: run whole,
    its `x.float()` would take the float64 replay back to float32."""
    try:
        from torch._library.custom_ops import OPDEFS
        opdef = OPDEFS.get(op._schema.name)
    except (ImportError, AttributeError):
        return None
    if opdef is None or op._schema.is_mutable:
        return None
    code = (getattr(opdef, "_backend_fns", None) or {}).get("cpu") or getattr(opdef, "_init_fn", None)
    if code is None or getattr(code, "__module__", "").split(".")[0] == "torch":
        return None

    def quiet(*args: Any, **kwargs: Any) -> Any:
        with muted():
            return code(*args, **kwargs)

    return quiet


@contextlib.contextmanager
def muted() -> Iterator[None]:
    """The script's own code run by a replay (a custom op) prints nowhere: its output belongs
    to its run, which the report shows."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


class UpcastMode(TriageDispatchMode):
    """Runs every aten op in float64 on the CPU; used to replay dynamo graphs."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return func(*tree_map(widen, args), **_widen_kwargs(tree_map(widen, kwargs or {})))


@dataclass
class Replay:
    values: dict[str, torch.Tensor]
    failed: dict[str, str] = field(default_factory=dict)  # node name -> why it has no value
    approximate: dict[str, str] = field(default_factory=dict)  # node -> op run at arm precision
    # node -> the float64 kernel's check against the node's independent answer (its worst one)
    checked: dict[str, Check] = field(default_factory=dict)
    seconds: float = 0.0
    incomplete: str | None = None


def replay_fp64(graph: fx.Graph, wanted: set[str], deadline_s: float,
                exact_singular: dict[str, int | None] | None = None) -> Replay:
    """Evaluate the ancestors of the `wanted` nodes in float64; values of `wanted` returned.

    `exact_singular` names determinant and SVD nodes whose input was shown exactly singular
    (with its exact rank, for SVDs) in rational arithmetic: their reference is the exact
    answer (det 0, logdet -inf, trailing singular values 0), not LAPACK's float64 noise.
    A small linalg call or special function is also answered independently
    (`triage.worker.independent`, on the replay's own float64 input): where the float64
    kernel is farther from that answer than a correct one's rounding allows (it shares a bug
    with the arm's kernel, or its formula cancels), the reference continues from the
    independent answer instead.
    """
    exact_singular = exact_singular or {}
    budget = Budget()
    start = time.monotonic()
    by_name = {n.name: n for n in graph.nodes}
    order = cone(graph, [by_name[w] for w in wanted if w in by_name])
    last_use = last_uses(order)
    env: dict[fx.Node, Any] = {}
    result = Replay(values={})
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            for i, n in enumerate(order):
                if time.monotonic() - start > deadline_s:
                    result.incomplete = f"the replay passed its {deadline_s:.0f} s budget"
                    break
                _evaluate(n, env, result)
                if n in env and "arm_choices" in n.meta:
                    env[n] = arm_choices.align(_packet(n), env[n], n.meta["arm_choices"])
                if n.name in exact_singular and n in env:
                    env[n] = _exact_singular_outputs(n, env[n], exact_singular[n.name])
                if n in env and n.op == "call_function" and _packet(n) in COVERED_OPS:
                    env[n] = _checked_outputs(n, env, budget, result)
                if n.name in wanted and n in env:
                    result.values[n.name] = env[n]
                release(env, n, i, last_use, wanted)
    finally:
        torch.set_default_dtype(previous_dtype)
    result.seconds = time.monotonic() - start
    return result


def _exact_singular_outputs(n: fx.Node, out: Any, rank: int | None = None) -> Any:
    name = n.target.overloadpacket.__name__
    if name in ("_linalg_svd", "linalg_svd", "linalg_svdvals") and rank is not None:
        s = (out[1] if isinstance(out, tuple) else out).clone()
        s[..., rank:] = 0
        return (out[0], s) + tuple(out[2:]) if isinstance(out, tuple) else s
    if name in ("_linalg_det", "linalg_det", "det"):
        det = out[0] if isinstance(out, tuple) else out
        return (torch.zeros_like(det),) + tuple(out[1:]) if isinstance(out, tuple) else torch.zeros_like(det)
    if name in ("_linalg_slogdet", "linalg_slogdet", "slogdet"):
        sign, logabsdet = out[0], out[1]
        return (torch.zeros_like(sign), torch.full_like(logabsdet, float("-inf"))) + tuple(out[2:])
    if name == "logdet":
        return torch.full_like(out, float("-inf"))
    return out


def _packet(n: fx.Node) -> str | None:
    packet = getattr(n.target, "overloadpacket", None)
    return packet.__name__ if packet is not None else None


def _checked_outputs(n: fx.Node, env: dict[fx.Node, Any], budget: Budget, result: Replay) -> Any:
    out = env[n]
    args = fx.node.map_arg(n.args, lambda a: env.get(a))
    kwargs = fx.node.map_arg(n.kwargs, lambda a: env.get(a))
    try:
        checks = [c for a in budget.answers(_packet(n), args, kwargs) if (c := a.check(out)) is not None]
    except Exception:  # noqa: BLE001 - an answer that cannot be computed only loses the check
        return out
    if not checks:
        return out
    result.checked[n.name] = max(checks, key=lambda c: c.error / c.bound)
    wrong = {c.answer.output: c for c in checks if c.disagrees}
    if not wrong:
        return out
    if not isinstance(out, tuple):
        return wrong[0].replacement if 0 in wrong else out
    return tuple(wrong[i].replacement if i in wrong else o for i, o in enumerate(out))


def cone(graph: fx.Graph, targets: list[fx.Node]) -> list[fx.Node]:
    """The targets and every node they depend on, in the graph's (execution) order."""
    seen: set[fx.Node] = set()
    stack = list(targets)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return [n for n in graph.nodes if n in seen]


def release(env: dict[fx.Node, Any], n: fx.Node, i: int, last_use: dict[fx.Node, int], keep: set[str]) -> None:
    """Drop the values whose last reader was `n` (the `i`-th node), unless they are wanted."""
    for a in n.all_input_nodes:
        if last_use.get(a) == i and a.name not in keep:
            env.pop(a, None)


def last_uses(order: list[fx.Node]) -> dict[fx.Node, int]:
    """For each node, the position in `order` of the last node that reads it: after that its
    value can be dropped."""
    last: dict[fx.Node, int] = {}
    for i, n in enumerate(order):
        for a in n.all_input_nodes:
            last[a] = i
    return last


def _evaluate(n: fx.Node, env: dict[fx.Node, Any], result: Replay) -> None:
    if n.op == "placeholder":
        leaf = n.meta["leaf"]
        env[n] = leaf.literal if leaf.literal is not None else widen(leaf.value)
        return
    missing = [a.name for a in n.all_input_nodes if a not in env]
    if missing:
        result.failed[n.name] = result.failed.get(missing[0], f"depends on {missing[0]}")
        return
    args = fx.node.map_arg(n.args, lambda a: env[a])
    kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
    target = n.target
    try:
        if target is operator.getitem:
            env[n] = shape_as_recorded(n, args[0][args[1]])
        elif isinstance(target, torch._ops.OpOverload):
            env[n] = _run_op(n, target, args, kwargs, result)
        else:  # a CompiledRegion: one run of a dynamo graph
            if target.random:
                result.failed[n.name] = "the compiled region draws random numbers, which a replay cannot reproduce"
                return
            # The graph may mutate its inputs: give it copies, never the values other nodes hold.
            copies = tree_map(lambda a: widen(a).clone() if isinstance(a, torch.Tensor) else a, args)
            with UpcastMode():
                env[n] = tree_map(widen, target(*copies))
    except Exception as e:  # noqa: BLE001 - any failure only removes this node's reference
        result.failed[n.name] = f"{_op_name(target)} could not be replayed in float64: {type(e).__name__}: {str(e)[:200]}"


def shape_as_recorded(n: fx.Node, value: Any) -> Any:
    """`value`, an output of a recorded op, where its shape is the one recorded; else raises.
    A kernel may compute an output only for autograd (sparse `mm`'s `amax` reduction leaves
    its argmax indices empty where no input requires a gradient), and the recorded backward
    then read the empty one past its end: a segfault that took the arm's process with it."""
    recorded = n.meta.get("shape")
    if recorded is not None and isinstance(value, torch.Tensor) and tuple(value.shape) != recorded:
        raise RuntimeError(f"the replay's output has shape {tuple(value.shape)} where the recording's had {recorded}")
    return value


# Quantization kernels that take their per-channel scales as float32 only ("Scale must be
# Float or BFloat16, found Double"): the replay keeps them float32, which holds the arm's
# float32 scales exactly, and widens the input alone.
FLOAT32_SCALES = {"fake_quantize_per_channel_affine", "fake_quantize_per_channel_affine_cachemask",
                  "_fake_quantize_learnable_per_channel_affine"}


def float32_scales(name: str, args: tuple) -> tuple:
    """`args` with a FLOAT32_SCALES op's scale (its second argument) back at float32."""
    if name not in FLOAT32_SCALES or len(args) < 2 or not isinstance(args[1], torch.Tensor) \
            or args[1].dtype != torch.float64:
        return args
    scale = args[1].float()
    scale.__dict__.update(args[1].__dict__)  # the replays' tags (its arm dtype, a stack of samples)
    return (args[0], scale) + tuple(args[2:])


def _run_op(n: fx.Node, op: torch._ops.OpOverload, args: tuple, kwargs: dict, result: Replay) -> Any:
    name = op.overloadpacket.__name__
    mutable = written_positions(op)
    # In-place and out= ops would mutate a value other nodes still need: give them a copy
    # (out= arguments are keyword-only, so they arrive in kwargs).
    args = tuple(a.clone() if i in mutable and isinstance(a, torch.Tensor) else a for i, a in enumerate(args))
    written_names = {op._schema.arguments[i].name for i in mutable}
    kwargs = {k: v.clone() if k in written_names and isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    if name in EXACT_OPS and any(isinstance(a, torch.dtype) for a in args):
        return _run_at_recorded_precision(n, op, args, kwargs, result)
    wide_args = float32_scales(name, tree_map(widen, args))
    wide_kwargs = _widen_kwargs(tree_map(widen, kwargs))
    custom = custom_implementation(op) or COMPOSITES.get(op)
    if custom is not None:
        with UpcastMode():
            return tree_map(widen, custom(*wide_args, **wide_kwargs))
    try:
        return tree_map(widen, op(*wide_args, **wide_kwargs))
    except (RuntimeError, NotImplementedError, TypeError):
        decomposition = torch._decomp.decomposition_table.get(op)
        if decomposition is not None:
            try:
                return tree_map(widen, decomposition(*wide_args, **wide_kwargs))
            except (RuntimeError, NotImplementedError, TypeError):
                pass
        return _run_at_recorded_precision(n, op, args, kwargs, result)


def _run_at_recorded_precision(n: fx.Node, op: Any, args: tuple, kwargs: dict, result: Replay) -> Any:
    dtypes = [a.meta.get("dtype") if isinstance(a, fx.Node) else None for a in n.args]
    narrowed = tuple(
        a.to(d) if isinstance(a, torch.Tensor) and d is not None else a
        for a, d in zip(args, dtypes + [None] * (len(args) - len(dtypes)), strict=False)
    )
    result.approximate[n.name] = _op_name(op)
    return tree_map(widen, op(*narrowed, **kwargs))


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target.overloadpacket.__name__}"
    return getattr(target, "__name__", str(target))
