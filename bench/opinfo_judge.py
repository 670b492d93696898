"""The rounding judge on PyTorch's own op database: `python bench/judge.py --opinfo`.

Every OpInfo entry of `op_db` (the ops PyTorch tests, on the sample inputs it tests them
with) on CPU at float32, float16 and bfloat16, up to `--opinfo-samples` samples each:

(a) the real eager kernel's value judged against the rounding spread of its own recorded
    computation (K = 29, sampled further at the Monte Carlo floor as `triage run` does):
    "outside" is a false alarm, and one outside by more than the audit's margin is a false
    `likely-bug` (nearer, triage says `inconclusive`);
(b) with `--opinfo-compile N`, the inductor-compiled value of the first float32 sample of N
    ops judged against the same spread: "outside" is a false alarm;
(c) float32 only: the recorded graph re-run with one op's output × (1 + ε), ε = 1e-4 and 1e-5,
    judged against the unperturbed spread; "effective" injections are those whose float64
    effect on the output is at least ε/10 normwise (an exact op downstream can erase one).

Ops that draw random numbers, return no floating tensor, or whose samples the recorder or
the float64 replay cannot take are counted as not judged, with the reason. The table is per
op family (unary, binary, reduction, linalg, nn.functional, special, other).
"""
from __future__ import annotations

import random
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import judge as bench  # noqa: E402 - bench/judge.py, run as a script from bench/
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _matrix_exp_wrong(dtype: torch.dtype) -> str | None:
    """Whether this torch's CPU `matrix_exp` is wrong at `dtype` on a matrix nothing is wrong
    with: exp(0.5·I) should be 1.6487·I. (torch 2.13: -21040 in fp16, -1.3e30 in bf16, and NaN
    for any norm between 0.05 and 0.3. By its source, the half kernels take the float64 path,
    whose T12/T18 coefficient tables are float64 values that `from_blob` reads as the half
    dtype.)"""
    out = torch.linalg.matrix_exp(0.5 * torch.eye(3, dtype=dtype))
    expected = torch.eye(3, dtype=torch.float64) * 1.6487212707001282
    if torch.allclose(out.double(), expected, rtol=0.02, atol=0.02):
        return None
    return f"matrix_exp(0.5·I) = {float(out[0, 0]):.5g}·I at {str(dtype).removeprefix('torch.')}, not 1.6487·I"


# Kernels this torch gets wrong on inputs nothing is wrong with, each checked when the bench
# runs: a value of theirs outside its spread is a finding of the judge, not a false alarm.
KERNEL_BUGS: dict[str, Callable[[torch.dtype], str | None]] = {"matrix_exp": _matrix_exp_wrong}


def kernel_bug(op: str, dtype: str) -> str | None:
    """The evidence that `op` at `dtype` (a DTYPES key) is wrong on this torch, or None."""
    check = KERNEL_BUGS.get(op)
    return check(DTYPES[dtype]) if check is not None and dtype in DTYPES else None


@dataclass
class OpResult:
    op: str
    family: str
    dtype: str
    judged: int = 0
    not_judged: Counter = field(default_factory=Counter)
    outside: list[str] = field(default_factory=list)  # eager false alarms (sample index: statistic)
    findings: int = 0  # of those, far enough out for a likely-bug (the audit's margin)
    compiled: int = 0
    compiled_outside: list[str] = field(default_factory=list)
    injections: list[dict[str, Any]] = field(default_factory=list)
    not_injected: Counter = field(default_factory=Counter)  # samples judged but given no injection, by reason


def family(info: Any) -> str:
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo

    name = info.name
    if name.startswith("linalg.") or name in ("det", "inverse", "pinverse", "svd", "qr", "cholesky", "lu",
                                               "matrix_exp", "logdet", "slogdet", "triangular_solve", "lu_solve",
                                               "cholesky_solve", "cholesky_inverse", "geqrf", "ormqr", "eig", "symeig"):
        return "linalg"
    if name.startswith("special.") or name in ("lgamma", "digamma", "polygamma", "mvlgamma", "erfinv", "i0", "igamma",
                                                 "igammac"):
        return "special"
    if name.startswith("nn.functional."):
        return "nn.functional"
    if isinstance(info, UnaryUfuncInfo):
        return "unary"
    if isinstance(info, BinaryUfuncInfo):
        return "binary"
    if isinstance(info, ReductionOpInfo) or name in ("sum", "mean", "prod", "cumsum", "cumprod", "var", "std",
                                                      "logsumexp", "norm", "nansum", "var_mean", "std_mean"):
        return "reduction"
    return "other"


