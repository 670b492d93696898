"""The op graph: an FX graph of aten ops with the real values of its leaves.

`OpRecorder` is a `TorchDispatchMode` active while the script runs eagerly.  Every aten op
the script executes becomes a `call_function` node; every tensor whose value did not come
from a recorded op becomes a *leaf* (an FX placeholder) holding a clone of its value at the
moment it was first used.  Leaves are:

* ``input``         a tensor created outside the recorded ops (``torch.tensor`` data, numpy),
* ``factory``       the output of a factory op (``full``, ``arange``, ``zeros`` …),
* ``random``        the output of a random op (``randn``, ``uniform_``, ``native_dropout``),
* ``uninitialized`` ``torch.empty`` and friends,
* ``stale``         a tensor mutated behind the recorder's back (a view of an in-place target),
* ``compiled``      a compiled region's input that the eager recording did not produce.

Staleness uses the tensor's version counter, which views share with their base: when the
counter moved since the tensor was registered, its recorded producer no longer describes its
value, so it is re-anchored to its actual value.  That keeps the float64 replay correct
without functionalizing the program.

Compiled regions are recorded through `RecordingBackend`, never with this mode active: each
run of a dynamo graph becomes one node whose target is the dynamo `GraphModule`.
"""
from __future__ import annotations

import operator
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.weak import WeakTensorKeyDictionary

from triage.worker.conditioning import LINALG_OPS, SENSITIVE_OPS, condition_of, sensitivity_of

UNINITIALIZED_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
# Ops whose outputs carry no numerical meaning worth a node (scalar extraction, metadata).
MAX_HAZARD_CHECKS = 256
SKIPPED_OPS = {"_local_scalar_dense", "is_nonzero", "equal", "sym_size", "sym_stride", "sym_numel"}


@dataclass
class Leaf:
    index: int
    node: fx.Node
    value: torch.Tensor
    kind: str
    op: str | None
    line: int | None
    # Random leaves: the generator state they were drawn from — the script's last
    # manual_seed (line, value; line None: triage's own seed) and how many random ops came
    # between it and this one — and the top-level script line that led here.
    seed: dict[str, Any] | None = None
    call_line: int | None = None


@dataclass
class Fault:
    """A test-only arm knob: perturb every floating output of one named aten op."""

    op: str
    how: str = "scale"

    @classmethod
    def parse(cls, text: str) -> "Fault":
        """``OP[:how]``, as the arm spec gives it (how defaults to scale)."""
        op, _, how = text.partition(":")
        return cls(op, how or "scale")

    def matches(self, func: Any) -> bool:
        name = func.overloadpacket.__name__
        return name.lstrip("_") == self.op.removeprefix("aten.").lstrip("_")

    def apply(self, out: Any) -> Any:
        if self.how == "raise":
            raise RuntimeError(f"triage fault injection: {self.op} failed")
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
                continue
            flat = t.view(-1) if t.is_contiguous() else None
            if self.how == "scale":
                t.mul_(1.01)
            elif self.how == "ulp":
                t.copy_(torch.nextafter(t, torch.full_like(t, float("inf"))))
            elif flat is not None and self.how == "nan":
                flat[0] = float("nan")
            elif flat is not None and self.how == "inf":
                flat[0] = float("inf")
            elif self.how == "finite":
                torch.nan_to_num_(t, nan=0.0, posinf=1e4, neginf=-1e4)
        return out


@dataclass
class Recording:
    """What the recorder hands to the reference replay and the result writer."""

    graph: fx.Graph
    leaves: list[Leaf]
    conditioning: list[dict[str, Any]]
    stopped: str | None
    random_before_seed: dict[str, Any] | None
    compiled_graphs: int
    compiled_random_ops: list[str] = field(default_factory=list)


