"""Issue 14, sweeps: `triage sweep` on this machine's local Ray against a sequential loop of
`triage run` over the same items, the cost of resuming a finished sweep, and Ray's own overhead.

Usage: python bench/sweep.py [--items N] [--cpus-per-arm X[,Y...]] [--torch R1,R2] [--out FILE]

Items: every CPU-runnable shared fixture, as `bench/fixtures_table.py` runs them (the issue repros
fixtures/issues/gh-* that need no CUDA, and fixtures/seeds/*.py), copied into one folder (one
folder per report), each with the arms `triage run` picks for it (an eager and a compile arm
where the script calls torch.compile, else `cpu`) and `--no-minimize --timeout 180`, as the table
runs them. `--items N` takes the first N (a smoke test, not a measurement).

1. loop    `triage run ITEM` for each item, one after the other: the total wall time.
2. sweep   `triage sweep FOLDER` into a fresh results store, once per `--cpus-per-arm` value
           (default 0.5, the command's default, and 1: the CPUs an item asks Ray for per arm): the wall time of the whole
           command (Ray's start and stop included). Target: ≤ 0.6× the loop, with the same
           verdict for every item (a differing item is named, and the script exits non-zero).
3. resume  the first sweep again on its store: no item runs. Target: seconds.
5. releases (with `--torch R1,R2`) `triage sweep FOLDER --torch R1,R2` into a fresh store, each
           release from its cached environment (built before the clock starts): the wall time,
           each release's verdict counts, and the items whose verdict differs between them.
4. Ray     its own overhead per item: `engine.run_items` of 8 items that do nothing, one worker
           process each (max_calls=1, as for real items), on a local Ray of 2 CPUs: the wall time
           per item slot, and the engine's submitted→started and finished→collected latencies.

Prints a markdown table (and writes it to --out).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from triage.arms.spec import default_arms  # noqa: E402
from triage.sweep.model import ItemResult  # noqa: E402

FIXTURES = ROOT / "fixtures"
COMMON = ("--no-minimize", "--timeout", "180")


def corpus(folder: Path, limit: int | None) -> list[Path]:
    """The items, copied into `folder` as `<name>/repro.py`; their paths."""
    scripts = []
    for case in sorted((FIXTURES / "issues").glob("gh-*")):
        if not json.loads((case / "meta.json").read_text())["needs_cuda"]:
            scripts.append((case.name, case / "repro.py"))
    scripts += [(f"seed-{p.stem}", p) for p in sorted((FIXTURES / "seeds").glob("*.py"))]
    copied = []
    for name, path in scripts[:limit]:
        (folder / name).mkdir(parents=True)
        shutil.copyfile(path, folder / name / "repro.py")
        copied.append(folder / name / "repro.py")
    return copied


def cpu_seconds() -> float:
    """CPU time the whole machine has been busy (user, nice, system, interrupts; /proc/stat):
    a run's arms, Ray's daemons and workers included, which a killed sandbox or Ray's shutdown
    would keep out of this process's rusage.  Meaningful on a quiet machine only."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


CPU: dict[str, float] = {}  # "loop", or a sweep's output folder -> CPU seconds it used


def loop(scripts: list[Path], work: Path) -> tuple[float, dict[str, str]]:
    verdicts = {}
    start = time.monotonic()
    cpu = cpu_seconds()
    for script in scripts:
        report = work / "report.json"
        report.unlink(missing_ok=True)
        arms = ",".join(a.spec for a in default_arms(script.read_text())[0])
        subprocess.run([sys.executable, "-m", "triage", "run", str(script), "--arms", arms, "--json", str(report),
                        "--comment", "-", "--minimal", "-", "--quiet", *COMMON], cwd=work, capture_output=True,
                       timeout=1800)
        key = f"{script.parent.name}/repro.py"
        verdicts[key] = json.loads(report.read_text())["verdict"]["kind"] if report.exists() else "no report"
    CPU["loop"] = cpu_seconds() - cpu
    return time.monotonic() - start, verdicts


