"""Stage 2: run the repro on each arm, each in its own fresh, isolated worker process."""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import numpy as np

from triage.model import ArmRun, ArmSpec, Observable, Repro
from triage.sandbox import Limits, ProcessOutcome, physical_memory, run_isolated, scrubbed_environment

GiB = 1 << 30
SPREAD_ARRAYS = ("sig", "up", "dn", "mu", "sd", "nf")  # what the worker's rounding simulation ships


@dataclass
class RunOptions:
    timeout_s: float = 300.0
    memory_bytes: int | None = None  # per arm; None: a share of this machine's memory
    output_bytes: int = 256 * 1024
    seed: int = 0
    reference: bool = True
    reference_budget_s: float = 120.0
    value_budget_bytes: int = 64 << 20
    max_leaf_bytes: int = 1 << 30
    jobs: int | None = None
    collect_env_timeout_s: float = 30.0
    cache_dir: str | None = None
    keep_dirs: bool = False
    export_graphs: bool = True  # eager arms write their op graph for the minimizer
    # Simulated rounding (triage/worker/rounding.py): K random replays of each observed value's
    # graph; 0 switches it off. It needs the float64 reference.
    rounding_samples: int = 29
    rounding_budget_s: float = 60.0


Progress = Callable[[str, str, dict[str, Any]], None]  # (arm spec, event, details)