def _called(info: Any, flat: list, spec: Any, slots: list[int], tensors: tuple) -> Any:
    """The op on the sample's (input, args, kwargs) with `tensors` in its tensor slots."""
    full = list(flat)
    for i, t in zip(slots, tensors, strict=False):
        full[i] = t
    x, args, kwargs = tree_unflatten(full, spec)
    return info(x, *args, **kwargs)


def as_case(info: Any, sample: Any) -> tuple[Callable, tuple] | None:
    """The sample as `fn(*tensors)`: every tensor of (input, args, kwargs) a leaf."""
    flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    if not slots:
        return None
    tensors = tuple(flat[i] for i in slots)

    def fn(*ts: torch.Tensor) -> torch.Tensor:
        out = _called(info, flat, spec, slots, ts)
        tensors_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        # The first floating output, else the first complex one (eig's, an FFT's).
        floats = [t for t in tensors_out if t.is_floating_point()] or [t for t in tensors_out if t.is_complex()]
        if not floats:
            raise TypeError("no floating output")
        return floats[0]

    return fn, tensors


def own_spread(result: OpResult, graph: Any, node: Any, out: torch.Tensor, dt: torch.dtype) -> tuple[Any, Any]:
    """The value's float64 reference and its spread, as `triage run` simulates it for the arm
    that computed `out` (counted as judged); (None, None) with the reason counted where there
    is none."""
    try:
        ref = bench.replay_fp64(graph, {node.name}, 60).values[node.name]
        spread, _, why = bench.simulate(graph, node, ref, dt, bench.K_DEFAULT, value=out)
    except Exception as e:  # noqa: BLE001
        result.not_judged[f"simulate: {type(e).__name__}: {str(e)[:40]}"] += 1
        return None, None
    if spread is None:
        result.not_judged[f"not judged: {(why or '?')[:60]}"] += 1
        return None, None
    result.judged += 1
    return ref, spread