class OpRecorder(TorchDispatchMode):
    def __init__(
        self,
        device: torch.device,
        site: Callable[[], int | None],
        fault: Fault | None = None,
        max_nodes: int = 200_000,
        max_leaf_bytes: int = 1 << 30,
        outer_site: Callable[[], int | None] = lambda: None,
    ) -> None:
        super().__init__()
        self.device = device
        self.site = site
        self.outer_site = outer_site
        self.fault = fault
        self.max_nodes = max_nodes
        self.max_leaf_bytes = max_leaf_bytes
        self.graph = fx.Graph()
        self.leaves: list[Leaf] = []
        self.leaf_bytes = 0
        self.nodes = 0
        self.paused = 0
        self.stopped: str | None = None
        self.conditioning: list[dict[str, Any]] = []
        # Cancellation/overflow/domain checks so far: each costs a float64 pass over the op's
        # input, so a training loop's thousandth matmul is not checked again.
        self.hazard_checks = 0
        self.producers: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        # data_ptr -> leaf kind of the latest factory/random output there: lets a tensor that
        # re-wraps that memory (nn.Parameter(torch.empty(...))) be labelled by its origin.
        self.storage_origin: dict[int, tuple[str, str]] = {}
        self.seeded = False
        self.random_before_seed: dict[str, Any] | None = None
        self.seed_state: dict[str, Any] = {"line": None, "value": None, "draws": 0}
        self.compiled_graphs = 0
        self.compiled_random_ops: list[str] = []

    # -- the dispatch hook -------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if self.paused or self.stopped is not None:
            return self._call(func, args, kwargs)
        name = func.overloadpacket.__name__
        if name in SKIPPED_OPS:
            return self._call(func, args, kwargs)
        flat, spec = tree_flatten((args, kwargs))
        is_random = draws_random(func, args, kwargs)
        has_tensor_input = any(isinstance(a, torch.Tensor) for a in flat)
        if is_random or not has_tensor_input or name in UNINITIALIZED_OPS:
            out = self._call(func, args, kwargs, random=is_random)
            kind = "random" if is_random else ("uninitialized" if name in UNINITIALIZED_OPS else "factory")
            if is_random and not self.seeded and self.random_before_seed is None:
                self.random_before_seed = {"op": name, "line": self.site()}
            self._paused_register_leaves(out, kind, name, _mutated(func, args))
            if is_random:
                self.seed_state["draws"] += 1
            return out
        self.paused += 1
        try:
            node_args = [self.node_for(a) if isinstance(a, torch.Tensor) else a for a in flat]
        finally:
            self.paused -= 1
        out = self._call(func, args, kwargs)
        if self.fault is not None and self.fault.matches(func):
            self.paused += 1
            try:
                out = self.fault.apply(out)
            finally:
                self.paused -= 1
        n_args, n_kwargs = tree_unflatten(node_args, spec)
        node = self.graph.call_function(func, tuple(n_args), dict(n_kwargs))
        node.meta["line"] = self.site()
        self._register_outputs(node, out, _mutated(func, args))
        linalg = name in LINALG_OPS and isinstance(args[0], torch.Tensor)
        checked = not linalg and name in SENSITIVE_OPS and self.hazard_checks < MAX_HAZARD_CHECKS
        if linalg or checked:
            self.hazard_checks += checked
            self.paused += 1
            try:
                note = condition_of(name, args[0]) if linalg else sensitivity_of(name, args, out)
            except Exception:  # noqa: BLE001 - a check that cannot read its input only loses a note
                note = None
            finally:
                self.paused -= 1
            if note is not None:
                note["node"] = node.name
                note["line"] = node.meta["line"]
                self.conditioning.append(note)
        self._count()
        return out

    def _call(self, func, args, kwargs, random: bool = False):  # noqa: ANN001
        if random and self.device.type != "cpu":
            return self._random_on_cpu(func, args, kwargs)
        return func(*args, **kwargs)

    def _random_on_cpu(self, func, args, kwargs):  # noqa: ANN001
        """Draw on the CPU generator, then move: every arm starts from the same numbers."""
        self.paused += 1
        try:
            def to_cpu(a: Any) -> Any:
                if isinstance(a, torch.Tensor):
                    return a.detach().cpu()
                if isinstance(a, torch.device) and a.type != "cpu":
                    return torch.device("cpu")
                return a

            flat, spec = tree_flatten((args, kwargs))
            cpu_args, cpu_kwargs = tree_unflatten([to_cpu(a) for a in flat], spec)
            out = func(*cpu_args, **cpu_kwargs)
            mutated = [i for i in written_positions(func) if i < len(args)]
            if mutated:
                for i in mutated:
                    args[i].copy_(cpu_args[i])
                return args[mutated[0]] if len(mutated) == 1 else tuple(args[i] for i in mutated)
            return torch.utils._pytree.tree_map(
                lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t, out
            )
        finally:
            self.paused -= 1

    # -- tensors to nodes --------------------------------------------------------------
    def lookup(self, t: torch.Tensor) -> fx.Node | None:
        entry = self.producers.get(t)
        if entry is None:
            return None
        node, version = entry
        return node if version == _version(t) else None

    def node_for(self, t: torch.Tensor, kind: str = "input") -> fx.Node | None:
        """The node whose value `t` holds now; a new leaf when there is none."""
        if self.stopped is not None:
            return self.lookup(t)
        node = self.lookup(t)
        if node is not None:
            return node
        if kind == "input":
            if t in self.producers:
                kind = "stale"
            else:
                origin = self.storage_origin.get(_data_ptr(t))
                if origin is not None:
                    kind = origin[0]
        return self._new_leaf(t, kind, None)

    def _new_leaf(self, t: torch.Tensor, kind: str, op: str | None, bump: int = 0) -> fx.Node:
        node = self.graph.placeholder(f"leaf{len(self.leaves)}")
        value = t.detach().clone()
        leaf = Leaf(len(self.leaves), node, value, kind, op, self.site())
        if kind == "random":
            leaf.seed = dict(self.seed_state)
            leaf.call_line = self.outer_site()
        node.meta["leaf"] = leaf
        node.meta["line"] = leaf.line
        node.meta["dtype"] = value.dtype
        self.leaves.append(leaf)
        self.producers[t] = (node, _version(t) + bump)
        self.leaf_bytes += value.numel() * value.element_size()
        if self.leaf_bytes > self.max_leaf_bytes:
            self.stop(f"the recorded leaf values passed {self.max_leaf_bytes >> 20} MiB")
        return node

    def _paused_register_leaves(self, out: Any, kind: str, op: str, mutated: set[int]) -> None:
        self.paused += 1
        try:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.storage_origin[_data_ptr(t)] = (kind, op)
                    if self.stopped is None:
                        self._new_leaf(t, kind, op, bump=1 if id(t) in mutated else 0)
        finally:
            self.paused -= 1

    def _register_outputs(self, node: fx.Node, out: Any, mutated: set[int] = frozenset()) -> None:
        # An in-place op's version bump happens above this mode (ADInplaceOrView), after we
        # return: a mutated tensor's valid version is one more than what it reads now.
        def version(t: torch.Tensor) -> int:
            return _version(t) + (1 if id(t) in mutated else 0)

        if isinstance(out, torch.Tensor):
            node.meta["dtype"] = out.dtype
            self.producers[out] = (node, version(out))
            return
        if isinstance(out, (tuple, list)):
            for i, t in enumerate(out):
                if isinstance(t, torch.Tensor):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta["line"] = node.meta.get("line")
                    item.meta["dtype"] = t.dtype
                    self.producers[t] = (item, version(t))
                elif isinstance(t, (tuple, list)):
                    for j, u in enumerate(t):
                        if isinstance(u, torch.Tensor):
                            inner = self.graph.call_function(operator.getitem, (node, i))
                            item = self.graph.call_function(operator.getitem, (inner, j))
                            item.meta["dtype"] = u.dtype
                            self.producers[u] = (item, version(u))

    def _count(self) -> None:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            self.stop(f"the script ran more than {self.max_nodes} ops")

    def stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason

    # -- compiled regions --------------------------------------------------------------
    def record_compiled_run(self, gm: fx.GraphModule, args: tuple, out: Any, random: bool) -> None:
        """Called by the recording backend, with every triage mode suspended."""
        if self.stopped is not None:
            return
        node_args = tuple(self.node_for(a, "compiled") if isinstance(a, torch.Tensor) else a for a in args)
        node = self.graph.call_function(CompiledRegion(gm, self.compiled_graphs, random), node_args)
        node.meta["line"] = self.site()
        node.meta["compiled"] = True
        # A compiled region may mutate its inputs without moving their version counters the way
        # eager in-place ops do: treat every input as rewritten, so its next use re-anchors it.
        for a in args:
            if isinstance(a, torch.Tensor):
                self.producers[a] = (node, -1)
        self._register_outputs(node, out)
        self._count()

    def finish(self) -> Recording:
        return Recording(
            graph=self.graph,
            leaves=self.leaves,
            conditioning=self.conditioning,
            stopped=self.stopped,
            random_before_seed=self.random_before_seed,
            compiled_graphs=self.compiled_graphs,
            compiled_random_ops=self.compiled_random_ops,
        )


