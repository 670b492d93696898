"""Stage 4a, ablations: which switch makes a divergence go away.

Maintainers close most "CPU ≠ GPU" reports by naming a setting — TF32, reduced-precision
reductions, the thread count, mkldnn, inductor's RNG — and the way to *show* it is to flip
that one setting and watch the sides agree. For a divergence this stage re-runs the arms
involved with one switch changed at a time (an arm knob, see `arms/spec.py`), keeping everything
else, and compares the same observables again. Only switches that apply to an arm are
tried (TF32 on CUDA arms, `fallback_random` on compile arms, …); each result names the
accuracy-note section and the exact line a user sets. `classify` rests
`expected-precision-mode` (and the RNG and nondeterministic-kernel explanations) on these.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from triage import policy
from triage.arms.run import run_arms
from triage.compare import pair_divergence, side_of
from triage.model import AGREEING_OUTCOMES, Ablation, ArmRun, ArmSpec, Comparison, Divergence, Repro, find_side
from triage.reporter import QUIET, Reporter
from triage.settings import AblationSettings, RunSettings

LOW_PRECISION = ("float16", "bfloat16")
FP32 = ("float32", "complex64")


@dataclass(frozen=True)
class Switch:
    knob: str
    value: str
    devices: tuple[str, ...]  # device types it applies to ("" = any)
    compile_only: bool
    dtypes: tuple[str, ...] | None  # the diverging value's dtypes it can matter for (None: any)
    section: policy.Section
    setting: str  # the line a user writes
    verdict: str  # the verdict kind it supports when it makes the sides agree


# Each switch is tried only where it can change the numbers: TF32 touches fp32 matmuls and
# convolutions on CUDA; reduced-precision reductions, oneDNN's low-precision kernels and
# inductor's cast emulation fp16/bf16; inductor's RNG only compiled regions that draw random
# numbers; deterministic algorithms CUDA kernels (CPU kernels are deterministic for a fixed
# thread count, which `threads=1` tests).
SWITCHES = (
    Switch("tf32", "off", ("cuda",), False, FP32, policy.TF32,
           'torch.backends.cuda.matmul.fp32_precision = "ieee"; torch.backends.cudnn.conv.fp32_precision = "ieee"',
           "expected-precision-mode"),
    Switch("reduced_precision", "off", ("cuda",), False, LOW_PRECISION, policy.REDUCED_PRECISION,
           "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False; "
           "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False", "expected-precision-mode"),
    Switch("cudnn_benchmark", "off", ("cuda",), False, None, policy.GENERAL,
           "torch.backends.cudnn.benchmark = False", "expected-precision-mode"),
    Switch("threads", "1", ("cpu",), False, None, policy.GENERAL, "torch.set_num_threads(1)",
           "expected-precision-mode"),
    Switch("mkldnn", "off", ("cpu",), False, LOW_PRECISION, policy.GENERAL, "torch.backends.mkldnn.enabled = False",
           "expected-precision-mode"),
    # Inductor's float32 intermediates are no GEMM's reduced-precision accumulation: the note's
    # general promise (no bitwise identity for mathematically identical computations) covers them.
    Switch("emulate_precision_casts", "on", ("",), True, LOW_PRECISION, policy.GENERAL,
           "torch._inductor.config.emulate_precision_casts = True", "expected-precision-mode"),
    Switch("fallback_random", "on", ("",), True, None, policy.GENERAL,
           "torch._inductor.config.fallback_random = True", "nondeterministic"),
    Switch("deterministic", "on", ("cuda",), False, None, policy.GENERAL, "torch.use_deterministic_algorithms(True)",
           "nondeterministic"),
)


# The order the switches are tried in when ablations stop at the first that explains: those
# that name randomness first, because classify ranks a random explanation above any precision
# mode, then `SWITCHES` order, which is the order classify picks among precision modes.  So
# the first explanation found is the one the verdict would name had every switch run.
TRIAL_ORDER = sorted(SWITCHES, key=lambda s: s.verdict != "nondeterministic")
SWITCH_INDEX = {f"{s.knob}={s.value}": i for i, s in enumerate(SWITCHES)}  # results are listed in this order


def ablate(repro: Repro, comparison: Comparison, options: RunSettings, settings: AblationSettings,
           reporter: Reporter = QUIET) -> list[Ablation]:
    """One `Ablation` per applicable switch, in `SWITCHES` order, within the time budget;
    after the first that explains the divergence the rest are listed as not run, unless
    `settings.exhaustive`."""
    d = comparison.divergence
    if not settings.enabled or d is None or any(not r.completed for r in comparison.arms) or _explained(d, comparison):
        return []
    if _rounding_explains(d):
        return []
    runs = {r.spec: r for r in comparison.arms}  # an ablated variant may be an arm that already ran
    involved = [comparison.resolve(d.a)[0]]
    if d.b is not None and d.b.arm != d.a.arm:
        involved.append(comparison.resolve(d.b)[0])
    # The float64 replay matters only when the divergence is against float64.
    # The ablated runs are judged against the original arms' rounding spreads (same graph), so
    # they need no simulation of their own; the float64 replay only for a divergence against it.
    rerun = dataclasses.replace(options, reference=d.source == "reference", export_graphs=False,
                                rounding_samples=0)
    started, results = time.monotonic(), []
    dtypes = {s.dtype for s in (d.a, d.b) if s is not None} | {d.dtype}
    dtypes |= {t for r in involved for t in (r.graph or {}).get("dtypes", [])}
    random_in_compiled = any(r.compiled_random_ops for r in involved)
    explained_by: Ablation | None = None
    for switch in TRIAL_ORDER:
        if switch.dtypes is not None and not dtypes & set(switch.dtypes):
            continue
        if switch.knob == "fallback_random" and not random_in_compiled:
            continue
        variants = [_with(r.arm, switch) for r in involved]
        if all(v is None for v in variants):
            continue
        if switch.knob == "threads" and _nonfinite_where_finite(d) and _elementwise(d, involved):
            results.append(_result(switch, variants, involved, "skipped",
                                   "not run: no op that computes the value accumulates (no reduction or product "
                                   "whose order the thread count sets), and it is non-finite where float64 is finite"))
            continue
        if explained_by is not None:
            results.append(_result(switch, variants, involved, "skipped",
                                   f"not run: `{explained_by.switch}` already explains the divergence "
                                   "(`--all-ablations` runs every switch)"))
            continue
        if time.monotonic() - started > settings.budget_s:
            results.append(_result(switch, variants, involved, "skipped", "the ablation time budget ran out"))
            continue
        needed = [v for v in variants if v is not None and v.spec not in runs]
        t0 = time.monotonic()
        fresh = {r.spec: r for r in run_arms(repro, needed, rerun, reporter)} if needed else {}
        ablated = [fresh.get(v.spec) or runs.get(v.spec) if v is not None else r for v, r in zip(variants, involved, strict=False)]
        outcome, detail = _judge(d, ablated)
        inside = _inside_spreads(d, involved, ablated) if outcome in AGREEING_OUTCOMES else None
        if inside is False:
            detail += "; but outside the rounding spread of the original computation, so it explains nothing"
        result = _result(switch, variants, involved, outcome, detail, round(time.monotonic() - t0, 2))
        result.inside_spread = inside
        results.append(result)
        if result.explains and not settings.exhaustive:
            explained_by = result
    return sorted(results, key=lambda a: SWITCH_INDEX[a.switch])


def _explained(d: Divergence, comparison: Comparison) -> bool:
    """Divergences whose cause no switch can change, so the re-runs would be wasted: the
    sides start from different random or uninitialized values, a module runs in training
    mode, a value overflows its dtype's range, or only the bits of a zero or a NaN differ."""
    if any(a["differs"] and a["kind"] in ("random", "uninitialized") for a in d.ancestors):
        return True
    if d.distinct_draws:  # the script compares two separate random draws
        return True
    if d.how == "rerun":  # each run drew its own random numbers: no switch changes that
        return True
    if d.how == "repeat":
        modules = [comparison.resolve(side)[1].module or {} for side in (d.a, d.b)]
        if any(m.get("train_layers") for m in modules):
            return True
    sides = [s for s in (d.a, d.b) if s is not None]
    if any(s.overflow_to_inf and s.overflow_to_inf == s.nonfinite_vs_reference for s in sides):
        return True
    return d.bit_difference is not None


