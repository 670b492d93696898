"""Minimization: triage vs torch._functorch.fx_minifier vs a source-level reducer.

Usage: TRIAGE_TEST_ARMS=1 python bench/minimize.py [--sizes 50,500,2500] [--no-source]

Cases: planted-divergence graphs (a chain of N aten ops with one `atan` among `sin`s, arms
`cpu` vs `cpu/fault=atan`: the planted minimum is exactly 1 op), the bundled compile_acosh
fixture (gh-183768: eager vs inductor) and the singular logdet seed with a faulted slogdet.
For each graph, in the same run and with the same predicate ("the two arms' outputs differ with
the same DivergenceKind"):
- triage: the warm-worker minimizer (`triage.minimize`), then its verification in fresh arms;
- fx_minifier: `torch._functorch.fx_minifier.minifier` on the same recorded aten graph, its
  predicate evaluated in this process (eager vs the same fault, or eager vs torch.compile);
- source: pysource-minimize on the script text, one pair of isolated arm subprocesses per query
  (compile_acosh only: it takes minutes).
Prints a markdown table (paste it into bench/RESULTS.md).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRIAGE_TEST_ARMS", "1")

from triage.arms.run import run_arms  # noqa: E402
from triage.arms.spec import parse_arms  # noqa: E402
from triage.compare import compare  # noqa: E402
from triage.extract import extract_repro  # noqa: E402
from triage.minimize import minimize_divergence  # noqa: E402
from triage.numerics.errors import divergence_kind  # noqa: E402
from triage.settings import MinimizeSettings, RunSettings  # noqa: E402

PLANTED = '''import torch
x = torch.linspace(-1.0, 1.0, 64)
for i in range({n}):
    x = torch.atan(x) if i == {k} else torch.sin(x)
print(x)
'''


def planted_script(directory: Path, n: int) -> Path:
    path = directory / f"planted_{n}.py"
    path.write_text(PLANTED.format(n=n, k=n * 2 // 3))
    return path


def run_triage(name: str, script: Path, arms_text: str) -> tuple[dict, object, object]:
    arms = parse_arms(arms_text)
    runs = run_arms(extract_repro(str(script)), arms, RunSettings(reference=False))
    comparison = compare(runs)
    # Every case diverges by construction: an arm that did not run, or no divergence, means
    # there is nothing to minimize and the row would compare nothing.
    failed = [f"{r.spec}: {r.status}" for r in runs if not r.completed]
    if failed or comparison.divergence is None:
        sys.exit(f"bench/minimize.py: case {name!r} ({arms_text}) "
                 + (f"failed to run ({'; '.join(failed)})" if failed else "did not diverge"))
    start = time.perf_counter()
    result = minimize_divergence(comparison, RunSettings(reference=False), MinimizeSettings())
    wall = time.perf_counter() - start
    m = result.minimal
    rate = (f"{m.timings['reduce_queries'] / m.timings['reduce']:.0f}" if m and m.timings.get("reduce") else "—")
    row = {"queries": m.queries if m else "—", "seconds": f"{wall:.1f}", "rate": rate,
           "verify": f"{m.timings.get('verify', 0):.1f}" if m else "—", "ops": len(m.ops) if m else "—",
           "verified": str(m.verified).lower() if m else "—", "nodes": len(_ops(runs[0])) if runs[0].graph_dir else 0}
    return row, runs, comparison


def _ops(run) -> list[str]:  # noqa: ANN001
    from triage.arms.graph import OpGraph

    return OpGraph(run.graph_dir).ops


def run_fx_minifier(runs, comparison, arms_text: str) -> dict:  # noqa: ANN001
    import torch
    from torch._functorch.fx_minifier import minifier

    from triage.arms.graph import OpGraph
    from triage.worker.fingerprint import dtype_name, to_numpy
    from triage.worker.graphio import LoadedGraph
    from triage.worker.opgraph import Fault

    d = comparison.divergence
    ra = runs[0]
    obs_a, obs_b = ra.observables[d.a.observable], runs[1].observables[d.b.observable]
    target = divergence_kind(obs_a.value, obs_b.value, obs_a.fingerprint["dtype"])
    graph, loaded = OpGraph(ra.graph_dir), LoadedGraph(Path(ra.graph_dir))
    plan = graph.plan(graph.cone(obs_a.node), outputs=[obs_a.node])
    gm = loaded.to_module(plan.nodes, plan.inputs, plan.outputs, torch.device("cpu"))
    inputs = [loaded.leaves[name].clone() for name in plan.inputs]
    arm_b = parse_arms(arms_text)[1]
    fault = dict(arm_b.knobs).get("fault")
    injected = Fault.parse(fault) if fault else None
    queries = [0]

    class FaultMode(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            return injected.apply(out) if injected.matches(func) else out

    def module_fails(g, inps) -> bool:  # noqa: ANN001
        queries[0] += 1
        try:
            a = g(*[t.clone() for t in inps])
            if fault:
                with FaultMode():
                    b = g(*[t.clone() for t in inps])
            else:
                torch._dynamo.reset()
                b = torch.compile(g, backend="inductor", fullgraph=True)(*[t.clone() for t in inps])
        except Exception:  # noqa: BLE001
            return False
        outs_a = a if isinstance(a, (tuple, list)) else [a]
        outs_b = b if isinstance(b, (tuple, list)) else [b]
        return any(isinstance(x, torch.Tensor) and divergence_kind(to_numpy(x), to_numpy(y), dtype_name(x.dtype)) == target
                   for x, y in zip(outs_a, outs_b, strict=False))

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with tempfile.TemporaryDirectory() as save_dir:
            small, _ = minifier(gm, inputs, module_fails, dump_state=lambda g, i: None, save_dir=save_dir)
    ops = [n for n in small.graph.nodes if n.op == "call_function"]
    wall = time.perf_counter() - start
    return {"queries": queries[0], "seconds": f"{wall:.1f}", "rate": f"{queries[0] / wall:.0f}", "ops": len(ops),
            "verified": "—"}


def run_source_reducer(script: Path, arms_text: str, target) -> dict:  # noqa: ANN001
    from pysource_minimize import minimize

    arms = parse_arms(arms_text)
    queries = [0]
    work = Path(tempfile.mkdtemp(prefix="triage-bench-src-"))

    def checker(source: str) -> bool:
        queries[0] += 1
        candidate = work / "candidate.py"
        candidate.write_text(source)
        runs = run_arms(extract_repro(str(candidate)), arms, RunSettings(reference=False, export_graphs=False,
                                                                          timeout_s=120))
        if not all(r.completed for r in runs):
            return False
        for x, y in zip(runs[0].observables, runs[1].observables, strict=False):
            if x.value is not None and y.value is not None and x.label == y.label and \
                    divergence_kind(x.value, y.value, x.fingerprint["dtype"]) == target:
                return True
        return False

    start = time.perf_counter()
    small = minimize(script.read_text(), checker)
    calls = sum(small.count(f"torch.{name}(") for name in ("acosh", "compile", "tensor"))
    wall = time.perf_counter() - start
    return {"queries": queries[0], "seconds": f"{wall:.1f}", "rate": f"{queries[0] / wall:.2f}",
            "ops": f"{len(small.splitlines())} lines ({calls} torch calls)", "verified": "—"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="50,500,2500")
    parser.add_argument("--no-source", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="triage-bench-"))
    cases = [(f"planted chain, {n} ops", planted_script(tmp, int(n)), "cpu,cpu/fault=atan", 1)
             for n in args.sizes.split(",")]
    cases += [("compile_acosh (gh-183768)", ROOT / "fixtures" / "compile_acosh.py", "cpu,cpu/compile", 1),
              ("singular_logdet, faulted slogdet", ROOT / "fixtures" / "singular_logdet.py",
               "cpu,cpu/fault=linalg_slogdet", 1)]
    print("| case | graph ops | planted min | tool | queries | wall s | reduction queries/s | final ops | verified |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, script, arms_text, minimum in cases:
        row, runs, comparison = run_triage(name, script, arms_text)
        print(f"| {name} | {row['nodes']} | {minimum} | triage | {row['queries']} | {row['seconds']} "
              f"(verify {row['verify']}) | {row['rate']} | {row['ops']} | {row['verified']} |", flush=True)
        fx = run_fx_minifier(runs, comparison, arms_text)
        print(f"| | | | fx_minifier | {fx['queries']} | {fx['seconds']} | {fx['rate']} | {fx['ops']} | {fx['verified']} |", flush=True)
        if "compile_acosh" in name and not args.no_source:
            d = comparison.divergence
            obs_a, obs_b = runs[0].observables[d.a.observable], runs[1].observables[d.b.observable]
            target = divergence_kind(obs_a.value, obs_b.value, obs_a.fingerprint["dtype"])
            src = run_source_reducer(script, arms_text, target)
            print(f"| | | | pysource-minimize | {src['queries']} | {src['seconds']} | {src['rate']} | {src['ops']} | "
                  f"{src['verified']} |", flush=True)
        for run in runs:
            if run.graph_dir:
                import shutil

                shutil.rmtree(os.path.dirname(run.graph_dir), ignore_errors=True)


if __name__ == "__main__":
    main()
