"""The op graph: an FX graph of aten ops with the real values of its leaves.

`OpRecorder` is a `TorchDispatchMode` active while the script runs eagerly.  Every aten op
the script executes becomes a `call_function` node; every tensor whose value did not come
from a recorded op becomes a *leaf* (an FX placeholder) holding a clone of its value at the
moment it was first used.  Leaves are:

* ``input``         a tensor created outside the recorded ops (``torch.tensor`` data, numpy,
                    a storage's bytes set into a tensor: ``copy.deepcopy``, ``torch.load``),
* ``factory``       the output of a factory op (``full``, ``arange``, ``zeros`` …),
* ``random``        the output of a random op (``randn``, ``uniform_``, ``native_dropout``),
* ``uninitialized`` ``torch.empty`` and friends,
* ``stale``         a tensor mutated behind the recorder's back (a view of an in-place target),
* ``compiled``      a compiled region's input that the eager recording did not produce,
* ``storage``       an ``as_strided`` view that reads its input's storage beyond the input's
                    own elements (a partial view's base): the replay holds only those elements.

Staleness uses the tensor's version counter, which views share with their base: when the
counter moved since the tensor was registered, its recorded producer no longer describes its
value, so it is re-anchored to its actual value.  That keeps the float64 replay correct
without functionalizing the program.  The version a tensor is registered with is read once
the op that produced it has returned (at the next op or lookup): an in-place op's bump and a
view's sharing of its base's counter both happen above this mode, after it returns.

An alias with a counter of its own (``p.data``) writes memory behind the version, and
``p.data = t`` swaps it without any op: each entry also keeps the tensor's exact memory and
the count of recorded writes to its storage, and a tensor reading exactly the memory a node's
value was last written to, with no recorded write since (``p.data``, ``nn.Parameter(t)``,
``p.data = t``), takes that node.

Ops that write tensor lists (``_foreach_add_``, ``_fused_adam_`` — the optimizers' foreach and
fused steps) move no version counter under a dispatch mode (pytorch/pytorch#191154), so the
recorder bumps them itself, and records such an op as its functional variant
(``_foreach_add``): each written tensor's new value is an output of the node, and the replay
carries the update at its own precision instead of re-anchoring the parameters.

Compiled regions are recorded through `RecordingBackend`, never with this mode active: each
run of a dynamo graph becomes one node whose target is the dynamo `GraphModule`.
"""
from __future__ import annotations

import collections
import functools
import math
import operator
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.weak import WeakTensorKeyDictionary

from triage.worker import arm_choices
from triage.worker.conditioning import (
    LINALG_OPS,
    SENSITIVE_OPS,
    VALUES_ONLY,
    WRAPPING_OPS,
    condition_of,
    integer_wraparound,
    range_length,
    sensitivity_of,
)
from triage.worker.independent import Budget, note_fields
from triage.worker.modes import TriageDispatchMode

UNINITIALIZED_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
# Views defined on their input's storage rather than on its elements: replayed from a leaf's
# value (its own elements, from offset 0), they read other memory than the arm did wherever
# the input is not the whole of its storage (`_beyond_own_elements`).
STORAGE_VIEWS = {"as_strided", "as_strided_", "as_strided_copy"}
# A view op and the op writing a value back through it: a write to `select(g, 0, i)` leaves
# `g` as `select_scatter(g, new, 0, i)`.
VIEW_SCATTERS = {torch.ops.aten.select.int: torch.ops.aten.select_scatter.default,
                 torch.ops.aten.slice.Tensor: torch.ops.aten.slice_scatter.default,
                 torch.ops.aten.diagonal.default: torch.ops.aten.diagonal_scatter.default}
# Ops whose outputs carry no numerical meaning worth a node (scalar extraction, metadata).
MAX_HAZARD_CHECKS = 256
SKIPPED_OPS = {"_local_scalar_dense", "is_nonzero", "equal", "sym_size", "sym_stride", "sym_numel"}


# Ops that return their argument's values as a new tensor (`torch.tensor(data)`'s last step).
LIFTS = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.detach.default,
         torch.ops.aten.alias.default}


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
    # A leaf the script built from Python floats its dtype does not hold exactly
    # (`torch.tensor(math.pi / 2)`): those numbers, in float64. The float64 reference computes
    # from them, and each simulated replay rounds them to the leaf's dtype: the script wrote
    # π/2, and float32's nearest value is part of the arm's rounding.
    literal: torch.Tensor | None = None
    # A factory kernel's error beyond the rounding of `literal`, per element, absolute
    # (`linspace`'s start + i·step errs by the step's rounding times i, near 0 as far as at its
    # ends): each simulated replay moves the numbers by up to it before rounding them.
    literal_error: torch.Tensor | None = None


# Factory ops whose values are a function of Python numbers, and their kernels' error beyond
# the rounding to their dtype, in units of the dtype's unit roundoff: (relative to each value,
# absolute times the largest value). `linspace` computes start + i·step (from both ends) and
# `arange` start + i·step at its dtype's opmath: a rounding of the step, times i, is an error of
# the largest value's size anywhere, 7,800 ulp of an element near 0 of a float32 linspace from
# −7.3 to 123.1; `logspace` raises the base to a linspace (`_note_factory`); `full` rounds its
# value once.
FACTORY_ERRORS = {"linspace": (0.0, 2.0), "arange": (0.0, 2.0), "logspace": (2.0, 0.0), "full": (0.0, 0.0),
                  "scalar_tensor": (0.0, 0.0)}
