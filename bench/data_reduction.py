"""Data reduction of minimal repros: input elements before and after, queries, seconds.

Usage: python bench/data_reduction.py [--out DIR]

Runs `triage run` (the whole pipeline, as a user would) on every still-diverging case that has
two arms to minimize — the shared fixtures' real reports that diverge on this machine, the
bundled fixtures with their test arms — and reads `report.json`'s `minimal`: op count, input
elements before (arm A's recorded values) and after the data passes, the data passes' queries
and seconds, whether the repro was verified, whether it needs a side file, and the longest line
of `minimal.py`.  Prints a markdown table (paste it into bench/RESULTS.md) with the median and
max of the elements after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

CASES = [
    ("issues/gh-183768/repro.py", "cpu,cpu/compile"),
    ("issues/gh-194347/repro.py", "cpu,cpu/compile"),
    ("compile_acosh.py", "cpu,cpu/compile"),
    ("fp16_intermediate_compile.py", "cpu,cpu/compile"),
    ("judge/expm1_backend.py", "cpu,cpu/compile"),
    ("judge/acosh_backend.py", "cpu,cpu/compile"),
    ("judge/midgraph_half_compile.py", "cpu,cpu/compile"),
    ("matmul_chain.py", "cpu,cpu/fault=mm"),
    ("matmul_chain.py", "cpu,cpu/fault=mm:ulp"),
    ("singular_logdet.py", "cpu,cpu/fault=linalg_slogdet:inf"),
    ("hilbert_solve.py", "cpu,cpu/fault=linalg_solve_ex"),
    ("cancelling_sum.py", "cpu,cpu/fault=sum:ulp"),
]


def run_case(script: str, arms: str, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "triage", "run", str(FIXTURES / script), "--arms", arms, "--quiet",
               "--json", str(out / "report.json"), "--comment", str(out / "comment.md"),
               "--minimal", str(out / "minimal.py")]
    subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, TRIAGE_TEST_ARMS="1"),
                   cwd=ROOT, timeout=1800)
    report = json.loads((out / "report.json").read_text())
    m = report.get("minimal")
    row = {"case": script.replace("issues/", "").replace("/repro.py", ""), "arms": arms,
           "verdict": report["verdict"]["kind"], "minimal": m is not None}
    if m is None:
        row["why"] = next((n for n in report["notes"] if n.startswith("Not minimized")), "no minimal repro")
        return row
    t = m.get("timings", {})
    script_text = m["script"]
    row.update(ops=len(m["ops"]), before=t.get("elements_before"), after=t.get("elements_after"),
               queries=t.get("data_queries"), seconds=t.get("data"), verified=m["verified"],
               side_file=m.get("inputs_file") is not None,
               longest=max(len(line) for line in script_text.splitlines()))
    return row


def table(rows: list[dict]) -> str:
    lines = ["| case | arms | verdict | ops | input elements before → after | data queries | data s | "
             "verified | side file | longest line |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["minimal"]:
            lines.append(f"| {r['case']} | `{r['arms']}` | {r['verdict']} | — | not minimized: "
                         f"{r['why'][:90]} | | | | | |")
            continue
        lines.append(f"| {r['case']} | `{r['arms']}` | {r['verdict']} | {r['ops']} | {r['before']} → {r['after']} | "
                     f"{r['queries']} | {r['seconds']} | {'yes' if r['verified'] else '**no**'} | "
                     f"{'yes' if r['side_file'] else 'no'} | {r['longest']} |")
    after = [r["after"] for r in rows if r["minimal"] and r["after"] is not None]
    if after:
        lines.append("")
        lines.append(f"Elements after, over the {len(after)} minimized cases: median {statistics.median(after):g}, "
                     f"max {max(after)}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="where each case's report, comment and minimal.py go")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="triage-data-bench-"))
    rows = []
    for script, arms in CASES:
        name = f"{script.replace('/', '_')}-{arms.replace('/', '_').replace(',', '+').replace(':', '_')}"
        rows.append(run_case(script, arms, out / name))
        print(f"{rows[-1]['case']} {arms}: {rows[-1].get('before')} -> {rows[-1].get('after')}", file=sys.stderr)
    print(table(rows))
    print(f"\n(reports under {out})", file=sys.stderr)


if __name__ == "__main__":
    main()
