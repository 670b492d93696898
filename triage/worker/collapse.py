"""Collapse the script's device choices onto the arm's device.

A repro is often written for two settings in one file (``m_cpu`` and ``m_gpu``).  An arm
runs the whole script with that difference collapsed: every ``.cuda()``, ``.cpu()``,
``.to(device)`` and ``device=`` lands on the arm's device, new tensors default to it (also
after ``torch.set_default_device("cuda")`` or inside ``with torch.device("cuda"):``), and
values read back to numpy still work.  On a CPU arm, ``torch.cuda`` answers as on a
one-GPU machine so that ``if torch.cuda.is_available():`` branches run too.  The comparison
is then between arms running the same program, op for op.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _device
from torch.utils._device import _device_constructors

_COLLAPSIBLE = {"cpu", "cuda", "mps", "xpu", "hip"}


class DeviceCollapse(TorchFunctionMode):
    triage_mode = True  # `observe.install_fast_paths` looks past it

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.constructors = _device_constructors()

    def collapse(self, d: Any) -> Any:
        if isinstance(d, int) and not isinstance(d, bool):
            return self.device
        if isinstance(d, (str, torch.device)):
            try:
                dev = torch.device(d)
            except RuntimeError:
                return d
            return self.device if dev.type in _COLLAPSIBLE else d
        return d

    def _defaults_collapse(self) -> bool:
        """Whether a new tensor made without ``device=`` must be placed on the arm's device.
        torch's default device (``set_default_device``, ``with torch.device(...)``) is applied
        by a mode below this one, so it is collapsed here; a default that is not a device
        choice (``meta``) is the script's to keep."""
        default = _device.CURRENT_DEVICE
        if default is None:
            return self.device.type != "cpu"
        return default.type in _COLLAPSIBLE

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda or func is torch.Tensor.cpu:
            return args[0].to(self.device)
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], self.collapse(args[1])) + tuple(args[2:])
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and args[0].device.type != "cpu":
            args = (args[0].cpu(),) + tuple(args[1:])
        if "device" in kwargs and kwargs["device"] is not None:
            kwargs["device"] = self.collapse(kwargs["device"])
        elif func in self.constructors and self._defaults_collapse():
            kwargs["device"] = self.device
        out = func(*args, **kwargs)
        if func in (torch.from_numpy, torch.as_tensor) and self.device.type != "cpu":
            out = out.to(self.device)
        return out


def install_cuda_shims(device: torch.device, script: str) -> None:
    """Make `torch.cuda` answer the script as a one-GPU machine would, on a non-CUDA arm.

    Only calls made from the script's own lines see the shim: torch internals (dynamo,
    inductor) keep asking the real `torch.cuda` and are not misled into CUDA code paths.
    """
    if device.type == "cuda":
        return
    cuda = torch.cuda
    answers = {
        "is_available": lambda *a, **k: True,
        "device_count": lambda *a, **k: 1,
        "current_device": lambda *a, **k: 0,
        "get_device_name": lambda *a, **k: f"(collapsed onto {device})",
    }
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "synchronize",
                 "empty_cache", "set_device", "reset_peak_memory_stats", "ipc_collect"):
        answers[name] = lambda *a, **k: None
    for name, answer in answers.items():
        setattr(cuda, name, _for_script(script, answer, getattr(cuda, name)))
    original_autocast_init = torch.autocast.__init__

    def autocast_init(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        if device_type in _COLLAPSIBLE:
            device_type = device.type
        original_autocast_init(self, device_type, *args, **kwargs)

    torch.autocast.__init__ = autocast_init


def _for_script(script: str, shim: Callable, real: Callable) -> Callable:
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code.co_filename == script:
            return shim(*args, **kwargs)
        return real(*args, **kwargs)

    return dispatch
