"""Issue 24, containment: what the kernel's confinement of every job costs an arm.

Usage: python bench/confinement.py --baseline-python OLD/bin/python [--repeat N]

Each job now confines itself (Landlock, seccomp: triage/sandbox/confine.py) and runs in a
cgroup of its own (triage/sandbox/cgroups.py); triage has no switch to turn either off, on
purpose.  So the baseline is another installation: a venv with triage at the commit before the
change (`git worktree add /tmp/old 7822e94 && python -m venv /tmp/oldvenv && /tmp/oldvenv/bin/pip
install torch==2.13.0 /tmp/old`).  For each case, `triage run FIX --arms ARM --no-minimize
--no-ablate` runs N times on each installation, interleaved so that a busy machine slows both
alike; reported are the medians of the arm's own wall time (`wall_s` in report.json: start to
result, the part confinement can slow) and of the whole run (`seconds`).  Target: ≤ 1.05× per
arm.  The parent notices an arm's exit at its next 50 ms poll, so differences come in steps of
about 0.05 s.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = (("thread_count.py", "cpu"), ("matmul_chain.py", "cpu"), ("hilbert_solve.py", "cpu"),
         ("compile_acosh.py", "cpu/compile"))
TARGET = 1.05


def arm_and_run_seconds(python: str, fixture: str, arm: str, folder: Path) -> tuple[float, float]:
    report = folder / "report.json"
    done = subprocess.run([python, "-m", "triage", "run", str(ROOT / "fixtures" / fixture), "--arms", arm,
                           "--quiet", "--comment", "-", "--minimal", "-", "--no-minimize", "--no-ablate",
                           "--json", str(report)], capture_output=True, text=True, cwd=folder)
    if not report.exists():
        sys.exit(f"{python} on {fixture}: no report (exit {done.returncode}): {done.stderr[-500:]}")
    data = json.loads(report.read_text())
    return data["arms"][0]["wall_s"], data["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-python", required=True, help="an interpreter with triage before the change")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    pythons = {"before": args.baseline_python, "confined": sys.executable}
    print("| case | arm | arm s, before | arm s, confined | arm ratio | run s, before | run s, confined | "
          "run ratio | met |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="triage-bench-") as tmp:
        for fixture, arm in CASES:
            arms: dict[str, list[float]] = {k: [] for k in pythons}
            runs: dict[str, list[float]] = {k: [] for k in pythons}
            for _ in range(args.repeat + 1):  # the first round warms both compile caches, and is dropped
                for name, python in pythons.items():
                    arm_s, run_s = arm_and_run_seconds(python, fixture, arm, Path(tmp))
                    arms[name].append(arm_s)
                    runs[name].append(run_s)
            a0, a1 = (statistics.median(arms[k][1:]) for k in pythons)
            r0, r1 = (statistics.median(runs[k][1:]) for k in pythons)
            print(f"| {fixture} | {arm} | {a0:.3f} | {a1:.3f} | {a1 / a0:.3f}× | {r0:.3f} | {r1:.3f} | "
                  f"{r1 / r0:.3f}× | {'yes' if a1 / a0 <= TARGET else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