def sweep(folder: Path, out: Path, cpus_per_arm: str, *extra: str) -> tuple[float, dict]:
    start = time.monotonic()
    cpu = cpu_seconds()
    proc = subprocess.run([sys.executable, "-m", "triage", "sweep", str(folder), "--out", str(out), "--quiet",
                           "--cpus-per-arm", cpus_per_arm, *COMMON, *extra], capture_output=True, text=True,
                          timeout=7200)
    seconds = time.monotonic() - start
    CPU[str(out)] = cpu_seconds() - cpu
    if proc.returncode != 0:
        sys.exit(f"bench/sweep.py: triage sweep exited {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return seconds, json.loads((out / "sweep.json").read_text())


def nothing(item, arms, torch_build, settings) -> ItemResult:  # noqa: ANN001 - the engine's triage_one
    return ItemResult(key=item.key, kind=item.kind, title=item.title, content_sha256=item.content_sha256,
                      torch_build=torch_build, arms=",".join(arms), outcome="triaged")


def ray_overhead(items: int = 8) -> tuple[float, object]:
    """Wall seconds per item slot for items that do nothing, and the engine's stats."""
    from triage.sweep.engine import EngineOptions, ItemWork, run_items
    from triage.sweep.model import SweepItem

    work = [ItemWork(SweepItem(key=f"nothing-{i}", kind="script", title="", text=str(i)), ("cpu",), "bench")
            for i in range(items)]
    env = {"env_vars": {"PYTHONPATH": f"{ROOT}:{ROOT / 'bench'}"}}
    stats = run_items(work, nothing, lambda r: None, EngineOptions(num_cpus=2, runtime_env=env))
    return stats.wall_s * 2 / items, stats


def release_lines(across: tuple[float, dict], loop_s: float) -> list[str]:
    """The two-release sweep: its wall time, verdict counts per build, and what changed."""
    seconds, summary = across
    builds = summary["torch_builds"]
    verdicts = {b: {i["key"]: i["verdict"] or i["outcome"] for i in summary["items"] if i["torch_build"] == b}
                for b in builds}
    lines = [f"`triage sweep --torch` on {' and '.join(builds)} ({summary['counts']['results']} results, every "
             f"item on each release): {seconds:.0f} s ({seconds / loop_s:.2f}× the loop on one release).", "",
             "| verdict | " + " | ".join(builds) + " |", "|---|" + "---|" * len(builds)]
    kinds = sorted({v for found in verdicts.values() for v in found.values()})
    lines += [f"| {k} | " + " | ".join(str(sum(v == k for v in verdicts[b].values())) for b in builds) + " |"
              for k in kinds]
    changed = sorted(k for k in verdicts[builds[0]] if len({verdicts[b].get(k) for b in builds}) > 1)
    lines += ["", "Verdict changed between the releases: " + ("; ".join(
        f"{k} ({', '.join(f'{verdicts[b].get(k)} on {b}' for b in builds)})" for k in changed) or "none") + "."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--cpus-per-arm", default="0.5,1")
    parser.add_argument("--torch", default=None, help="also sweep on these releases (comma-separated)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    shares = args.cpus_per_arm.split(",")
    releases = [r.strip() for r in (args.torch or "").split(",") if r.strip()]
    if releases:
        from triage.sandbox.torch_envs import torch_env

        for release in releases:  # built (or found) before any clock starts
            torch_env(release, log=print)
    with tempfile.TemporaryDirectory(prefix="triage-bench-sweep-") as tmp:
        tmp_path = Path(tmp)
        folder = tmp_path / "corpus"
        scripts = corpus(folder, args.items)
        (tmp_path / "loop").mkdir()
        loop_s, loop_verdicts = loop(scripts, tmp_path / "loop")
        sweeps = {share: sweep(folder, tmp_path / f"out-{share}", share) for share in shares}
        sweep_cpu = {share: CPU[str(tmp_path / f"out-{share}")] for share in shares}
        resume_s, resumed = sweep(folder, tmp_path / f"out-{shares[0]}", shares[0])
        across = sweep(folder, tmp_path / "out-releases", shares[0], "--torch", ",".join(releases)) if releases else None
    differ = sorted({f"{k} (loop {v}, sweep at {share} CPU/arm {swept.get(k)})"
                     for share, (_, summary) in sweeps.items()
                     for swept in [{i["key"]: i["verdict"] or i["outcome"] for i in summary["items"]}]
                     for k, v in loop_verdicts.items() if swept.get(k) != v})
    per_slot, stats = ray_overhead()
    summary = sweeps[shares[0]][1]
    engine = summary["engine"] or {}
    lines = [
        f"{len(scripts)} items (`--no-minimize --timeout 180`), 2 cores, torch {summary['torch_builds'][0]}:",
        "",
        "| run | wall | vs loop | target | CPU busy (whole machine) |",
        "|---|---|---|---|---|",
        f"| loop of `triage run` | {loop_s:.0f} s | 1.00× | | {CPU['loop']:.0f} s |",
        *[f"| `triage sweep --cpus-per-arm {share}` (local Ray) | {seconds:.0f} s | {seconds / loop_s:.2f}× | ≤ 0.6× "
          f"| {sweep_cpu[share]:.0f} s |" for share, (seconds, _) in sweeps.items()],
        f"| `triage sweep` again (resume) | {resume_s:.1f} s | {resume_s / loop_s:.3f}× | seconds | |",
        "",
        f"Verdicts: every sweep against the loop, {len(loop_verdicts)} items: "
        + (f"differ: {'; '.join(differ)}" if differ else "identical")
        + f". The resumed sweep ran {resumed['counts']['ran']} items.",
        "",
        f"Ray's own overhead per item (8 items that do nothing, a fresh worker each, 2 CPUs): {per_slot:.2f} s of "
        f"wall per item slot; submitted→started median {stats.start_latency.median_s:.2f} s (queueing included), "
        f"finished→collected median {stats.collect_latency.median_s * 1000:.0f} ms. In the sweep above: "
        f"finished→collected median {(engine.get('collect_latency') or {}).get('median_s', 0) * 1000:.0f} ms.",
    ]
    if across is not None:
        lines += ["", *release_lines(across, loop_s)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
