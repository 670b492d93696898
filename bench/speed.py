"""Issue 13, speed: how much longer a maintainer waits for `triage run` than for `python repro.py`,
and how much memory triage's processes take meanwhile.

Usage: python bench/speed.py [--repeat N] [--only eager|two|full]... [--quick]

Three sections, each a markdown table; every time is a whole process's wall time, the median of
N runs (default 3), the runs of a case interleaved so that a busy machine slows both sides alike:
  eager  `triage run FIX --arms cpu` on every top-level fixture (fixtures/*.py) against plain
         `python FIX`. Target: ≤ 1.2×.
  two    two arms, minimization and ablations off (`--no-minimize --no-ablate`), against the
         slower of the two arms run alone with the same options (both are measured; the slower
         median is the baseline). Target: ≤ 1.0×, i.e. the second arm costs no wall time.
  full   the default pipeline (arms, float64 reference, rounding judge, ablations, minimization,
         verification of minimal.py; comment.md and minimal.py written) against plain python.
         Target: ≤ 1.5×. fp16_overflow.py's natural arm is `cpu` alone, judged against float64:
         it has no two arms to minimize, which its report column shows.
`--quick` runs the first two cases of each section once: a smoke test, not a measurement.

Peak memory: every 50 ms the benchmark reads /proc for the measured process and its descendants
(found through their parent ids) and keeps each one's VmHWM, the kernel's own high-water mark of
its resident set, so growth between two polls is not lost; only a process's last 50 ms, and a
process that lives less than that, can be missed. Reported: triage's own process, its largest
single descendant (an arm's worker, a minimizer's warm worker...) and the plain python process
itself (in `two`, the slower arm alone's largest descendant). Polling costs about 1 ms of CPU per
poll, for plain and triage runs alike.

Plain python's inductor cache and triage's per-script compile cache are both warm after a case's
first repetition, as they are for a maintainer who runs the repro again. Listed as skipped, with
the reason: a fixture whose plain run cannot work here (it needs CUDA or a missing module; its
error is shown), and in `eager` a fixture that calls torch.compile (the eager arm makes
torch.compile return the function itself, so plain python, which compiles, is no baseline; such
fixtures are timed in `two` and `full`). A plain run that exits non-zero for any other reason (a
failing assertion, the API error a fixture makes on purpose) is the script's own behaviour, and
its time counts. Cases whose arms include a fault-injecting test arm (`cpu/fault=...`) run
triage with TRIAGE_TEST_ARMS=1. Exits non-zero, naming the case, when a run fails: a missing row
would make the tables lie by omission.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from triage.arms.spec import calls_compile  # noqa: E402

FIXTURES = ROOT / "fixtures"
TRIAGE_RUN = [sys.executable, "-m", "triage", "run"]
NO_OUTPUT_FILES = ("--quiet", "--comment", "-", "--minimal", "-")
ARMS_ONLY = ("--no-minimize", "--no-ablate")
POLL_S = 0.05
# Exit status of `triage run` when the script could not run at all: the right answer for a script
# whose plain run fails too.
COULD_NOT_RUN = 3
# Plain-run errors that say the script cannot work on this machine, rather than that it fails.
CANNOT_RUN_HERE = ("CUDA", "ModuleNotFoundError")


@dataclass(frozen=True)
class Case:
    script: Path
    arms: str
    options: tuple[str, ...]
    # Baseline: the slower of the arms run alone (section `two`), instead of plain python.
    against_arms_alone: bool = False

    @property
    def name(self) -> str:
        return str(self.script.relative_to(FIXTURES))


@dataclass(frozen=True)
class Section:
    label: str  # for the summary line
    title: str
    target: float
    baseline: str  # what the baseline columns hold, for their headers
    cases: list[Case]


@dataclass(frozen=True)
class Sample:
    seconds: float
    returncode: int
    output: str
    own_peak_kib: int
    largest_descendant_peak_kib: int


@dataclass(frozen=True)
class Row:
    arms: str
    baseline_s: float
    triage_s: float
    triage_peak_kib: int
    child_peak_kib: int
    baseline_peak_kib: int
    report: str


TWO_ARMS_ONLY = NO_OUTPUT_FILES + ARMS_ONLY
# comment.md and minimal.py are written, into the case's temporary working directory.
FULL = ("--quiet",)
SECTIONS = {
    "eager": Section(
        "one eager arm", "One eager arm: `triage run FIX --arms cpu` against `python FIX`", 1.2, "plain",
        [Case(script, "cpu", NO_OUTPUT_FILES) for script in sorted(FIXTURES.glob("*.py"))]),
    "two": Section(
        "two arms", "Two arms, minimization and ablations off, against the slower arm alone", 1.0, "slower arm alone",
        [Case(FIXTURES / "compile_acosh.py", "cpu,cpu/compile", TWO_ARMS_ONLY, against_arms_alone=True),
         Case(FIXTURES / "matmul_chain.py", "cpu,cpu/threads=1", TWO_ARMS_ONLY, against_arms_alone=True),
         Case(FIXTURES / "fp16_intermediate_compile.py", "cpu,cpu/compile", TWO_ARMS_ONLY, against_arms_alone=True)]),
    "full": Section(
        "full pipeline", "Full pipeline (`triage run` defaults) against `python FIX`", 1.5, "plain",
        [Case(FIXTURES / "issues" / "gh-183768" / "repro.py", "cpu,cpu/compile", FULL),
         Case(FIXTURES / "fp16_overflow.py", "cpu", FULL),
         Case(FIXTURES / "compile_acosh.py", "cpu,cpu/compile", FULL),
         Case(FIXTURES / "matmul_chain.py", "cpu,cpu/fault=mm", FULL),
         Case(FIXTURES / "judge" / "expm1_backend.py", "cpu,cpu/compile", FULL)]),
}


def children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited since the directory was listed
            continue
        # The command name in parentheses may hold spaces: the parent id is the second field after it.
        parent = int(stat.rsplit(b")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    return children


def peak_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None  # gone, or a zombie (it has no memory left to report)


class TreePeaks:
    """Polls a process and its descendants every POLL_S from a thread, keeping each one's VmHWM."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.peak_kib: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while True:
            children = children_by_parent()
            pending = [self.root]
            while pending:
                pid = pending.pop()
                kib = peak_rss_kib(pid)
                if kib is not None:
                    self.peak_kib[pid] = max(kib, self.peak_kib.get(pid, 0))
                pending.extend(children.get(pid, ()))
            if self._stop.wait(POLL_S):
                return

    def own_kib(self) -> int:
        return self.peak_kib.get(self.root, 0)

    def largest_descendant_kib(self) -> int:
        return max((kib for pid, kib in self.peak_kib.items() if pid != self.root), default=0)


