"""The op graph on disk, and running any part of it on one arm.

An arm's worker writes the recorded graph as ``graph.json`` (nodes in execution order, every
argument encoded as JSON) and ``leaves.pt`` (the leaf values, loaded with
``weights_only=True``).  Triage's own process reads the JSON to plan reductions without
importing torch; the warm workers load both and execute *plans*: an ordered list of node names
to compute, the names whose values are given as inputs, and the names to return.
"""
from __future__ import annotations

import functools
import inspect
import json
import math
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from triage.worker.process import to_json

FORMAT = "triage.opgraph/1"


class UnsupportedGraph(Exception):
    """The recording holds something the JSON form cannot carry (the reason is the message)."""


# -- export (inside the arm's run) --------------------------------------------------------
def _order_free(target: Any) -> bool:
    """Each output element comes from its own inputs alone, whatever the thread count: data
    movement, exact and correctly rounded ops, elementwise library functions — not a reduction,
    a contraction, a decomposed op or a linear-algebra routine."""
    from triage.worker.rounding import op_class

    kind = op_class(target)
    return kind in ("exact", "correctly-rounded") or (kind == "library" and torch.Tag.pointwise in target.tags)


# Leaf tensors past which the graph is not exported: saving each costs about 0.1 ms (a loop
# of 100,001 `torch.tensor([x])` took 13 s of the 30 s after its script), and the minimizer
# would not reduce such a graph within its budget anyway.
MAX_EXPORTED_LEAVES = 20_000


def export_graph(graph: fx.Graph, directory: Path) -> str | None:
    """Write graph.json + leaves.pt; None, or why the graph cannot be exported."""
    made = sum(1 for n in graph.nodes if n.op == "placeholder")
    if made > MAX_EXPORTED_LEAVES:
        return (f"the script made {made:,} leaf tensors; the minimizer takes graphs of up to "
                f"{MAX_EXPORTED_LEAVES:,}")
    nodes, leaves = [], {}
    try:
        for n in graph.nodes:
            line = n.meta.get("line")
            dtype = n.meta.get("dtype")
            entry: dict[str, Any] = {"name": n.name, "line": line,
                                     "dtype": str(dtype).replace("torch.", "") if dtype is not None else None}
            if n.op == "placeholder":
                leaf = n.meta["leaf"]
                entry.update(op="leaf", kind=leaf.kind, source=leaf.op, shape=list(leaf.value.shape))
                leaves[n.name] = leaf.value
            elif n.op == "call_function" and n.target is operator.getitem:
                entry.update(op="getitem", of=n.args[0].name, index=n.args[1])
            elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
                entry.update(op="call", target=_target_name(n.target),
                             args=encode(n.args), kwargs=encode(dict(n.kwargs)),
                             order_free=_order_free(n.target))
            elif n.op == "call_function":
                raise UnsupportedGraph(f"node {n.name} runs {getattr(n.target, '__name__', n.target)}, not an aten op")
            else:
                continue
            nodes.append(entry)
    except UnsupportedGraph as e:
        return str(e)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(leaves, directory / "leaves.pt")
    (directory / "graph.json").write_text(to_json({"format": FORMAT, "nodes": nodes}))
    return None


def _target_name(op: torch._ops.OpOverload) -> str:
    return f"{op.namespace}.{op._opname}.{op._overloadname}"