def floating_dtypes(graph: fx.Graph) -> list[str]:
    """Every floating dtype an op of the run computed in, compiled regions' ops included: a
    graph that rounds to fp16 mid-way matters even when what the script observes is fp32."""
    found: set[torch.dtype] = set()
    for n in graph.nodes:
        d = n.meta.get("dtype")
        if isinstance(d, torch.dtype) and d.is_floating_point:
            found.add(d)
        if isinstance(n.target, CompiledRegion):
            for inner in n.target.gm.graph.nodes:
                value = inner.meta.get("example_value")
                if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
                    found.add(value.dtype)
    return sorted(str(d).replace("torch.", "") for d in found)


def draws_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this call draws random numbers: ops tagged so (dropout, attention with a
    dropout argument) draw none when their dropout probability is 0 or they run in eval."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    schema = func._schema.arguments
    values = {a.name: a.default_value for a in schema if a.has_default_value()}
    values |= dict(zip((a.name for a in schema), args)) | kwargs
    if "dropout_p" in values:
        return float(values["dropout_p"] or 0) > 0
    if func.overloadpacket.__name__ in ("native_dropout", "dropout", "feature_dropout", "alpha_dropout"):
        return float(values.get("p", 0) or 0) > 0 and values.get("train", True) is not False
    return True


