"""Entering and leaving triage's own torch modes around triage's own code.

Two situations need care:
* triage's bookkeeping (fingerprinting a tensor, cloning a leaf) must not be seen by the
  observation mode, collapsed onto a device, or recorded as one of the script's ops;
* a compiled callable must run with *no* triage mode on the stack: a dispatch mode around
  a compiled call makes it run eagerly (gh-183768's inf vanishes), and dynamo would trace
  a torch-function mode's Python code into the graph.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.utils import _python_dispatch


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

    def __init__(self, recorder: "object | None") -> None:
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
