"""Environment capture (collect_env, with a timeout) and the numerics flags it omits."""
from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any

import torch


def collect_env(timeout_s: float) -> tuple[str | None, str | None]:
    """`torch.utils.collect_env`'s report, or why it is missing.  Runs before any patching."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            from torch.utils import collect_env as ce

            box["text"] = ce.get_pretty_env_info()
        except Exception as e:  # noqa: BLE001 - collect_env shells out and may fail anywhere
            box["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return None, f"collect_env did not finish within {timeout_s:.0f} s"
    return box.get("text"), box.get("error")


def numerics_flags() -> dict[str, Any]:
    """The switches that change numbers and that collect_env does not report."""
    b = torch.backends
    flags: dict[str, Any] = {
        "torch": torch.__version__,
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "default_dtype": str(torch.get_default_dtype()).replace("torch.", ""),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "mkldnn_enabled": b.mkldnn.enabled,
        "cpu_capability": b.cpu.get_cpu_capability(),
        "cuda_available": torch.cuda.is_available(),
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
    flags["cuda_matmul_allow_tf32"] = b.cuda.matmul.allow_tf32
    flags["cudnn_allow_tf32"] = b.cudnn.allow_tf32
    flags["cudnn_benchmark"] = b.cudnn.benchmark
    flags["cudnn_deterministic"] = b.cudnn.deterministic
    flags["allow_fp16_reduced_precision_reduction"] = b.cuda.matmul.allow_fp16_reduced_precision_reduction
    flags["allow_bf16_reduced_precision_reduction"] = b.cuda.matmul.allow_bf16_reduced_precision_reduction
    return flags


def apply_knobs(knobs: dict[str, str]) -> None:
    """Set the arm's knobs; the parent has already validated names and values."""
    b = torch.backends
    on = lambda v: v in ("on", "1", "true")  # noqa: E731
    for name, value in knobs.items():
        if name == "threads":
            torch.set_num_threads(int(value))
            # The arm's thread count holds for the whole script: a script that sets its own
            # (gh-88718 switches between 1 and 6) is exactly what `threads=N` rules out.
            torch.set_num_threads = lambda n: None
        elif name == "tf32":
            b.cuda.matmul.allow_tf32 = on(value)
            b.cudnn.allow_tf32 = on(value)
        elif name == "reduced_precision":
            b.cuda.matmul.allow_fp16_reduced_precision_reduction = on(value)
            b.cuda.matmul.allow_bf16_reduced_precision_reduction = on(value)
        elif name == "deterministic":
            torch.use_deterministic_algorithms(on(value), warn_only=True)
        elif name == "cudnn_benchmark":
            b.cudnn.benchmark = on(value)
        elif name == "mkldnn":
            b.mkldnn.enabled = on(value)
        elif name in ("fallback_random", "emulate_precision_casts"):
            import torch._inductor.config as inductor_config

            setattr(inductor_config, name, on(value))


def watch_knob_calls(knobs: dict[str, str], script: str) -> list[dict[str, Any]]:
    """Record each call of the script's that sets a numerics switch (`knob_calls.SETTERS`):
    where the arm's knobs set it, only a call to another value (the report says which held);
    elsewhere every call (the report places a setting the script changes between two values
    it compares). The list returned fills as the script runs.  The call itself behaves as
    before: `threads` stays pinned where the arm sets it (`apply_knobs`), every other switch
    takes the script's value, as it would without triage.  Call after `apply_knobs`."""
    from triage.worker.knob_calls import MAX_KNOB_CALLS, SETTERS, overrides, recordable

    calls: list[dict[str, Any]] = []

    def record(setter: str, value: Any) -> None:
        value = recordable(setter, value)
        knob = SETTERS[setter][0]
        if value is None or knob in knobs and not overrides(setter, value, knobs[knob]):
            return
        line = _script_caller_line(script)
        entry = {"setter": setter, "value": value, "line": line}
        if line is not None and entry not in calls and len(calls) < MAX_KNOB_CALLS:
            calls.append(entry)

    for setter, (knob, _) in SETTERS.items():
        if setter == "set_num_threads":
            if knob in knobs:
                torch.set_num_threads = lambda n: record("set_num_threads", n)  # pinned: only recorded
            else:
                torch.set_num_threads = functools.partial(_recorded_call, record, torch.set_num_threads)
            continue
        original = getattr(torch._C, setter, None)
        if original is None:  # not in this torch release
            continue

        def recorded(value: Any, *rest: Any, _setter: str = setter, _original: Any = original, **kw: Any) -> Any:
            record(_setter, value)
            return _original(value, *rest, **kw)

        # torch.backends reads most setters from torch._C at each call; cudnn's and mkldnn's
        # properties hold theirs.
        setattr(torch._C, setter, recorded)
        for prop in _properties_setting_with(original):
            prop.setter = recorded
    return calls


def _recorded_call(record: Any, original: Any, n: Any) -> Any:
    """`torch.set_num_threads(n)` on an arm that does not pin the thread count: recorded, and done."""
    record("set_num_threads", n)
    return original(n)


def _properties_setting_with(setter: Any) -> list[Any]:
    from torch.backends import ContextProp

    return [prop for module in (torch.backends.cudnn, torch.backends.mkldnn) for prop in vars(type(module)).values()
            if isinstance(prop, ContextProp) and prop.setter is setter]


# Where torch's own wrappers around a setter live: `torch.use_deterministic_algorithms`,
# `torch.backends.*` properties and `flags()` context managers.  A call reached through other
# torch code (dynamo, a module's forward) is torch's, not the script's.
_SETTER_WRAPPERS = (os.path.join(os.path.dirname(torch.__file__), "__init__.py"),
                    os.path.join(os.path.dirname(torch.__file__), "backends") + os.sep)


def _script_caller_line(script: str) -> int | None:
    """The script's line that made this setter call, through torch's own wrappers only; None
    where the call came from elsewhere (torch itself, triage after the script)."""
    import contextlib

    frame = sys._getframe(3)  # the caller of the recording setter (here ← record ← the setter)
    while frame is not None and (frame.f_code.co_filename.startswith(_SETTER_WRAPPERS)
                                 or frame.f_code.co_filename == contextlib.__file__):
        frame = frame.f_back
    return frame.f_lineno if frame is not None and frame.f_code.co_filename == script else None
