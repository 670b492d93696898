"""Observables: what the script itself sees, recorded identically on every arm.

* ``call``     outputs of each call of a root ``nn.Module`` or of a compiled callable,
* ``readback`` values turned into Python or printed (``.item()``, ``.tolist()``,
               ``.numpy()``, ``repr``/``print``, f-string formatting), the tensor operands
               of a comparison the script turns into a bool (``assert diff < 1e-6``), and
               the values of top-level expression statements (``expressions.py``),
* ``claim``    operands of the script's own comparisons (``torch.equal``, ``allclose``,
               ``isclose``, ``torch.testing.assert_close``) with the script's answer,
* ``final``    tensors bound to top-level names when the script ends.

Each observable keeps a fingerprint, its value within a memory budget, and the op-graph node
whose float64 replay is its reference.  Observables of two arms align by program order.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import os
import re
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from triage.worker.fingerprint import fingerprint, readable_fingerprint, to_numpy
from triage.worker.modes import Quiet, suspended_modes
from triage.worker.opgraph import OpRecorder, RecordingBackend
from triage.worker.protocol import CHECKED_OPERAND, DIFFERENCE_CLAIM, OBSERVED, RELATIVE_DIFFERENCE_CLAIMS

MAX_OBSERVABLES = 2000
MAX_TENSORS_PER_CALL = 32

READBACKS: dict[Any, str] = {
    torch.Tensor.item: ".item()",
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.numpy: ".numpy()",
    torch.Tensor.__array__: "np.asarray()",
    torch.Tensor.__repr__: "print/repr",
    torch.Tensor.__format__: "format",
    torch.Tensor.__float__: "float()",
    torch.Tensor.__int__: "int()",
}
# Readbacks whose call is not the value's expression (`print(a, b)`, an f-string): the parent
# names those from the source where it can (triage/operands.py).
SHOWN_READBACKS = {torch.Tensor.__repr__, torch.Tensor.__format__}
MAX_EXPRESSION = 120
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CLAIMS: dict[Any, str] = {
    torch.equal: "torch.equal",
    torch.allclose: "torch.allclose",
    torch.isclose: "torch.isclose",
    torch.Tensor.equal: "Tensor.equal",
    torch.Tensor.allclose: "Tensor.allclose",
    torch.Tensor.isclose: "Tensor.isclose",
}


def _tensor_and_torch_functions(name: str) -> list[Any]:
    """`Tensor.name` and, for a plain name, `torch.name` (a module has dunders of its own)."""
    functions = [getattr(torch.Tensor, name, None)]
    if not name.startswith("__"):
        functions.append(getattr(torch, name, None))
    return [f for f in functions if f is not None]


# Tensor comparisons, by operator: a Python bool made of their result is the script checking
# the compared values (`assert (a - b).abs().max() < 1e-6`, `if torch.all(x == y):`).
COMPARISONS: dict[Any, str] = {
    func: symbol
    for symbol, names in (("<", ("__lt__", "lt", "less")), ("<=", ("__le__", "le", "less_equal")),
                          (">", ("__gt__", "gt", "greater")), (">=", ("__ge__", "ge", "greater_equal")),
                          ("==", ("__eq__", "eq")), ("!=", ("__ne__", "ne", "not_equal")))
    for name in names
    for func in _tensor_and_torch_functions(name)
}
# Ops that fold a comparison's result into the value that is checked (`torch.all(x == y)`,
# `(a != b).sum() == 0`, `not (x > 0).any()`): the result still stands for the comparison.
CHECK_FOLDS = {
    func
    for name in ("all", "any", "sum", "count_nonzero", "logical_not", "logical_and", "logical_or",
                 "logical_xor", "__invert__", "__and__", "__or__", "__xor__", "__rand__", "__ror__", "__rxor__")
    for func in _tensor_and_torch_functions(name)
}
CHECK_CONVERSIONS = {torch.Tensor.__bool__, torch.Tensor.item}
# A script's own error measure of two values, `(a - b).abs().max()`: the difference of two
# tensors of one shape, its absolute value, its maximum over every element. Read back or
# checked, it claims a and b agree (a loss such as `((pred - y) ** 2).mean()` is no such claim).
DIFFERENCES = {f for name in ("sub", "__sub__") for f in _tensor_and_torch_functions(name)}
ABSOLUTES = {f for name in ("abs", "__abs__") for f in _tensor_and_torch_functions(name)}
MAXIMA = {f for name in ("max", "amax") for f in _tensor_and_torch_functions(name)}
# A difference divided by one of its operands is the relative error of the same two values:
# `((mine - ref) / ref).abs().max()`.
RELATIVE = {f for name in ("div", "__truediv__") for f in _tensor_and_torch_functions(name)}
DIFFERENCE_STEPS = DIFFERENCES | ABSOLUTES | MAXIMA | RELATIVE  # one lookup per torch call on the script's hot path
# Tensors made from Python data, whose numbers the script wrote in float64 (`Leaf.literal`).
LITERAL_FACTORIES = {torch.tensor, torch.as_tensor}
NARROW_FLOATS = {torch.float32, torch.float16, torch.bfloat16}
MAX_LITERAL_ELEMENTS = 1 << 20
MAX_CHECKS_PER_VALUE = 8
MAX_BUFFERS = 64  # result.json's limit on a module call's buffers (triage/arms/output.py)
MAX_BUFFER_BYTES = 1 << 20


class Comparison:
    """One tensor comparison whose operands are recorded once, when the script checks it."""

    def __init__(self, symbol: str, operands: list[torch.Tensor]) -> None:
        self.symbol = symbol
        self.operands = operands
        self.recorded = False


class ObservationStore:
    def __init__(self, recorder: OpRecorder, site: Callable[[], int | None], value_budget: int,
                 emit: Callable[[dict], None]) -> None:
        self.recorder = recorder
        self.site = site
        self.value_budget = value_budget
        self.emit = emit
        self.records: list[dict[str, Any]] = []
        self.values: dict[str, np.ndarray] = {}
        self.claims = itertools.count()
        self.quiet = Quiet(recorder)
        self.full = False
        self.muted = 0  # inside a testing helper: its internal isclose calls are not the script's
        self.compiled_depth = 0  # inside a compiled call: modules dynamo runs are not root calls
        self.recorded_versions = WeakTensorKeyDictionary()  # tensor -> its version when recorded

    def holds_current(self, t: torch.Tensor) -> bool:
        """`t` was recorded already and has not changed since: recording it again adds nothing."""
        version = _version_of(t)
        return version is not None and self.recorded_versions.get(t) == version

    def add(self, kind: str, label: str, t: torch.Tensor, line: int | None = None,
            claim: dict[str, Any] | None = None, module: dict[str, Any] | None = None,
            expression: str | None = None) -> int | None:
        """Record `t` as the next observable; its index, or None where nothing was recorded."""
        if self.muted:
            return None
        if len(self.records) >= MAX_OBSERVABLES:
            self.full = True
            return None
        with self.quiet:
            index = len(self.records)
            fp, unreadable = readable_fingerprint(t)  # an odd tensor must not stop the script
            label = _fitted(label, f" (no values: {unreadable})" if unreadable else "")
            node = self.recorder.node_for(t) if fp is not None else None
            record = {
                "index": index, "kind": kind, "label": label,
                "line": line if line is not None else self.site(),
                "call_line": self.recorder.outer_site() if kind != "final" else None,
                "fingerprint": fp, "node": node.name if node is not None else None,
                "claim": claim, "module": module, "expression": expression,
            }
            if fp is not None and fp["numel"] * 8 <= self.value_budget:
                value = to_numpy(t)
                if value is not None:
                    self.values[f"{OBSERVED}{index}"] = value
                    self.value_budget -= value.nbytes
            self.records.append(record)
            self.recorded_versions[t] = _version_of(t)
            self.emit({"observable": {k: record[k] for k in ("index", "kind", "label", "line", "fingerprint")}})
            return index

    def add_all(self, kind: str, label: str, value: Any, line: int | None = None,
                module: dict[str, Any] | None = None) -> None:
        tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
        for i, t in enumerate(tensors[:MAX_TENSORS_PER_CALL]):
            suffix = f" output {i}" if len(tensors) > 1 else ""
            self.add(kind, label + suffix, t, line, module=module)


MAX_LABEL = 300  # result.json's limit (triage/arms/output.py): a longer one would cost the arm


def _fitted(label: str, note: str, limit: int = MAX_LABEL) -> str:
    """`label` + `note` within `limit` characters: a module's class name is the script's to
    choose, at any length; the note is kept whole."""
    if len(label) + len(note) <= limit:
        return label + note
    return label[:limit - len(note) - 1] + "…" + note


def _version_of(t: torch.Tensor) -> int | None:
    """The tensor's version counter; None for tensors without one (made in inference mode)."""
    try:
        return t._version
    except RuntimeError:
        return None