def run_op(info: Any, dtype: str, samples: int, compile_this: bool, rng: random.Random) -> OpResult:
    result = OpResult(info.name + (f".{info.variant_test_name}" if info.variant_test_name else ""), family(info), dtype)
    dt = DTYPES[dtype]
    try:
        inputs = list(info.sample_inputs("cpu", dt, requires_grad=False))[:samples]
    except Exception as e:  # noqa: BLE001 - an op whose samples cannot be built
        result.not_judged[f"samples: {type(e).__name__}"] += 1
        return result
    for index, sample in enumerate(inputs):
        case = as_case(info, sample)
        if case is None:
            result.not_judged["no tensor input"] += 1
            continue
        fn, tensors = case
        try:
            graph, node, out = bench.record(fn, tensors)
        except Exception as e:  # noqa: BLE001 - the op rejects its own sample, or the recorder cannot take it
            result.not_judged[f"record: {type(e).__name__}"] += 1
            continue
        if node is None or not isinstance(out, torch.Tensor) or out.dtype not in (dt, bench.COMPLEX_OF.get(dt)) \
                or out.numel() == 0:
            result.not_judged["output not of the sample's dtype"] += 1
            continue
        ref, spread = own_spread(result, graph, node, out, dt)
        if spread is None:
            continue
        j = bench.judge(out, spread, "eager")
        if j.zone == "outside":
            result.outside.append(f"sample {index}: {j.statistic:.3g}σ (samples {j.max_sample_stat or 0:.3g}σ, "
                                  f"K = {j.samples}){'' if bench._a_finding(j) else ', fragile'}")
            result.findings += bench._a_finding(j)
        if compile_this and index == 0 and dtype == "fp32":
            try:
                value, _ = bench.compiled_value(fn, tensors)
                result.compiled += 1
                jc = bench.judge(value, spread, "compile")
                if jc.zone == "outside":
                    result.compiled_outside.append(f"{jc.statistic:.3g}σ (samples {jc.max_sample_stat or 0:.3g}σ)")
            except Exception:  # noqa: BLE001 - an op inductor cannot compile is not a judge result
                pass
        if dtype != "fp32":
            continue
        order = bench.cone(node)
        base = bench.rerun(order, wide=False)
        sites = bench.injection_sites(order, base)
        if not sites:
            continue
        # The eager value's spread may have stopped early (that value certainly inside): an
        # injected value is judged against the full K = 29, as an arm's own value would be.
        spread, _, why = bench.simulate(graph, node, ref, dt, bench.K_DEFAULT)
        if spread is None:
            continue
        site = rng.choice(sites)
        try:
            wide_base = bench.rerun(order, wide=True)[node]
        except Exception as e:  # noqa: BLE001 - an op that refuses float64 (linear_cross_entropy's float32 accumulator)
            result.not_injected[f"float64 re-run: {type(e).__name__}"] += 1
            continue
        for eps in bench.EPSILONS:
            value = bench.rerun(order, wide=False, inject=site, eps=eps)[node]
            effect = bench.normwise(bench.rerun(order, wide=True, inject=site, eps=eps)[node], wide_base)
            ji = bench.judge(value, spread, "injected")
            result.injections.append({"eps": eps, "effective": effect >= eps / 10, "zone": ji.zone,
                                      "finding": bench._a_finding(ji), "site": str(site.target),
                                      "statistic": ji.statistic})
    return result


def report(results: list[OpResult], seconds: float) -> None:
    bench.table_head("OpInfo: the real eager kernel against its own spread (a false alarm unless a kernel bug "
                     "below), K = 29",
                     ["family", "dtype", "ops", "samples judged", "not judged", "eager outside",
                      "eager outside by the audit's margin (a likely-bug)", "compiled outside"])
    groups = bench.grouped(results, lambda r: (r.family, r.dtype))
    total = [0, 0, 0, 0, 0, 0]
    for (fam, dtype) in sorted(groups):
        rs = groups[(fam, dtype)]
        judged = sum(r.judged for r in rs)
        nj = sum(sum(r.not_judged.values()) for r in rs)
        out = sum(len(r.outside) for r in rs)
        comp = sum(r.compiled for r in rs)
        comp_out = sum(len(r.compiled_outside) for r in rs)
        found = sum(r.findings for r in rs)
        total = [total[0] + judged, total[1] + nj, total[2] + out, total[3] + comp, total[4] + comp_out, total[5] + found]
        print(f"| {fam} | {dtype} | {len(rs)} | {judged} | {nj} | {bench.pct(out, judged)} | {bench.pct(found, judged)} "
              f"| {bench.pct(comp_out, comp)} |")
    print(f"| **all** | all | {len(results)} | {total[0]} | {total[1]} | **{bench.pct(total[2], total[0])}** | "
          f"**{bench.pct(total[5], total[0])}** | **{bench.pct(total[4], total[3])}** |")
    bench.table_head("OpInfo: detection of an injected error (float32; one op's output × (1 + ε))",
                     ["family", "ε", "injections", "effective", "outside, effective", "a finding, effective"])
    for fam in sorted({r.family for r in results}):
        for eps in bench.EPSILONS:
            inj = [i for r in results if r.family == fam for i in r.injections if i["eps"] == eps]
            eff = [i for i in inj if i["effective"]]
            print(f"| {fam} | {eps:g} | {len(inj)} | {len(eff)} | "
                  f"{bench.pct(sum(i['zone'] == 'outside' for i in eff), len(eff))} | "
                  f"{bench.pct(sum(i['finding'] for i in eff), len(eff))} |")
    for eps in bench.EPSILONS:
        eff = [i for r in results for i in r.injections if i["eps"] == eps and i["effective"]]
        print(f"| **all** | {eps:g} | | {len(eff)} | **{bench.pct(sum(i['zone'] == 'outside' for i in eff), len(eff))}** | "
              f"**{bench.pct(sum(i['finding'] for i in eff), len(eff))}** |")
    outside = [(r, s, kernel_bug(r.op, r.dtype)) for r in results for s in r.outside]
    alarms = [(r, s) for r, s, bug in outside if bug is None]
    bugs = [(r, s, bug) for r, s, bug in outside if bug is not None]
    if bugs:
        judged = sum(r.judged for r in results)
        print(f"\nOf the eager values outside, {len(bugs)} are a kernel this torch gets wrong (checked on "
              f"a plain input as the bench ran): the judge's findings. False alarms: "
              f"{bench.pct(len(alarms), judged)}.\n")
        for r, s, bug in bugs:
            print(f"- `{r.op}` {r.dtype} {s}: {bug}")
    if alarms:
        print("\nFalse alarms (op, dtype, sample: statistic):\n")
        for r, s in alarms[:60]:
            print(f"- `{r.op}` {r.dtype} {s}")
        if len(alarms) > 60:
            print(f"- … and {len(alarms) - 60} more")
    missed = [(r, i) for r in results for i in r.injections if i["effective"] and i["zone"] != "outside"]
    if missed:
        print("\nEffective injections judged inside (op, ε, the op injected: statistic):\n")
        for r, i in missed[:60]:
            print(f"- `{r.op}` {i['eps']:g} `{i['site']}`: {i['statistic'] or 0:.3g}σ")
    reasons = Counter()
    for r in results:
        reasons.update(r.not_judged)
    print("\nNot judged, by reason: " + "; ".join(f"{k} ({v})" for k, v in reasons.most_common(8)))
    skipped = Counter()
    for r in results:
        skipped.update(r.not_injected)
    if skipped:
        print("\nJudged but not injected, by reason: " + "; ".join(f"{k} ({v})" for k, v in skipped.most_common(8)))
    print(f"\nOpInfo wall time: {seconds:.0f} s.")


