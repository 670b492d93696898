"""What ablations cost and what they change.

    TRIAGE_TEST_ARMS=1 python bench/ablate.py

For each case: `triage run --no-minimize` with `--no-ablate` and with ablations, the verdict
each gives, wall seconds, the ratio, and the switches tried with their outcome. A run that gives
no report stops the benchmark with the case named.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("thread_count", ROOT / "fixtures" / "thread_count.py", "cpu,cpu/threads=1"),
    ("cancelling_sum", ROOT / "fixtures" / "cancelling_sum.py", "cpu,cpu/threads=1"),
    ("gh-88718", ROOT / "fixtures" / "issues" / "gh-88718" / "repro.py", "cpu"),
    ("matmul fault", ROOT / "fixtures" / "matmul_chain.py", "cpu,cpu/fault=mm"),
    ("compile_acosh", ROOT / "fixtures" / "compile_acosh.py", "cpu,cpu/compile"),
]


def run(name: str, script: Path, arms: str, *extra: str) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "triage", "run", str(script), "--arms", arms, "--json",
                               str(report), "--comment", "-", "--minimal", "-", "--no-minimize", "--quiet", *extra],
                              cwd=tmp, capture_output=True, text=True, env=dict(os.environ, TRIAGE_TEST_ARMS="1"),
                              timeout=900)
        if not report.exists():
            sys.exit(f"bench/ablate.py: case {name!r} ({' '.join(extra) or 'with ablations'}) gave no report "
                     f"(exit {proc.returncode})\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return json.loads(report.read_text()), time.monotonic() - start


def main() -> None:
    print("| case | arms | verdict, no ablation | verdict, ablations | s without | s with | ratio | switches |")
    print("|---|---|---|---|---|---|---|---|")
    for name, script, arms in CASES:
        plain, t0 = run(name, script, arms, "--no-ablate")
        full, t1 = run(name, script, arms)
        switches = ", ".join(f"{a['switch']}: {a['outcome']}" for a in full["ablations"]) or "none (cause already certain)"
        print(f"| {name} | {arms} | {plain['verdict']['kind']} | {full['verdict']['kind']} | {t0:.1f} | {t1:.1f} | "
              f"{t1 / t0:.2f}× | {switches} |", flush=True)


if __name__ == "__main__":
    main()
