"""Every issue repro and seed (fixtures/issues/gh-*, fixtures/seeds) through `triage run`,
tabulated next to its meta.json.

    python bench/fixtures_table.py [--out docs/fixtures.md]

Issues run on the arms their reporter compared that a CPU can run (eager vs compile as
`cpu,cpu/compile`, everything else on `cpu` against float64); seeds on `cpu`. A CUDA-only case
runs so too, with its reporter's output (`reported.txt`, copied from meta.json's
`reported_output` as it stands there) judged as the reported arm (`--reported`). Prints the
markdown table and writes it to --out; a case that gives no report is named and the script
exits non-zero without writing --out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def run(script: Path, arms: str, *extra: str) -> tuple[dict | None, float]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "triage", "run", str(script), "--arms", arms, "--json",
                               str(report), "--comment", "-", "--minimal", "-", "--no-minimize", "--quiet",
                               "--timeout", "180", *extra], cwd=tmp, capture_output=True, text=True, timeout=900)
        seconds = time.monotonic() - start
        if not report.exists():
            print(f"{script}: no report (exit {proc.returncode})\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}",
                  file=sys.stderr, flush=True)
            return None, seconds
        return json.loads(report.read_text()), seconds


def reported_cell(report: dict) -> str:
    """The reported arm: each posted value judged, or why not."""
    values = (report.get("reported") or {}).get("values") or []
    if not values:
        return "no value in the posted text"
    parts = []
    for v in values:
        j = v.get("judgement") or {}
        what = j.get("zone") if j.get("status") == "judged" else "not judged"
        parts.append(f"`{v['printed'][:40]}` {what}")
    return "; ".join(parts).replace("|", "\\|")


def cause(report: dict) -> str:
    summary = report["verdict"]["summary"].replace("|", "\\|").replace("\n", " ")
    agreed = [a["switch"] for a in report.get("ablations", []) if a["outcome"] in ("agree-bitwise", "within-tolerance")]
    text = summary if len(summary) <= 260 else summary[:257] + "…"
    return text + (f" **Ablation:** `{'`, `'.join(agreed)}` agrees." if agreed else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "docs" / "fixtures.md"))
    args = parser.parse_args()
    rows = ["| fixture | arms | reporter saw / maintainers | torch 2.13 CPU (meta.json) | triage verdict | cause triage gives | s |",
            "|---|---|---|---|---|---|---|"]
    cuda_rows = ["| fixture | arms | reporter saw / maintainers | triage verdict | posted values (reported.txt) | "
                 "cause triage gives | s |", "|---|---|---|---|---|---|---|"]
    failed = []
    for case in sorted((FIXTURES / "issues").glob("gh-*")):
        meta = json.loads((case / "meta.json").read_text())
        verdict = meta.get("maintainer_verdict", "").split(" (")[0][:60]
        seen = f"{meta['classification_expected']} / {verdict}"
        arms = "cpu,cpu/compile" if meta["arms"] == ["eager", "compile"] else "cpu"
        posted = ("--reported", str(case / "reported.txt")) if meta["needs_cuda"] else ()
        report, seconds = run(case / "repro.py", arms, *posted)
        if report is None:
            failed.append(case.name)
            continue
        kind = f"**{report['verdict']['kind']}**"
        if meta["needs_cuda"]:
            cuda_rows.append(f"| {case.name} | {arms} | {seen} | {kind} | {reported_cell(report)} | "
                             f"{cause(report)} | {seconds:.0f} |")
        else:
            rows.append(f"| {case.name} | {arms} | {seen} | {meta['observed_status']} | {kind} | "
                        f"{cause(report)} | {seconds:.0f} |")
        print((cuda_rows if meta["needs_cuda"] else rows)[-1], flush=True)
    for seed in sorted((FIXTURES / "seeds").glob("*.py")):
        report, seconds = run(seed, "cpu")
        if report is None:
            failed.append(f"seeds/{seed.name}")
            continue
        rows.append(f"| seeds/{seed.name} | cpu | (article) | | **{report['verdict']['kind']}** | {cause(report)} | "
                    f"{seconds:.0f} |")
        print(rows[-1], flush=True)
    if failed:
        sys.exit(f"bench/fixtures_table.py: no report for {', '.join(failed)}; {args.out} left as it was")
    text = ("\n".join(rows) + "\n\n## CUDA-only cases, judged from what their reporters posted\n\n"
            "Run on the CPU (the CUDA calls collapse onto it) with `--reported reported.txt`: meta.json's "
            "`reported_output` as it stands, often a summary, so a value it paraphrases is listed as not "
            "judged, never guessed.\n\n" + "\n".join(cuda_rows) + "\n")
    # The host matters: a kernel's vectorized path differs with the CPU capability (gh-177839's
    # logit bug shows on AVX2, not on AVX-512).
    host = (f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"{os.cpu_count()} cores, `--no-minimize`")
    Path(args.out).write_text("# Shared fixtures through triage\n\nGenerated by `python bench/fixtures_table.py` "
                              f"({host}).\n\n" + text)
    print(text)


if __name__ == "__main__":
    main()
