"""Calibration of the rounding judge: false alarms, detection power and cost.

    python bench/judge.py            # full run (about 15 minutes on 2 cores)
    python bench/judge.py --quick    # a few minutes
    python bench/judge.py --fixtures # also time `triage run` on every bundled fixture
    python bench/judge.py --opinfo   # instead: every OpInfo op and sample (bench/opinfo_judge.py)

The judge (`triage.worker.rounding` + `triage.judge`) calls a value "outside" when no
simulated rounding of its own recorded computation, at the arm's precision, explains it. Two
things make it useful, and this benchmark measures both on random models:

* **No false alarms.** Values that *are* just rounding must land inside (or in the directed
  envelope). For each random case the op graph is recorded in eager mode, its rounding is
  simulated (K = 29 by default), and three real arms are judged against that one spread:
  the eager value itself (default thread count), the eager value with
  ``torch.set_num_threads(1)`` (same formula, another reduction order) and, on a subset,
  the ``torch.compile`` (inductor) value (fused kernels, another evaluation order). Any of
  them judged "outside" is a false alarm. Target: at most 1 % of cases.
* **Detection.** A computation that differs from the recorded one must land outside. On the
  fp32 cases one op of the recorded graph (a random floating node feeding the output) gets
  its output multiplied by (1 + ε), ε = 1e-4 and 1e-5, the graph is re-run at the arm's
  precision, and the result is judged against the *unperturbed* spread. Targets: ≥ 95 %
  outside at 1e-4, ≥ 75 % at 1e-5. An injection that the model itself erases (a uniform
  scale before a layer norm, a shift before a softmax, a relu that zeroes it) cannot be
  detected by any judge: its float64 effect on the output is measured too, and the rates
  are also given over the injections whose effect is at least ε/10 (normwise).

Model families (fp32, fp16, bf16; sizes, seeds and input scales random per case): MLP
(Linear + GELU/ReLU), conv (Conv2d + ReLU + max/avg pooling), layer norm (with an offset
mean, which stresses the variance), attention (softmax(QKᵀ/√d)V written out, and
``F.scaled_dot_product_attention`` separately), softmax, and full sum/mean reductions of
10²…10⁷ terms. Also measured: the simulation's time against the eager run's, and, on a
subset, how K (the number of simulated roundings; the smallest p is 1/(K+1)) trades
confidence for false alarms and detection. With ``--fixtures``: the judge's share of
``triage run`` wall time on every bundled fixture.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from triage.judge import RoundingSpread, judge_value  # noqa: E402
from triage.worker.opgraph import OpRecorder  # noqa: E402
from triage.worker.reference import UpcastMode, replay_fp64, widen  # noqa: E402
from triage.worker.rounding import COMPLEX_PARTS, SimulationOptions, simulate_rounding  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
FAMILIES = ["mlp", "conv", "layernorm", "attention", "softmax", "reduction", "sdpa"]
EPSILONS = (1e-4, 1e-5)
K_DEFAULT = 29
K_SWEEP = (9, 19, 29, 59)


# -- random models ------------------------------------------------------------------------
@dataclass
class Case:
    family: str
    dtype: str
    seed: int
    fn: Callable[..., torch.Tensor]
    inputs: tuple[torch.Tensor, ...]
    desc: str
    compile: bool = False  # also judge the torch.compile arm
    sweep: bool = False  # also simulate at every K of K_SWEEP


def scale(rng: random.Random, lo: float, hi: float) -> float:
    """A log-uniform input scale in [10^lo, 10^hi]."""
    return 10 ** rng.uniform(lo, hi)


def make_mlp(rng: random.Random, dt: torch.dtype) -> tuple[Any, tuple, str]:
    d_in, hidden, d_out = rng.choice([16, 32, 64, 128, 256]), rng.choice([32, 64, 128, 256, 512]), rng.choice([1, 10, 64])
    depth, batch = rng.choice([1, 2]), rng.choice([1, 4, 16, 64])
    act = rng.choice([nn.GELU, nn.ReLU])
    layers: list[nn.Module] = [nn.Linear(d_in, hidden), act()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), act()]
    layers.append(nn.Linear(hidden, d_out))
    s = scale(rng, -2, 2)
    x = torch.randn(batch, d_in) * s
    return nn.Sequential(*layers).to(dt).eval(), (x.to(dt),), \
        f"{batch}x{d_in}→{hidden}{'x2' if depth == 2 else ''}→{d_out} {act.__name__} scale {s:.2g}"


def make_conv(rng: random.Random, dt: torch.dtype) -> tuple[Any, tuple, str]:
    c_in, c, k = rng.choice([1, 3, 8]), rng.choice([4, 8, 16]), rng.choice([1, 3, 5])
    hw, batch = rng.choice([8, 12, 16, 24, 32]), rng.choice([1, 2, 4])
    pool = rng.choice([nn.MaxPool2d, nn.AvgPool2d])
    layers: list[nn.Module] = [nn.Conv2d(c_in, c, k, padding=k // 2), nn.ReLU(), pool(2)]
    second = rng.random() < 0.5
    if second:
        layers += [nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1)]
    s = scale(rng, -2, 2)
    x = torch.randn(batch, c_in, hw, hw) * s
    return nn.Sequential(*layers).to(dt).eval(), (x.to(dt),), \
        f"{batch}x{c_in}x{hw}² conv{k} {c_in}→{c} {pool.__name__}{' +conv3+gap' if second else ''} scale {s:.2g}"


def make_layernorm(rng: random.Random, dt: torch.dtype) -> tuple[Any, tuple, str]:
    d, batch = rng.choice([8, 32, 64, 256, 1024]), rng.choice([1, 4, 16, 64])
    ln = nn.LayerNorm(d)
    with torch.no_grad():
        ln.weight.copy_(1 + 0.1 * torch.randn(d))
        ln.bias.copy_(0.1 * torch.randn(d))
    s = scale(rng, -2, 2)
    offset = rng.choice([0.0, 0.0, 1.0, 10.0]) * s  # a mean far from 0 makes the variance cancel
    x = torch.randn(batch, d) * s + offset
    return ln.to(dt).eval(), (x.to(dt),), f"{batch}x{d} scale {s:.2g} offset {offset:.2g}"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def _qkv(rng: random.Random, dt: torch.dtype) -> tuple[tuple, str]:
    b, h, l, d = rng.choice([1, 2]), rng.choice([1, 2, 4]), rng.choice([4, 16, 32, 64]), rng.choice([8, 16, 32, 64])
    s = scale(rng, -1, 0.5)
    return tuple((torch.randn(b, h, l, d) * s).to(dt) for _ in range(3)), f"{b}x{h}x{l}x{d} scale {s:.2g}"


def make_attention(rng: random.Random, dt: torch.dtype) -> tuple[Any, tuple, str]:
    qkv, desc = _qkv(rng, dt)
    return attention, qkv, desc


def make_sdpa(rng: random.Random, dt: torch.dtype) -> tuple[Any, tuple, str]:
    qkv, desc = _qkv(rng, dt)
    return sdpa, qkv, desc


def make_softmax(rng: random.Random, dt: torch.dtype) -> tuple[Any, tuple, str]:
    rows, cols = rng.choice([1, 4, 16, 64]), rng.choice([10, 100, 1000])
    s = scale(rng, -1, 1.5)
    x = torch.randn(rows, cols) * s
    return (lambda x: torch.softmax(x, dim=-1)), (x.to(dt),), f"{rows}x{cols} scale {s:.2g}"


def make_reduction(rng: random.Random, dt: torch.dtype) -> tuple[Any, tuple, str]:
    n = int(10 ** rng.uniform(2, 7))
    op = rng.choice(["sum", "mean"])
    s = scale(rng, -2, 1)
    offset = rng.choice([0.0, 0.0, 1.0]) * s
    x = (torch.randn(n) * s + offset).to(dt)
    fn = (lambda x: x.sum()) if op == "sum" else (lambda x: x.mean())
    return fn, (x,), f"{op} of {n:.1e} terms scale {s:.2g} offset {offset:.2g}"


BUILDERS = {"mlp": make_mlp, "conv": make_conv, "layernorm": make_layernorm, "attention": make_attention,
            "softmax": make_softmax, "reduction": make_reduction, "sdpa": make_sdpa}


def make_cases(per: int, sdpa_per: int, compile_per: int, sweep_per: int) -> list[Case]:
    """`per` cases for every family and dtype (deterministic seeds); the first `compile_per`
    of each also get a compile arm, the first `sweep_per` the K sweep."""
    cases = []
    for fi, family in enumerate(FAMILIES):
        for di, (dname, dt) in enumerate(DTYPES.items()):
            count = sdpa_per if family == "sdpa" else per
            for i in range(count):
                seed = 1000 * fi + 100 * di + i
                rng = random.Random(seed)
                torch.manual_seed(seed)
                fn, inputs, desc = BUILDERS[family](rng, dt)
                cases.append(Case(family, dname, seed, fn, inputs, desc,
                                  compile=i < (min(compile_per, 1) if family == "sdpa" else compile_per),
                                  sweep=i < sweep_per and family != "sdpa"))
    return cases


# -- recording, simulating, judging -------------------------------------------------------
def record(fn: Callable, inputs: tuple) -> tuple[fx.Graph, fx.Node, torch.Tensor]:
    """The eager run under triage's recorder: its op graph, the output's node, the value."""
    rec = OpRecorder(torch.device("cpu"), site=lambda: None)
    with torch.no_grad(), rec:
        out = fn(*inputs)
    node = rec.lookup(out)
    return rec.finish().graph, node, out


def simulate(graph: fx.Graph, node: fx.Node, ref: torch.Tensor, dt: torch.dtype, samples: int, seed: int = 0,
             value: torch.Tensor | None = None) -> tuple[RoundingSpread | None, float, str | None]:
    """The spread at K = `samples`; given the arm's `value`, as `triage run` simulates it for
    that arm (sampling stops early once the value is certainly inside, and goes on at the
    Monte Carlo floor): a spread to judge that value with, and no other."""
    start = time.perf_counter()
    arm = {node.name: widen(value.detach())} if value is not None else None
    # A complex output (eig's, an FFT's) is stored as the complex dtype of the sample's precision.
    stored = COMPLEX_OF.get(dt, dt) if ref.is_complex() else dt
    sim = simulate_rounding(graph, {node.name: ref}, SimulationOptions(samples=samples, seed=seed), {node.name: stored},
                            arm)
    seconds = time.perf_counter() - start
    spread = sim.spreads[node.name]
    if spread.status != "judged":
        return None, seconds, spread.reason
    reference = ref.resolve_conj()  # an ihfft's value is a conjugate view
    # The spread of a complex value is of its real pairs.
    reference = (torch.view_as_real(reference) if reference.is_complex() else reference).numpy()
    return RoundingSpread.of_simulation(spread, reference, str(dt).removeprefix("torch.")), seconds, None


def judge(value: torch.Tensor, spread: RoundingSpread, arm: str) -> Any:
    return judge_value(widen(value.detach()).numpy(), spread, arm, 0, "out", None)


# The complex dtype of each real one (`COMPLEX_PARTS`, inverted).
COMPLEX_OF = {part: whole for whole, part in COMPLEX_PARTS.items()}


def eager_seconds(fn: Callable, inputs: tuple, repeats: int = 10, budget_s: float = 0.5) -> float:
    """The fastest of up to `repeats` warm eager runs (the fastest is the least disturbed)."""
    with torch.no_grad():
        fn(*inputs)
        times: list[float] = []
        while len(times) < repeats and sum(times) < budget_s:
            start = time.perf_counter()
            fn(*inputs)
            times.append(time.perf_counter() - start)
    return min(times)


def threads1_value(fn: Callable, inputs: tuple) -> torch.Tensor:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return fn(*inputs)
    finally:
        torch.set_num_threads(threads)


def compiled_value(fn: Callable, inputs: tuple) -> tuple[torch.Tensor, float]:
    torch._dynamo.reset()
    start = time.perf_counter()
    with torch.no_grad():
        out = torch.compile(fn)(*inputs)
    return out, time.perf_counter() - start


# -- injected errors ----------------------------------------------------------------------
def cone(node: fx.Node) -> list[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return [n for n in node.graph.nodes if n in seen]


def rerun(order: list[fx.Node], wide: bool, inject: fx.Node | None = None, eps: float = 0.0
          ) -> dict[fx.Node, Any]:
    """Re-run the recorded ops at the arm's precision (or all in float64 with `wide`), with
    `inject`'s output multiplied by (1 + eps). Wide, every op runs as the float64 reference's
    replay runs it (`UpcastMode`: dtype arguments and tensors the graph makes widened too)."""
    env: dict[fx.Node, Any] = {}
    with torch.no_grad(), UpcastMode() if wide else contextlib.nullcontext():
        for n in order:
            if n.op == "placeholder":
                # A copy: an in-place op of the graph would otherwise write into the recorded
                # leaf, and every later re-run would start from that write.
                v = n.meta["leaf"].value
                env[n] = v.double() if wide and v.is_floating_point() else v.clone()
                continue
            args = fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
            out = n.target(*args, **kwargs)
            if n is inject:
                out = (widen(out) * (1 + eps)).to(out.dtype)
            env[n] = out
    return env


def injection_sites(order: list[fx.Node], env: dict[fx.Node, Any]) -> list[fx.Node]:
    return [n for n in order if n.op == "call_function" and isinstance(env.get(n), torch.Tensor)
            and (env[n].is_floating_point() or env[n].is_complex())]


def normwise(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = widen(a), widen(b)
    scale_ = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) / scale_ if scale_ > 0 else 0.0


# -- one case -----------------------------------------------------------------------------
@dataclass
class Result:
    case: Case
    ops: int = 0
    sim_s: float = 0.0
    eager_s: float = 0.0
    compile_s: float | None = None
    not_judged: str | None = None
    arms: dict[str, Any] = field(default_factory=dict)  # arm -> Judgement
    replay_matches_eager: bool | None = None
    injections: list[dict[str, Any]] = field(default_factory=list)
    sweep: dict[int, dict[str, Any]] = field(default_factory=dict)  # K -> {"arms": {...}, "inj": [...]}
    error: str | None = None


def run_case(case: Case, rng: random.Random) -> Result:
    res = Result(case)
    dt = DTYPES[case.dtype]
    graph, node, out = record(case.fn, case.inputs)
    res.ops = sum(1 for n in graph.nodes if n.op == "call_function")
    ref = replay_fp64(graph, {node.name}, 120).values[node.name]
    spread, res.sim_s, why = simulate(graph, node, ref, dt, K_DEFAULT)
    res.eager_s = eager_seconds(case.fn, case.inputs)
    if spread is None:
        res.not_judged = why
        return res
    values = {"eager": out, "threads=1": threads1_value(case.fn, case.inputs)}
    if case.compile:
        values["compile"], res.compile_s = compiled_value(case.fn, case.inputs)
    res.arms = {arm: judge(v, spread, arm) for arm, v in values.items()}
    injected: list[tuple[dict[str, Any], torch.Tensor]] = []
    if case.dtype == "fp32":
        order = cone(node)
        base = rerun(order, wide=False)
        res.replay_matches_eager = bool(torch.equal(base[node], out))
        sites = injection_sites(order, base)
        wide_base = rerun(order, wide=True)[node]
        for site in rng.sample(sites, min(2, len(sites))):
            for eps in EPSILONS:
                value = rerun(order, wide=False, inject=site, eps=eps)[node]
                effect = normwise(rerun(order, wide=True, inject=site, eps=eps)[node], wide_base)
                info = {"eps": eps, "op": str(site.target).removeprefix("aten."), "effect": effect}
                info["judgement"] = judge(value, spread, "injected")
                res.injections.append(info)
                injected.append((info, value))
    if case.sweep:
        for k in K_SWEEP:
            sp, seconds, _ = (spread, res.sim_s, None) if k == K_DEFAULT else simulate(graph, node, ref, dt, k)
            if sp is None:
                continue
            res.sweep[k] = {"arms": {arm: judge(v, sp, arm).zone for arm, v in values.items() if arm != "compile"},
                            "inj": [(info["eps"], info["effect"], judge(v, sp, "injected").zone)
                                    for info, v in injected], "seconds": seconds}
    return res


# -- tables -------------------------------------------------------------------------------
def pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.1f} %)" if b else "—"


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)] if xs else float("nan")


def ms(x: float) -> str:
    return f"{1000 * x:.3g}" if x < 1 else f"{1000 * x:.0f}"


def table_head(title: str, columns: list[str]) -> None:
    """A markdown section title and table header."""
    print(f"\n### {title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def grouped(items: list[Any], key: Callable[[Any], tuple[str, str]]) -> dict[tuple[str, str], list[Any]]:
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return groups


def false_alarm_table(results: list[Result]) -> None:
    table_head("False alarms (real arms judged against the eager recording's spread, K = 29)",
               ["family", "dtype", "cases", "not judged", "eager outside", "threads=1 outside", "compile outside",
                "any arm in envelope"])
    groups = grouped(results, lambda r: (r.case.family, r.case.dtype))
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def row(label: str, dtype: str, rs: list[Result], count: bool = True) -> None:
        judged = [r for r in rs if r.arms]
        cells = []
        for arm in ("eager", "threads=1", "compile"):
            with_arm = [r for r in judged if arm in r.arms]
            bad = sum(1 for r in with_arm if r.arms[arm].zone == "outside")
            cells.append(pct(bad, len(with_arm)))
            if count:
                totals[arm][0] += bad
                totals[arm][1] += len(with_arm)
        env = sum(1 for r in judged if any(j.zone == "envelope" for j in r.arms.values()))
        not_judged = sum(1 for r in rs if r.not_judged or r.error)
        print(f"| {label} | {dtype} | {len(rs)} | {not_judged} | " + " | ".join(cells) + f" | {env} |")

    for family in FAMILIES:
        for dtype in DTYPES:
            if (family, dtype) in groups:
                row(family if family != "sdpa" else "sdpa (F.scaled_dot_product_attention)", dtype,
                    groups[(family, dtype)], count=family != "sdpa")
    main = [r for r in results if r.case.family != "sdpa"]
    print(f"| **all but sdpa** | all | {len(main)} | {sum(1 for r in main if r.not_judged or r.error)} | "
          + " | ".join(f"**{pct(*totals[a])}**" for a in ("eager", "threads=1", "compile")) + " | "
          + f"{sum(1 for r in main if r.arms and any(j.zone == 'envelope' for j in r.arms.values()))} |")
    cases_any = sum(1 for r in main if r.arms and any(j.zone == "outside" for j in r.arms.values()))
    print(f"\nCases with any real arm outside (all but sdpa): **{pct(cases_any, sum(1 for r in main if r.arms))}**"
          f" (target ≤ 1 %).")


def detection_table(results: list[Result]) -> None:
    print("\n### Detection (fp32: one op's output × (1 + ε), judged against the unperturbed spread, K = 29)\n")
    print("*outside*: the judge says not rounding (the target). *or envelope*: outside the random spread at all. "
          "*effective*: injections whose float64 effect on the output is ≥ ε/10 normwise (the rest the model "
          "itself erases).\n")
    print("*a finding*: outside by more than the audit's margin (`triage/audit.py` FRAGILE_MARGIN × the samples' "
          "largest statistic), which a `likely-bug` verdict needs; nearer is `inconclusive`.\n")
    print("| family | ε | injections | outside | outside or envelope | effective | outside, effective "
          "| outside or envelope, effective | a finding, effective |")
    print("|---|---|---|---|---|---|---|---|---|")
    for family in FAMILIES + ["**all but sdpa**"]:
        for eps in EPSILONS:
            inj = [i for r in results for i in r.injections
                   if i["eps"] == eps and (r.case.family == family or (family.startswith("**") and r.case.family != "sdpa"))]
            if not inj:
                continue
            eff = [i for i in inj if i["effect"] >= eps / 10]
            out = lambda xs: sum(1 for i in xs if i["judgement"].zone == "outside")  # noqa: E731
            oe = lambda xs: sum(1 for i in xs if i["judgement"].zone != "inside")  # noqa: E731
            print(f"| {family} | {eps:g} | {len(inj)} | {pct(out(inj), len(inj))} | {pct(oe(inj), len(inj))} | "
                  f"{len(eff)} | {pct(out(eff), len(eff))} | {pct(oe(eff), len(eff))} | "
                  f"{pct(sum(1 for i in eff if _a_finding(i['judgement'])), len(eff))} |")


def _a_finding(j) -> bool:  # noqa: ANN001 - Judgement
    """Outside, and far enough out that the evidence audit lets a bug verdict stand (its
    `outside_is_meaningful`): a nonfinite value no rounding gives always does; a finite one
    needs digits and more than FRAGILE_MARGIN × the samples' largest statistic."""
    from triage.audit import FRAGILE_MARGIN

    if j.zone != "outside":
        return False
    if j.nonfinite and j.nonfinite.startswith("outside"):
        return True
    if j.computational_zero or (j.digits is not None and j.digits < 1):
        return False
    return not (j.statistic is not None and j.max_sample_stat and math.isfinite(j.statistic)
                and j.statistic <= FRAGILE_MARGIN * j.max_sample_stat)


