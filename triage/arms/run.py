"""Stage 2: run the repro on each arm, each in its own fresh, isolated worker process."""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from triage.arms.output import read_result, read_values, streamed_observables, values_budget, worker_error_text
from triage.model import ArmRun, ArmSpec, Observable, Repro
from triage.reporter import QUIET, Reporter
from triage.sandbox import (
    Confinement,
    Isolation,
    Limits,
    ProcessOutcome,
    isolation,
    physical_memory,
    run_isolated,
    scrubbed_environment,
)
from triage.sandbox.caches import (
    EnvironmentCache,
    collect_environment,
    compile_cache,
    inductor_default_dir,
    warm_up_cache,
)
from triage.sandbox.process import IDLE_CPU, MAX_DISK_ENTRIES, MAX_TASKS
from triage.sandbox.zygote import fork_server
from triage.settings import RunSettings
from triage.untrusted import UntrustedOutput, remove_tree
from triage.worker.protocol import CHECK_OPERAND, INPUTS_FILE, OBSERVED, REFERENCE, SPREAD_ARRAYS, WORKER_ERROR_STATUS

GiB = 1 << 30
PROCESS_LIMIT = MAX_TASKS  # processes and threads of one arm at once
DISK_LIMIT = 8 * GiB  # bytes one arm may write (scratch directory and its compile cache)
STARTUP_S = 120.0  # the worker's own start (interpreter, torch import) before the script begins
# A timed-out arm whose processes used no CPU for at least this long, and for at least half
# its run, is reported as waiting rather than slow (`ProcessOutcome.idle_s`).
IDLE_NOTED_S = 2.0


def worker_python(arm: ArmSpec, options: RunSettings) -> str:
    """The interpreter of `arm`'s worker: triage's own, or its torch release's environment."""
    if arm.torch is None:
        return sys.executable
    if arm.torch not in options.interpreters:
        raise ValueError(f"arm {arm.spec}: torch {arm.torch} was not prepared (sandbox.torch_envs.interpreters_for)")
    return options.interpreters[arm.torch]


