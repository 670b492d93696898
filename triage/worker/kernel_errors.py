"""Measured kernel errors: how far each aten op's real kernel lands from float64, per dtype.

The rounding simulation (`triage.worker.rounding`) rounds every op's float64 result to the
arm's dtype. A library kernel (``exp``, ``tanh``, ``erf``, softmax's fused loop, …) is also
some units of roundoff off *before* that rounding, and how many is a property of the kernel
on a device and CPU capability, not of the script: SLEEF's ``expf`` is within 1 ulp, the
vectorized ``exp_u20`` of softmax within about 20, ``lgamma`` far more near its zeros.
Guessing that per op class called correct kernels bugs; so it is measured.

`measure` runs PyTorch's own op database (``op_db`` from OpInfo: every op PyTorch tests, on
the sample inputs it tests them with) under a dispatch mode that re-runs every aten call on
float64 copies of its inputs. The inputs are exactly representable in float64, so the
difference is the kernel's own error, in units u·scale (u the dtype's unit roundoff; scale
|y| for a pointwise op, max(|y|, rms y) for any other, so a normalized output near zero is
not scored by its own tiny magnitude). For fp16/bf16 calls it also notes whether the result
is the float32 computation rounded once (the kernel's opmath is float32).

The table ships with the package (``kernel_errors.json``), one entry per torch release,
device type and CPU capability; ``triage calibrate`` regenerates the entry for this machine.
`KernelTable.load` picks the entry of the arm's own release, device and capability, else the
largest error any entry for the device measured. An op the table has no measurement for gets
`UNMEASURED_U` and the verdict says which ops those were.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import math
import platform
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from triage import policy
from triage.worker.opclasses import EXACT, UNIT_ROUNDOFF

TABLE = Path(__file__).with_name("kernel_errors.json")
FORMAT = 1
# The largest error over a finite set of samples underestimates the kernel's; the bound the
# simulation uses is this multiple of it, and never below the unmeasured library default.
MARGIN = 2.0
LIBRARY_FLOOR_U = 4.0
UNMEASURED_U = policy.UNMEASURED_U
# A non-pointwise kernel measured beyond this many u of its output's scale met an
# ill-conditioned sample (a layer norm of a nearly constant row), not a kernel error.
FUSED_CAP = 64.0
SAMPLES_PER_OP = 12


@dataclass(frozen=True)
class KernelError:
    """One op at one dtype: the largest forward error seen (units of u·scale; for a pointwise
    op where it is well conditioned), the largest error where it is not (units of u·max(Σ|xᵢ|, |f|),
    pointwise ops only: `backward_u`; and in units of u·max(Σ|xᵢ·∂f/∂xᵢ|, |f|): `sensitivity_u`),
    how many elements and calls they rest on, and whether the fp16/bf16 results are the float32
    computation rounded once (None: float32 and wider)."""

    max_u: float
    elements: int
    calls: int
    float32_opmath: bool | None = None
    backward_u: float | None = None  # None: not a pointwise op
    # None: not measured, or on fewer than SENSITIVITY_EVIDENCE ill-conditioned elements.
    sensitivity_u: float | None = None

    @property
    def pointwise(self) -> bool:
        return self.backward_u is not None


class KernelTable:
    """Per op and dtype, the measured error of the kernel (``None``: not measured)."""

    def __init__(self, ops: dict[str, dict[str, KernelError]], source: str) -> None:
        self.ops = ops
        self.source = source

    @classmethod
    def load(cls, device: str, capability: str | None, torch_version: str, path: Path = TABLE) -> KernelTable:
        try:
            tables = json.loads(path.read_text())["tables"]
        except (OSError, ValueError, KeyError):
            return cls({}, "no measured table")
        release = _release(torch_version)
        same_device = [t for t in tables if t.get("device") == device]
        exact = [t for t in same_device if _release(t.get("torch", "")) == release
                 and (capability is None or t.get("capability") == capability)]
        chosen = exact[:1] or same_device
        if not chosen:
            return cls({}, f"no measurement for device {device}")
        ops: dict[str, dict[str, KernelError]] = {}
        for t in chosen:
            for op, per_dtype in t.get("ops", {}).items():
                for dtype, e in per_dtype.items():
                    seen = ops.setdefault(op, {}).get(dtype)
                    here = KernelError(float(e["max_u"]), int(e["elements"]), int(e["calls"]),
                                       e.get("float32_opmath"), e.get("backward_u"), e.get("sensitivity_u"))
                    if seen is not None:  # several entries: the larger error of each kind
                        here = KernelError(max(here.max_u, seen.max_u), max(here.elements, seen.elements),
                                           max(here.calls, seen.calls),
                                           here.float32_opmath if here.float32_opmath == seen.float32_opmath else None,
                                           _larger(here.backward_u, seen.backward_u),
                                           _larger(here.sensitivity_u, seen.sensitivity_u))
                    ops[op][dtype] = here
        names = ", ".join(sorted({f"torch {t.get('torch')} {t.get('capability') or device}" for t in chosen}))
        return cls(ops, f"measured on {names}" + ("" if exact else " (the largest error of each op)"))

    def get(self, op: str, dtype: Any) -> KernelError | None:
        return self.ops.get(op, {}).get(_dtype_name(dtype))

    def library_u(self, op: str, dtype: Any) -> float | None:
        """The forward error bound (units of u) the simulation applies to the result before
        rounding it to `dtype` (a non-pointwise op's measurement past FUSED_CAP met an
        ill-conditioned sample: capped there, since the replay carries conditioning itself)."""
        e = self.get(op, dtype)
        if e is None:
            return None
        measured = e.max_u if e.pointwise else min(e.max_u, FUSED_CAP)
        return max(LIBRARY_FLOOR_U, MARGIN * measured)

    def input_u(self, op: str, dtype: Any) -> float:
        """The error bound (units of u·max(Σ|xᵢ|, |f|)) the simulation adds to a pointwise op's result
        where the function is ill-conditioned: a formula that cancels there (1 + erf(x)) is
        accurate relative to its inputs, not to its result."""
        return self._input_bound(op, dtype)[0]

    def _input_bound(self, op: str, dtype: Any) -> tuple[float, bool]:
        """`input_u`, and whether it is the bound a float32-opmath kernel inherits
        (`_opmath_input_u`) rather than this dtype's own measurement."""
        e = self.get(op, dtype)
        # Any error left after two roundings of the result is the formula's (a correctly
        # rounded kernel leaves none): lerp's a + w·(b − a) is 0.35 u·Σ|xᵢ| off where it cancels.
        own = 0.0 if e is None or not e.backward_u else MARGIN * e.backward_u
        inherited = self._opmath_input_u(op, dtype)
        return (inherited, True) if inherited and inherited >= own else (own, False)

    def _opmath_input_u(self, op: str, dtype: Any) -> float:
        """`input_u` a float16/bfloat16 kernel that computes in float32 (`float32_opmath`)
        inherits: the float32 kernel's error where the function is ill-conditioned, an absolute
        error in float32's units, in this dtype's. Measured in this dtype's units it rounds to
        0 (bfloat16 GELU's gradient: `backward_u` 0.0), yet at x = −6.19 that float32
        computation gives 0 for −1.2e-8, and the correct bfloat16 kernel was 42σ outside."""
        e = self.get(op, dtype)
        wide = self.get(op, torch.float32)
        if e is None or not e.float32_opmath or wide is None or not wide.backward_u or dtype not in UNIT_ROUNDOFF:
            return 0.0
        return MARGIN * wide.backward_u * UNIT_ROUNDOFF[torch.float32] / UNIT_ROUNDOFF[dtype]

    def sensitivity_ratio(self, op: str, dtype: Any) -> float | None:
        """Where a pointwise op is ill-conditioned, the bound its kernel's measured error sets
        in units of u·max(Σ|xᵢ·∂f/∂xᵢ|, |f|), as a multiple of `input_u`'s unit, so that the
        simulation's scale there is the smaller of the two (`ill_conditioned_scale`). A kernel
        that computes an accurate formula of its inputs (softplus's log1p(exp(x)) at x = −18)
        errs by its inputs' rounding times the function's slope, κ·u of a result of 1.5e-8,
        where u·|x| is a hundred million times that. None where the kernel was not measured on
        SENSITIVITY_EVIDENCE ill-conditioned elements, or erred by more than BACKWARD_STABLE_U
        of that scale on one: a formula that cancels (GELU's 1 + erf) errs by u·|x|, which
        outgrows its slope without bound (79.6 u of it on OpInfo's samples, 10⁹ at x = −8);
        it keeps the input's scale alone, the wider."""
        e = self.get(op, dtype)
        backward, inherited = self._input_bound(op, dtype)
        if inherited:  # float32's bound: its slope figure too
            return self.sensitivity_ratio(op, torch.float32)
        if e is None or e.sensitivity_u is None or e.sensitivity_u > BACKWARD_STABLE_U or not backward:
            return None
        return max(LIBRARY_FLOOR_U, MARGIN * e.sensitivity_u) / backward

    def fused_u(self, op: str, dtype: Any) -> float | None:
        """A fused kernel's measured error (units of u of its output's scale) beyond its
        decomposition, where the measurement is an error at all: past FUSED_CAP the samples
        were ill-conditioned and the decomposition's replay models them better."""
        e = self.get(op, dtype)
        return None if e is None or e.max_u > FUSED_CAP else MARGIN * e.max_u