# -- gradients ------------------------------------------------------------------------------
def gradient_case(info: Any, sample: Any, index: int) -> tuple[Callable, tuple] | None:
    """The sample's gradient as `fn(*tensors)`: the first floating output's vector-Jacobian
    product with a fixed random cotangent (seeded by the sample's index, drawn before the
    recording), with respect to the first input that requires a gradient."""
    flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    wrt = next((j for j, i in enumerate(slots) if flat[i].requires_grad and flat[i].is_floating_point()), None)
    if wrt is None:
        return None
    tensors = tuple(flat[i] for i in slots)

    def output(ts: tuple) -> torch.Tensor:
        floats = [t for t in tree_flatten(_called(info, flat, spec, slots, ts))[0]
                  if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
        if not floats:
            raise TypeError("no differentiable floating output")
        return floats[0]

    shape = output(tensors).shape
    cotangent = torch.randn(shape, generator=torch.Generator().manual_seed(index), dtype=torch.float64)

    def fn(*ts: torch.Tensor) -> torch.Tensor:
        out = output(ts)
        (grad,) = torch.autograd.grad(out, ts[wrt], cotangent.to(out.dtype))
        return grad

    return fn, tensors


# Elements of the dense inputs a one-input op's gradient is also judged on (`dense_samples`).
DENSE_ELEMENTS = 1 << 16


def dense_samples(info: Any, inputs: list, dt: torch.dtype) -> list:
    """For an op of one tensor input and nothing else (a unary ufunc, an activation), two
    more samples the calibration never saw: its domain on a uniform grid, where a derivative's
    roots and saturations lie (silu's at −1.28, tanh's 1 − y² past |x| ≈ 9), and normal values
    of standard deviation 3."""
    from torch.testing._internal.opinfo.core import SampleInput

    if not inputs or inputs[0].args or inputs[0].kwargs or not isinstance(inputs[0].input, torch.Tensor):
        return []
    if not all(_no_larger_than_its_input(info, sample) for sample in inputs):
        return []  # `diag_embed` of 65,536 values: 34 GB, and torch's kernel crashes when it cannot have them
    low, high = getattr(info, "domain", (None, None)) or (None, None)
    low = -20.0 if low is None else max(float(low), -20.0)
    high = 20.0 if high is None else min(float(high), 20.0)
    # Open at both ends: a domain's bound (log's 0, acosh's 1) is no point of it.
    grid = torch.linspace(low, high, DENSE_ELEMENTS + 2, dtype=torch.float64)[1:-1]
    normal = (torch.randn(DENSE_ELEMENTS, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 3
              ).clamp(low + 1e-3, high - 1e-3)
    return [SampleInput(x.to(dt).requires_grad_()) for x in (grid, normal)]


def _no_larger_than_its_input(info: Any, sample: Any) -> bool:
    """Whether the op's outputs on this sample have no more elements than its input: an
    elementwise function's do, an op that builds a matrix from a vector's (`diag_embed`,
    `vander`) do not."""
    try:
        with torch.no_grad():
            out = info(sample.input, *sample.args, **sample.kwargs)
    except Exception:  # noqa: BLE001 - a sample the op rejects: no dense samples either
        return False
    return all(t.numel() <= max(1, sample.input.numel()) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))


def record_with_grad(fn: Callable, inputs: tuple) -> tuple[Any, Any, torch.Tensor]:
    """`bench.record` with autograd on: the recorder sees the backward's calls too."""
    rec = bench.OpRecorder(torch.device("cpu"), site=lambda: None)
    with torch.enable_grad(), rec:
        out = fn(*inputs)
    node = rec.lookup(out)
    return rec.finish().graph, node, out.detach()


def backward_kernels(graph: Any) -> set[str]:
    """The pointwise backward kernels (``tanh_backward`` …) a recorded graph calls."""
    return {n.target.overloadpacket.__name__ for n in graph.nodes
            if isinstance(n.target, torch._ops.OpOverload) and n.target.overloadpacket.__name__.endswith("_backward")
            and torch.Tag.pointwise in n.target.tags}


def run_gradient(info: Any, dtype: str, samples: int) -> tuple[OpResult, set[str]]:
    """Each sample's gradient judged against its own spread; and the pointwise backward
    kernels its graphs called."""
    result = OpResult(info.name + (f".{info.variant_test_name}" if info.variant_test_name else ""), family(info), dtype)
    dt = DTYPES[dtype]
    kernels: set[str] = set()
    try:
        inputs = list(info.sample_inputs("cpu", dt, requires_grad=True))[:samples]
    except Exception as e:  # noqa: BLE001 - an op whose samples cannot be built
        result.not_judged[f"samples: {type(e).__name__}"] += 1
        return result, kernels
    for index, sample in enumerate(inputs + dense_samples(info, inputs, dt)):
        try:
            case = gradient_case(info, sample, index)
            if case is None:
                result.not_judged["no input to differentiate"] += 1
                continue
            graph, node, out = record_with_grad(*case)
        except Exception as e:  # noqa: BLE001 - a sample whose gradient cannot be taken or recorded
            result.not_judged[f"gradient: {type(e).__name__}"] += 1
            continue
        if node is None or out.dtype != dt or out.numel() == 0:
            result.not_judged["gradient not of the sample's dtype"] += 1
            continue
        _, spread = own_spread(result, graph, node, out, dt)
        if spread is None:
            continue
        called = backward_kernels(graph)
        kernels |= called
        j = bench.judge(out, spread, "eager")
        if j.zone == "outside":
            result.outside.append(f"sample {index}: {j.statistic:.3g}σ (samples {j.max_sample_stat or 0:.3g}σ, "
                                  f"K = {j.samples}){'' if bench._a_finding(j) else ', fragile'}"
                                  + (f", through {', '.join(sorted(called))}" if called else ""))
            result.findings += bench._a_finding(j)
    return result, kernels


def main_gradients(samples: int, only: list[str] | None) -> list[str]:
    """The OpInfo gradients bench: every differentiable op's gradient on CPU at float32,
    float16 and bfloat16, judged against its own spread (a false alarm when outside; no kernel
    here is known wrong); the table per family, and separately the gradients whose graph calls
    a pointwise backward kernel. Returns the ops that crashed the bench itself."""
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db  # needs expecttest

    start = time.monotonic()
    from triage.worker.kernel_errors import aborts_in_backward

    infos = [i for i in op_db if (not only or i.name in only) and i.supports_autograd]
    results, crashed, through, aborting = [], [], {}, []
    for n, info in enumerate(infos):
        for dtype, dt in DTYPES.items():
            if dt not in info.supported_backward_dtypes("cpu"):
                continue
            if aborts_in_backward(info.name, "cpu", dt):  # the process would die in torch's kernel
                aborting.append(f"`{info.name}` {dtype}")
                continue
            try:
                result, kernels = run_gradient(info, dtype, samples)
                results.append(result)
                if kernels:
                    through[(result.op, dtype)] = kernels
            except Exception:  # noqa: BLE001 - the bench names what it could not run
                crashed.append(f"{info.name} {dtype}")
                print(f"CRASH {info.name} {dtype}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if (n + 1) % 50 == 0:
            print(f"  … {n + 1}/{len(infos)} ops, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    bench.table_head("OpInfo gradients: the eager gradient against its own spread (a false alarm), K = 29",
                     ["family", "dtype", "ops", "gradients judged", "not judged", "outside",
                      "outside by the audit's margin (a likely-bug)"])
    groups = bench.grouped(results, lambda r: (r.family, r.dtype))
    for key in sorted(groups) + ["all", "backward kernels"]:
        rs = results if key == "all" else [r for r in results if (r.op, r.dtype) in through] \
            if key == "backward kernels" else groups[key]
        fam, dtype = (f"**{key}**", "all") if isinstance(key, str) else key
        judged = sum(r.judged for r in rs)
        print(f"| {fam} | {dtype} | {len(rs)} | {judged} | {sum(sum(r.not_judged.values()) for r in rs)} | "
              f"{bench.pct(sum(len(r.outside) for r in rs), judged)} | {bench.pct(sum(r.findings for r in rs), judged)} |")
    called = sorted(set().union(*through.values())) if through else []
    print(f"\nThe gradients of {len(through)} op × dtype called a pointwise backward kernel: "
          + ", ".join(f"`{k}`" for k in called) + ".")
    alarms = [(r, s) for r in results for s in r.outside]
    if alarms:
        print("\nFalse alarms (op, dtype, sample: statistic):\n")
        for r, s in alarms[:60]:
            print(f"- `{r.op}` {r.dtype} {s}")
        if len(alarms) > 60:
            print(f"- … and {len(alarms) - 60} more")
    reasons = Counter()
    for r in results:
        reasons.update(r.not_judged)
    print("\nNot judged, by reason: " + "; ".join(f"{k} ({v})" for k, v in reasons.most_common(8)))
    if aborting:
        print(f"\nNot run (this torch's CPU kernel aborts the process: `kernel_errors.BACKWARD_CRASHES`): "
              f"{', '.join(aborting)}.")
    print(f"\nOpInfo gradients wall time: {time.monotonic() - start:.0f} s.")
    return crashed


def main(samples: int, compile_ops: int, only: list[str] | None) -> list[str]:
    """Run the OpInfo bench; returns the ops that crashed the bench itself."""
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db  # needs expecttest

    start = time.monotonic()
    rng = random.Random(26)
    infos = [i for i in op_db if not only or i.name in only]
    compile_names = {i.name for i in rng.sample(infos, min(compile_ops, len(infos)))}
    results, crashed = [], []
    for n, info in enumerate(infos):
        for dtype, dt in DTYPES.items():
            if dt not in info.supported_dtypes("cpu"):
                continue
            try:
                results.append(run_op(info, dtype, samples, info.name in compile_names, rng))
            except Exception:  # noqa: BLE001 - the bench names what it could not run
                crashed.append(f"{info.name} {dtype}")
                print(f"CRASH {info.name} {dtype}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if (n + 1) % 50 == 0:
            print(f"  … {n + 1}/{len(infos)} ops, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    report(results, time.monotonic() - start)
    return crashed
