"""Arm specs: ``cpu``, ``cuda:1``, ``cpu/compile``, ``cuda/compile=aot_eager``,
``cuda/tf32=off``, ``cpu/threads=1``, ``cpu/compile@2.15.0`` (another torch release) …
parsed into `ArmSpec`s."""
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


# A torch release's numbers, ASCII only (Python's \d also matches ٢ or ２, which pip would be
# asked for): at most 4 digits for a release number (2.15.0), 8 for the rest (a nightly's
# .dev20250310, rc1, .post1, a local tag's cu128).
MAX_RELEASE_DIGITS, MAX_OTHER_DIGITS = 4, 8
_RELEASE_NUMBERS = re.compile(r"[0-9]+(?:\.[0-9]+)*", re.ASCII)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_DEVICE = re.compile(r"cpu|mps|cuda(:[0-9]{1,4})?", re.ASCII)
MAX_THREADS_DIGITS = 4


def torch_release(text: str) -> str:
    """`text` as a torch release to install (`release_version`), refused first where it holds
    anything but ASCII or a number of absurd size: TorchEnvError says what is wrong."""
    from triage.sandbox.torch_envs import _INVISIBLE, TorchEnvError, release_version

    version = text.translate(_INVISIBLE).strip().lower()
    if not version.isascii() or not version.isprintable():
        odd = next(c for c in version if not (c.isascii() and c.isprintable()))
        raise TorchEnvError(f"{text!r} is not a torch release version (e.g. 2.15.0): it holds {odd!r} "
                            f"(U+{ord(odd):04X}); a version is written in ASCII digits, letters and dots")
    numbers = _RELEASE_NUMBERS.match(version)
    release = numbers.group(0).split(".") if numbers else []
    checks = [(digits, MAX_RELEASE_DIGITS) for digits in release]
    checks += [(digits, MAX_OTHER_DIGITS) for digits in _DIGITS.findall(version[len(".".join(release)):])]
    for digits, limit in checks:
        if len(digits) > limit:
            raise TorchEnvError(f"'{text[:60]}' is not a torch release version (e.g. 2.15.0): the number "
                                f"{digits[:24]}{'…' if len(digits) > 24 else ''} is longer than the {limit} digits "
                                "a torch version has there")
    return release_version(text)


def parse_arm(text: str) -> ArmSpec:
    text, at, release = text.partition("@")
    torch = None
    if at:
        from triage.sandbox.torch_envs import TorchEnvError

        try:
            torch = torch_release(release)
        except TorchEnvError as e:
            shown = release if len(release) <= 80 else release[:79] + "…"
            raise ArmSpecError(f"{e} in arm '{text}@{shown}'") from None
    parts = text.split("/")
    device = parts[0].strip().lower()
    if not _DEVICE.fullmatch(device):
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
    return ArmSpec(device=device, mode=mode, backend=backend, knobs=tuple(knobs), torch=torch)


def _example(name: str) -> str:
    return {"threads": "1", "fault": "aten.acosh"}.get(name, "off")


def _check_value(name: str, value: str, text: str) -> str:
    if name == "threads":
        # ASCII digits only: str.isdigit() is true of '²', which int() then refuses.
        if not re.fullmatch(rf"[0-9]{{1,{MAX_THREADS_DIGITS}}}", value, re.ASCII) or int(value) < 1:
            raise ArmSpecError(f"threads must be a positive integer (at most {'9' * MAX_THREADS_DIGITS}) in arm "
                               f"'{text}', not '{value}'")
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


def default_arms(source: str | None) -> tuple[list[ArmSpec], list[str]]:
    """The arms the script compares, and why: a script that calls `torch.compile` gets an eager
    and a compile arm (run with the script's own backend and options), on CUDA where it uses
    CUDA and this machine has it; otherwise `cpu,cuda` where CUDA is present, else `cpu`
    against its float64 reference."""
    uses_cuda = mentions_cuda(source)
    here = cuda_present()
    notes = []
    if uses_cuda and not here:
        notes.append("The script uses CUDA and this machine has no CUDA device: its CUDA calls ran on the CPU "
                     "arm (`.cuda()` and `device=\"cuda\"` collapse onto the arm's device). Not tested here: the "
                     "CUDA side; on a machine with a GPU, run `triage run repro.py --arms cpu,cuda`.")
    if calls_compile(source):
        device = "cuda" if uses_cuda and here else "cpu"
        notes.append(f"The script calls `torch.compile`: arms `{device}` (eager: `torch.compile` returns the function "
                     f"itself, or the module wrapped as it wraps one, run eagerly) and `{device}/compile` (compiled with the script's own backend and options).")
        return [ArmSpec(device), ArmSpec(device, mode="compile")], notes
    if here:
        return [ArmSpec("cpu"), ArmSpec("cuda")], notes
    notes.append("Default arm `cpu`: judged against its float64 reference and the script's own claims.")
    return [ArmSpec("cpu")], notes


def calls_compile(source: str | None) -> bool:
    """Whether the script calls (or decorates with) `torch.compile`."""
    if not source:
        return False
    import ast

    from triage.extract import parse_python

    tree = parse_python(source)
    if tree is None:
        return "torch.compile" in source
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "torch"
                for a in n.names if a.name == "compile"}
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == "compile" and isinstance(n.value, ast.Name) \
                and n.value.id == "torch":
            return True
        if isinstance(n, ast.Name) and n.id in imported:
            return True
    return False


def mentions_cuda(source: str | None) -> bool:
    """Whether the script asks for CUDA (`.cuda()`, `"cuda"` devices, `torch.cuda` calls)."""
    return bool(source) and re.search(r"\.cuda\(|[\"']cuda(:\d+)?[\"']|torch\.cuda\.(?!is_available)", source) is not None