def _version(t: torch.Tensor) -> int:
    """The tensor's version counter; inference tensors (`torch.inference_mode`) have none and
    cannot be mutated outside inference mode, so their value never goes stale."""
    try:
        return t._version
    except RuntimeError:
        return 0


def written_positions(func: Any) -> list[int]:
    """Positions of the arguments an aten op writes to (in-place self, out= arguments)."""
    return [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _mutated(func: Any, args: tuple) -> set[int]:
    """ids of the tensors this call writes to."""
    return {id(args[i]) for i in written_positions(func) if i < len(args) and isinstance(args[i], torch.Tensor)}


def _data_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
    except (RuntimeError, NotImplementedError):
        return -1


class CompiledRegion:
    """The target of an op-graph node standing for one run of a dynamo graph."""

    def __init__(self, gm: fx.GraphModule, number: int, random: bool) -> None:
        self.gm = gm
        self.random = random  # draws random numbers: a replay would draw different ones
        self.__name__ = f"compiled_region_{number}"

    def __call__(self, *args: Any) -> Any:
        return self.gm(*args)


def _graph_copy(graph: fx.Graph) -> fx.Graph:
    copy = fx.Graph()
    out = copy.graph_copy(graph, {})
    copy.output(out)
    return copy


class RecordingBackend:
    """A dynamo backend that compiles with the real backend and records every run."""

    def __init__(self, real: Callable, recorder: OpRecorder) -> None:
        self.real = real
        self.recorder = recorder

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        # The replays (float64 reference, simulated rounding) evaluate the program dynamo
        # captured, not what the backend rewrote it into: backends mutate the graph in place
        # (inductor's pre-grad passes, a custom backend's rewrite of expm1 as exp - 1).
        captured = fx.GraphModule(gm, _graph_copy(gm.graph))
        compiled = self.real(gm, example_inputs)
        gm = captured
        recorder = self.recorder
        recorder.compiled_graphs += 1
        random_ops = [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
                      if n.op in ("call_function", "call_method") and _is_random_callable(n.target)]
        recorder.compiled_random_ops.extend(random_ops)

        def run(*args: Any) -> Any:
            out = compiled(*args)
            try:
                recorder.record_compiled_run(gm, args, out, bool(random_ops))
            except Exception as e:  # noqa: BLE001 - triage's bookkeeping must not break the script
                recorder.stop(f"recording a compiled region failed: {type(e).__name__}: {e}")
            return out

        return run


_RANDOM_NAMES = {
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm",
    "bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "uniform_", "dropout",
    "native_dropout", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_",
    "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "rrelu",
}


def _is_random_callable(target: Any) -> bool:
    name = target if isinstance(target, str) else getattr(target, "__name__", None)
    return name in _RANDOM_NAMES


def script_site(script_path: str) -> Callable[[], int | None]:
    """A cheap function returning the innermost line of the script on the current stack."""

    def site() -> int | None:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename == script_path:
                return frame.f_lineno
            frame = frame.f_back
        return None

    return site


def script_outer_site(script_path: str) -> Callable[[], int | None]:
    """The outermost line of the script on the current stack: the top-level statement
    (`weights = train_model()`) that led to whatever runs now."""

    def site() -> int | None:
        frame, line = sys._getframe(2), None
        while frame is not None:
            if frame.f_code.co_filename == script_path:
                line = frame.f_lineno
            frame = frame.f_back
        return line

    return site
