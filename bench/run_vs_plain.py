"""Wall time of `triage run` against plain `python repro.py`, per arm, on three fixtures.

Usage: python bench/run_vs_plain.py [--repeat N]
Prints a markdown table of seconds and ratios (triage / plain).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "fixtures"
CASES = [
    ("matmul_chain (cpu)", ROOT / "fixtures" / "matmul_chain.py", "cpu"),
    ("logdet seed (cpu)", SHARED / "seeds" / "logdet_cpu_vs_cuda.py", "cpu"),
    ("gh-187180 (cpu)", SHARED / "issues" / "gh-187180" / "repro.py", "cpu"),
    ("gh-183768 (cpu/compile)", SHARED / "issues" / "gh-183768" / "repro.py", "cpu/compile"),
]


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, cwd="/tmp")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| case | plain python (s) | triage run, one arm (s) | ratio |")
    print("|---|---|---|---|")
    for name, script, arm in CASES:
        if not script.exists():
            continue
        plain = min(timed([sys.executable, str(script)]) for _ in range(args.repeat))
        tri = min(timed([sys.executable, "-m", "triage", "run", str(script), "--arms", arm, "--quiet",
                         "--comment", "-"]) for _ in range(args.repeat))
        print(f"| {name} | {plain:.2f} | {tri:.2f} | {tri / plain:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