def reduction_detection_table(results: list[Result]) -> None:
    print("\n#### Reductions by length (fp32, effective injections)\n")
    print("| terms | ε | injections | outside | outside or envelope |")
    print("|---|---|---|---|---|")
    for lo in range(2, 7):
        for eps in EPSILONS:
            inj = [i for r in results if r.case.family == "reduction" for i in r.injections
                   if i["eps"] == eps and i["effect"] >= eps / 10
                   and lo <= math.log10(r.case.inputs[0].numel()) < lo + 1]
            if inj:
                print(f"| 10^{lo}…10^{lo + 1} | {eps:g} | {len(inj)} | "
                      f"{pct(sum(1 for i in inj if i['judgement'].zone == 'outside'), len(inj))} | "
                      f"{pct(sum(1 for i in inj if i['judgement'].zone != 'inside'), len(inj))} |")


def cost_table(results: list[Result]) -> None:
    print("\n### Cost (K = 29: the simulation against one eager run)\n")
    print("| family | dtype | cases | ops (median) | eager ms (median) | simulation ms (median) | simulation ms (p90) "
          "| ratio (median) | compile s (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for r in results:
        if not r.error:
            groups[(r.case.family, r.case.dtype)].append(r)
    every = [r for rs in groups.values() for r in rs]
    for (family, dtype), rs in list(groups.items()) + [(("**all**", "all"), every)]:
        comp = [r.compile_s for r in rs if r.compile_s is not None]
        print(f"| {family} | {dtype} | {len(rs)} | {statistics.median(r.ops for r in rs):.0f} | "
              f"{ms(statistics.median(r.eager_s for r in rs))} | {ms(statistics.median(r.sim_s for r in rs))} | "
              f"{ms(quantile([r.sim_s for r in rs], 0.9))} | "
              f"{statistics.median(r.sim_s / max(r.eager_s, 1e-7) for r in rs):.0f}× | "
              f"{f'{statistics.median(comp):.1f}' if comp else '—'} |")


def sweep_table(results: list[Result]) -> None:
    sub = [r for r in results if r.sweep]
    if not sub:
        return
    fp32 = [r for r in sub if r.case.dtype == "fp32"]
    print(f"\n### K against confidence (subset: {len(sub)} cases, every family but sdpa and every dtype; "
          f"detection on its {len(fp32)} fp32 cases)\n")
    print("| K | smallest p = 1/(K+1) | p < α = 0.05 possible | arms judged | false alarms (outside) "
          "| 1e-5 injections (effective) | detected (outside) | outside or envelope | simulation ms (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in K_SWEEP:
        rows = [r.sweep[k] for r in sub if k in r.sweep]
        arms = [z for row in rows for z in row["arms"].values()]
        inj = [z for row in rows for eps, effect, z in row["inj"] if eps == 1e-5 and effect >= eps / 10]
        print(f"| {k} | {1 / (k + 1):.3f} | {'yes' if 1 / (k + 1) <= 0.05 else 'no'} | {len(arms)} | "
              f"{pct(sum(1 for z in arms if z == 'outside'), len(arms))} | {len(inj)} | "
              f"{pct(sum(1 for z in inj if z == 'outside'), len(inj))} | "
              f"{pct(sum(1 for z in inj if z != 'inside'), len(inj))} | "
              f"{ms(statistics.median(row['seconds'] for row in rows))} |")


def details(results: list[Result]) -> None:
    bad = [(r, arm, j) for r in results for arm, j in r.arms.items() if j.zone == "outside"]
    if bad:
        print("\n### Real arms judged outside (the false alarms, one line each)\n")
        print("| family | dtype | seed | case | arm | T | max sample T | element | value | reference | σ |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r, arm, j in bad:
            print(f"| {r.case.family} | {r.case.dtype} | {r.case.seed} | {r.case.desc} | {arm} | "
                  f"{j.statistic:.3g} | {j.max_sample_stat if j.max_sample_stat is None else f'{j.max_sample_stat:.3g}'} | "
                  f"{j.element} | {j.value:.9g} | {j.reference:.9g} | {j.sigma:.3g} |")
    missed = defaultdict(lambda: [0, 0])
    for r in results:
        for i in r.injections:
            if i["eps"] == 1e-5 and i["effect"] >= 1e-6:
                key = (r.case.family, i["op"])
                missed[key][1] += 1
                missed[key][0] += i["judgement"].zone != "outside"
    rows = [(k, v) for k, v in missed.items() if v[0]]
    if rows:
        print("\n### Effective 1e-5 injections not judged outside, by family and injected op\n")
        print("| family | injected op | missed / injections |")
        print("|---|---|---|")
        for (family, op), (m, n) in sorted(rows, key=lambda x: (x[0][0], -x[1][0])):
            print(f"| {family} | {op} | {m}/{n} |")
    other = [r for r in results if r.error or r.not_judged]
    if other:
        print("\n### Cases not judged or crashed\n")
        for r in other:
            print(f"- {r.case.family} {r.case.dtype} seed {r.case.seed} ({r.case.desc}): "
                  f"{r.not_judged or r.error.strip().splitlines()[-1]}")
    mismatch = [r for r in results if r.replay_matches_eager is False]
    print(f"\nRe-running the recorded fp32 graph reproduced the eager value bit for bit in "
          f"{sum(1 for r in results if r.replay_matches_eager)} of "
          f"{sum(1 for r in results if r.replay_matches_eager is not None)} cases"
          + (f" (not in: {', '.join(f'{r.case.family}/{r.case.seed}' for r in mismatch)})." if mismatch else "."))


# -- fixtures -----------------------------------------------------------------------------
def fixtures_table() -> list[str]:
    """`triage run` on every bundled fixture: the simulation's share of the wall time. Returns
    the fixtures that gave no report."""
    print("\n### The judge's share of `triage run` (every bundled fixture, `--no-minimize --no-ablate`)\n")
    print("| fixture | arms | triage s | simulation s (all arms) | share | verdict |")
    print("|---|---|---|---|---|---|")
    paths = sorted(glob.glob(str(ROOT / "fixtures" / "*.py"))) + sorted(glob.glob(str(ROOT / "fixtures" / "judge" / "*.py")))
    total_t = total_s = 0.0
    failed = []
    for path in paths:
        arms = "cpu,cpu/compile" if "torch.compile" in Path(path).read_text() else "cpu"
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            proc = subprocess.run([sys.executable, "-m", "triage", "run", path, "--arms", arms, "--no-minimize",
                                   "--no-ablate", "--json", str(report), "--comment", "-", "--minimal", "-", "--quiet"],
                                  cwd=tmp, capture_output=True, text=True, timeout=900)
            name = os.path.relpath(path, ROOT / "fixtures")
            if not report.exists():
                print(f"| {name} | {arms} | — | — | — | no report (exit {proc.returncode}) |")
                print(f"{name}: no report (exit {proc.returncode})\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}",
                      file=sys.stderr, flush=True)
                failed.append(f"fixtures/{name}")
                continue
            data = json.loads(report.read_text())
        sim = sum(float((a.get("rounding") or {}).get("seconds") or 0.0) for a in data.get("arms", []))
        wall = float(data.get("seconds") or 0.0)
        total_t, total_s = total_t + wall, total_s + sim
        verdict = data.get("verdict")
        verdict = verdict.get("label") or verdict.get("kind") if isinstance(verdict, dict) else verdict
        print(f"| {name} | {arms} | {wall:.1f} | {sim:.2f} | {100 * sim / wall if wall else 0:.1f} % | {verdict} |")
    if total_t:
        print(f"| **all** | | {total_t:.1f} | {total_s:.2f} | {100 * total_s / total_t:.1f} % | |")
    return failed


# -- main ---------------------------------------------------------------------------------
def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "?")
    return (f"{os.cpu_count()} cores (nproc), {cpu}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} intra-op threads by default, Python {platform.python_version()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few cases per family (a few minutes)")
    parser.add_argument("--fixtures", action="store_true", help="also time triage run on every bundled fixture")
    parser.add_argument("--no-fixtures", action="store_true", help="skip the fixture table in the full run")
    parser.add_argument("--opinfo", action="store_true",
                        help="instead: every OpInfo op on CPU (bench/opinfo_judge.py; needs expecttest)")
    parser.add_argument("--opinfo-samples", type=int, default=3, help="samples per op and dtype (--opinfo)")
    parser.add_argument("--opinfo-compile", type=int, default=0, metavar="N",
                        help="also judge the inductor value of N random ops' first float32 sample (--opinfo)")
    parser.add_argument("--opinfo-op", action="append", default=None, metavar="NAME", help="only these OpInfo names")
    parser.add_argument("--opinfo-gradients", action="store_true",
                        help="instead: every differentiable OpInfo op's gradient on CPU (needs expecttest)")
    args = parser.parse_args()
    if args.opinfo_gradients:
        import opinfo_judge

        print(f"## Rounding judge on OpInfo gradients\n\n`python bench/judge.py --opinfo-gradients` — {machine()}; "
              f"{args.opinfo_samples} samples per op and dtype.")
        crashed = opinfo_judge.main_gradients(args.opinfo_samples, args.opinfo_op)
        if crashed:
            sys.exit(f"bench/judge.py --opinfo-gradients: {len(crashed)} op(s) crashed the bench: {', '.join(crashed[:20])}")
        return
    if args.opinfo:
        import opinfo_judge

        print(f"## Rounding judge on OpInfo\n\n`python bench/judge.py --opinfo` — {machine()}; "
              f"{args.opinfo_samples} samples per op and dtype, compiled on {args.opinfo_compile} ops.")
        crashed = opinfo_judge.main(args.opinfo_samples, args.opinfo_compile, args.opinfo_op)
        if crashed:
            sys.exit(f"bench/judge.py --opinfo: {len(crashed)} op(s) crashed the bench: {', '.join(crashed[:20])}")
        return
    per, sdpa_per, compile_per, sweep_per = (3, 2, 1, 1) if args.quick else (20, 6, 3, 3)
    start = time.monotonic()
    print(f"## Rounding judge calibration\n\n`python bench/judge.py{' --quick' if args.quick else ''}` — {machine()}.")
    cases = make_cases(per, sdpa_per, compile_per, sweep_per)
    print(f"\n{len(cases)} cases ({per} per family and dtype, {sdpa_per} for sdpa); compile arm on "
          f"{sum(c.compile for c in cases)}; K sweep on {sum(c.sweep for c in cases)}.", flush=True)
    results = []
    rng = random.Random(12345)
    for i, case in enumerate(cases):
        try:
            results.append(run_case(case, rng))
        except Exception:  # noqa: BLE001 - report the crash with the model
            results.append(Result(case, error=traceback.format_exc()))
            print(f"CRASH {case.family} {case.dtype} seed {case.seed} ({case.desc}):\n{results[-1].error}",
                  file=sys.stderr, flush=True)
        if (i + 1) % 20 == 0:
            print(f"  … {i + 1}/{len(cases)} cases, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    false_alarm_table(results)
    detection_table(results)
    reduction_detection_table(results)
    sweep_table(results)
    cost_table(results)
    details(results)
    # A crashed case or a fixture without a report is missing from every rate above: the tables
    # are printed (they show what did run), then the run fails with the cases named.
    failed = [f"{r.case.family} {r.case.dtype} seed {r.case.seed}" for r in results if r.error]
    if args.fixtures or not (args.quick or args.no_fixtures):
        failed += fixtures_table()
    print(f"\nBenchmark wall time: {time.monotonic() - start:.0f} s.")
    if failed:
        sys.exit(f"bench/judge.py: {len(failed)} case(s) failed to run: {', '.join(failed)}")


if __name__ == "__main__":
    main()