def _nonfinite_where_finite(d: Divergence) -> bool:
    """A side is inf or NaN where float64 gives a finite value its dtype can hold."""
    sides = [s for s in (d.a, d.b) if s is not None]
    return d.nonfinite_mismatch > 0 and any(s.nonfinite_vs_reference > s.overflow_to_inf for s in sides)


def _elementwise(d: Divergence, involved: list[ArmRun]) -> bool:
    """The diverging value is computed without accumulation, on every arm that recorded its
    op graph (at least one): no reduction or contraction whose order the thread count sets,
    so `threads=1` cannot turn a non-finite value of a finite computation into rounding."""
    from triage.arms.graph import OpGraph
    from triage.untrusted import UntrustedOutput

    sides = {s.arm: s for s in (d.a, d.b) if s is not None}
    checked = 0
    for run in involved:
        found = find_side([run], sides.get(run.spec))
        node = found[1].node if found is not None else None
        if not run.graph_dir or node is None:
            continue
        try:
            graph = OpGraph(run.graph_dir)
        except (UntrustedOutput, OSError, ValueError):
            return False
        if node not in graph.by_name or not graph.order_free(graph.cone(node)):
            return False
        checked += 1
    return checked > 0


def _rounding_explains(d: Divergence) -> bool:
    """Every side judged inside its own rounding spread (or the directed envelope): no
    switch is needed to explain it, and one that merely changes the noise would mislead."""
    sides = [s for s in (d.a, d.b) if s is not None]
    js = d.judgements
    return len(js) == len(sides) and all(j.status == "judged" and j.zone != "outside" for j in js)


