"""The calls by which a script sets what an arm's knob sets (`cpu/threads=1` against the
script's own `torch.set_num_threads(2)`): the worker records them (`envinfo.watch_knob_calls`),
the parent names them in the report's notes.  No torch import: the parent reads this too."""
from __future__ import annotations

from typing import Any

# The torch function each call reaches (`torch._C`'s setter, or `torch.set_num_threads`), the
# knob it belongs to, and how the script's call reads.
SETTERS: dict[str, tuple[str, str]] = {
    "set_num_threads": ("threads", "torch.set_num_threads({})"),
    "_set_cublas_allow_tf32": ("tf32", "torch.backends.cuda.matmul.allow_tf32 = {}"),
    "_set_cudnn_allow_tf32": ("tf32", "torch.backends.cudnn.allow_tf32 = {}"),
    "_set_float32_matmul_precision": ("tf32", "torch.set_float32_matmul_precision({!r})"),
    "_set_cublas_allow_fp16_reduced_precision_reduction":
        ("reduced_precision", "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = {}"),
    "_set_cublas_allow_bf16_reduced_precision_reduction":
        ("reduced_precision", "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = {}"),
    "_set_deterministic_algorithms": ("deterministic", "torch.use_deterministic_algorithms({})"),
    "_set_cudnn_benchmark": ("cudnn_benchmark", "torch.backends.cudnn.benchmark = {}"),
    "_set_mkldnn_enabled": ("mkldnn", "torch.backends.mkldnn.enabled = {}"),
}
MATMUL_PRECISIONS = ("highest", "high", "medium")  # "highest": no TF32
MAX_KNOB_CALLS = 16  # recorded per arm: a script sets a switch a few times, not in a loop worth listing
MAX_THREADS = 9999  # arms.MAX_THREADS_DIGITS


def recordable(setter: str, value: Any) -> Any:
    """`value` as result.json holds it (an int, a bool, a precision name), or None where the
    call is not one worth recording (a value torch itself will refuse)."""
    if setter == "set_num_threads":
        return value if type(value) is int and 1 <= value <= MAX_THREADS else None
    if setter == "_set_float32_matmul_precision":
        return value if value in MATMUL_PRECISIONS else None
    return bool(value)


def overrides(setter: str, value: Any, knob_value: str) -> bool:
    """Whether the script's call asks for something else than the arm's knob (`knob_value`)."""
    if setter == "set_num_threads":
        return value != int(knob_value)
    on = knob_value == "on"
    if setter == "_set_float32_matmul_precision":
        return (value != "highest") != on
    return value != on


def knob_call_note(spec: str, knob: str, knob_value: str, call: dict[str, Any]) -> str:
    """The report's note on one script call that sets what the arm's knob sets, and which of
    the two held."""
    shown = SETTERS[call["setter"]][1].format(call["value"])
    where = f" (line {call['line']})" if call.get("line") else ""
    if knob == "threads":
        return (f"`{spec}`: the script calls `{shown}`{where}; the arm's `{knob}={knob_value}` overrode it (the "
                "arm holds its thread count for the whole run, so that call had no effect here).")
    return (f"`{spec}`: the script sets `{shown}`{where}, overriding the arm's `{knob}={knob_value}`: the script's "
            "setting held from that line until the script set it back, if it did.")
