"""Do the judge's decisions move with triage's own seed? `python bench/seeds.py [--quick]`

The rounding simulation draws its random roundings from a seed (`SimulationOptions.seed`,
the run's `--seed`). A decision that one seed calls "outside" and another "inside" is a
verdict that depends on triage, not on the script. For every calibration case of
`bench/judge.py` (random MLP, conv, layer norm, attention, softmax, reductions, SDPA in
fp32/fp16/bf16) each arm value — the eager kernel's, and on fp32 cases the recorded graph
with one op × (1 + 1e-5), the injection nearest the decision boundary — is simulated and
judged under seeds 0–9, each simulation given the value it judges (so the sequential
sampling at the Monte Carlo floor runs as in `triage run`). The decision is mapped to the
verdict it would support: a finding (outside by more than the audit's margin: `likely-bug`),
fragile (outside, nearer: `inconclusive`), or rounding (inside or in the directed envelope).
Target: the same decision under all ten seeds on at least 99 % of values.

`python bench/seeds.py --scripts DIR [--only NAME ...]` does the same for whole scripts (a new
user's repro set, say): `triage run SCRIPT --seed S` for S in 0–9 — the seed of the script's
own generators and of the simulation — and the verdict kind of each run. Target: one kind
under all ten seeds for every script.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import judge as bench  # noqa: E402

SEEDS = range(10)


def decision(j) -> str:  # noqa: ANN001 - a Judgement
    if j.zone == "outside":
        return "finding" if bench._a_finding(j) else "fragile"
    return "rounding"


def decisions(graph, node, ref, dt, value) -> tuple[list[str], list[int]]:  # noqa: ANN001
    out, samples = [], []
    for seed in SEEDS:
        spread, _, _ = bench.simulate(graph, node, ref, dt, bench.K_DEFAULT, seed=seed, value=value)
        if spread is None:
            return [], []
        out.append(decision(bench.judge(value, spread, "arm")))
        samples.append(spread.samples)
    return out, samples


def script_kinds(script: Path) -> list[str]:
    """The verdict kind of `triage run SCRIPT --seed S` for each seed (its default arms)."""
    kinds = []
    with tempfile.TemporaryDirectory(prefix="seeds_") as tmp:
        for seed in SEEDS:
            report = Path(tmp) / f"{seed}.json"
            subprocess.run([sys.executable, "-m", "triage", "run", str(script.resolve()), "--seed", str(seed), "--json",
                            str(report), "--comment", "-", "--no-minimize", "--quiet"], cwd=tmp, capture_output=True,
                           timeout=900, env=dict(os.environ, COLUMNS="100"))
            kinds.append(json.loads(report.read_text())["verdict"]["kind"] if report.exists() else "(no report)")
    return kinds


def scripts_main(folder: Path, only: list[str]) -> None:
    start = time.monotonic()
    scripts = sorted(p for p in folder.glob("*.py") if not only or any(p.name.startswith(o) for o in only))
    print(f"## Seed stability of whole scripts\n\n`python bench/seeds.py --scripts {folder.name}` — "
          f"{bench.machine()}; `triage run SCRIPT --seed S`, S = 0–9.\n")
    print("| script | kinds seen (runs) | one kind |")
    print("|---|---|---|")
    stable = 0
    for script in scripts:
        kinds = Counter(script_kinds(script))
        stable += len(kinds) == 1
        print(f"| {script.stem} | " + ", ".join(f"{k} ({v})" for k, v in kinds.most_common())
              + f" | {'yes' if len(kinds) == 1 else '**no**'} |", flush=True)
    print(f"\n{bench.pct(stable, len(scripts))} scripts keep one verdict kind; wall time "
          f"{time.monotonic() - start:.0f} s.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 cases per family and dtype")
    parser.add_argument("--scripts", type=Path, help="a folder of repro scripts, each run under seeds 0–9")
    parser.add_argument("--only", action="append", default=[], help="with --scripts: names starting so")
    args = parser.parse_args()
    if args.scripts:
        scripts_main(args.scripts, args.only)
        return
    per, sdpa_per = (3, 2) if args.quick else (10, 4)
    start = time.monotonic()
    cases = bench.make_cases(per, sdpa_per, 0, 0)
    rng = random.Random(7)
    rows: list[tuple[str, str, str, list[str], list[int]]] = []
    for i, case in enumerate(cases):
        dt = bench.DTYPES[case.dtype]
        graph, node, out = bench.record(case.fn, case.inputs)
        ref = bench.replay_fp64(graph, {node.name}, 120).values[node.name]
        values = {"eager": out}
        if case.dtype == "fp32":
            order = bench.cone(node)
            sites = bench.injection_sites(order, bench.rerun(order, wide=False))
            if sites:
                values["1e-5 injected"] = bench.rerun(order, wide=False, inject=rng.choice(sites), eps=1e-5)[node]
        for arm, value in values.items():
            got, samples = decisions(graph, node, ref, dt, value)
            if got:
                rows.append((case.family, case.dtype, arm, got, samples))
        if (i + 1) % 20 == 0:
            print(f"  … {i + 1}/{len(cases)} cases, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    print(f"## Seed stability of the judge\n\n`python bench/seeds.py{' --quick' if args.quick else ''}` — "
          f"{bench.machine()}; {len(cases)} cases, seeds 0–9, K = {bench.K_DEFAULT} (sequential up to 199).\n")
    print("| arm | values | same decision under all 10 seeds | decisions seen (values) | mean samples |")
    print("|---|---|---|---|---|")
    for arm in ("eager", "1e-5 injected"):
        mine = [r for r in rows if r[2] == arm]
        stable = sum(1 for r in mine if len(set(r[3])) == 1)
        kinds = Counter("/".join(sorted(set(r[3]))) for r in mine)
        mean = sum(sum(r[4]) / len(r[4]) for r in mine) / max(1, len(mine))
        print(f"| {arm} | {len(mine)} | {bench.pct(stable, len(mine))} | "
              + ", ".join(f"{k} ({v})" for k, v in kinds.most_common()) + f" | {mean:.0f} |")
    stable = sum(1 for r in rows if len(set(r[3])) == 1)
    print(f"| **all** | {len(rows)} | **{bench.pct(stable, len(rows))}** | | |")
    moving = [r for r in rows if len(set(r[3])) > 1]
    if moving:
        print("\nValues whose decision moves with the seed:\n")
        for fam, dtype, arm, got, _ in moving[:30]:
            print(f"- {fam} {dtype} {arm}: " + " ".join(got))
    print(f"\nWall time: {time.monotonic() - start:.0f} s.")


if __name__ == "__main__":
    main()