def encode(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": {k: encode(v) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).replace("torch.", "")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).replace("torch.", "")}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    raise UnsupportedGraph(f"an op argument of type {type(value).__name__}")


def decode(value: Any, env: dict[str, Any], device: torch.device) -> Any:
    if isinstance(value, list):
        return [decode(v, env, device) for v in value]
    if not isinstance(value, dict):
        return value
    if "node" in value:
        return env[value["node"]]
    if "dict" in value:
        return {k: decode(v, env, device) for k, v in value["dict"].items()}
    if "float" in value:
        return float(value["float"])
    if "dtype" in value:
        return getattr(torch, value["dtype"])
    if "device" in value:
        # The recording arm's device stands for "this arm's device" on every other arm.
        return device
    if "layout" in value:
        return getattr(torch, value["layout"])
    if "memory_format" in value:
        return getattr(torch, value["memory_format"])
    if "complex" in value:
        return complex(*value["complex"])
    raise ValueError(f"cannot decode {value!r}")


def resolve(target: str) -> torch._ops.OpOverload:
    namespace, packet, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


# -- execution (inside a warm worker) -----------------------------------------------------
class LoadedGraph:
    """graph.json + leaves.pt, ready to execute plans on one device."""

    def __init__(self, directory: Path) -> None:
        doc = json.loads((directory / "graph.json").read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"unknown graph format {doc.get('format')!r}")
        self.nodes: dict[str, dict[str, Any]] = {n["name"]: n for n in doc["nodes"]}
        self.leaves: dict[str, torch.Tensor] = torch.load(directory / "leaves.pt", weights_only=True)
        self.ops: dict[str, Callable] = {name: resolve(n["target"]) for name, n in self.nodes.items()
                                         if n["op"] == "call"}

    def run_eager(self, plan: list[str], inputs: dict[str, Any], device: torch.device,
                  after_op: Callable[[Callable, Any], Any] | None = None,
                  keep: Callable[[str, Any], None] | None = None,
                  upcast: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Compute `plan` in order from `inputs`; `after_op` may replace an op's output (a fault),
        `keep` sees every computed value (to store intermediates), ops in `upcast` run in float64."""
        env = dict(inputs)
        for name in plan:
            node = self.nodes[name]
            if node["op"] == "getitem":
                env[name] = env[node["of"]][node["index"]]
            else:
                fn = self.ops[name]
                call = functools.partial(in_float64, fn) if name in upcast else fn
                out = call(*decode(node["args"], env, device), **decode(node["kwargs"], env, device))
                env[name] = after_op(fn, out) if after_op is not None else out
            if keep is not None:
                keep(name, env[name])
        return env

    def to_module(self, plan: list[str], input_names: list[str], outputs: list[str],
                  device: torch.device, upcast: frozenset[str] = frozenset(),
                  torch_level: dict[str, Callable] | None = None) -> fx.GraphModule:
        """The plan as an FX GraphModule taking `input_names` and returning `outputs` (a tuple);
        ops in `upcast` run in float64.  `torch_level` (a compile backend's own targets by
        name, possibly none): each aten op that has a torch-level function is called through
        it (`torch_function`), so the backend sees the graph the script's own `torch.compile`
        gave it (`torch.expm1`, not `aten.expm1.default`)."""
        graph = fx.Graph()
        env: dict[str, Any] = {name: graph.placeholder(_py_name(name)) for name in input_names}
        for name in plan:
            node = self.nodes[name]
            if node["op"] == "getitem":
                env[name] = graph.call_function(operator.getitem, (env[node["of"]], node["index"]))
            else:
                args = decode(node["args"], env, device)
                kwargs = decode(node["kwargs"], env, device)
                if name in upcast:
                    env[name] = graph.call_function(in_float64, (self.ops[name], *args), kwargs)
                else:
                    op = self.ops[name] if torch_level is None else torch_function(self.ops[name], args, kwargs,
                                                                                     torch_level)
                    env[name] = graph.call_function(op, tuple(args), kwargs)
        graph.output(tuple(env[name] for name in outputs))
        return fx.GraphModule(torch.nn.Module(), graph)


def torch_function(op: Callable, args: Any = (), kwargs: Any = None,
                   preferred: dict[str, Callable] | None = None) -> Callable:
    """The torch-level function a script calls for the aten op `aten.<name>.<overload>`:
    the backend's own target of that name (`preferred`: `F.relu` where it tests for that,
    not `torch.relu`), else `torch.<name>` (the overloads are its signatures), else
    `torch.nn.functional.<name>` (`F.gelu`: dynamo's graphs hold these functions), each only
    where it accepts the recorded arguments; else the aten op itself."""
    packet = getattr(op, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    spelled = _spelled_otherwise(name, args, kwargs or {}, preferred or {})
    if spelled is not None:
        return spelled
    if not name or name.startswith("_"):
        return op
    candidates = [(preferred or {}).get(name), getattr(torch, name, None), getattr(torch.nn.functional, name, None)]
    for fn in candidates:
        if callable(fn) and not isinstance(fn, type) and _accepts(fn, args, kwargs or {}):
            return fn
    return op



# Aten ops a script reaches through a torch-level function of another name (`torch.softmax`
# runs as `aten._softmax`, `a / b` as `aten.div.Tensor`, `a @ b` as `aten.mm`): the names a
# backend's own targets may have for each (`operator.truediv.__name__` is "truediv").
OTHER_SPELLINGS = {"_softmax": ("softmax",), "_log_softmax": ("log_softmax",), "div": ("truediv", "true_divide"),
                   "mm": ("matmul",), "bmm": ("matmul",)}


def _spelled_otherwise(name: str, args: Any, kwargs: dict[str, Any],
                       preferred: dict[str, Callable]) -> Callable | None:
    """The backend's own target for an op it reaches under another name (`OTHER_SPELLINGS`),
    as a function taking the op's recorded arguments; None where it names none of them."""
    fn = next((preferred[n] for n in OTHER_SPELLINGS.get(name, ()) if n in preferred), None)
    if fn is None or kwargs:
        return None
    if name in ("_softmax", "_log_softmax") and len(args) == 3:
        # `dim` by keyword, as scripts write it (a backend that rewrites `node.kwargs["dim"]`
        # would otherwise pass it twice); aten's third argument asks for a float32 result.
        def normalized(x: Any, dim: int, half_to_float: bool) -> Any:
            return fn(x, dim=dim, dtype=torch.float32) if half_to_float else fn(x, dim=dim)

        return normalized
    if len(args) == 2:
        def binary(a: Any, b: Any) -> Any:
            return fn(a, b)

        return binary
    return None

def _accepts(fn: Callable, args: Any, kwargs: Any) -> bool:
    """Whether `fn`'s signature binds these arguments (`F.elu` takes no `scale`, which
    `aten.elu` does); a builtin without one (torch's, `F.gelu`) mirrors its aten schema."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def in_float64(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn` computed in float64 from its (upcast) floating inputs, each floating output cast
    back to the dtype its inputs had: the op alone at higher precision."""
    flat = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    dtype = flat[0].dtype if flat else None

    def up(a: Any) -> Any:
        return a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a

    out = fn(*(up(a) for a in args), **{k: up(v) for k, v in kwargs.items()})
    if dtype is None:
        return out

    def down(t: Any) -> Any:
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t

    return type(out)(down(t) for t in out) if isinstance(out, (tuple, list)) else down(out)


def _py_name(name: str) -> str:
    return name if name.isidentifier() else "v_" + "".join(c if c.isalnum() else "_" for c in name)