def run_polled(argv: list[str], cwd: Path, env: dict[str, str] | None) -> Sample:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    peaks = TreePeaks(proc.pid)
    output, _ = proc.communicate()
    seconds = time.perf_counter() - start
    peaks.stop()
    return Sample(seconds, proc.returncode, output, peaks.own_kib(), peaks.largest_descendant_kib())


def fail(case: Case, what: str, argv: list[str], output: str) -> NoReturn:
    sys.exit(f"bench/speed.py: case {case.name!r} ({case.arms}) failed ({what}): {' '.join(argv)}\n{output[-3000:]}")


def run_plain(case: Case, cwd: Path) -> Sample:
    argv = [sys.executable, str(case.script)]
    sample = run_polled(argv, cwd, None)
    if sample.returncode < 0:
        fail(case, f"plain python killed by signal {-sample.returncode}", argv, sample.output)
    return sample


def cannot_run_here(plain: Sample) -> str | None:
    """Why the plain run shows that the script cannot work on this machine, or None."""
    if plain.returncode == 0 or not any(marker in plain.output for marker in CANNOT_RUN_HERE):
        return None
    lines = [line.strip() for line in plain.output.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {plain.returncode}"


def run_triage(case: Case, arms: str, cwd: Path, plain_failed: bool) -> tuple[Sample, dict]:
    report = cwd / "report.json"
    report.unlink(missing_ok=True)
    argv = [*TRIAGE_RUN, str(case.script), "--arms", arms, *case.options, "--json", str(report)]
    env = dict(os.environ, TRIAGE_TEST_ARMS="1") if "/fault=" in arms else None
    sample = run_polled(argv, cwd, env)
    accepted = (0, COULD_NOT_RUN) if plain_failed else (0,)
    if sample.returncode not in accepted or not report.exists():
        fail(case, f"exit {sample.returncode}" + ("" if report.exists() else ", no report"), argv, sample.output)
    data = json.loads(report.read_text())
    if data["verdict"]["kind"] == "could-not-run" and not plain_failed:
        fail(case, "triage could not run a script that plain python runs", argv, sample.output)
    return sample, data


def describe(report: dict) -> str:
    """The verdict, and which of the optional stages ran."""
    parts = [report["verdict"]["kind"]]
    ablations = [a for a in report.get("ablations") or [] if a["outcome"] != "skipped"]
    if ablations:
        parts.append(f"{len(ablations)} ablation{'s' * (len(ablations) != 1)}")
    minimal = report.get("minimal")
    if minimal:
        parts.append(f"minimal: {len(minimal['ops'])} op{'s' * (len(minimal['ops']) != 1)}, "
                     + ("verified" if minimal["verified"] else "NOT verified"))
    return "; ".join(parts)


def measure(case: Case, repeat: int) -> Row | str:
    """The case's row, or why it was skipped."""
    if calls_compile(case.script.read_text()) and "compile" not in case.arms:
        return "calls torch.compile, which plain python runs and an eager arm does not"
    triage_runs: list[Sample] = []
    # Baseline runs by name: "plain", or each arm run alone.
    baselines: dict[str, list[Sample]] = {}
    report: dict = {}
    with tempfile.TemporaryDirectory(prefix="triage-speed-") as tmp:
        cwd = Path(tmp)
        for _ in range(repeat):
            plain_failed = False  # without a plain run, every triage run must give a verdict
            if case.against_arms_alone:
                for arm in case.arms.split(","):
                    baselines.setdefault(arm, []).append(run_triage(case, arm, cwd, plain_failed)[0])
            else:
                plain = run_plain(case, cwd)
                reason = cannot_run_here(plain)
                if reason:
                    return reason
                plain_failed = plain.returncode != 0
                baselines.setdefault("plain", []).append(plain)
            sample, report = run_triage(case, case.arms, cwd, plain_failed)
            triage_runs.append(sample)
    slowest, baseline_runs = max(baselines.items(), key=lambda item: statistics.median(s.seconds for s in item[1]))
    if case.against_arms_alone:
        arms = f"{case.arms} (alone: {slowest})"
        baseline_peak = max(s.largest_descendant_peak_kib for s in baseline_runs)
    else:
        arms = case.arms
        baseline_peak = max(s.own_peak_kib for s in baseline_runs)
    return Row(arms,
               baseline_s=statistics.median(s.seconds for s in baseline_runs),
               triage_s=statistics.median(s.seconds for s in triage_runs),
               triage_peak_kib=max(s.own_peak_kib for s in triage_runs),
               child_peak_kib=max(s.largest_descendant_peak_kib for s in triage_runs),
               baseline_peak_kib=baseline_peak, report=describe(report))


def mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def run_section(section: Section, cases: list[Case], repeat: int) -> str:
    """Prints the section's table as its rows come; returns its summary."""
    baseline_peak = "plain peak MiB" if section.baseline == "plain" else f"{section.baseline}: largest child peak MiB"
    print(f"\n### {section.title} (target ≤ {section.target}×)\n\n"
          f"| case | arms | {section.baseline} s | triage s | ratio | target | met | triage parent peak MiB "
          f"| largest child peak MiB | {baseline_peak} | report |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    ratios: list[float] = []
    skipped: list[str] = []
    for case in cases:
        row = measure(case, repeat)
        if isinstance(row, str):
            skipped.append(f"{case.name} ({row})")
            continue
        # Judged as shown (two decimals): a 1.004× is noise, and "1.00× no" would read as a bug.
        ratio = round(row.triage_s / row.baseline_s, 2)
        ratios.append(ratio)
        print(f"| {case.name} | {row.arms} | {row.baseline_s:.2f} | {row.triage_s:.2f} | {ratio:.2f}× "
              f"| ≤ {section.target}× | {'yes' if ratio <= section.target else 'no'} | {mib(row.triage_peak_kib)} "
              f"| {mib(row.child_peak_kib)} | {mib(row.baseline_peak_kib)} | {row.report} |", flush=True)
    if skipped:
        print(f"\nSkipped: {'; '.join(skipped)}.", flush=True)
    met = sum(ratio <= section.target for ratio in ratios)
    median = f", median ratio {statistics.median(ratios):.2f}×" if ratios else ""
    return f"{section.label}: {met}/{len(ratios)} within {section.target}×{median}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=None, help="runs per measurement, median kept (default 3)")
    parser.add_argument("--only", action="append", choices=list(SECTIONS), help="run this section (repeatable)")
    parser.add_argument("--quick", action="store_true", help="smoke test: repeat 1, two cases per section")
    args = parser.parse_args()
    repeat = args.repeat if args.repeat is not None else 1 if args.quick else 3
    if repeat < 1:
        parser.error("--repeat must be at least 1")
    started = time.perf_counter()
    summaries = []
    for key in [key for key in SECTIONS if key in (args.only or SECTIONS)]:
        section = SECTIONS[key]
        summaries.append(run_section(section, section.cases[:2] if args.quick else section.cases, repeat))
    print(f"\n**Summary** (median of {repeat}): {'; '.join(summaries)}. "
          f"Benchmark wall time {time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