def _with(arm: ArmSpec, switch: Switch) -> ArmSpec | None:
    """`arm` with the switch set, or None where it does not apply or is already set."""
    if switch.compile_only and arm.mode != "compile":
        return None
    if switch.devices != ("",) and arm.device.split(":")[0] not in switch.devices:
        return None
    if (switch.knob, switch.value) in arm.knobs:
        return None
    knobs = tuple(k for k in arm.knobs if k[0] != switch.knob) + ((switch.knob, switch.value),)
    return dataclasses.replace(arm, knobs=knobs)


def _judge(d: Divergence, ablated: list[ArmRun]) -> tuple[str, str]:
    """Does the divergence hold in the ablated runs? (agree-bitwise | within-tolerance |
    still-diverges | not-comparable)"""
    if any(not r.completed for r in ablated):
        bad = next(r for r in ablated if not r.completed)
        return "not-comparable", f"`{bad.spec}` {bad.status}: {bad.failure}"
    if d.source == "arms":
        ra, rb = ablated
        x, y = _observable(ra, d.a.observable), _observable(rb, d.b.observable)
        if x is None or y is None:
            return "not-comparable", "the ablated runs observed a different sequence of values"
        after = pair_divergence("arms", ra, x, rb, y)
    elif d.source == "claim":
        run = ablated[0]
        x, y = _observable(run, d.a.observable), _observable(run, d.b.observable)
        if x is None or y is None:
            return "not-comparable", "the ablated run observed a different sequence of values"
        after = pair_divergence("claim", run, x, run, y)
    else:
        run = ablated[0]
        x = _observable(run, d.a.observable)
        if x is None:
            return "not-comparable", "the ablated run observed a different sequence of values"
        side = side_of(run, x)
        if side.agrees_with_reference:
            return "within-tolerance", f"agrees with float64 (max rel. error {side.max_rel_error or 0:.3g})"
        return "still-diverges", f"still far from float64 (max rel. error {side.max_rel_error or 0:.3g})"
    if after.bitwise_equal:
        return "agree-bitwise", "the two sides are bit-identical"
    if after.within_tolerance and d.within_tolerance:
        return "still-diverges", f"still differs in its bits (max |diff| {after.max_abs_diff:.3g})"
    if after.within_tolerance:
        return "within-tolerance", f"max |diff| {after.max_abs_diff:.3g}, within {after.dtype} tolerance"
    diff = f"max |diff| {after.max_abs_diff:.3g}" if after.max_abs_diff is not None else "values differ"
    return "still-diverges", diff + (f", {after.nonfinite_mismatch} non-finite mismatch(es)" if after.nonfinite_mismatch else "")


def _inside_spreads(d: Divergence, involved: list[ArmRun], ablated: list[ArmRun]) -> bool | None:
    """Whether the ablated values lie inside the rounding spreads of the original arms'
    computations (None: no spread to judge them by)."""
    from triage.judge import RoundingSpread, judge_value

    verdicts = []
    pairs = [(involved[0], ablated[0], d.a.observable)]
    if d.b is not None:
        pairs.append((involved[-1], ablated[-1], d.b.observable))
    for original, rerun, index in pairs:
        before, after = _observable(original, index), _observable(rerun, index)
        spread = RoundingSpread.of(before) if before is not None else None
        if spread is None or after is None or after.value is None:
            return None
        verdicts.append(judge_value(after.value, spread, rerun.spec, index, after.label, after.line).zone != "outside")
    return all(verdicts)


def _observable(run: ArmRun, index: int):  # noqa: ANN202 - Observable | None
    """The ablated run's observable at `index`, if the run observed the same kind there."""
    if index >= len(run.observables):
        return None
    o = run.observables[index]
    return o if o.value is not None or o.fingerprint is not None else None


def _result(switch: Switch, variants: list[ArmSpec | None], involved: list[ArmRun], outcome: str, detail: str,
            seconds: float = 0.0) -> Ablation:
    arms = [v.spec if v is not None else r.spec for v, r in zip(variants, involved, strict=False)]
    return Ablation(switch=f"{switch.knob}={switch.value}", arms=arms, outcome=outcome, detail=detail,
                    section=switch.section.title, setting=switch.setting, supports=switch.verdict, seconds=seconds)
