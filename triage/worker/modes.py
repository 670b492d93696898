"""Entering and leaving triage's own torch modes around triage's own code.

Three situations need care:
* triage's bookkeeping (fingerprinting a tensor, cloning a leaf) must not be seen by the
  observation mode, collapsed onto a device, or recorded as one of the script's ops;
* a compiled callable must run with *no* triage mode on the stack: a dispatch mode around
  a compiled call makes it run eagerly (gh-183768's inf vanishes), and dynamo would trace
  a torch-function mode's Python code into the graph;
* a script may enter modes of its own and never leave them (or pop triage's): when it ends,
  `ModeStacks.restore` puts both stacks back as they were, so that leaving triage's modes
  pops triage's and the script's modes do not see triage's bookkeeping.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils import _device, _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode


class TriageDispatchMode(TorchDispatchMode):
    """A dispatch mode of triage's whose ``__torch_dispatch__`` is hidden from dynamo only once
    dynamo is imported.  torch wraps every mode's ``__torch_dispatch__`` in
    ``torch._disable_dynamo``, which imports ``torch._dynamo`` on the first op: about a second
    that a plain ``python repro.py`` of an eager script never pays.  Before dynamo is imported
    nothing can be tracing, so calling the method as it is is the same thing."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # torch's eager wrapper is replaced by the lazy one below

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        raw = cls.__dict__.get("__torch_dispatch__")
        if raw is not None and not isinstance(raw, classmethod):
            cls.__torch_dispatch__ = _skip_dynamo_once_imported(raw)


def _skip_dynamo_once_imported(raw: Callable[..., Any]) -> Callable[..., Any]:
    hidden: list[Callable[..., Any]] = []

    @functools.wraps(raw)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if not hidden:
            disable = getattr(sys.modules.get("torch._dynamo"), "disable", None)
            if disable is None:  # not imported (or still importing): nothing is tracing
                return raw(*args, **kwargs)
            hidden.append(disable(raw, recursive=True, wrapping=False))
        return hidden[0](*args, **kwargs)

    return dispatch


@contextlib.contextmanager
def suspended_modes() -> Iterator[None]:
    """Pop every torch-function and dispatch mode, restoring them afterwards."""
    function_modes = []
    while torch._C._len_torch_function_stack() > 0:
        function_modes.append(torch._C._pop_torch_function_stack())
    dispatch_modes = []
    while _python_dispatch._len_torch_dispatch_stack() > 0:
        dispatch_modes.append(_python_dispatch._pop_mode())
    try:
        yield
    finally:
        for mode in reversed(dispatch_modes):
            _python_dispatch._push_mode(mode)
        for mode in reversed(function_modes):
            torch._C._push_on_torch_function_stack(mode)


class Quiet:
    """Context for triage's bookkeeping: no torch-function modes, recorder paused."""

    def __init__(self, recorder: object | None) -> None:
        self.recorder = recorder
        self._disable = None

    def __enter__(self) -> None:
        if self.recorder is not None:
            self.recorder.paused += 1
        self._disable = torch._C.DisableTorchFunction()
        self._disable.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._disable.__exit__(*exc)
        if self.recorder is not None:
            self.recorder.paused -= 1


@dataclass
class ModeStacks:
    """The torch-function and dispatch mode stacks (and torch's default device) at one moment."""

    function: list[Any]
    dispatch: list[Any]
    default_device: Any
    default_device_context: Any

    @classmethod
    def now(cls) -> ModeStacks:
        return cls(function=_get_current_function_mode_stack(),
                   dispatch=_python_dispatch._get_current_dispatch_mode_stack(),
                   default_device=_device.CURRENT_DEVICE,
                   default_device_context=getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None))

    def restore(self) -> list[str]:
        """Put both stacks back as they were; the class names of the modes the script left on
        them. ``torch.set_default_device`` and an unexited ``with torch.device(...)`` put
        torch's own mode at the bottom of the stack: it is removed too (triage's bookkeeping
        runs on the arm's device) but is not the script's mode."""
        function_left = _restore_stack(self.function, _get_current_function_mode_stack,
                                       torch._C._pop_torch_function_stack, torch._C._push_on_torch_function_stack,
                                       leave=lambda mode: torch._C._pop_torch_function_stack())
        dispatch_left = _restore_stack(self.dispatch, _python_dispatch._get_current_dispatch_mode_stack,
                                       _python_dispatch._pop_mode, _python_dispatch._push_mode,
                                       leave=_leave_dispatch_mode)
        _device.CURRENT_DEVICE = self.default_device
        torch._GLOBAL_DEVICE_CONTEXT.device_context = self.default_device_context
        return [type(mode).__qualname__ for mode in function_left + dispatch_left
                if not isinstance(mode, _device.DeviceContext)]


def _restore_stack(saved: list[Any], current: Callable[[], list[Any]], pop: Callable[[], Any],
                   push: Callable[[Any], None], leave: Callable[[Any], None]) -> list[Any]:
    """Pop until the stack is a prefix of `saved` (by identity), then push the rest of `saved`
    back. A mode in `saved` is popped as it is, to be pushed back; any other is left through
    `leave`. Returns those others, innermost first."""
    left = []
    for _ in range(len(current())):
        stack = current()
        if _is_prefix(stack, saved):
            break
        mode = stack[-1]
        if any(mode is kept for kept in saved):
            pop()
        else:
            leave(mode)
            left.append(mode)
    for mode in saved[len(current()):]:
        push(mode)
    return left


def _is_prefix(stack: list[Any], saved: list[Any]) -> bool:
    return len(stack) <= len(saved) and all(a is b for a, b in zip(stack, saved, strict=False))


def _leave_dispatch_mode(mode: Any) -> None:
    """Pop the innermost dispatch mode as torch's own ``TorchDispatchMode.__exit__`` does (it
    also resets torch's note of whether a mode is active), not as a script's override would."""
    if isinstance(mode, TorchDispatchMode) and getattr(mode, "old_dispatch_mode_flags", None):
        TorchDispatchMode.__exit__(mode, None, None, None)
    else:
        _python_dispatch._pop_mode()