def _larger(a: float | None, b: float | None) -> float | None:
    """The larger of two entries' measurements of one figure; None where either lacks it."""
    return None if a is None or b is None else max(a, b)


def _release(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


# -- measuring ------------------------------------------------------------------------------
# The passes `measure` makes over the samples: the ops' own calls, and the calls autograd makes
# for their gradients.
PASSES = ("forward", "backward")


def measure(device: str = "cpu", dtypes: Iterable[str] = ("float32", "float16", "bfloat16"),
            only: Iterable[str] | None = None, samples_per_op: int = SAMPLES_PER_OP,
            progress: Callable[[str], None] | None = None, time_limit: float | None = None,
            passes: Iterable[str] = PASSES) -> dict[str, Any]:
    """Measure every aten call the OpInfo database's samples make (`only`: OpInfo names) on
    `device`; returns one table entry (``torch``/``device``/``capability``/``ops``). Past
    `time_limit` seconds no further OpInfo entry starts, and the entry's ``coverage`` says how
    far it came (a lent GPU's minutes: what was measured is kept).

    The ``backward`` pass differentiates each sample (`_run_backward`) and keeps the pointwise
    kernels only the gradients call (``tanh_backward``, ``silu_backward``, …), which a training
    script's every step runs: a kernel the forward pass measured keeps the forward samples'
    figure, and a non-pointwise backward kernel (a layer norm's, a convolution's) stays
    unmeasured, since its samples' error against the output's scale mixes the kernel's with
    the conditioning the replay carries itself."""
    from torch.testing._internal.common_methods_invocations import op_db  # needs expecttest

    wanted = [getattr(torch, d) for d in dtypes]
    keep = set(only) if only else None
    passes = set(passes)
    probe, gradients = _Probe(), _Probe(backward_kernels=True)
    start = time.monotonic()
    deadline = start + time_limit if time_limit is not None else None
    with warnings.catch_warnings(), _without_tf32():
        warnings.simplefilter("ignore")  # OpInfo's samples exercise every deprecated overload
        reached = _run_samples(op_db, wanted, keep, device, samples_per_op,
                               probe if "forward" in passes else None, progress, deadline,
                               gradients if "backward" in passes else None)
    # Ops the samples' forward calls (with gradients or without) keep the forward figure.
    forward_seen = set(probe.seen) | gradients.forward_seen
    for op, per in gradients.seen.items():
        kept = {d: e for d, e in per.items() if "backward_u" in e}  # pointwise
        if op not in forward_seen and kept:
            probe.seen[op] = kept
    capability = torch.backends.cpu.get_cpu_capability() if device == "cpu" else \
        torch.cuda.get_device_name() if device.startswith("cuda") else device
    entry = {"torch": torch.__version__, "device": device.split(":")[0], "capability": capability,
             "machine": platform.processor() or platform.machine(), "seconds": round(time.monotonic() - start, 1),
             "ops": {op: {d: _rounded(e) for d, e in sorted(per.items())} for op, per in sorted(probe.seen.items())}}
    if reached < len(op_db):
        entry["coverage"] = (f"the first {reached} of {len(op_db)} OpInfo entries in op_db order (the time "
                             f"limit, {time_limit:g} s, ran out): {len(entry['ops'])} aten ops")
    return entry


@contextlib.contextmanager
def _without_tf32() -> Iterator[None]:
    """TF32 off for matmuls and cuDNN, the other cuDNN flags kept: TF32 is a precision mode the
    simulation models from the arm's flags, not a kernel's error (measured with cuDNN's default
    on, an H200's float32 convolution read 3.4e4 u). cuDNN's flags only through its context
    manager: OpInfo's import disables setting them globally."""
    cudnn = torch.backends.cudnn
    params = inspect.signature(cudnn.flags).parameters
    kept = {k: getattr(cudnn, k) for k in ("enabled", "benchmark", "benchmark_limit", "deterministic")
            if k in params and hasattr(cudnn, k)}
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with cudnn.flags(**kept, allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


def _run_samples(op_db: list, wanted: list, keep: set[str] | None, device: str, samples_per_op: int,
                 probe: _Probe | None, progress: Callable[[str], None] | None, deadline: float | None = None,
                 gradients: _Probe | None = None) -> int:
    """Run the samples (under `probe`; their gradients' calls under `gradients`); returns how
    many OpInfo entries it went through (all, unless `deadline`, a `time.monotonic()` value,
    passed first)."""
    for reached, info in enumerate(op_db):
        if deadline is not None and time.monotonic() > deadline:
            return reached
        if keep is not None and info.name not in keep and f"{info.name}.{info.variant_test_name}" not in keep:
            continue
        if progress:
            progress(info.name)
        for dtype in wanted:
            if dtype not in info.supported_dtypes(device):
                continue
            try:
                # reference_inputs: the samples plus the extremal and large inputs PyTorch
                # checks its kernels' numerics with (a unary ufunc's values over its domain).
                samples = info.reference_inputs(device, dtype, requires_grad=False) if probe is not None else ()
                for i, sample in enumerate(samples):
                    if i >= samples_per_op:
                        break
                    with torch.no_grad(), probe:
                        try:
                            info(sample.input, *sample.args, **sample.kwargs)
                        except Exception:  # noqa: BLE001 - a sample the op rejects measures nothing
                            pass
            except Exception:  # noqa: BLE001 - an op whose samples cannot be built on this device
                pass
            if gradients is not None and info.supports_autograd and dtype in info.supported_backward_dtypes(device):
                _run_backward(info, device, dtype, samples_per_op, gradients)
    return len(op_db)


# Gradients a torch release's CPU kernels crash the process on (heap corruption, not an
# exception): not taken. torch 2.13: grid_sampler_2d_backward in float16 and bfloat16 on
# OpInfo's first reference sample (2×3×345×456) aborts with "double free or corruption".
BACKWARD_CRASHES = {("2.13", "cpu", "nn.functional.grid_sample"): ("float16", "bfloat16")}


def aborts_in_backward(name: str, device: str, dtype: Any) -> bool:
    """Whether this torch's kernels crash the process on OpInfo entry `name`'s gradient at
    `dtype` on `device` (`BACKWARD_CRASHES`)."""
    return _dtype_name(dtype) in BACKWARD_CRASHES.get((_release(torch.__version__), device.split(":")[0], name), ())


def _run_backward(info: Any, device: str, dtype: Any, samples_per_op: int, gradients: _Probe) -> None:
    """The gradient of each sample's floating outputs with respect to its inputs, for random
    output gradients (a fixed seed: the same figures every run), with `gradients` recording
    the calls autograd makes; the forward calls are noted by name (`_Probe.forward_seen`)."""
    if aborts_in_backward(info.name, device, dtype):
        return
    generator = torch.Generator(device="cpu").manual_seed(0)
    try:
        samples = info.reference_inputs(device, dtype, requires_grad=True)
        for i, sample in enumerate(samples):
            if i >= samples_per_op:
                break
            try:
                with gradients.forward_only():
                    out = info(sample.input, *sample.args, **sample.kwargs)
                outs = [t for t in tree_flatten(out)[0]
                        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
                leaves = [t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
                          if isinstance(t, torch.Tensor) and t.requires_grad]
                if not outs or not leaves:
                    continue
                grads = [torch.randn(t.shape, generator=generator, dtype=torch.float32).to(t.dtype).to(t.device)
                         for t in outs]
                with gradients:
                    torch.autograd.grad(outs, leaves, grads, allow_unused=True)
            except Exception:  # noqa: BLE001 - a sample whose gradient cannot be taken measures nothing
                continue
    except Exception:  # noqa: BLE001 - an op whose samples cannot be built with gradients here
        return


def write(entry: dict[str, Any], path: Path = TABLE, partial: bool = False) -> None:
    """Add `entry` to the table at `path`, replacing the one of the same release, device and
    capability; a `partial` entry (some ops only, or a time limit that ran out) is merged into
    it instead: its ops × dtypes replace those measured before, every other one is kept (a
    `--op` run must not leave the simulation with four ops of a machine's 256)."""
    try:
        tables = json.loads(path.read_text())["tables"]
    except (OSError, ValueError, KeyError):
        tables = []
    key = (_release(entry["torch"]), entry["device"], entry["capability"])
    same = [t for t in tables if (_release(t.get("torch", "")), t.get("device"), t.get("capability")) == key]
    if partial and same:
        before = same[0]
        ops = {name: dict(per) for name, per in before.get("ops", {}).items()}
        for name, per in entry["ops"].items():
            ops.setdefault(name, {}).update(per)
        remeasured = len(entry["ops"])
        entry = dict(entry, ops=ops, coverage=f"{remeasured} aten ops measured again ({entry.get('coverage') or 'the ops asked for'}),"
                                                f" merged into the earlier entry of {len(before.get('ops', {}))}")
    tables = [t for t in tables if t not in same]
    tables.append(entry)
    tables.sort(key=lambda t: (t.get("device", ""), t.get("torch", ""), t.get("capability", "")))
    path.write_text(json.dumps({"format": FORMAT, "tables": tables}, indent=1, sort_keys=True) + "\n")


def _rounded(e: dict[str, Any]) -> dict[str, Any]:
    out = {"max_u": float(f"{e['max_u']:.3g}"), "elements": e["elements"], "calls": e["calls"]}
    if "backward_u" in e:
        out["backward_u"] = float(f"{e['backward_u']:.3g}")
        if e.get("ill_elements", 0) >= SENSITIVITY_EVIDENCE:
            out["sensitivity_u"] = float(f"{e['sensitivity_u']:.3g}")
    if e["compared"]:
        out["float32_opmath"] = e["agreeing"] >= OPMATH_SHARE * e["compared"]
    return out


class _Probe(TorchDispatchMode):
    """Runs every aten call as it comes and, beside it, the same call on float64 (and, for
    fp16/bf16, float32) copies of its inputs; keeps the largest error per op and dtype."""

    def __init__(self, backward_kernels: bool = False) -> None:
        super().__init__()
        self.seen: dict[str, dict[str, dict[str, Any]]] = {}
        # Measure the pointwise backward kernels only (`tanh_backward`: the backward pass keeps
        # no other, `measure`); a gradient's other calls (`sgn`, `mul`) are forward ops, which
        # the forward samples measure.
        self.backward_kernels = backward_kernels
        self.forward_seen: set[str] = set()  # the ops called under `forward_only`, by name (not measured)
        self._noting = False

    @contextlib.contextmanager
    def forward_only(self) -> Iterator[None]:
        """Note the ops called (an OpInfo sample's forward, before its gradients) without
        measuring them."""
        self._noting = True
        try:
            with self:
                yield
        finally:
            self._noting = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._noting:
            self.forward_seen.add(func.overloadpacket.__name__)
            return out
        try:
            self._record(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - a call the float64 copy cannot make measures nothing
            pass
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        name = func.overloadpacket.__name__
        if name in EXACT or func._schema.is_mutable or torch.Tag.nondeterministic_seeded in func.tags \
                or self.backward_kernels and (torch.Tag.pointwise not in func.tags or not name.endswith("_backward")):
            return
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor) and a.is_floating_point()]
        dtypes = {a.dtype for a in inputs}
        if len(dtypes) != 1:
            return
        dtype = dtypes.pop()
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs or any(t.dtype != dtype for t in outs if t.is_floating_point()):
            return

        def widened(to: Any) -> Callable[[Any], Any]:
            return lambda a: (a.to(to) if isinstance(a, torch.Tensor) and a.dtype == dtype
                              else to if a is dtype else a)

        def kernel_scalar(a: Any) -> Any:
            # A Python float operand (`x / 0.3`) enters the kernel at its opmath, float32 for
            # all three dtypes: the reference reads it so, or its rounding (up to ½ u) is
            # counted as the kernel's error (a correctly rounded division measured 1.46 u).
            return float(torch.tensor(a, dtype=torch.float32)) if type(a) is float else a

        reference = [t for t in tree_flatten(func(*tree_map(widened(torch.float64), tree_map(kernel_scalar, args)),
                                                  **tree_map(widened(torch.float64), kwargs)))[0]
                     if isinstance(t, torch.Tensor)]
        single = None
        if dtype != torch.float32:
            single = [t for t in tree_flatten(func(*tree_map(widened(torch.float32), args),
                                                   **tree_map(widened(torch.float32), kwargs)))[0]
                      if isinstance(t, torch.Tensor)]
        u = UNIT_ROUNDOFF[dtype]
        tiny = torch.finfo(dtype).tiny
        pointwise = torch.Tag.pointwise in func.tags and len(outs) == 1
        sensitivity = input_sensitivity(func, args, kwargs, dtype, outs[0].shape) if pointwise else None
        magnitude = input_magnitude(args, dtype, outs[0].shape) if pointwise else None
        forward, backward, by_slope, ill, elements, agreeing, compared = 0.0, 0.0, 0.0, 0, 0, 0, 0
        for i, (y, r) in enumerate(zip(outs, reference, strict=False)):
            if not y.is_floating_point() or y.shape != r.shape or y.numel() == 0:
                continue
            y, r = y.detach().double().cpu(), r.detach().double().cpu()
            # Normal results only: a subnormal has fewer digits than the dtype, so its relative
            # error says nothing about the kernel.
            ok = torch.isfinite(y) & torch.isfinite(r) & torch.isfinite(r.to(dtype)) & (r.abs() >= tiny)
            if not bool(ok.any()):
                continue
            scale = r.abs()
            if not pointwise:
                scale = scale.clamp(min=float(r[ok].square().mean().sqrt()))
            err = (y - r).abs()
            relative = err / (u * scale.clamp(min=tiny))
            if sensitivity is not None:
                # Forward error where the function is well conditioned (any kernel is accurate
                # relative to its result there). Elsewhere a formula that cancels (gelu's
                # x·(1 + erf(x/√2))/2 for x ≪ 0) is accurate relative to its inputs, not its
                # result: that error is measured in units of u·max(Σ|xᵢ|, |f|) (the larger, so a
                # function growing far faster than its input, erfcx, is still scored relative
                # to its result).
                calm = ok & well_conditioned(sensitivity, magnitude, scale)
                if bool(calm.any()):
                    forward = max(forward, float(relative[calm].max()))
                rough = ok & ~calm
                if bool(rough.any()):
                    excess = (err - 2 * u * scale).clamp(min=0)
                    beyond = excess / (u * torch.maximum(magnitude, scale).clamp(min=tiny))
                    backward = max(backward, float(beyond[rough].max()))
                    # The same error against the function's slope: a kernel accurate for its
                    # inputs errs by about u·Σ|xᵢ·∂f/∂xᵢ|. Where the slope is 0 (a clamped input,
                    # or float64 quantized there) it says nothing, and the simulation keeps the
                    # input's scale there (`ill_conditioned_scale`): not measured either.
                    sloped = rough & (sensitivity > 0)
                    if bool(sloped.any()):
                        by_slope = max(by_slope, float((excess / (u * torch.maximum(sensitivity, scale).clamp(min=tiny)))
                                                       [sloped].max()))
                        ill += int(sloped.sum())
            else:
                forward = max(forward, float(relative[ok].max()))
            elements += int(ok.sum())
            if single is not None and i < len(single):
                rounded = single[i].detach().cpu().to(dtype).double()
                spacing = 2 * u * rounded.abs().clamp(min=tiny)
                agree = ((y - rounded).abs() <= spacing) | (~torch.isfinite(y) & (y.isnan() == rounded.isnan()))
                agreeing += int(agree.sum())
                compared += agree.numel()
        if not elements:
            return
        entry = self.seen.setdefault(name, {}).setdefault(_dtype_name(dtype), {
            "max_u": 0.0, "elements": 0, "calls": 0, "agreeing": 0, "compared": 0})
        entry["max_u"] = max(entry["max_u"], forward)
        if sensitivity is not None:
            entry["backward_u"] = max(entry.get("backward_u", 0.0), backward)
            entry["sensitivity_u"] = max(entry.get("sensitivity_u", 0.0), by_slope)
            entry["ill_elements"] = entry.get("ill_elements", 0) + ill
        entry["elements"] += elements
        entry["calls"] += 1
        entry["agreeing"] += agreeing
        entry["compared"] += compared


# Ill-conditioned elements a pointwise op's `sensitivity_u` must rest on before the simulation
# bounds its error by the function's slope: a few samples that happen to be benign must not
# narrow the spread of a formula that cancels elsewhere.
SENSITIVITY_EVIDENCE = 64
# A kernel whose every ill-conditioned sample erred by at most this many u·max(Σ|xᵢ·∂f/∂xᵢ|, |f|)
# computes an accurate formula of its inputs (backward stable): its error follows the slope.
BACKWARD_STABLE_U = 4.0
# An element is well conditioned where Σ|xᵢ ∂f/∂xᵢ| ≤ this multiple of |f|.
WELL_CONDITIONED = 4.0


def well_conditioned(sensitivity: torch.Tensor, magnitude: torch.Tensor, value: torch.Tensor,
                     threshold: float = WELL_CONDITIONED) -> torch.Tensor:
    """Elements where Σ|xᵢ ∂f/∂xᵢ| ≤ threshold·|f|. A zero slope at nonzero inputs is
    float64 itself quantized there (1 + erf moves in steps of 1e-16): no figure, so not
    well conditioned either."""
    return (sensitivity <= threshold * value) & ((sensitivity > 0) | (magnitude == 0))


# Where the simulation adds the measured error relative to its inputs (`backward_u`) of a
# kernel whose formula cancels (`_analytic_terms`: GELU's 1 + erf): wherever the function
# amplifies its inputs' relative error at all. The measurement splits its samples at
# WELL_CONDITIONED, and OpInfo's few samples of GELU missed the band below it where the
# formula already errs relative to its input (x = −2.06, κ = 3.98: 46 u of its result, where
# the forward bound is 17.5). Other functions keep the measurement's split: their forward
# bound was measured on that band (polygamma's, widened there, hid an injected 1e-4).
AMPLIFYING = 1.0
# fp16/bf16 results that are the float32 computation rounded once, within one ulp, on at
# least this share of elements: the kernel's opmath is float32 (ill-conditioned samples
# differ either way).
OPMATH_SHARE = 0.99


def input_magnitude(args: tuple, dtype: Any, shape: Any) -> Any:
    """Σ|xᵢ| per element over a pointwise op's tensor inputs of `dtype` (broadcast to `shape`)."""
    total = torch.zeros(shape, dtype=torch.float64)
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype == dtype:
            total = total + a.detach().double().cpu().abs().expand(shape)
    return total


# The ops `_closed_form_terms` knows, with how many positional arguments it gives a term for.
CLOSED_FORM_TERMS = {"lerp": 3, "addcmul": 3, "addcdiv": 3, "tanh_backward": 2, "sigmoid_backward": 2}


def _closed_form_terms(name: str, args: tuple, kwargs: dict) -> list[Any] | None:
    """xᵢ·∂f/∂xᵢ for each argument of an op that is a sum of terms each linear in one argument
    (lerp's, addcmul's, addcdiv's) or a gradient g times a quadratic in the output y (tanh's
    backward g·(1 − y²), sigmoid's g·y·(1 − y)): exactly what central differences find (they
    are exact for a quadratic), in a few passes instead of a dozen per argument, on tensors or
    NumPy arrays alike. None for any other op."""
    if name == "lerp" and len(args) >= 2:
        start, end = args[:2]
        weight = args[2] if len(args) > 2 else kwargs["weight"]
        return [start * (1 - weight), end * weight, weight * (end - start)]
    if name in ("addcmul", "addcdiv") and len(args) >= 3:
        start, t1, t2 = args[:3]
        term = kwargs.get("value", 1) * (t1 * t2 if name == "addcmul" else t1 / t2)  # `value`: keyword-only
        return [start, term, term]  # t2·∂(t1/t2)/∂t2 = −t1/t2: the same magnitude
    if name == "tanh_backward" and len(args) == 2:
        g, y = args
        return [g * (1 - y * y), -2 * g * y * y]
    if name == "sigmoid_backward" and len(args) == 2:
        g, y = args
        return [g * y * (1 - y), g * y * (1 - 2 * y)]
    return None


ANALYTIC_TERMS = {"gelu"}  # the ops `_analytic_terms` knows


def _analytic_terms(name: str, args: tuple, kwargs: dict) -> list[Any] | None:
    """x·f′(x) of a function whose float64 kernel cancels where the function does not, from
    formulas that keep their digits there; None for any other op. GELU's float64
    x·(1 + erf(x/√2))/2 moves in steps of 1e-16 for x ≪ 0 (1 + erf is quantized at float64's
    spacing near −1): central differences across such a plateau find x·f′ = f, "well
    conditioned", where the function is as sensitive as x² times its value, and its float32
    kernel (the same formula) errs by about u·|x|, a hundred times its result or more. From
    erfc and the logistic function (0.5·(1 + tanh z) = σ(2z)) the slope keeps its digits."""
    if name not in ANALYTIC_TERMS or not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    if kwargs.get("approximate", args[1] if len(args) > 1 else "none") == "tanh":
        k, a = math.sqrt(2 / math.pi), 0.044715
        s = torch.sigmoid(2 * k * (x + a * x * x * x))
        slope = s + x * s * (1 - s) * 2 * k * (1 + 3 * a * x * x)
    else:
        slope = 0.5 * torch.special.erfc(-x / math.sqrt(2)) + x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    return [x * slope]


# Up to this many elements the conditioning of an op with closed-form terms is found in
# NumPy: a few dozen passes over a small value are mostly the calls' overhead (an optimizer's
# `lerp_`, `addcmul_`, `addcdiv_` on every parameter, every step: a quarter of a training
# loop's simulated rounding in torch; `tanh_backward` on every hidden layer, every step).
NUMPY_CONDITIONING_ELEMENTS = 1 << 12


def ill_conditioned_scale(func: Any, args: tuple, kwargs: dict, slope_ratio: float | None = None,
                          value: torch.Tensor | None = None) -> torch.Tensor | None:
    """Where pointwise `func` (out of place) is ill-conditioned on these float64 arguments
    (Σ|xᵢ·∂f/∂xᵢ| above WELL_CONDITIONED·|f|, or AMPLIFYING·|f| for a formula that cancels)
    and every input is finite: the scale
    max(Σ|xᵢ|, |f|) there and 0 elsewhere; None where it is well conditioned everywhere or has
    no sensitivity figure. With the kernel's `slope_ratio` (`KernelTable.sensitivity_ratio`),
    the scale is at most that multiple of max(Σ|xᵢ·∂f/∂xᵢ|, |f|). `value`: `func`'s result on
    these arguments, where the caller has it."""
    value = func(*args, **kwargs) if value is None else value
    name = func.overloadpacket.__name__.rstrip("_")
    if value.numel() <= NUMPY_CONDITIONING_ELEMENTS and name in CLOSED_FORM_TERMS \
            and len(args) <= CLOSED_FORM_TERMS[name]:
        return _ill_conditioned_scale_numpy(name, args, kwargs, value, slope_ratio)
    sens = input_sensitivity(func, args, kwargs, torch.float64, value.shape)
    if sens is None:
        return None
    magnitude = input_magnitude(args, torch.float64, value.shape)
    # An infinite input's result is IEEE's special case (logaddexp(x, −inf) = x, exactly): no
    # scale, and the forward bound holds there.
    threshold = AMPLIFYING if name in ANALYTIC_TERMS else WELL_CONDITIONED
    ill = ~well_conditioned(sens, magnitude, value.abs(), threshold) & torch.isfinite(magnitude)
    if not bool(ill.any()):
        return None
    scale = torch.maximum(magnitude, value.abs())
    if slope_ratio is not None:  # where the function has a slope (not clamped flat: `logit`'s eps)
        scale = torch.where(sens > 0, torch.minimum(scale, slope_ratio * torch.maximum(sens, value.abs())), scale)
    return torch.where(ill, scale, 0.0)


def _ill_conditioned_scale_numpy(name: str, args: tuple, kwargs: dict, value: torch.Tensor,
                                 slope_ratio: float | None = None) -> torch.Tensor | None:
    """`ill_conditioned_scale` of an op with closed-form terms (`_closed_form_terms`), in NumPy: the
    same IEEE operations in the same order as `input_sensitivity`, `input_magnitude` and
    `well_conditioned`, so the same scale bit for bit."""
    shape = tuple(value.shape)
    arrays = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
    linear = _closed_form_terms(name, tuple(arrays), {k: v.numpy() if isinstance(v, torch.Tensor) else v
                                                      for k, v in kwargs.items()})
    f = np.abs(value.numpy())

    def spread(x: Any) -> np.ndarray:  # `expand`, without NumPy's cost where the shape is the result's already
        x = np.asarray(x, dtype=np.float64)
        return x if x.shape == shape else np.broadcast_to(x, shape)

    sens = None
    magnitude = np.zeros(shape)
    for j, (a, x) in enumerate(zip(args, arrays, strict=True)):
        if not isinstance(a, torch.Tensor) or a.dtype != torch.float64:
            continue
        magnitude = magnitude + spread(np.abs(x))
        if _broadcasts_to(x.shape, shape):
            term = spread(np.abs(linear[j]))
            term = np.where(np.isfinite(term), term, math.inf)
            sens = term if sens is None else sens + term
    if sens is None:
        return None
    ill = ~((sens <= WELL_CONDITIONED * f) & ((sens > 0) | (magnitude == 0))) & np.isfinite(magnitude)
    if not ill.any():
        return None
    scale = np.maximum(magnitude, f)
    if slope_ratio is not None:
        scale = np.where(sens > 0, np.minimum(scale, slope_ratio * np.maximum(sens, f)), scale)
    return torch.from_numpy(np.where(ill, scale, 0.0))


def _in_float64(a: Any, dtype: Any) -> Any:
    """An argument with tensors of `dtype` in float64 and `dtype` itself named float64."""
    if isinstance(a, torch.Tensor):
        return a.double() if a.dtype == dtype else a
    if isinstance(a, (list, tuple)):
        return type(a)(_in_float64(x, dtype) for x in a)
    return torch.float64 if a is dtype else a


def _broadcasts_to(shape: Any, result: Any) -> bool:
    """Whether an operand of `shape` broadcast against `result` gives `result`: each of its
    dimensions, aligned from the last, 1 or the result's. By hand: `torch.broadcast_shapes`
    costs 60–190 µs a call, and an optimizer's `lerp_`, `addcmul_` and `addcdiv_` ask it for
    every operand of every parameter, every step (a seventh of a training loop's simulation)."""
    return len(shape) <= len(result) and all(
        s == 1 or s == r for s, r in zip(reversed(tuple(shape)), reversed(tuple(result)), strict=False))


def input_sensitivity(func: Any, args: tuple, kwargs: dict, dtype: Any, shape: Any) -> Any:
    """Σ|xᵢ·∂f/∂xᵢ| per element of a pointwise op's result, by central differences in
    float64 over each tensor input (broadcast to the result: `addcdiv(x, t1[:, None], t2[None])`'s
    quotient term cancels against x as much as a full-size one; None where there is none);
    exactly for an op whose terms have a closed form (`_closed_form_terms`)."""
    wide = [_in_float64(a, dtype) for a in args]
    wide_kwargs = {k: _in_float64(v, dtype) for k, v in kwargs.items()}
    name = func.overloadpacket.__name__.rstrip("_")
    linear = _closed_form_terms(name, tuple(wide), wide_kwargs) or _analytic_terms(name, tuple(wide), wide_kwargs)
    total = None
    for j, a in enumerate(wide):
        if not isinstance(a, torch.Tensor) or a.dtype != torch.float64 or not _broadcasts_to(a.shape, shape):
            continue
        if linear is not None and j < len(linear):
            term = torch.as_tensor(linear[j], dtype=torch.float64).abs().expand(shape)
        else:
            # A coarse step: float64 itself is quantized where the formula cancels (1 + erf(x)
            # at x = -7 moves in steps of 4e-5 of itself), and an order of magnitude is all
            # the conditioning test needs.
            h = (a.abs() * 1e-3).clamp(min=1e-300)
            moved = [list(wide), list(wide)]
            moved[0][j], moved[1][j] = a + h, a - h
            slope = (func(*moved[0], **wide_kwargs) - func(*moved[1], **wide_kwargs)) / (2 * h)
            term = (a * slope).abs().expand(shape)
        term = torch.where(torch.isfinite(term), term, math.inf)
        total = term if total is None else total + term
    return total