def run_arms(repro: Repro, arms: list[ArmSpec], options: RunSettings,
             reporter: Reporter = QUIET) -> list[ArmRun]:
    """Run every arm (concurrently, where the machine has cores for it); order is kept.

    collect_env's text comes from triage's cache or, on a miss, from a jailed process of its
    own that runs beside the arms: what an arm reports about its environment is never kept."""
    jobs = options.jobs or max(1, min(len(arms), os.cpu_count() or 1))
    memory = options.memory_bytes or max(2 * GiB, int(physical_memory() * 0.6) // jobs)
    how = isolation(options.isolation)
    pythons = [worker_python(arm, options) for arm in arms]
    # One environment text per interpreter: arms on another torch release report theirs.
    environments: dict[str, tuple[str | None, str | None]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs + len(set(pythons))) as pool:
        collecting = {}
        for python in dict.fromkeys(pythons):
            cached = EnvironmentCache(options.cache_dir, python).get()
            if cached is not None:
                environments[python] = (cached, None)
            else:
                collecting[python] = pool.submit(collect_environment, how, options.collect_env_timeout_s,
                                                 any(a.device != "cpu" for a in arms), python)
        # The rounding simulations share the cores as the arms do.
        threads = max(1, (os.cpu_count() or 1) // min(jobs, len(arms)))
        futures = [pool.submit(run_arm, repro, arm, options, memory, reporter, how, threads) for arm in arms]
        runs = _every_run(futures)
        for python, collected in collecting.items():
            environments[python] = collected.result()
            if environments[python][0]:
                EnvironmentCache(options.cache_dir, python).put(environments[python][0])
    for run, python in zip(runs, pythons, strict=False):
        run.environment, run.environment_error = environments[python]
    return runs


def _every_run(futures: list[concurrent.futures.Future[ArmRun]]) -> list[ArmRun]:
    """Each arm's run, in order.  Should one arm raise, the graph directories the others
    exported are removed before the error propagates (no one else would remove them)."""
    concurrent.futures.wait(futures)
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is None:
        return [f.result() for f in futures]
    for f in futures:
        if f.exception() is None and f.result().graph_dir:
            remove_tree(os.path.dirname(f.result().graph_dir))
    raise failed


def run_arm(repro: Repro, arm: ArmSpec, options: RunSettings, memory_bytes: int,
            reporter: Reporter = QUIET, how: Isolation | None = None,
            simulation_threads: int | None = None) -> ArmRun:
    """One arm's isolated run. `simulation_threads`: the cores its rounding simulation may
    use (None: as many as the script runs on)."""
    root = Path(tempfile.mkdtemp(prefix="triage-arm-"))
    try:
        return _run_arm_in(root, repro, arm, options, memory_bytes, reporter, how, simulation_threads)
    finally:
        if not options.keep_dirs:
            remove_tree(root)


def _run_arm_in(root: Path, repro: Repro, arm: ArmSpec, options: RunSettings, memory_bytes: int,
                reporter: Reporter, how: Isolation | None, simulation_threads: int | None) -> ArmRun:
    how = how or isolation(options.isolation)
    work, out = root / "work", root / "out"
    work.mkdir()
    out.mkdir()
    compiled = options.compile_cache or compile_cache(repro.source, options.cache_dir)
    job = {
        "script": repro.path,
        "script_args": list(options.script_args),
        "arm": arm.to_job(),
        "seed": options.seed,
        # triage's parent collects the environment itself (run_arms): the worker does not.
        "collect_env": None,
        "collect_env_timeout": 0,
        "reference": options.reference,
        "reference_budget_s": options.reference_budget_s,
        "value_budget": options.value_budget_bytes,
        "max_leaf_bytes": options.max_leaf_bytes,
        "export_graph": options.export_graphs,
        "rounding": {"samples": options.rounding_samples, "budget_s": options.rounding_budget_s,
                     "value_bytes": options.value_budget_bytes, "model": options.rounding_model,
                     "threads": simulation_threads}
        if options.reference and options.rounding_samples else None,
        "result_dir": str(out),
        # CUDA reserves far more address space than it uses: limit it on CPU arms only.
        "address_space_limit": memory_bytes + 8 * GiB if arm.device == "cpu" else None,
    }
    (out / "job.json").write_text(json.dumps(job))
    # Deadlines: the worker's start, then the script, then the float64 reference and the
    # rounding simulation; each phase may claim its allowance once (sandbox.process).
    limits = Limits(timeout_s=STARTUP_S, memory_bytes=memory_bytes, output_bytes=options.output_bytes,
                    max_processes=PROCESS_LIMIT, disk_bytes=DISK_LIMIT,
                    phases=(("script-start", options.timeout_s),
                            ("script-done", _after_script_s(options))))
    jail = Confinement(scratch=str(root), workdir=str(work), readable=_readable(repro),
                       writable=[compiled], accelerators=arm.device != "cpu")
    env = arm_environment(compiled)
    jail.mounts.update(inductor_default_dir(env, compiled))
    reporter.arm_started(arm.spec)
    started = time.monotonic()
    outcome = run_isolated(
        [worker_python(arm, options), "-I", "-m", "triage.worker", str(out / "job.json")],
        jail=jail, env=env, limits=limits, isolation=how, imports="compile" if arm.mode == "compile" else "torch",
        on_message=lambda m: reporter.arm_phase(arm.spec, str(m["phase"])) if "phase" in m else None,
    )
    run = _arm_run(arm, outcome, out, options, memory_bytes)
    run.wall_s = round(time.monotonic() - started, 3)
    if run.completed and options.export_graphs:
        run.graph_dir = _keep_graph(out / "graph")
    # A script's own failing check is what a report is made of, not a crash: said so.
    reporter.arm_ended(arm.spec, "the script's check failed" if run.status == "raised" and (run.exception or {}).get("claim")
                       else run.status)
    return run


def arm_environment(compiled: str) -> dict[str, str]:
    """The environment of every process that runs the script or its ops: allow-listed, with
    the run's compile cache."""
    return dict(scrubbed_environment(), TORCHINDUCTOR_CACHE_DIR=compiled,
                TRITON_CACHE_DIR=os.path.join(compiled, "triton"))


@contextlib.contextmanager
def forking_workers(repro: Repro, arms: list[ArmSpec], options: RunSettings) -> Iterator[None]:
    """The run's fork servers (sandbox/zygote.py) for the block, one per interpreter the arms
    run (triage's own, another torch release's): the arms, ablations, the minimizer's workers
    and the verification are forked with torch (and, when an arm compiles, inductor) already
    imported.  `options.compile_cache` must be set."""
    compiled = options.compile_cache or compile_cache(repro.source, options.cache_dir)
    env = arm_environment(compiled)
    compiles: dict[str, bool] = {}  # interpreter -> whether one of its arms compiles
    for a in arms:
        python = worker_python(a, options)
        compiles[python] = compiles.get(python, False) or a.mode == "compile"
    with contextlib.ExitStack() as servers:
        for python, with_inductor in compiles.items():
            own = None if python == sys.executable else python
            servers.enter_context(fork_server(
                env=env, isolation=isolation(options.isolation), writable=[compiled],
                mounts=inductor_default_dir(env, compiled), readable=_readable(repro), compile=with_inductor,
                python=own, warm_cache=warm_up_cache(own, options.cache_dir) if with_inductor else None))
        yield


def _readable(repro: Repro) -> list[str]:
    return [os.path.abspath(repro.path), *_inputs_file(repro)]


def _keep_graph(graph: Path) -> str | None:
    """The arm's exported op graph, moved out of the arm's directory (the pipeline removes it
    when the minimizer is done); None when there is none.  Only a real directory is moved: the
    script could have left a link there, and the minimizer reads what it points to."""
    if not graph.is_dir() or graph.is_symlink() or not os.path.lexists(graph / "graph.json"):
        return None
    holder = tempfile.mkdtemp(prefix="triage-graph-")
    try:
        os.rename(graph, os.path.join(holder, "graph"))
    except OSError:
        remove_tree(holder)
        return None
    return os.path.join(holder, "graph")


def _inputs_file(repro: Repro) -> list[str]:
    """The inputs file beside a minimal repro triage wrote (which loads it by that name):
    the one file next to a script an arm may read."""
    sibling = Path(repro.path).with_name(INPUTS_FILE)
    if f'with_name("{INPUTS_FILE}")' in repro.source and sibling.is_file() and not sibling.is_symlink():
        return [str(sibling.absolute())]
    return []


# What the worker may take after its script besides the reference and the simulation: the
# recording's last steps and writing its result (a loop of 100,001 `torch.tensor([x])`: 3 s).
# A script that forges the worker's "script-done" gets it too, once: kept short.
AFTER_SCRIPT_S = 20.0


def _after_script_s(options: RunSettings) -> float:
    """What the worker may take after the script: the float64 reference and the rounding
    simulation when asked for, and writing its result."""
    budget = AFTER_SCRIPT_S
    if options.reference:
        budget += options.reference_budget_s + (options.rounding_budget_s if options.rounding_samples else 0)
    return budget


def _arm_run(arm: ArmSpec, outcome: ProcessOutcome, out: Path, options: RunSettings, memory: int) -> ArmRun:
    run = ArmRun(spec=arm.spec, arm=arm, device=arm.device, mode=arm.mode, status="ok",
                 exit_code=outcome.exit_code, signal=outcome.signal, stdout=outcome.stdout,
                 stderr=outcome.stderr, output_dropped=outcome.output_dropped)
    phases = [m.get("phase") for m in outcome.messages if "phase" in m]
    invalid = None
    if os.path.lexists(out / "result.json") and not (outcome.timed_out or outcome.memory_exceeded
                                                      or outcome.limit_exceeded):
        # Everything the arm left is the script's to rewrite: checked before it is believed.
        try:
            result = read_result(out / "result.json", script_started="script-start" in phases)
            values = read_values(out / "values.npz", result, values_budget(options.value_budget_bytes))
        except UntrustedOutput as e:
            invalid = str(e)
        else:
            _fill_from_result(run, result, values)
            return run
    # No usable result: keep what the worker streamed before it stopped.
    run.observables = [
        Observable(index=i, kind=o["kind"], label=o["label"], line=o["line"], fingerprint=o["fingerprint"],
                   reference={"fingerprint": None, "note": "the arm did not finish", "approximate": False})
        for i, o in enumerate(streamed_observables(outcome.messages))
    ]
    run.elapsed_s = round(outcome.elapsed_s, 3)
    if outcome.timed_out:
        run.status = "timeout"
        if "script-done" not in phases:
            where, limit = "while running the script", options.timeout_s
        elif options.reference:
            where, limit = "while computing the float64 reference", options.reference_budget_s
        else:
            # The worker said the script was done; the script can say so too (its control pipe).
            where, limit = "after the worker reported the script done", _after_script_s(options)
        if outcome.idle_s >= max(IDLE_NOTED_S, outcome.elapsed_s / 2):
            # Asleep, not slow: a longer limit ends nothing that waits for good.
            run.failure = (f"killed after running past the {limit:.0f} s limit {where}; its processes had used "
                           f"under {IDLE_CPU:.0%} of a core for the last {outcome.idle_s:.0f} s: they were waiting, "
                           "not computing (a "
                           "deadlock, such as a forked worker using its parent's OpenMP threads, or a long sleep), "
                           "and a longer --timeout helps only if that wait ends")
        else:
            run.failure = f"killed after running past the {limit:.0f} s limit {where} (raise it with --timeout)"
    elif outcome.memory_exceeded:
        run.status = "crashed"
        run.failure = f"killed for using more than {memory / GiB:.1f} GiB of memory (raise it with --memory)"
    elif outcome.limit_exceeded == "processes":
        run.status = "crashed"
        run.failure = (f"killed for running more than {PROCESS_LIMIT} processes and threads at once (the sandbox's "
                       "ceiling; a fork or thread bomb, or a pool far larger than a repro needs)")
    elif outcome.limit_exceeded == "files":
        run.status = "crashed"
        run.failure = (f"killed for creating more than {MAX_DISK_ENTRIES:,} files and folders in its scratch "
                       "directory (working directory, /tmp, HOME and /dev/shm together)")
    elif outcome.limit_exceeded == "disk":
        run.status = "crashed"
        run.failure = (f"killed for writing more than {DISK_LIMIT / GiB:.0f} GiB to its scratch directory "
                       "(working directory, /tmp, HOME and /dev/shm together)")
    else:
        run.status = "crashed"
        run.failure = (f"the arm's output is not valid: {invalid}" if invalid
                       else _crash_failure(run, outcome, phases, options))
    return run


def _crash_failure(run: ArmRun, outcome: ProcessOutcome, phases: list[Any], options: RunSettings) -> str:
    """Why the arm ended without a result, from what the parent can tell.  The worker's own
    error path sends `worker-error` and exits with WORKER_ERROR_STATUS; before the script starts
    only triage's code has run, after it the script shares the process and can send (or cause)
    the same, so only then is the message reported neutrally."""
    if outcome.exit_code == WORKER_ERROR_STATUS:
        error = worker_error_text(outcome.messages)
        if error:
            run.stderr = (run.stderr + "\n" + error)[-options.output_bytes:]
        last = _first_line(error.strip().splitlines()[-1]) if error else "no traceback was sent"
        if "script-start" not in phases:
            return f"triage's worker failed before the script started (a bug in triage): {last}"
        if "script-done" in phases:
            return ("the worker reported an error after the script had finished, while analysing its values in the "
                    "script's process (the cause may be triage's analysis or a state the script left; the traceback "
                    f"is in the arm's stderr): {last}")
        return ("the worker reported an error after the script had started (the script runs in the worker's "
                f"process, so the cause may be the script's): {last}")
    if outcome.signal:
        return f"the process died with {outcome.signal}{_signal_hint(outcome)}"
    if "script-start" in phases and "script-done" not in phases:
        return (f"the script ended the process (os._exit or similar, status {outcome.exit_code}) before triage "
                "could collect a result")
    return f"the process exited with status {outcome.exit_code} before triage could collect a result"


def _signal_hint(outcome: ProcessOutcome) -> str:
    hint = " (segmentation fault)" if outcome.signal == "SIGSEGV" else ""
    frame = _crashed_frame(outcome.stderr)
    return hint + (f"; last script frame: {frame}" if frame else "")


def _crashed_frame(stderr: str) -> str | None:
    """The innermost frame of the crashed thread that is neither Python's, an installed
    package's nor triage's, from the faulthandler dump the worker leaves on a fatal signal
    (most recent call first)."""
    dump = stderr.rfind("Current thread ")
    if dump < 0:
        return None
    installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    for line in stderr[dump:].splitlines()[1:]:
        line = line.strip()
        if not line.startswith('File "'):
            break
        path = line[len('File "'):].partition('"')[0]
        if not (path.startswith("<") or path.startswith(installed) or "triage/worker" in path.replace(os.sep, "/")):
            return line[:600]  # the dump is the script's stderr: it may be forged, at any length
    return None


def _operand(record: dict[str, Any], value: np.ndarray | None) -> dict[str, Any] | None:
    """A check operand as the worker wrote it (`read_result`, `read_values` checked both), with
    its values; None where values.npz did not hold them."""
    return None if value is None else {"name": record["name"], "dtype": record["dtype"], "value": value,
                                       "one_change": record.get("one_change")}


def _fill_from_result(run: ArmRun, result: dict[str, Any], values: dict[str, np.ndarray]) -> None:
    """`result` and `values` as `read_result`/`read_values` checked them."""
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
    run.left_out = result.get("left_out")
    run.graph = result.get("graph")
    run.reference = result.get("reference")
    run.random_before_seed = result.get("random_before_seed")
    run.compiled_random_ops = result.get("compiled_random_ops", [])
    run.rounding = result.get("rounding")
    run.knob_calls = result.get("knob_calls", [])
    operands = [_operand(x, values.get(f"{CHECK_OPERAND}{i}")) for i, x in enumerate(result.get("check_operands", []))]
    run.check_operands = [x for x in operands if x is not None]
    if run.status == "unavailable":
        run.failure = result.get("unavailable")
        return
    nodes = {o["index"]: o.get("node") for o in result.get("observables", [])}
    for o in result.get("observables", []):
        i = o["index"]
        # A value observed again shares its first record's spread arrays, if that record is the same node.
        shared = (o.get("rounding") or {}).get("spread_of")
        same_value = shared in nodes and o.get("node") is not None and nodes[shared] == o.get("node")
        j = shared if same_value else i
        run.observables.append(Observable(
            index=i, kind=o["kind"], label=o["label"], line=o.get("line"), fingerprint=o.get("fingerprint"),
            reference=o.get("reference"), ancestors=o.get("ancestors", []), claim=o.get("claim"),
            conditioning=o.get("conditioning", []), node=o.get("node"), module=o.get("module"),
            call_line=o.get("call_line"), expression=o.get("expression"), uninitialized=o.get("uninitialized"),
            compiled_line=o.get("compiled_line"),
            value=values.get(f"{OBSERVED}{i}"), reference_value=values.get(f"{REFERENCE}{i}"),
            rounding=o.get("rounding"),
            spread=_spread_of(values, j),
        ))
    if run.status == "raised" and run.exception:
        e = run.exception
        if e.get("claim") and run.exit_note:
            # The script's own check failed: say so, so that it does not read as a crash.
            run.failure = run.exit_note
            return
        where = f" at line {e['line']}" if e.get("line") else ""
        run.failure = f"{e['type']}{where}: {_first_line(e.get('message', ''))}{_raise_hint(e, run.stderr)}"


def _spread_of(values: dict[str, np.ndarray], index: int) -> dict[str, np.ndarray] | None:
    """Observable `index`'s spread arrays, their figures in float64 (the worker sends sigma
    and sd in float32, whose squares underflow for a tiny value's spread), or None."""
    found = {key: values[f"{key}{index}"] for key in SPREAD_ARRAYS if f"{key}{index}" in values}
    return {key: a if key == "nf" else np.asarray(a, np.float64) for key, a in found.items()} or None


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def _raise_hint(e: dict[str, Any], stderr: str = "") -> str:
    msg = e.get("message", "")
    if e["type"] == "EOFError" and "reading a line" in msg:
        return " — the script waits for keyboard input (input()); triage runs scripts with no stdin"
    missing = re.search(r"No such file or directory: '([^']+)'", msg)
    if e["type"] == "FileNotFoundError" and missing and not os.path.isabs(missing.group(1)):
        return (f" — the script opens {missing.group(1)!r} by a relative path; triage runs it in an empty scratch "
                "directory and does not copy the files next to it")
    if "has finished its bootstrapping phase" in stderr:
        return (" — a process the script started with the 'spawn' method failed: it re-runs the script's top "
                "level, which needs `if __name__ == '__main__':` around the code that starts processes "
                "(the arm's stderr has the child's error)")
    if "not compiled with CUDA" in msg or "NCCL" in msg or "nccl" in msg or "no NVIDIA driver" in msg:
        return " — the script needs CUDA (and, for NCCL, several GPUs) that this machine does not have"
    if e["type"] in ("ModuleNotFoundError", "ImportError"):
        return " — a package the script imports is not installed where triage runs"
    return ""