def run_arms(repro: Repro, arms: list[ArmSpec], options: RunOptions,
             progress: Progress | None = None) -> list[ArmRun]:
    """Run every arm (concurrently, where the machine has cores for it); order is kept."""
    jobs = options.jobs or max(1, min(len(arms), os.cpu_count() or 1))
    memory = options.memory_bytes or max(2 * GiB, int(physical_memory() * 0.6) // jobs)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_arm, repro, arm, options, memory, progress) for arm in arms]
        return [f.result() for f in futures]


def run_arm(repro: Repro, arm: ArmSpec, options: RunOptions, memory_bytes: int,
            progress: Progress | None = None) -> ArmRun:
    notify = (lambda event, details: progress(arm.spec, event, details)) if progress else (lambda e, d: None)
    root = Path(tempfile.mkdtemp(prefix="triage-arm-"))
    work, out = root / "work", root / "out"
    work.mkdir()
    out.mkdir()
    cache = _EnvCache(options.cache_dir)
    cached_env = cache.get(arm.device)
    job = {
        "script": repro.path,
        "arm": arm.to_job(),
        "seed": options.seed,
        "collect_env": cached_env,
        "collect_env_timeout": options.collect_env_timeout_s,
        "reference": options.reference,
        "reference_budget_s": options.reference_budget_s,
        "value_budget": options.value_budget_bytes,
        "max_leaf_bytes": options.max_leaf_bytes,
        "export_graph": options.export_graphs,
        "rounding": {"samples": options.rounding_samples, "budget_s": options.rounding_budget_s,
                     "value_bytes": options.value_budget_bytes}
        if options.reference and options.rounding_samples else None,
        "result_dir": str(out),
        # CUDA reserves far more address space than it uses: limit it on CPU arms only.
        "address_space_limit": memory_bytes + 8 * GiB if arm.device == "cpu" else None,
    }
    (out / "job.json").write_text(json.dumps(job))
    limits = Limits(timeout_s=options.timeout_s + options.collect_env_timeout_s, memory_bytes=memory_bytes,
                    output_bytes=options.output_bytes,
                    grace_after={"script-start": options.timeout_s,
                                 "script-done": options.reference_budget_s + options.rounding_budget_s + 30})
    notify("start", {})
    started = time.monotonic()
    outcome = run_isolated(
        [sys.executable, "-I", "-m", "triage.worker", str(out / "job.json")],
        cwd=str(work), env=scrubbed_environment(), limits=limits,
        on_message=lambda m: notify("message", m),
    )
    run = _arm_run(arm, outcome, out, options, memory_bytes)
    run.wall_s = round(time.monotonic() - started, 3)
    if run.environment and not cached_env:
        cache.put(arm.device, run.environment)
    if (out / "graph" / "graph.json").exists() and run.completed:
        # Outlives the arm's directory; the pipeline removes it when the minimizer is done.
        holder = tempfile.mkdtemp(prefix="triage-graph-")
        shutil.move(str(out / "graph"), holder)
        run.graph_dir = os.path.join(holder, "graph")
    if not options.keep_dirs:
        shutil.rmtree(root, ignore_errors=True)
    notify("end", {"status": run.status})
    return run


def _arm_run(arm: ArmSpec, outcome: ProcessOutcome, out: Path, options: RunOptions, memory: int) -> ArmRun:
    run = ArmRun(spec=arm.spec, device=arm.device, mode=arm.mode, status="ok",
                 exit_code=outcome.exit_code, signal=outcome.signal, stdout=outcome.stdout,
                 stderr=outcome.stderr, output_dropped=outcome.output_dropped)
    result_file = out / "result.json"
    result: dict[str, Any] = {}
    if result_file.exists() and not (outcome.timed_out or outcome.memory_exceeded):
        result = json.loads(result_file.read_text())
    phases = [m.get("phase") for m in outcome.messages if "phase" in m]
    streamed = [m["observable"] for m in outcome.messages if isinstance(m.get("observable"), dict)]
    if result:
        _fill_from_result(run, result, out / "values.npz")
    else:
        # No result file: keep what the worker streamed before it died.
        run.observables = [
            Observable(index=o.get("index", i), kind=o.get("kind", "?"), label=o.get("label", "?"),
                       line=o.get("line"), fingerprint=o.get("fingerprint"),
                       reference={"fingerprint": None, "note": "the arm did not finish", "approximate": False})
            for i, o in enumerate(streamed)
        ]
        run.elapsed_s = round(outcome.elapsed_s, 3)
        if outcome.timed_out:
            run.status = "timeout"
            where = "while computing the float64 reference" if "script-done" in phases else "while running the script"
            limit = options.reference_budget_s if "script-done" in phases else options.timeout_s
            run.failure = f"killed after running past the {limit:.0f} s limit {where} (raise it with --timeout)"
        elif outcome.memory_exceeded:
            run.status = "crashed"
            run.failure = f"killed for using more than {memory / GiB:.1f} GiB of memory (raise it with --memory)"
        else:
            run.status = "crashed"
            worker_error = next((m.get("error") for m in outcome.messages if m.get("phase") == "worker-error"), None)
            if worker_error:
                run.failure = "triage's worker failed (a bug in triage): " + worker_error.strip().splitlines()[-1]
                run.stderr = (run.stderr + "\n" + worker_error)[-options.output_bytes:]
            elif outcome.signal:
                run.failure = f"the process died with {outcome.signal}{_signal_hint(outcome)}"
            else:
                run.failure = f"the process exited with status {outcome.exit_code} before triage could collect a result"
                if "script-start" in phases and "script-done" not in phases:
                    run.failure = f"the script ended the process (os._exit or similar, status {outcome.exit_code}) before triage could collect a result"
    return run


def _signal_hint(outcome: ProcessOutcome) -> str:
    text = outcome.stderr
    hint = " (segmentation fault)" if outcome.signal == "SIGSEGV" else ""
    marker = 'File "'
    for line in text.splitlines():
        if line.strip().startswith(marker) and "triage/worker" not in line:
            hint = hint + f"; last script frame: {line.strip()}"
    return hint


def _fill_from_result(run: ArmRun, result: dict[str, Any], values_file: Path) -> None:
    run.status = result["status"]
    run.exception = result.get("exception")
    run.exit_note = result.get("exit_note")
    run.elapsed_s = result.get("elapsed_s")
    run.torch_import_s = result.get("torch_import_s")
    run.environment = result.get("environment")
    run.environment_error = result.get("environment_error")
    run.flags_start = result.get("flags_start")
    run.flags_end = result.get("flags_end")
    run.leaves = result.get("leaves", [])
    run.conditioning = result.get("conditioning", [])
    run.graph = result.get("graph")
    run.reference = result.get("reference")
    run.random_before_seed = result.get("random_before_seed")
    run.compiled_random_ops = result.get("compiled_random_ops", [])
    run.rounding = result.get("rounding")
    if run.status == "unavailable":
        run.failure = result.get("unavailable")
        return
    values: dict[str, np.ndarray] = {}
    if values_file.exists():
        with np.load(values_file, allow_pickle=False) as data:
            values = {k: data[k] for k in data.files}
    for o in result.get("observables", []):
        i = o["index"]
        run.observables.append(Observable(
            index=i, kind=o["kind"], label=o["label"], line=o.get("line"), fingerprint=o.get("fingerprint"),
            reference=o.get("reference"), ancestors=o.get("ancestors", []), claim=o.get("claim"),
            conditioning=o.get("conditioning", []), node=o.get("node"), module=o.get("module"),
            value=values.get(f"obs{i}"), reference_value=values.get(f"ref{i}"),
            rounding=o.get("rounding"),
            spread={key: values[f"{key}{i}"] for key in SPREAD_ARRAYS if f"{key}{i}" in values} or None,
        ))
    if run.status == "raised" and run.exception:
        e = run.exception
        if e.get("claim") and run.exit_note:
            # The script's own check failed: say so, so that it does not read as a crash.
            run.failure = run.exit_note
            return
        where = f" at line {e['line']}" if e.get("line") else ""
        run.failure = f"{e['type']}{where}: {_first_line(e.get('message', ''))}{_raise_hint(e)}"


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def _raise_hint(e: dict[str, Any]) -> str:
    msg = e.get("message", "")
    if e["type"] == "EOFError" and "reading a line" in msg:
        return " — the script waits for keyboard input (input()); triage runs scripts with no stdin"
    if "not compiled with CUDA" in msg or "NCCL" in msg or "nccl" in msg or "no NVIDIA driver" in msg:
        return " — the script needs CUDA (and, for NCCL, several GPUs) that this machine does not have"
    if e["type"] in ("ModuleNotFoundError", "ImportError"):
        return " — a package the script imports is not installed where triage runs"
    return ""


class _EnvCache:
    """collect_env text, cached per interpreter + torch version + device type (a day)."""

    TTL_S = 86400

    def __init__(self, directory: str | None) -> None:
        base = directory or os.environ.get("TRIAGE_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "triage")
        self.dir = Path(base)
        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = "none"
        self.key = f"{sys.executable}|{torch_version}|{os.uname().nodename}"

    def _path(self, device: str) -> Path:
        kind = device.split(":")[0]
        return self.dir / f"collect_env-{hashlib.sha256(f'{self.key}|{kind}'.encode()).hexdigest()[:16]}.txt"

    def get(self, device: str) -> str | None:
        p = self._path(device)
        try:
            if time.time() - p.stat().st_mtime < self.TTL_S:
                return p.read_text()
        except OSError:
            pass
        return None

    def put(self, device: str, text: str) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self._path(device).with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(self._path(device))
        except OSError:
            pass