class Observer(TorchFunctionMode):
    """Records readbacks and the script's comparisons as they happen."""

    triage_mode = True  # `install_fast_paths` looks past it

    def __init__(self, store: ObservationStore, script: str) -> None:
        super().__init__()
        self.store = store
        self.script = script
        self.source_lines = Path(script).read_bytes().splitlines()
        self.spans: dict[Any, list[tuple]] = {}  # code object -> its instructions' source positions
        # A comparison's result (or what folds it) -> the comparisons it stands for, until
        # the script turns it into a Python bool.
        self.comparisons = WeakTensorKeyDictionary()
        # A difference of two values, or its absolute value, or its maximum -> (a, b, which).
        self.differences = WeakTensorKeyDictionary()
        # An absolute value -> (a weak reference to) what it is the absolute value of: a relative
        # error may divide by `b.abs()`.
        self.moduli = WeakTensorKeyDictionary()
        # A difference of two values -> how many of the script's frames were on the stack where
        # it was made.
        self.difference_depths = WeakTensorKeyDictionary()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in READBACKS and args and isinstance(args[0], torch.Tensor):
            expression = self._expression() if func not in SHOWN_READBACKS else self._shown_name(args[0])
            readback = self.store.add("readback", READBACKS[func], args[0], expression=expression)
            self._record_difference(args[0], readback)
            if args[0] in self.comparisons:
                # `print(a == b)`: what the script looks at is the comparison of a and b.
                self._record_checked(args[0])
        elif func in CLAIMS and len(args) >= 2 and all(isinstance(a, torch.Tensor) for a in args[:2]):
            record_claim(self.store, CLAIMS[func], args[0], args[1], _claim_result(out),
                         tolerance=_tolerance_of(func, args, kwargs))
        if func in COMPARISONS or func in CHECK_FOLDS:
            self._track_comparison(func, args, out)
        if func in DIFFERENCE_STEPS:
            self._track_difference(func, args, kwargs, out)
        if func in CHECK_CONVERSIONS and args and self._called_by_script():
            self._record_checked(args[0])
        if func in LITERAL_FACTORIES and args and isinstance(out, torch.Tensor) and out.dtype in NARROW_FLOATS:
            self._note_literal(args[0], out)
        return out

    def _note_literal(self, data: Any, out: torch.Tensor) -> None:
        """`out` was made from `data`, Python numbers, which its dtype holds only approximately
        (`torch.tensor(0.1)`): noted where some element moved. (A NumPy array is a float64 leaf
        of its own, and its cast a recorded op.)"""
        if type(out) is not torch.Tensor or out.numel() > MAX_LITERAL_ELEMENTS or not _plain_numbers(data):
            return  # a fake tensor of dynamo's tracing has no values to compare
        with self.store.quiet:
            try:
                literal = torch.tensor(data, dtype=torch.float64)
            except (TypeError, ValueError, RuntimeError):  # ragged or non-numeric data: no literal
                return
            if literal.shape == out.shape and not torch.equal(literal, out.detach().double()):
                self.store.recorder.note_literal(out, literal)

    def _called_by_script(self) -> bool:
        """The conversion is the script's own (not torch's argument checks): its nearest
        caller outside triage's modes is the script."""
        frame = sys._getframe(2)
        while frame is not None and "triage/worker/" in frame.f_code.co_filename.replace(os.sep, "/"):
            frame = frame.f_back
        return frame is not None and frame.f_code.co_filename == self.script

    def _expression(self) -> str | None:
        """The script's source of the call it is making now (`a.item()`, `float(loss)`): the
        span of its innermost frame's current instruction, which tells two readbacks of one
        line apart. None where it spans lines or is long."""
        frame = self._script_frame()
        return self._span(frame) if frame is not None else None

    def _shown_name(self, tensor: torch.Tensor) -> str | None:
        """The script's name for a value it prints or formats (`print(y, z)` shows `y` and `z`,
        which the call's span does not tell apart): the one plain name in that span bound, in
        the script's frame, to this very tensor. Read by identity, so no script code runs."""
        frame = self._script_frame()
        span = self._span(frame) if frame is not None else None
        if span is None:
            return None
        local, glob = frame.f_locals, frame.f_globals
        names = {w for w in IDENTIFIER.findall(span) if (local[w] if w in local else glob.get(w)) is tensor}
        return names.pop() if len(names) == 1 else None

    def _script_depth(self) -> int:
        """How many of the script's own frames are on the stack now."""
        frame, depth = sys._getframe(1), 0
        while frame is not None:
            depth += frame.f_code.co_filename == self.script
            frame = frame.f_back
        return depth

    def _script_frame(self) -> Any:
        frame = sys._getframe(3)
        while frame is not None and frame.f_code.co_filename != self.script:
            frame = frame.f_back
        return frame

    def _span(self, frame: Any) -> str | None:
        if frame.f_lasti < 0:
            return None
        spans = self.spans.get(frame.f_code)
        if spans is None:
            spans = self.spans[frame.f_code] = list(frame.f_code.co_positions())
        start, end, column, end_column = spans[frame.f_lasti // 2]
        if start is None or start != end or column is None or end_column is None \
                or not 0 < start <= len(self.source_lines):
            return None
        text = self.source_lines[start - 1][column:end_column].decode(errors="replace")  # UTF-8 byte columns
        return text if 0 < len(text) <= MAX_EXPRESSION else None

    def _track_comparison(self, func: Any, args: tuple, out: Any) -> None:
        if not isinstance(out, torch.Tensor):
            return
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        comparisons = [c for a in tensors for c in self.comparisons.get(a, ())]
        if func in COMPARISONS:
            comparisons.append(Comparison(COMPARISONS[func], tensors))
        if comparisons:
            self.comparisons[out] = comparisons[-MAX_CHECKS_PER_VALUE:]

    def _track_difference(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Follow a script's error measure of two values, step by step: their difference, over
        one of them (a relative error), its absolute value, its maximum."""
        if not isinstance(out, torch.Tensor) or not args or not isinstance(args[0], torch.Tensor):
            return
        if func in DIFFERENCES:
            if len(args) == 2 and isinstance(args[1], torch.Tensor) and not kwargs and _same_shape(*args) \
                    and not _stencil(args[0], args[1]):
                # The claim's line is the subtraction's, which spells the two values.
                self.differences[out] = (args[0], args[1], "difference", self.store.site(), DIFFERENCE_CLAIM)
                self.difference_depths[out] = self._script_depth()
            return
        if func in ABSOLUTES and len(args) == 1:
            self.moduli[out] = weakref.ref(args[0])
        a, b, which, line, label = self.differences.get(args[0], (None, None, None, None, None))
        if which == "difference" and self._script_depth() < self.difference_depths.get(args[0], 0):
            # A difference a function of the script returned (`return a - b` in a difference of
            # Gaussians, whose magnitude the caller prints) is a quantity it computes, not its
            # error measure of two values: a measure is taken where the difference is made, or
            # in a helper it calls.
            return
        # Over one of the two, or its absolute value: `(a - b) / b`, `(a - b).abs() / b.abs()`.
        divisor = args[1] if len(args) == 2 and isinstance(args[1], torch.Tensor) and not kwargs else None
        if divisor is not None and divisor in self.moduli:
            divisor = self.moduli[divisor]()
        if which in ("difference", "absolute") and func in RELATIVE and divisor is not None \
                and any(divisor is x for x in (a, b)):
            self.differences[out] = (a, b, which, line, RELATIVE_DIFFERENCE_CLAIMS[divisor is b])
        elif which == "difference" and func in ABSOLUTES:
            self.differences[out] = (a, b, "absolute", line, label)
        elif which == "absolute" and func in MAXIMA and len(args) == 1 and not kwargs:
            self.differences[out] = (a, b, "measure", line, label)

    def _record_difference(self, value: torch.Tensor, readback: int | None = None) -> None:
        """The script reads back (observable `readback`) or checks its error measure of two
        values: record the claim that they agree, once."""
        a, b, which, line, label = self.differences.get(value, (None, None, None, None, None))
        # Of one element the absolute difference is its own maximum: `(a - b).abs().item()`.
        if which == "measure" or which == "absolute" and value.numel() == 1:
            self.differences[value] = (a, b, "recorded", line, label)
            # It holds or fails by a tolerance the script does not state (None: not told).
            record_claim(self.store, label, a, b, None, line, measure=readback)

    def _record_checked(self, value: Any) -> None:
        """The script made a Python bool of a comparison: record what it compared."""
        for comparison in self.comparisons.get(value, ()) if isinstance(value, torch.Tensor) else ():
            if comparison.recorded:
                continue
            comparison.recorded = True
            for operand in comparison.operands:
                if isinstance(operand, torch.Tensor):
                    self._record_difference(operand)
            if comparison.symbol == "==" and len(comparison.operands) == 2 and _same_shape(*comparison.operands):
                # `assert (a == b).all()`, `print(a == b)`: the script claims two values are equal.
                a, b = comparison.operands
                with self.store.quiet, torch._C.DisableTorchFunction():
                    holds = bool(torch.equal(a, b))
                record_claim(self.store, "==", a, b, holds)
                continue
            numbered = len(comparison.operands) > 1
            for i, operand in enumerate(comparison.operands):
                if not self.store.holds_current(operand):
                    which = f" {i + 1}" if numbered else ""
                    self.store.add("readback", f"`{comparison.symbol}` operand{which}{CHECKED_OPERAND}", operand)


def _buffer_digest(t: torch.Tensor) -> str:
    try:
        if t.device.type == "meta" or t.numel() * t.element_size() > MAX_BUFFER_BYTES:
            return f"v{_version_of(t)}"
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return hashlib.blake2b(data, digest_size=8).hexdigest()
    except Exception:  # noqa: BLE001 - an odd buffer only means its state is not compared
        return "?"


def _same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two floating or complex values of one shape: a difference of them measures error."""
    return a.shape == b.shape and _inexact(a) and _inexact(b)


def _stencil(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two shifted windows of one tensor's memory (`img[..., 1:] - img[..., :-1]`, a finite
    difference): a stencil, not two versions of one quantity. Two slices apart (a batch's rows
    `y[0] - y[1]`) or one memory in two layouts (`A - A.T`, a symmetry check) are versions."""
    try:
        if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() or a.storage_offset() == b.storage_offset():
            return False
    except Exception:  # noqa: BLE001 - a tensor without storage (a fake, sparse or batched one) is no window
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        reach = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True) if n > 0)
        return t.storage_offset(), t.storage_offset() + reach

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 <= b1 and b0 <= a1


def _inexact(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


# Checks with a tolerance, and the (rtol, atol) they apply where the call names none.
CLOSE_CHECKS = {torch.allclose, torch.isclose, torch.Tensor.allclose, torch.Tensor.isclose}
CLOSE_DEFAULT = (1e-5, 1e-8)


def _tolerance_of(func: Any, args: tuple, kwargs: dict) -> dict[str, float] | None:
    """The rtol and atol an `allclose`/`isclose` call applies (positional, by keyword, or its
    defaults); None for a check without one (`equal`), or one given as something else."""
    if func not in CLOSE_CHECKS:
        return None
    rtol = args[2] if len(args) > 2 else kwargs.get("rtol", CLOSE_DEFAULT[0])
    atol = args[3] if len(args) > 3 else kwargs.get("atol", CLOSE_DEFAULT[1])
    if not all(isinstance(x, (int, float)) for x in (rtol, atol)):
        return None
    return {"rtol": float(rtol), "atol": float(atol)}


def _claim_result(out: Any) -> Any:
    if isinstance(out, bool):
        return out
    if isinstance(out, torch.Tensor):
        with torch._C.DisableTorchFunction():
            return bool(out.all())
    return None


def _plain_numbers(data: Any) -> bool:
    """`data` is a Python float, or lists and tuples of Python ints and floats with some float,
    within MAX_LITERAL_ELEMENTS: read again without running any of the script's code (an
    object's own `__float__` would run twice)."""
    stack, seen, floats = [data], 0, False
    while stack:
        x = stack.pop()
        if type(x) in (list, tuple):
            stack.extend(x)
        elif type(x) is float:
            floats = True
        elif type(x) is not int:
            return False
        seen += 1
        if seen > 2 * MAX_LITERAL_ELEMENTS:
            return False
    return floats


def record_claim(store: ObservationStore, func: str, a: torch.Tensor, b: torch.Tensor, holds: Any,
                 line: int | None = None, measure: int | None = None,
                 tolerance: dict[str, float] | None = None) -> None:
    """`measure`: the observable that read back the script's own error measure of `a` and `b`;
    `tolerance`: the rtol and atol the check asked for."""
    claim_id = next(store.claims)
    line = store.site() if line is None else line
    claim = {"id": claim_id, "func": func, "holds": holds} | ({"measure": measure} if measure is not None else {}) \
        | ({"tolerance": tolerance} if tolerance else {})
    for operand, t in enumerate((a, b)):
        store.add("claim", f"{func} operand {operand + 1}", t, line, claim=claim | {"operand": operand})


class RootCalls:
    """Global module hooks that record the outputs of root (outermost) module calls, with
    what decides whether two calls of one module on one input may differ: the layers that
    behave differently in training mode, and the numerics settings in force."""

    def __init__(self, store: ObservationStore, script: str) -> None:
        self.store = store
        self.script = script
        self.depth = 0
        self.counts: dict[str, int] = {}
        self.instances: list[torch.nn.Module] = []  # kept alive so that id() stays unique
        self.pending: list[dict[str, Any]] = []
        self.handles = []

    def install(self) -> None:
        hooks = torch.nn.modules.module
        self.handles.append(hooks.register_module_forward_pre_hook(self.pre))
        try:
            self.handles.append(hooks.register_module_forward_hook(self.post, always_call=True))
        except TypeError:  # torch without always_call
            self.handles.append(hooks.register_module_forward_hook(self.post))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def pre(self, module: torch.nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling() or self.store.compiled_depth:
            return
        self.depth += 1
        if self.depth == 1:
            with self.store.quiet:
                self.pending.append(self._state(module, args))

    def post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling() or self.store.compiled_depth:
            return
        self.depth -= 1
        if self.depth != 0:
            return
        state = self.pending.pop() if self.pending else None
        inner = getattr(module, "_orig_mod", module)
        name = type(inner).__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        self.store.add_all("call", f"{name}() call #{self.counts[name]}", output, module=state)

    def _state(self, module: torch.nn.Module, args: Any) -> dict[str, Any]:
        inner = getattr(module, "_orig_mod", module)
        instance = next((i for i, m in enumerate(self.instances) if m is inner), None)
        if instance is None:
            instance = len(self.instances)
            self.instances.append(inner)
        digests = []
        for t in tree_flatten(args)[0]:
            if isinstance(t, torch.Tensor):
                try:
                    digests.append((fingerprint(t) or {}).get("sha256"))
                except Exception:  # noqa: BLE001 - an odd input only means no repeat check
                    digests.append(None)
        # In-place updates (optimizer.step, load_state_dict) bump a parameter's version: equal
        # sums mean the same weights, so two calls on one input should give one answer.
        weights = sum(p._version for p in itertools.islice(inner.parameters(), 10000))
        # Buffers are state too (BatchNorm's running statistics): a train-mode forward moves
        # them without touching a parameter, and the next eval call answers differently.
        # Kernels update them in place without moving a version counter, so their bytes are
        # what tells (a large buffer, a positional table, is told by its version instead).
        buffers = {name[:200]: _buffer_digest(b) for name, b in itertools.islice(inner.named_buffers(), MAX_BUFFERS)}
        return {"instance": instance, "variable": _variable_of(inner, self.script), "training": inner.training,
                "train_layers": training_layers(inner), "inputs": digests, "weights_version": weights,
                "buffers": buffers, "settings": numerics_settings()}


TRAIN_MODE_LAYERS = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm, torch.nn.RReLU)


def training_layers(module: torch.nn.Module, limit: int = 20) -> list[dict[str, str]]:
    """Submodules that compute something else in training mode than in eval mode."""
    found = []
    for path, m in module.named_modules():
        if not m.training or not isinstance(m, TRAIN_MODE_LAYERS):
            continue
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            if m.p == 0:
                continue
            effect = f"zeroes a random {m.p:g} of its inputs on every call"
        elif isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            effect = "normalizes with the batch's own statistics and updates running_mean/running_var"
        else:
            effect = "draws a random negative slope on every call"
        # Within result.json's limits (1000 and 300 characters): the names are the script's.
        found.append({"path": _fitted(path, "", 1000), "type": _fitted(type(m).__name__, ""), "effect": effect})
        if len(found) >= limit:
            break
    return found


def numerics_settings() -> dict[str, Any]:
    """The settings a script may change between two calls that change the numbers."""
    b = torch.backends
    return {"num_threads": torch.get_num_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "mkldnn": b.mkldnn.enabled, "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_tf32": b.cuda.matmul.allow_tf32, "cudnn_tf32": b.cudnn.allow_tf32,
            "cudnn_benchmark": b.cudnn.benchmark, "default_dtype": str(torch.get_default_dtype()),
            "autocast_cpu": _autocast("cpu"), "autocast_cuda": _autocast("cuda")}


def _autocast(device: str) -> str | None:
    """The autocast dtype in force on `device` (None: off) — a call under autocast computes in
    another precision than the same call outside it."""
    try:
        return str(torch.get_autocast_dtype(device)).replace("torch.", "") if torch.is_autocast_enabled(device) else None
    except (RuntimeError, TypeError, AttributeError):
        return None


def _variable_of(module: torch.nn.Module, script: str) -> str | None:
    """The script's name for `module` (`model_dropout`), for a fix the reader can paste."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == script:
            for scope in (frame.f_locals, frame.f_globals):
                for name, value in scope.items():
                    # A name longer than result.json takes is no name to paste: none.
                    if value is module and not name.startswith("_") and len(name) <= MAX_LABEL:
                        return name
        frame = frame.f_back
    return None


def compile_backend(name_or_fn: Any, mode: Any, options: Any, dynamic: Any) -> Callable:
    """The backend callable `torch.compile` itself would build for these arguments."""
    if callable(name_or_fn):
        return name_or_fn
    if name_or_fn == "inductor":
        return torch._TorchCompileInductorWrapper(mode, options, dynamic)
    return torch._TorchCompileWrapper(name_or_fn, mode, options, dynamic)


MAX_SCRIPT_BACKENDS = 16


def _note_script_backend(recorder: OpRecorder, backend: Callable) -> None:
    """A backend the script passes as a callable (its own function): named with the line it
    is defined on, for the minimizer's note (its workers compile with inductor only)."""
    code = getattr(backend, "__code__", None) or getattr(type(backend).__call__, "__code__", None)
    entry = {"name": str(getattr(backend, "__name__", type(backend).__name__))[:200],
             "line": getattr(code, "co_firstlineno", None)}
    if entry not in recorder.script_backends and len(recorder.script_backends) < MAX_SCRIPT_BACKENDS:
        recorder.script_backends.append(entry)


def _eager_optimized_module(model: torch.nn.Module) -> torch.nn.Module:
    """What `torch.compile(model)` returns, with dynamo disabled: the script's own wrapper type
    (`OptimizedModule`, `compiled._orig_mod`, `_orig_mod.`-prefixed state_dict keys) running
    the module eagerly, so an eager arm runs the program the script wrote. Returning the module
    itself broke `compiled._orig_mod` on that arm alone, which read as a crash of one
    configuration."""
    from torch._dynamo.eval_frame import DisableContext, OptimizedModule

    return OptimizedModule(model, DisableContext())


def install_compile(store: ObservationStore, recorder: OpRecorder, compile_arm: bool,
                    arm_backend: str | None) -> None:
    """Replace `torch.compile`: eager arms return the function itself (a module wrapped as
    torch.compile wraps it, run eagerly); compile arms compile it with a recording backend and
    call it with every triage mode suspended."""
    real_compile = torch.compile
    counts: dict[str, int] = {}

    def triage_compile(model: Any = None, *, fullgraph: bool = False, dynamic: Any = None,
                       backend: Any = "inductor", mode: Any = None, options: Any = None,
                       disable: bool = False, **rest: Any) -> Any:
        if model is None:
            return functools.partial(triage_compile, fullgraph=fullgraph, dynamic=dynamic,
                                     backend=backend, mode=mode, options=options,
                                     disable=disable, **rest)
        if isinstance(model, torch.nn.Module) and not compile_arm and not disable:
            return _eager_optimized_module(model)
        if not compile_arm or disable:
            target = model
        else:
            real = compile_backend(arm_backend or backend, mode, options, dynamic)
            if arm_backend is None and callable(backend):
                _note_script_backend(recorder, backend)
            target = real_compile(model, fullgraph=fullgraph, dynamic=dynamic,
                                  backend=RecordingBackend(real, recorder), **rest)
        if isinstance(model, torch.nn.Module):
            if target is not model:
                forward = target.forward

                def suspended_forward(*a: Any, **k: Any) -> Any:
                    store.compiled_depth += 1
                    try:
                        with suspended_modes():
                            return forward(*a, **k)
                    finally:
                        store.compiled_depth -= 1

                target.forward = suspended_forward
            return target
        name = getattr(model, "__name__", type(model).__name__)

        @functools.wraps(model)
        def compiled_call(*a: Any, **k: Any) -> Any:
            if target is model:
                out = model(*a, **k)
            else:
                store.compiled_depth += 1
                try:
                    with suspended_modes():
                        out = target(*a, **k)
                finally:
                    store.compiled_depth -= 1
            counts[name] = counts.get(name, 0) + 1
            store.add_all("call", f"compiled `{name}` call #{counts[name]}", out)
            return out

        return compiled_call

    torch.compile = triage_compile


def install_assert_close(store: ObservationStore) -> None:
    original = torch.testing.assert_close

    @functools.wraps(original)
    def assert_close(actual: Any, expected: Any, *args: Any, **kwargs: Any) -> None:
        holds: bool | None = None
        store.muted += 1
        try:
            original(actual, expected, *args, **kwargs)
            holds = True
        except AssertionError:
            holds = False
            raise
        finally:
            store.muted -= 1
            if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
                # The tolerance asked for; assert_close's own dtype defaults where it asks for none.
                given = {k: float(kwargs[k]) for k in ("rtol", "atol") if isinstance(kwargs.get(k), (int, float))}
                record_claim(store, "torch.testing.assert_close", actual, expected, holds,
                             tolerance=given if len(given) == 2 else None)

    torch.testing.assert_close = assert_close


# Modules whose forward takes a fused native kernel only where no argument "has a torch
# function" (`torch.overrides.has_torch_function`), which any active TorchFunctionMode makes
# true; the rounding simulation replays each kernel op by op. (nn.TransformerEncoder's own
# fast path turns a padded batch into nested tensors, which the replay does not follow: its
# layers take theirs.)
FAST_PATH_MODULES = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer)


def install_fast_paths() -> None:
    """Keep torch's fused fast paths where the script would take them: triage's own function
    modes turned every script's attention onto the Python path, and a reporter's difference
    between the fused kernel and a compiled graph vanished ("not-reproduced"). These modules'
    forward runs with triage's modes (`triage_mode`) set aside, where they are the only ones
    active (a script's own mode keeps its effect); the recorder, a dispatch mode, still sees
    every op. Under dynamo the forward is torch's own, as traced."""
    for cls in FAST_PATH_MODULES:
        cls.forward = _without_triage_modes(cls.forward)


def _without_triage_modes(forward: Callable) -> Callable:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        stack = [] if torch.compiler.is_compiling() else torch.overrides._get_current_function_mode_stack()
        if not stack or not all(getattr(mode, "triage_mode", False) for mode in stack):
            return forward(*args, **kwargs)
        popped = [torch._C._pop_torch_function_stack() for _ in stack]
        try:
            return forward(*args, **kwargs)
        finally:
            for mode in reversed(popped):
                torch._C._push_on_torch_function_stack(mode)

    return run


def install_seed_watch(recorder: OpRecorder) -> None:
    """Note when the script seeds torch itself (for the unseeded-draw report)."""
    for module in (torch, torch.random):
        original = module.manual_seed

        def manual_seed(seed: Any, _original: Callable = original) -> Any:
            recorder.seeded = True
            recorder.seed_state = {"line": recorder.site(), "value": int(seed), "draws": 0}
            return _original(seed)

        module.manual_seed = manual_seed


def install_flush_watch(recorder: OpRecorder) -> None:
    """Note when the script turns the CPU's flush-to-zero on or off: torch has no getter for it,
    and the replay must flush where the arm did."""
    original = torch.set_flush_denormal

    def set_flush_denormal(mode: bool) -> bool:
        supported = original(mode)
        if supported:  # False: this CPU has no such mode, and nothing changed
            recorder.flush_denormal(bool(mode))
        return supported

    torch.set_flush_denormal = set_flush_denormal


def final_tensors(namespace: dict[str, Any], limit: int = 64) -> list[tuple[str, torch.Tensor]]:
    """Tensors bound to the script's top-level names (REPL-style snippets print nothing)."""
    found: list[tuple[str, torch.Tensor]] = []
    for name, value in list(namespace.items()):
        if name.startswith("_") or len(found) >= limit:
            continue
        if isinstance(value, torch.Tensor):
            found.append((name, value))
        elif isinstance(value, (list, tuple)) and 0 < len(value) <= 16 and all(isinstance(v, torch.Tensor) for v in value):
            found.extend((f"{name}[{i}]", v) for i, v in enumerate(value))
    return found
