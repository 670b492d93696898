"""Wall time of `triage run` against plain `python repro.py`, per arm, on four fixtures, and
the namespace sandbox's own cost (`--isolation namespace` against `--isolation process`).

Usage: python bench/run_vs_plain.py [--repeat N]
Prints a markdown table of seconds and ratios (triage / plain). The two isolations run
interleaved, best of N each, so that a busy machine slows both alike. Exits non-zero, naming
the case, when a run fails: a missing row would make the table lie by omission.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
# (name, script, arm, plain python needs CUDA): the logdet seed moves its model to the GPU, so
# without one its plain run is only the time to the `.cuda()` error, not a baseline.
CASES = [
    ("matmul_chain (cpu)", FIXTURES / "matmul_chain.py", "cpu", False),
    ("logdet seed (cpu)", FIXTURES / "seeds" / "logdet_cpu_vs_cuda.py", "cpu", True),
    ("gh-187180 (cpu)", FIXTURES / "issues" / "gh-187180" / "repro.py", "cpu", False),
    ("gh-183768 (cpu/compile)", FIXTURES / "issues" / "gh-183768" / "repro.py", "cpu/compile", False),
]


def timed(name: str, argv: list[str], report: Path | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd="/tmp")
    seconds = time.perf_counter() - start
    if proc.returncode != 0 or (report is not None and not report.exists()):
        what = f"exit {proc.returncode}" + ("" if report is None or report.exists() else ", no report")
        sys.exit(f"bench/run_vs_plain.py: case {name!r} failed ({what}): {' '.join(argv)}\n"
                 f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| case | plain python (s) | triage run, one arm, namespace sandbox (s) | ratio "
          "| same, process sandbox only (s) | sandbox's own cost |")
    print("|---|---|---|---|---|---|")
    for name, script, arm, plain_needs_cuda in CASES:
        best = {"namespace": float("inf"), "process": float("inf")}
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            for _ in range(args.repeat):
                for how in best:
                    seconds = timed(name, [sys.executable, "-m", "triage", "run", str(script), "--arms", arm,
                                           "--quiet", "--comment", "-", "--minimal", "-", "--json", str(report),
                                           "--isolation", how], report)
                    best[how] = min(best[how], seconds)
                    data = json.loads(report.read_text())
                    if data["verdict"]["kind"] == "could-not-run":
                        sys.exit(f"bench/run_vs_plain.py: case {name!r}: triage could not run the script")
        tri, weak = best["namespace"], best["process"]
        cost = f"{100 * (tri - weak) / weak:+.1f}%"
        if plain_needs_cuda and not torch.cuda.is_available():
            print(f"| {name} | not run (needs CUDA) | {tri:.2f} | — | {weak:.2f} | {cost} |", flush=True)
            continue
        plain = min(timed(name, [sys.executable, str(script)]) for _ in range(args.repeat))
        print(f"| {name} | {plain:.2f} | {tri:.2f} | {tri / plain:.2f}× | {weak:.2f} | {cost} |", flush=True)


if __name__ == "__main__":
    main()
