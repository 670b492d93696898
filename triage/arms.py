"""Arm specs: ``cpu``, ``cuda:1``, ``cpu/compile``, ``cuda/compile=aot_eager``,
``cuda/tf32=off``, ``cpu/threads=1`` … parsed into `ArmSpec`s."""
from __future__ import annotations

import os
import re

from triage.model import ArmSpec

ON_OFF = ("on", "off")
KNOBS: dict[str, tuple[str, ...] | None] = {
    "threads": None,  # a positive integer
    "tf32": ON_OFF,
    "reduced_precision": ON_OFF,
    "deterministic": ON_OFF,
    "cudnn_benchmark": ON_OFF,
    "mkldnn": ON_OFF,
    "fallback_random": ON_OFF,
    "emulate_precision_casts": ON_OFF,
    "fault": None,  # tests only: OP[:scale|nan|inf|finite|raise]
}
COMPILE_ONLY = {"fallback_random", "emulate_precision_casts"}
BACKENDS = {"inductor", "aot_eager", "aot_eager_decomp_partition", "eager", "cudagraphs"}
FAULT_KINDS = {"scale", "ulp", "nan", "inf", "finite", "raise"}
TEST_ARMS_ENV = "TRIAGE_TEST_ARMS"


class ArmSpecError(ValueError):
    """A bad --arms value; the message names the offending part."""


def parse_arms(text: str) -> list[ArmSpec]:
    specs = [parse_arm(part.strip()) for part in text.split(",") if part.strip()]
    if not specs:
        raise ArmSpecError("--arms is empty: name at least one arm, e.g. 'cpu' or 'cpu,cuda'")
    seen = set()
    for s in specs:
        if s.spec in seen:
            raise ArmSpecError(f"arm '{s.spec}' is given twice")
        seen.add(s.spec)
    return specs


def parse_arm(text: str) -> ArmSpec:
    parts = text.split("/")
    device = parts[0].strip().lower()
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise ArmSpecError(f"unknown device '{parts[0]}' in arm '{text}' (use cpu, cuda, cuda:N or mps)")
    mode, backend, knobs = "eager", None, []
    for part in parts[1:]:
        name, eq, value = part.partition("=")
        name, value = name.strip().lower(), value.strip()
        if name == "compile":
            if mode == "compile":
                raise ArmSpecError(f"'compile' appears twice in arm '{text}'")
            mode = "compile"
            if eq:
                if value not in BACKENDS:
                    raise ArmSpecError(f"unknown compile backend '{value}' in arm '{text}' "
                                       f"(known: {', '.join(sorted(BACKENDS))})")
                backend = value
            continue
        if name == "eager" and not eq:
            continue
        if name not in KNOBS:
            raise ArmSpecError(f"unknown knob '{name}' in arm '{text}' "
                               f"(known: compile, {', '.join(k for k in KNOBS if k != 'fault')})")
        if not eq or not value:
            raise ArmSpecError(f"knob '{name}' in arm '{text}' needs a value, e.g. {name}={_example(name)}")
        knobs.append((name, _check_value(name, value.lower() if name != "fault" else value, text)))
    for name, _ in knobs:
        if name in COMPILE_ONLY and mode != "compile":
            raise ArmSpecError(f"knob '{name}' in arm '{text}' applies to compile arms only")
    if len({k for k, _ in knobs}) != len(knobs):
        raise ArmSpecError(f"a knob is set twice in arm '{text}'")
    return ArmSpec(device=device, mode=mode, backend=backend, knobs=tuple(knobs))


def _example(name: str) -> str:
    return {"threads": "1", "fault": "aten.acosh"}.get(name, "off")


def _check_value(name: str, value: str, text: str) -> str:
    if name == "threads":
        if not value.isdigit() or int(value) < 1:
            raise ArmSpecError(f"threads must be a positive integer in arm '{text}', not '{value}'")
        return str(int(value))
    if name == "fault":
        if os.environ.get(TEST_ARMS_ENV) != "1":
            raise ArmSpecError(f"knob 'fault' in arm '{text}' is for triage's own tests "
                               f"(set {TEST_ARMS_ENV}=1 to use it)")
        op, _, how = value.partition(":")
        if not re.fullmatch(r"(aten\.)?[A-Za-z_][A-Za-z0-9_]*", op) or (how and how not in FAULT_KINDS):
            raise ArmSpecError(f"fault must be OP[:{'|'.join(sorted(FAULT_KINDS))}] in arm '{text}'")
        return value
    allowed = KNOBS[name]
    if value in ("1", "true"):
        value = "on"
    if value in ("0", "false"):
        value = "off"
    if allowed is not None and value not in allowed:
        raise ArmSpecError(f"knob '{name}' in arm '{text}' must be one of {', '.join(allowed)}, not '{value}'")
    return value


def cuda_present() -> bool:
    """Whether this machine has an NVIDIA device node (no torch import needed)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def default_arms() -> tuple[list[ArmSpec], str | None]:
    """`cpu,cuda` where CUDA is present; otherwise `cpu` and the reason there is no CUDA arm."""
    if cuda_present():
        return [ArmSpec("cpu"), ArmSpec("cuda")], None
    return [ArmSpec("cpu")], ("No CUDA device on this machine: the CUDA arm could not run here, so the "
                              "CPU arm is judged against its float64 reference and the script's own claims.")