MAX_FACTORY_ELEMENTS = 1 << 22


@dataclass
class Fault:
    """A test-only arm knob: perturb every floating output of one named aten op (and, scaled,
    every complex one)."""

    op: str
    how: str = "scale"

    @classmethod
    def parse(cls, text: str) -> Fault:
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
            if (not isinstance(t, torch.Tensor) or t.numel() == 0
                    or not (t.is_floating_point() or (t.is_complex() and self.how == "scale"))):
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
    # A vector note's index -> the note for its matrix's values alone, for a run whose observed
    # values read none of that op's vectors (the session decides, from their cones).
    values_only: dict[int, dict[str, Any]] = field(default_factory=dict)


class OpRecorder(TriageDispatchMode):
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
        self.values_only: dict[int, dict[str, Any]] = {}  # a vector note's index -> the values' own note
        self.answer_budget = Budget()
        # Cancellation/overflow/domain checks so far: each costs a float64 pass over the op's
        # input, so a training loop's thousandth matmul is not checked again.
        self.hazard_checks = 0
        self.wrap_checks = 0  # integer ops checked for a result past their dtype's range
        # tensor -> (node, version, memory, recorded writes to its storage): see _set/_holds.
        self.producers: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        # Recorded writes per storage, and for each exact memory the node whose value it held
        # last (its storage, weakly: a freed storage's address is reused, and the write count
        # then): an alias made after the tensor that wrote it died still finds its value.
        self.writes: dict[tuple, int] = {}
        self.holders: dict[tuple, tuple[weakref.ref, fx.Node, int]] = {}
        # The latest recorded writes per storage, each (its write count, offset, sizes, strides,
        # dtype): a view none of them reached still holds its value, though they moved the
        # version counter it shares (a GRU cell's in-place gates on one split of its GEMM's output).
        self.write_log: dict[tuple, collections.deque] = {}
        # Tensors the op in flight registered: their final version is known once it returned.
        # Weak: a strong reference would make autograd copy gradients it could steal.
        self.unsettled: list[tuple[weakref.ref, fx.Node]] = []
        # data_ptr -> leaf kind of the latest factory/random output there: lets a tensor that
        # re-wraps that memory (nn.Parameter(torch.empty(...))) be labelled by its origin.
        self.storage_origin: dict[int, tuple[str, str]] = {}
        # tensor -> the float64 numbers the script built it from, until its leaf is made (`note_literal`).
        self.literals: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        # tensor -> the absolute error bound of a factory kernel's values (`Leaf.literal_error`).
        self.literal_errors: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.seeded = False
        self.random_before_seed: dict[str, Any] | None = None
        self.seed_state: dict[str, Any] = {"line": None, "value": None, "draws": 0}
        self.compiled_graphs = 0
        self.script_backends: list[dict[str, Any]] = []  # backends the script passes as callables
        self.compiled_random_ops: list[str] = []
        # The script's flush-to-zero (`torch.set_flush_denormal`, observe.install_flush_watch):
        # whether it is on, and the line that turned it on until an op has carried its note.
        self.flushing = False
        self.flush_line: int | None = None
        # Whether a contraction computed from bfloat16 inputs (oneDNN under the script's
        # float32 matmul precision) has carried its note yet, and whether oneDNN read a
        # contraction's inputs so, by op and operand shapes (`_bfloat16_candidates`).
        self.reduced_matmul_noted = False
        self.bfloat16_reads: dict[tuple, bool] = {}

    def flush_denormal(self, on: bool) -> None:
        """The script turned the CPU's flush-to-zero on or off: the ops recorded while it is
        on are replayed flushing as well (`rounding.RoundingMode`)."""
        self.flushing = on
        self.flush_line = self.site() if on else None

    def _flushed(self, node: fx.Node, out: Any) -> None:
        """Mark `node` as computed with flush-to-zero on, where it is (a CPU result: the switch
        is the CPU's); the first such op after the script's call carries the note naming it."""
        if not self.flushing:  # every recorded op passes here: nothing more while it is off
            return
        first = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
        if first is None or first.device.type != "cpu":
            return
        node.meta["flush_denormal"] = True
        if self.flush_line is None:
            return
        self.conditioning.append(dict(
            op=node.target.overloadpacket.__name__ if isinstance(node.target, torch._ops.OpOverload)
            else "compiled region", shape=list(first.shape), dtype=str(first.dtype).replace("torch.", ""),
            node=node.name, line=self.flush_line, kind="flush-to-zero", singular=False, ill_conditioned=False,
            figure=(f"the script turns on flush-to-zero at line {self.flush_line} (`torch.set_flush_denormal(True)`): "
                    "from there the CPU's results below the smallest normal value (1.2e-38 in float32 and "
                    "bfloat16, 6.1e-05 in float16) are 0, and the simulation flushes them too")))
        self.flush_line = None

    def _bfloat16_candidates(self, func: Any, name: str, args: tuple, kwargs: dict) -> tuple | None:
        """Before a CPU float32 contraction that oneDNN may compute from bfloat16 inputs (the
        script's `torch.set_float32_matmul_precision("medium")`, or oneDNN's own fp32_precision
        "bf16", on a CPU with bfloat16 support): its operand shapes, and where those were not
        seen yet, the op in float64 on its inputs and on its inputs rounded to bfloat16, which
        `_reduced_matmul` tells the result apart by. Whether oneDNN reads them so depends on
        the CPU's bfloat16 path and the sizes (an AMD EPYC with AVX512-BF16 computed a 64×512
        Linear at float32 under "medium"; an Intel Xeon with AMX read it as bfloat16): it is
        measured, not assumed. None where no such op is about to run."""
        if name not in ONEDNN_BF16_OPS or onednn_fp32_precision(name) != "bf16":
            return None
        flat, spec = tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        if not tensors or any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
            return None
        key = (name, tuple((tuple(t.shape), t.stride()) for t in tensors))
        if key in self.bfloat16_reads:
            return key, None, None
        self.paused += 1
        try:
            exact_args, exact_kwargs = tree_unflatten([a.detach().double() if isinstance(a, torch.Tensor) else a
                                                       for a in flat], spec)
            rounded_args, rounded_kwargs = tree_unflatten([a.detach().to(torch.bfloat16).double()
                                                           if isinstance(a, torch.Tensor) else a for a in flat], spec)
            return key, func(*exact_args, **exact_kwargs), func(*rounded_args, **rounded_kwargs)
        except Exception:  # noqa: BLE001 - an out= form, say: oneDNN's documented behaviour is assumed
            return key, None, None
        finally:
            self.paused -= 1

    def _reduced_matmul(self, node: fx.Node, name: str, out: Any, candidates: tuple | None) -> None:
        """Mark a CPU float32 contraction that oneDNN computed from bfloat16 inputs: its result
        nearer the op on bfloat16-rounded inputs than on its own (`_bfloat16_candidates`), as
        the first op of its shapes was. The replay rounds its inputs to bfloat16 too
        (`rounding.RoundingMode`); the first one carries the note."""
        if candidates is None or not isinstance(out, torch.Tensor) or out.dtype != torch.float32 \
                or out.device.type != "cpu":
            return
        key, exact, rounded = candidates
        if isinstance(exact, torch.Tensor) and isinstance(rounded, torch.Tensor) \
                and exact.shape == out.shape == rounded.shape:
            result = out.detach().double()
            self.bfloat16_reads[key] = bool((result - rounded).norm() < (result - exact).norm())
        if not self.bfloat16_reads.get(key, True):
            return
        node.meta["matmul_inputs"] = "bf16"
        if self.reduced_matmul_noted:
            return
        self.reduced_matmul_noted = True
        self.conditioning.append(dict(
            op=name, shape=list(out.shape), dtype="float32", node=node.name, line=node.meta.get("line"),
            kind="reduced-matmul-precision", singular=False, ill_conditioned=False,
            figure=("oneDNN computes this CPU's float32 matmuls from bfloat16 inputs (8-bit significands) here, as "
                    "the script's `torch.set_float32_matmul_precision('medium')` asks; the simulation rounds their "
                    "inputs so too")))

    # -- the dispatch hook -------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        self._settle()
        if self.paused or self.stopped is not None:
            return self._call(func, args, kwargs)
        name = func.overloadpacket.__name__
        if name in SKIPPED_OPS:
            return self._call(func, args, kwargs)
        flat, spec = tree_flatten((args, kwargs))
        is_random = draws_random(func, args, kwargs)
        has_tensor_input = any(isinstance(a, torch.Tensor) for a in flat)
        beyond = name in STORAGE_VIEWS and _beyond_own_elements(args[0])
        stored = _reads_storage(flat)
        if is_random or not has_tensor_input or name in UNINITIALIZED_OPS or beyond or stored:
            out = self._call(func, args, kwargs, random=is_random)
            if name not in REPOINTING_OPS:
                self._wrote(_written_tensors(func, args, kwargs))
            kind = ("random" if is_random else "uninitialized" if name in UNINITIALIZED_OPS
                    else "storage" if beyond else "input" if stored else "factory")
            if is_random and not self.seeded and self.random_before_seed is None:
                self.random_before_seed = {"op": name, "line": self.site()}
            if kind == "factory" and name in FACTORY_ERRORS:
                self._note_factory(func, name, args, kwargs, out)
            self._paused_register_leaves(out, kind, name)
            if kind == "factory" and name == "arange":
                self._note_length(func, args, kwargs, out)
            if is_random:
                self.seed_state["draws"] += 1
            return out
        self.paused += 1
        try:
            node_args = [self.node_for(a) if isinstance(a, torch.Tensor) else a for a in flat]
        finally:
            self.paused -= 1
        written = _written_tensors(func, args, kwargs)
        written_lists = _writes_list(func)
        before = [_version(t) for t in written] if written_lists else []
        through = self._viewed_bases(written) if written and not written_lists else []
        bfloat16_candidates = self._bfloat16_candidates(func, name, args, kwargs)
        out = self._call(func, args, kwargs)
        if written_lists:
            self._bump_unmoved(written, before)
        if name not in REPOINTING_OPS:
            self._wrote(written)
        if self.fault is not None and self.fault.matches(func):
            self.paused += 1
            try:
                out = self.fault.apply(out)
            finally:
                self.paused -= 1
        n_args, n_kwargs = tree_unflatten(node_args, spec)
        functional = functional_variant(func) if written_lists else None
        node = self.graph.call_function(functional or func, tuple(n_args), dict(n_kwargs))
        node.meta["line"] = self.site()
        if isinstance(out, torch.Tensor):  # for the one-change search's operand swaps
            node.meta["value_shape"] = tuple(out.shape)
        self._flushed(node, out)
        self._reduced_matmul(node, name, out, bfloat16_candidates)
        if functional is not None:
            self._register_written(node, func, args, kwargs, out)
        else:
            self._register_outputs(node, out)
            self._write_through(through, node)
            choices = arm_choices.keep(name, out)
            if choices is not None:
                node.meta["arm_choices"] = choices
            if written_lists:
                # No functional form to replay: the written tensors re-anchor at their next use.
                for t in written:
                    self.producers[t] = (node, -1, None, 0)
        if name in WRAPPING_OPS and self.wrap_checks < MAX_HAZARD_CHECKS:
            self._note_wraparound(func, name, args, kwargs, out, node)
        linalg = name in LINALG_OPS and isinstance(args[0], torch.Tensor)
        checked = not linalg and name in SENSITIVE_OPS and self.hazard_checks < MAX_HAZARD_CHECKS
        if linalg or checked:
            self.hazard_checks += checked
            self.paused += 1
            try:
                note = condition_of(name, args[0], kwargs) if linalg else sensitivity_of(name, args, out)
            except Exception:  # noqa: BLE001 - a check that cannot read its input only loses a note
                note = None
            finally:
                self.paused -= 1
            if note is not None:
                values_only = note.pop(VALUES_ONLY, None)
                note["node"] = node.name
                note["line"] = node.meta["line"]
                if values_only is not None:
                    self.values_only[len(self.conditioning)] = dict(values_only, node=node.name, line=node.meta["line"])
                if linalg:
                    self._answer(name, args, kwargs, out, note)
                self.conditioning.append(note)
        self._count()
        return out

    def _note_wraparound(self, func: Any, name: str, args: tuple, kwargs: dict, out: Any, node: fx.Node) -> None:
        """Note an integer op whose exact result left its dtype's range (`integer_wraparound`)."""
        if not isinstance(out, torch.Tensor) or out.dtype.is_floating_point or out.dtype.is_complex \
                or out.dtype == torch.bool:
            return
        self.wrap_checks += 1
        self.paused += 1
        try:
            note = integer_wraparound(func, name, args, kwargs, out)
        except Exception:  # noqa: BLE001 - a check that cannot recompute the op only loses a note
            note = None
        finally:
            self.paused -= 1
        if note is not None:
            self.conditioning.append(dict(note, node=node.name, line=node.meta["line"]))

    def _answer(self, name: str, args: tuple, kwargs: dict[str, Any], out: Any, note: dict[str, Any]) -> None:
        """Check the arm's own output of a small linalg call against its independent answer
        (the worst of its outputs goes into the note)."""
        self.paused += 1
        try:
            found = self.answer_budget.answers(name, args, kwargs or {})
            checks = [c for a in found if (c := a.check(out)) is not None]
        except Exception:  # noqa: BLE001 - an answer that cannot be computed only loses the check
            return
        finally:
            self.paused -= 1
        if checks:
            note.update(note_fields(max(checks, key=lambda c: c.error / c.bound), "kernel"))

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

    def _bump_unmoved(self, tensors: list[torch.Tensor], before: list[int]) -> None:
        """Advance the version of every written tensor the op left unmoved, as the op does
        outside a dispatch mode: autograd's saved-tensor checks and the staleness here rely on it."""
        self.paused += 1
        try:
            for t, v in zip(tensors, before, strict=False):
                if _version(t) == v and not t.is_inference():
                    torch.autograd.graph.increment_version(t)
        finally:
            self.paused -= 1

    def _wrote(self, tensors: list[torch.Tensor]) -> None:
        """Count a recorded write to each tensor's storage: aliases with a version counter of
        their own (`p.data`) see it only here."""
        for t in tensors:
            memory = _memory(t)
            if memory is not None:
                count = self.writes[memory[:2]] = self.writes.get(memory[:2], 0) + 1
                log = self.write_log.get(memory[:2])
                if log is None:
                    log = self.write_log[memory[:2]] = collections.deque(maxlen=WRITE_LOG)
                log.append((count,) + memory[2:6])

    # -- tensors to nodes --------------------------------------------------------------
    def _set(self, t: torch.Tensor, node: fx.Node) -> None:
        """`t` holds `node`'s value now."""
        memory = _memory(t)
        writes = self.writes.get(memory[:2], 0) if memory else 0
        self.producers[t] = (node, _version(t), memory, writes)
        if memory is not None:
            self.holders[memory] = (weakref.ref(t.untyped_storage()), node, writes)

    def _holds(self, t: torch.Tensor, entry: tuple) -> bool:
        """Whether `t` still holds the value its entry was stamped with: nothing wrote to its
        storage since, or only recorded writes to other elements of it (`_untouched`)."""
        _, version, memory, writes = entry
        now = _memory(t)
        if now != memory:
            return False
        if now is None:
            return version == _version(t)
        current = self.writes.get(now[:2], 0)
        if version == _version(t) and current == writes:
            return True
        return self._untouched(t, entry, current)

    def _untouched(self, t: torch.Tensor, entry: tuple, current: int) -> bool:
        """Every write to `t`'s storage since its stamp was recorded (its version counter moved
        no more than they number: views share it, `unsafe_split`'s pieces do not) and none
        reached an element of `t`: it holds its value, stamped anew."""
        node, version, memory, writes = entry
        if version == -1:  # a compiled region's input: rewritten, whatever its counter says
            return False
        since = [w for w in self.write_log.get(memory[:2], ()) if w[0] > writes]
        if len(since) != current - writes or not 0 <= _version(t) - version <= len(since):
            return False  # a write the recorder did not see (or one it no longer remembers)
        if not all(_disjoint(memory, w) for w in since):
            return False
        self.producers[t] = (node, _version(t), memory, current)
        return True

    def _bind(self, t: torch.Tensor, node: fx.Node) -> None:
        """`t` now holds `node`'s value; its version is read once the op in flight returned."""
        self._set(t, node)
        self.unsettled.append((weakref.ref(t), node))

    def _settle(self) -> None:
        """Re-read the versions of the previous op's outputs now that it has returned: an
        in-place target's bump, and a view output's sharing of its base's counter, happen
        above this mode (ADInplaceOrView) after the op ran."""
        for ref, node in self.unsettled:
            t = ref()
            entry = self.producers.get(t) if t is not None else None
            if entry is not None and entry[0] is node and entry[1] != -1:
                self._set(t, node)
        self.unsettled.clear()

    def lookup(self, t: torch.Tensor) -> fx.Node | None:
        self._settle()
        entry = self.producers.get(t)
        if entry is not None and self._holds(t, entry):
            return entry[0]
        return self._same_memory(t)

    def _same_memory(self, t: torch.Tensor) -> fx.Node | None:
        """The node whose value `t`'s exact memory holds, when no recorded write reached its
        storage since (`p.data`, a Parameter wrapping a recorded tensor, `p.data = new`)."""
        memory = _memory(t)
        held = self.holders.get(memory) if memory is not None else None
        if held is None or held[0]() is not t.untyped_storage() or self.writes.get(memory[:2], 0) != held[2]:
            return None
        self._set(t, held[1])
        return held[1]

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

    def _new_leaf(self, t: torch.Tensor, kind: str, op: str | None, in_flight: bool = False) -> fx.Node:
        node = self.graph.placeholder(f"leaf{len(self.leaves)}")
        value = t.detach().clone()
        leaf = Leaf(len(self.leaves), node, value, kind, op, self.site(), literal=self.literals.pop(t, None),
                    literal_error=self.literal_errors.pop(t, None))
        if kind == "random":
            leaf.seed = dict(self.seed_state)
            leaf.call_line = self.outer_site()
        node.meta["leaf"] = leaf
        node.meta["line"] = leaf.line
        node.meta["dtype"] = value.dtype
        self.leaves.append(leaf)
        if in_flight:  # an output of the op in flight (a random or factory op)
            self._bind(t, node)
        else:
            self._set(t, node)
        self.leaf_bytes += value.numel() * value.element_size()
        if self.leaf_bytes > self.max_leaf_bytes:
            self.stop(f"the recorded leaf values passed {self.max_leaf_bytes >> 20} MiB")
        return node

    def note_literal(self, t: torch.Tensor, literal: torch.Tensor) -> None:
        """`t` was built from the float64 numbers `literal` (`Leaf.literal`): on its leaf, now
        if it has one, else when it is made (a tensor from Python data is a leaf at first use)."""
        node = self.lookup(t)
        if node is None:
            self.literals[t] = literal
            return
        # `torch.tensor(data)` records the tensor it built from the data as a leaf and returns
        # `lift_fresh` of it: the same values.
        while node.op == "call_function" and node.target in LIFTS and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
        if node.op == "placeholder" and node.meta["leaf"].value.shape == literal.shape:
            node.meta["leaf"].literal = literal

    def _note_factory(self, func: Any, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """A factory op's values in a floating dtype narrower than float64 (`torch.logspace(0, 4,
        9, dtype=torch.float16)`): the same call in float64 is what the script asked for, and the
        arm's values are its kernel's rounding of that (`Leaf.literal`, with the kernel's error
        bound, `FACTORY_ERRORS`). Without it the arm's float16 values were the float64 reference
        of themselves, with a spread of 0: a correctly rounded `logspace` was "a different
        function" from the float64 one."""
        if not isinstance(out, torch.Tensor) or out.dtype not in (torch.float32, torch.float16, torch.bfloat16) \
                or not 0 < out.numel() <= MAX_FACTORY_ELEMENTS:
            return
        self.paused += 1
        try:
            with torch.no_grad():
                wide = func(*args, **{**kwargs, "dtype": torch.float64, "device": "cpu"})
        except Exception:  # noqa: BLE001 - no float64 version: the values as they are
            return
        finally:
            self.paused -= 1
        if not isinstance(wide, torch.Tensor) or wide.shape != out.shape or torch.equal(wide, out.detach().cpu().double()):
            return
        u = torch.finfo(out.dtype).eps / 2
        relative, absolute = FACTORY_ERRORS[name]
        error = wide.abs() * (relative * u)
        if absolute:
            error = error + absolute * u * float(wide.abs().max())
        if name == "logspace":  # base ** x: the exponent's rounding, ln(base)·|x|·u relative
            base = float(kwargs.get("base", args[3] if len(args) > 3 else 10.0))
            exponent = torch.log(wide) / math.log(base) if base > 0 and base != 1 else torch.zeros_like(wide)
            error = error + wide.abs() * (abs(math.log(base)) * exponent.abs() * u)
        if not bool(torch.isfinite(error).all()):  # numbers past any range (an underflowed power): as recorded
            return
        self.literals[out] = wide
        self.literal_errors[out] = error

    def _note_length(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Note an `arange` whose length rounding decided (`conditioning.range_length`), on
        its leaf: a check of its length downstream reads it (`classify.ladder`)."""
        named = {a.name: v for a, v in zip(func._schema.arguments, args, strict=False)} | kwargs
        numbers = [named.get("start", 0), named.get("end"), named.get("step", 1)]
        if not isinstance(out, torch.Tensor) or not all(isinstance(x, (int, float)) for x in numbers):
            return
        note = range_length("arange", *(float(x) for x in numbers), out.numel(), out.dtype)
        node = self.lookup(out)
        if note is not None and node is not None:
            self.conditioning.append(dict(note, node=node.name, line=node.meta.get("line")))

    def _paused_register_leaves(self, out: Any, kind: str, op: str) -> None:
        self.paused += 1
        try:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.storage_origin[_data_ptr(t)] = (kind, op)
                    if self.stopped is None:
                        self._new_leaf(t, kind, op, in_flight=True)
        finally:
            self.paused -= 1

    def _register_outputs(self, node: fx.Node, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            node.meta["dtype"] = out.dtype
            self._bind(out, node)
            return
        if isinstance(out, (tuple, list)):
            for i, t in enumerate(out):
                if isinstance(t, torch.Tensor):
                    self._bind(t, self._item(node, i, t))
                elif isinstance(t, (tuple, list)):
                    inner = self._item(node, i, None)
                    for j, u in enumerate(t):
                        if isinstance(u, torch.Tensor):
                            self._bind(u, self._item(inner, j, u))

    def _viewed_bases(self, written: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor, fx.Node,
                                                                         fx.Node | None]]:
        """The written tensors that are views of a base the recording holds (`g[i] = x` writes
        `select(g, 0, i)`): (view, base, the base's node, the view's node). Only a contiguous
        base at offset 0 of the view's dtype, whose replayed value has the same layout, so that
        the view's sizes, strides and offset locate it there too."""
        found = []
        for t in written:
            base = t._base
            if (base is None or base.dtype != t.dtype or base.storage_offset() != 0 or not base.is_contiguous()
                    or base.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()):
                continue
            node = self.lookup(base)
            if node is not None:
                found.append((t, base, node, self.lookup(t)))
        return found

    def _write_through(self, through: list[tuple[torch.Tensor, torch.Tensor, fx.Node, fx.Node | None]],
                       node: fx.Node) -> None:
        """The bases an in-place op wrote through their views: each base's new value is its old
        one with the view's new value scattered in (functionalization's rule), so it keeps its
        history instead of re-anchoring as a stale leaf whose float64 value is the arm's own (a
        gradient filled element by element). The view op's own scatter where the view was taken
        of the base directly (`select_scatter` for `g[i]`), else the view's place in the base's
        memory (`as_strided_scatter`)."""
        for view, base, base_node, view_node in through:
            entry = self.producers.get(view)
            if entry is None or entry[0] is not node:
                continue
            twin = (VIEW_SCATTERS.get(view_node.target) if view_node is not None and view_node.op == "call_function"
                    and view_node.args and view_node.args[0] is base_node else None)
            if twin is not None:
                scatter = self.graph.call_function(twin, (base_node, node, *view_node.args[1:]), dict(view_node.kwargs))
            else:
                scatter = self.graph.call_function(torch.ops.aten.as_strided_scatter.default,
                                                   (base_node, node, list(view.shape), list(view.stride()),
                                                    view.storage_offset()))
            scatter.meta["line"] = node.meta["line"]
            scatter.meta["dtype"] = base.dtype
            self._bind(base, scatter)

    def _register_written(self, node: fx.Node, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """`node` runs the functional variant of the in-place `func`: its outputs are `func`'s
        own outputs, then the new value of each written argument, in argument order."""
        returns = list(out) if isinstance(out, (tuple, list)) else [] if out is None else [out]
        values = returns + [_argument(func, i, args, kwargs) for i in written_positions(func)]
        for k, value in enumerate(values):
            # A single return is the node's value itself, not a one-element tuple.
            holder = node if len(values) == 1 else self._item(node, k, None)
            if isinstance(value, torch.Tensor):
                holder.meta["dtype"] = value.dtype
                self._bind(value, holder)
            elif isinstance(value, (tuple, list)):
                for j, t in enumerate(value):
                    if isinstance(t, torch.Tensor):
                        self._bind(t, self._item(holder, j, t))

    def _item(self, node: fx.Node, index: int, value: torch.Tensor | None) -> fx.Node:
        item = self.graph.call_function(operator.getitem, (node, index))
        item.meta["line"] = node.meta.get("line")
        if value is not None:
            item.meta["dtype"] = value.dtype
            # What a replay must give back (`reference.shape_as_recorded`): a kernel may leave an
            # output empty where nothing asks for its gradient.
            item.meta["shape"] = tuple(value.shape)
        return item

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
        self._settle()
        node_args = tuple(self.node_for(a, "compiled") if isinstance(a, torch.Tensor) else a for a in args)
        node = self.graph.call_function(CompiledRegion(gm, self.compiled_graphs, random), node_args)
        node.meta["line"] = self.site()
        node.meta["call_line"] = self.outer_site()  # the script's top-level line that called the compiled function
        node.meta["compiled"] = True
        self._flushed(node, out)
        # A compiled region may mutate its inputs without moving their version counters the way
        # eager in-place ops do: treat every input as rewritten, so its next use re-anchors it.
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        self._wrote(inputs)
        for a in inputs:
            self.producers[a] = (node, -1, None, 0)
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
            values_only=self.values_only,
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


# In-place ops that overwrite every element of their target: the target's old value is not
# something the result depends on (nn.LayerNorm fills torch.empty storage with ones_).
OVERWRITING_OPS = {"fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
                   "geometric_", "cauchy_", "log_normal_"}


def value_inputs(n: fx.Node) -> list[fx.Node]:
    """The input nodes whose values `n`'s value depends on: all of them, except the target of
    an op that overwrites it entirely."""
    target = n.target
    if isinstance(target, torch._ops.OpOverload) and target.overloadpacket.__name__ in OVERWRITING_OPS \
            and n.args and isinstance(n.args[0], fx.Node):
        overwritten = n.args[0]
        return [a for a in n.all_input_nodes if a is not overwritten]
    return n.all_input_nodes


def _beyond_own_elements(t: Any) -> bool:
    """Whether `t` is anything but the whole of its storage, contiguous from the storage's
    start: an `as_strided` of it may then read memory outside its elements (a partial view's
    base), or its elements in another layout than a replay's contiguous copy of them."""
    if not isinstance(t, torch.Tensor):
        return False
    return t.storage_offset() != 0 or not t.is_contiguous() \
        or t.untyped_storage().nbytes() != t.numel() * t.element_size()


def _reads_storage(flat: list) -> bool:
    """An op given a storage, not a tensor (`set_(storage, …)`: how `copy.deepcopy` and
    `torch.load` rebuild a tensor): its result holds that storage's bytes, which no recorded op
    produced, and a float64 replay would read a float32 storage's bytes as float64."""
    return any(isinstance(a, (torch.UntypedStorage, torch.TypedStorage)) for a in flat)


def draws_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this call draws random numbers: ops tagged so (dropout, attention with a
    dropout argument) draw none when their dropout probability is 0 or they run in eval."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    schema = func._schema.arguments
    values = {a.name: a.default_value for a in schema if a.has_default_value()}
    values |= dict(zip((a.name for a in schema), args, strict=False)) | kwargs
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


@functools.cache
def written_positions(func: Any) -> tuple[int, ...]:
    """Positions of the arguments an aten op writes to (in-place self, out= arguments)."""
    return tuple(i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write)


def _writes_list(func: Any) -> bool:
    """Whether the op writes to a tensor-list argument (foreach and fused optimizer steps)."""
    return any(a.alias_info is not None and a.alias_info.is_write and isinstance(a.type, torch.ListType)
               for a in func._schema.arguments)


def _argument(func: Any, position: int, args: tuple, kwargs: dict) -> Any:
    """The value of the schema's `position`-th argument in this call (keyword-only ones
    arrive in kwargs)."""
    if position < len(args):
        return args[position]
    return kwargs.get(func._schema.arguments[position].name)


# Ops that point their tensor at another storage and write no element: counted as a write to
# the storage it then holds, `copy.deepcopy` of a module (`set_` of a byte view onto each
# buffer's storage, to clone it) left every buffer it copied unrecorded ("stale").
REPOINTING_OPS = {"set_"}


def _written_tensors(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Every tensor this call writes to, list elements included."""
    found = []
    for i in written_positions(func):
        value = _argument(func, i, args, kwargs)
        found.extend(t for t in (value if isinstance(value, (tuple, list)) else [value])
                     if isinstance(t, torch.Tensor))
    return found


def functional_variant(func: Any) -> Any:
    """The out-of-place twin of an in-place op (``_foreach_add_.List`` → ``_foreach_add.List``)
    returning the op's outputs then each written argument's new value; None when there is none."""
    name = func.overloadpacket.__name__
    if not name.endswith("_"):
        return None
    packet = getattr(getattr(torch.ops, func.namespace), name[:-1], None)
    variant = getattr(packet, func._overloadname, None) if packet is not None else None
    if variant is None:
        return None
    written = written_positions(func)
    schema, own = variant._schema, func._schema
    if (len(schema.returns) != len(own.returns) + len(written) or len(schema.arguments) != len(own.arguments)
            or any(a.alias_info is not None for a in schema.arguments)):
        return None
    return variant


def _memory(t: torch.Tensor) -> tuple | None:
    """The exact memory a tensor reads — (device, storage) first, then offset, sizes, strides,
    dtype and the lazy conj/neg bits — or None for a tensor without a plain storage."""
    try:
        return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
                t.dtype, t.is_conj(), t.is_neg())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


# Recorded writes remembered per storage (`OpRecorder.write_log`), and the most elements two
# views may have for their elements to be compared one by one (`_disjoint`).
WRITE_LOG = 64
DISJOINT_ELEMENTS = 1 << 16


def _disjoint(memory: tuple, write: tuple) -> bool:
    """Whether a view (`_memory`) and a recorded write (`OpRecorder.write_log`) of one storage
    share no element: their extents apart, or else their elements compared (the splits of a
    matrix along its columns interleave within one extent). Views of another dtype: shared."""
    offset, shape, stride, dtype = memory[2:6]
    _, w_offset, w_shape, w_stride, w_dtype = write
    if dtype != w_dtype:
        return False
    if not math.prod(shape) or not math.prod(w_shape):
        return True
    a_low, a_high = _extent(offset, shape, stride)
    b_low, b_high = _extent(w_offset, w_shape, w_stride)
    if a_high < b_low or b_high < a_low:
        return True
    if math.prod(shape) + math.prod(w_shape) > DISJOINT_ELEMENTS:
        return False
    return not np.isin(_elements(offset, shape, stride), _elements(w_offset, w_shape, w_stride)).any()


def _extent(offset: int, shape: tuple, stride: tuple) -> tuple[int, int]:
    """The first and last storage element a (non-empty) strided view reaches."""
    low = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True) if s < 0)
    high = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True) if s > 0)
    return low, high


def _elements(offset: int, shape: tuple, stride: tuple) -> np.ndarray:
    """The storage elements a strided view reads."""
    index = np.array([offset], dtype=np.int64)
    for n, s in zip(shape, stride, strict=True):
        index = (index[:, None] + np.arange(n, dtype=np.int64) * s).reshape(-1)
    return index


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


# Contractions ATen's CPU kernels hand to oneDNN, which computes float32 ones from bfloat16
# inputs where the float32 precision of oneDNN's matmuls (or convolutions) is "bf16" and the
# CPU has bfloat16 arithmetic (AVX-512 BF16, AMX).
ONEDNN_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
ONEDNN_CONVOLUTIONS = {"convolution", "_convolution"}
ONEDNN_BF16_OPS = ONEDNN_MATMULS | ONEDNN_CONVOLUTIONS


def onednn_fp32_precision(name: str) -> str | None:
    """oneDNN's float32 precision for op `name` now ("bf16", "tf32", "ieee", "none"), where
    it computes that op on this CPU at all; None where it does not, or this torch has no such
    setting."""
    b = torch.backends
    group = getattr(b.mkldnn, "matmul" if name in ONEDNN_MATMULS else "conv", None)
    precision = getattr(group, "fp32_precision", None)
    if precision in (None, "none", "ieee") or not b.mkldnn.enabled or not _bf16_arithmetic():
        return None
    return precision


@functools.cache
def _bf16_arithmetic() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


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
                      if n.op in ("call_function", "call_method") and _draws_random(n)]
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


# Dropout draws only where it drops: the positions (and names) of its probability and its
# training flag. A layer in eval mode, or built with dropout=0.0, leaves the call in the graph
# dynamo captures (attention's `F.dropout(x, 0.0, False)`), and it draws nothing.
_DROPOUT_ARGUMENTS = {name: ((1, "p"), (2, "training")) for name in (
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")}
_DROPOUT_ARGUMENTS["native_dropout"] = ((1, "p"), (2, "train"))


def _draws_random(n: fx.Node) -> bool:
    """A captured graph's call that draws random numbers when it runs."""
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", None)
    if name not in _RANDOM_NAMES and name not in _DROPOUT_ARGUMENTS:
        return False

    def argument(position: int, keyword: str, default: Any) -> Any:
        return n.args[position] if len(n.args) > position else n.kwargs.get(keyword, default)

    if name in _DROPOUT_ARGUMENTS:
        (p_at, p_name), (training_at, training_name) = _DROPOUT_ARGUMENTS[name]
        p, training = argument(p_at, p_name, 0.5), argument(training_at, training_name, True)
        # Only constants say so: a probability or flag computed in the graph may draw.
        return not (isinstance(p, (int, float)) and p == 0 or training is False)
    if name == "rrelu":  # random slopes in training only
        return argument(3, "training", False) is not False
    return True


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
