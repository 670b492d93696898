"""Stage 4: from the headline divergence to a verified minimal repro, with localization.

1. pick the two arms of the divergence; arm A is the one whose eager op graph is used;
2. start a warm worker per arm; arm A computes every op of the diverging value's cone once,
   and those values become the *recorded inputs* of any sub-graph;
3. measure reliability (the whole cone, several runs) — a flaky divergence stops here;
4. localize (`triage.minimize.localize`); reduce the ops (`triage.minimize.passes`), then the
   data (`triage.minimize.data`) with the `ReductionProblem`;
5. write the standalone script and verify it in fresh arms (`triage.minimize.standalone`).
Every step that cannot proceed says why in a note; none of them raises.
"""
from __future__ import annotations

import concurrent.futures
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triage import policy
from triage.arms.graph import OpGraph
from triage.arms.run import worker_python
from triage.minimize import standalone
from triage.minimize.arm_worker import ArmWorker, WorkerFailed
from triage.minimize.backend_source import backend_definitions, torch_level_targets
from triage.minimize.data import DataReduction, reduce_data
from triage.minimize.localize import localize
from triage.minimize.passes import RELIABILITY_RUNS, reduce, reliability
from triage.minimize.problem import ReductionProblem
from triage.model import Ablation, ArmRun, ArmSpec, Comparison, LocalizedOp, Minimal
from triage.numerics.errors import divergence_kind
from triage.reporter import QUIET, Reporter
from triage.settings import MinimizeSettings, RunSettings
from triage.untrusted import UntrustedOutput, remove_tree


@dataclass
class MinimizeResult:
    minimal: Minimal | None = None
    localization: list[LocalizedOp] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    script_dir: str | None = None
    ablations: list[Ablation] = field(default_factory=list)  # float64 upcasts of the minimal graph's ops
    # The whole cone replayed on both arms' workers before reducing: {"arms", "hits", "runs",
    # "seen", "failed", "script_backend"} — whether the recorded op graph itself diverges.
    replay: dict[str, Any] | None = None


class NotMinimized(Exception):
    """A step that cannot go on; its arguments are the notes the report gets instead."""


def minimize_divergence(comparison: Comparison | None, run_options: RunSettings, options: MinimizeSettings,
                        reporter: Reporter = QUIET, source: str | None = None) -> MinimizeResult:
    """`source`: the script's text, for a compile arm that used the script's own backend."""
    result = MinimizeResult()
    if not options.enabled or comparison is None or comparison.divergence is None:
        return result
    try:
        _minimize(comparison, run_options, options, reporter, source, result)
    except NotMinimized as e:
        result.notes.extend(e.args)
    return result


def _minimize(comparison: Comparison, run_options: RunSettings, options: MinimizeSettings, reporter: Reporter,
              source: str | None, result: MinimizeResult) -> None:
    """The steps, in order, each filling `result`; a step that cannot go on raises NotMinimized."""
    chosen = _choose(comparison)
    if isinstance(chosen, str):
        raise NotMinimized(f"Not minimized: {chosen}.")
    run_a, spec_a, spec_b, obs_a, obs_b = chosen
    script_backend = _script_backend(comparison, spec_b, source)
    dtype = (obs_a.fingerprint or {}).get("dtype", "?")
    target = divergence_kind(obs_a.value, obs_b.value, dtype)
    try:
        graph = OpGraph(run_a.graph_dir)
    except UntrustedOutput as e:
        raise NotMinimized(f"Not minimized: the op graph {run_a.spec} recorded is not valid ({e}).") from None
    cone = graph.cone(obs_a.node)
    if target is None or not cone:
        raise NotMinimized("Not minimized: the diverging value is a recorded input, not computed by an op.")
    # Arm A's worker writes the recorded values here, and arm B's reads them. B may run the
    # script's own code (its compile backend), so it writes nothing A or triage reads: A renders
    # into a folder of its own, and triage writes the script it is sent into its own folder.
    scratch = Path(tempfile.mkdtemp(prefix="triage-values-"))
    rendered = Path(tempfile.mkdtemp(prefix="triage-render-"))
    started = time.monotonic()
    timings: dict[str, float] = {}

    def lap(step: str) -> None:
        timings[step] = round(time.monotonic() - started - sum(timings.values()), 3)

    reporter.minimize_step("start")
    workers: list[ArmWorker] = []
    directory: Path | None = None  # minimal.py's, made once there is a script to write
    written = False
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(ArmWorker, spec, run_a.graph_dir, options.memory_bytes,
                                   shared=[str(scratch), str(rendered)] if spec is spec_a else [],
                                   reading=[] if spec is spec_a else [str(scratch)],
                                   isolation=run_options.isolation, compile_dir=run_options.compile_cache,
                                   python=worker_python(spec, run_options),
                                   script_backend=script_backend if spec is spec_b else None)
                       for spec in (spec_a, spec_b)]
            failures = []
            for f in futures:
                try:
                    workers.append(f.result())
                except WorkerFailed as e:
                    failures.append(f"Not minimized: {e}.")
        if failures:
            raise NotMinimized(*failures)
        a, b = workers
        problem = ReductionProblem(graph, a, b, target, query_timeout_s=options.query_timeout_s)
        lap("startup")
        digests = _record_values(problem, cone, scratch / "values.pt", options)
        if isinstance(digests, str):
            raise NotMinimized(f"Not minimized: {digests}.")
        lap("record_values")
        reporter.minimize_step("reliability")
        hits, outcomes = reliability(problem, cone)
        lap("reliability")
        seen = sorted({k.describe() for o in outcomes for k in o.kinds.values() if k is not None})
        failure = next((o.failure for o in outcomes if o.failure), None)
        result.replay = {"arms": [spec_a.spec, spec_b.spec], "hits": hits, "runs": RELIABILITY_RUNS,
                         "seen": seen, "failed": failure is not None,
                         "script_backend": bool(_script_backends(comparison, spec_b))}
        if hits < RELIABILITY_RUNS:
            shown = failure or (", ".join(seen) if seen else "bitwise-equal values")
            raise NotMinimized(
                f"Not minimized: replaying the recorded op graph on {spec_a.spec} and {spec_b.spec} showed "
                f"{target.describe()} in {hits} of {RELIABILITY_RUNS} runs (otherwise: {shown})"
                + ("; the divergence is flaky." if hits else _uncaptured(comparison, spec_b, script_backend)))
        reporter.minimize_step("localize")
        result.localization, note = localize(problem, cone, compiled=spec_b.mode == "compile")
        if note:
            result.notes.append(f"Localization incomplete: {note}.")
        lap("localize")
        reporter.minimize_step("reduce")
        problem.deadline = time.monotonic() + options.budget_s
        queries_before = problem.queries
        ops = reduce(problem, cone, digests)
        lap("reduce")
        reduce_queries = problem.queries - queries_before
        if time.monotonic() > problem.deadline:
            result.notes.append(f"Minimization stopped at its {options.budget_s:.0f} s budget; the op set is the "
                                "smallest found by then.")
        reporter.minimize_step("data")
        problem.deadline = time.monotonic() + options.data_budget_s
        data = reduce_data(problem, ops, options.query_timeout_s) if options.reduce_data else DataReduction()
        if data.failure:
            result.notes.append(f"The inputs were not reduced: arm A could not give their values ({data.failure}).")
        elif time.monotonic() > problem.deadline:
            result.notes.append(f"Data reduction stopped at its {options.data_budget_s:.0f} s budget; the inputs are "
                                "the smallest found by then.")
        problem.deadline = float("inf")
        lap("data")
        outputs = problem.diverging_outputs(ops)
        plan = problem.plan(ops, outputs=outputs)
        reporter.minimize_step("float64")
        result.ablations = upcast_ablations(problem, ops, plan, [spec_a.spec, spec_b.spec])
        lap("float64")
        reporter.minimize_step("render")
        directory = Path(options.directory or tempfile.mkdtemp(prefix="triage-minimal-"))
        directory.mkdir(parents=True, exist_ok=True)
        error, reply = standalone.render(a, plan.request(script_backend=script_backend), spec_a, spec_b, target,
                                         rendered, directory, options.query_timeout_s,
                                         problem.overrides_for(plan))
        if error:
            raise NotMinimized(f"Minimized to {len(ops)} op(s), but writing the script failed: {error}.")
        _set_float64_lines(result.ablations, problem.graph.ordered(ops), reply.get("float64_lines") or {})
        written = True
        lap("render")
        queries, seconds = problem.queries, time.monotonic() - started
    finally:
        for w in workers:
            w.close()
        remove_tree(scratch)
        remove_tree(rendered)
        if directory is not None and not written:
            _discard(directory, options)
    reporter.minimize_step("verify")
    try:
        verified, seen = standalone.verify(directory, spec_a, spec_b, target, run_options, reply.get("results"))
    except BaseException:
        _discard(directory, options)
        raise
    lap("verify")
    timings["reduce_queries"] = reduce_queries
    if options.reduce_data and not data.failure:
        timings.update(data_queries=data.queries, elements_before=data.elements_before,
                       elements_after=data.elements_after)
    result.script_dir = str(directory)
    result.minimal = Minimal(
        ops=graph.op_names(ops), script=reply["script"], verified=verified, queries=queries,
        seconds=round(seconds, 2), arms=[spec_a.spec, spec_b.spec], kind=target.describe(),
        reliability=f"{hits} of {RELIABILITY_RUNS} replays of the recorded op graph diverged the same way",
        original_ops=len(cone), verification=seen, inputs_file=reply.get("side_file"), timings=timings)
    reporter.minimize_ended(verified)


def _discard(directory: Path, options: MinimizeSettings) -> None:
    """Remove the script's directory when triage made it (not one the caller named)."""
    if not options.directory:
        remove_tree(directory)


MAX_UPCAST = 4


def upcast_ablations(problem: ReductionProblem, ops: frozenset[str], plan: Any, arms: list[str]) -> list[Ablation]:
    """The minimal graph again with one op at a time computed in float64 on both arms (its
    inputs upcast, its outputs cast back): does the divergence start in that op's precision?"""
    found = []
    for op in problem.graph.ordered(ops)[:MAX_UPCAST]:
        name = problem.graph.op_names([op])[0]
        short = name.removeprefix("aten.")
        outcome = problem.run(plan, upcast=[op])
        kinds = list(outcome.kinds.values())
        if outcome.failure or not kinds:
            result, detail = "not-comparable", outcome.failure or "no output to compare"
        elif all(k is None for k in kinds):
            result, detail = "agree-bitwise", "the two arms' outputs are bit-identical"
        elif problem.target not in kinds and all(k is None or k.kind == "rounding" for k in kinds):
            result, detail = "within-tolerance", "the outputs differ only within the dtype's tolerance"
        else:
            result, detail = "still-diverges", "; ".join(sorted({k.describe() for k in kinds if k is not None}))
        found.append(Ablation(switch=f"float64={short}", arms=list(arms), outcome=result, detail=detail,
                              section=policy.GENERAL.title, supports="evidence", setting=""))
    return found


def _set_float64_lines(ablations: list[Ablation], ops: list[str], lines: dict[str, str]) -> None:
    """Each float64 ablation's "set with" line (`upcast_ablations` made one per op, in order):
    the minimal script's own call of that op with float64 inputs, cast back — written from the
    recorded call and run once by arm A's worker.  An op with no such line that runs shows none."""
    for ablation, op in zip(ablations, ops, strict=False):
        ablation.setting = lines.get(op, "")


def _script_backends(comparison: Comparison, spec: ArmSpec) -> list[dict[str, Any]]:
    run = comparison.run(spec.spec)
    return ((run.graph or {}).get("backends") or []) if run is not None and spec.mode == "compile" else []


def _script_backend(comparison: Comparison, spec: ArmSpec, source: str | None) -> dict[str, str] | None:
    """The script's own compile backend, as definitions the compile worker can run: candidates
    then compile with the very function the arm used, not with inductor."""
    backends = _script_backends(comparison, spec)
    if len(backends) != 1 or not source:
        return None  # none, or several: which one made the divergence is not known
    definitions = backend_definitions(source, backends[0]["name"])
    if not definitions:
        return None
    # The torch-level functions it picks nodes by: the candidates call an op through the one
    # of these its name matches (`F.relu` for `aten.relu`, not `torch.relu`).
    return {"name": backends[0]["name"], "definitions": definitions, "targets": torch_level_targets(definitions)}


def _uncaptured(comparison: Comparison, spec_b: ArmSpec, loaded: dict[str, str] | None) -> str:
    """Why a divergence the arms show does not appear when the graph is replayed: a compile
    arm that used the script's own backend, which the workers could not load, or which does
    something to the whole program that a candidate's graph does not show."""
    backends = _script_backends(comparison, spec_b)
    if not backends:
        return "; the divergence needs something the op graph does not capture."
    b = backends[0]
    where = f" (defined at line {b['line']})" if b.get("line") else ""
    matched = (loaded or {}).get("targets") or []
    if matched:
        # Possibly triage's limit, not the backend's: say so rather than send the reader after state.
        named = ", ".join(f"`{m}`" for m in matched[:4])
        return (f"; `{spec_b.spec}` compiled with the script's own backend `{b['name']}`{where}, which picks graph "
                f"nodes by their torch-level function ({named}), and the candidates compiled with it do not "
                "diverge. The candidates call each recorded aten op through the function of its name; a function "
                "that runs as an op of another name (`F.layer_norm` as `aten.native_layer_norm`) is not in their "
                f"graphs, so the test matches nothing there. That is a limit of the minimizer, not a sign that the "
                f"divergence lies elsewhere: start with what `{b['name']}` does to {named}.")
    if loaded:
        return (f"; `{spec_b.spec}` compiled with the script's own backend `{b['name']}`{where}, and the candidates "
                f"compiled with it too do not diverge: `{b['name']}` depends on more than the op graph (the "
                "script's state, the whole program's graph). Start there.")
    why = ("the script passes several backends" if len(backends) > 1 else
           f"its definition could not be taken from the script (`{b['name']}` is not a top-level function there)")
    return (f". `{spec_b.spec}` compiled with the script's own backend `{b['name']}`{where}, which the minimizer's "
            f"workers could not load — {why} — so they compiled each candidate with inductor, where the divergence "
            f"is not there. It lives in what `{b['name']}` does to the graph: start there.")


def _choose(comparison: Comparison) -> tuple | str:
    """(arm A's run, A's spec, B's spec, A's observable, B's observable), or why not."""
    d = comparison.divergence
    if d.source == "reference" or d.b is None:
        return ("the divergence is between one arm and its float64 reference; the minimizer compares two arms "
                "(add one with --arms, e.g. cpu,cpu/threads=1)")
    if d.source != "arms":
        return ("the divergence is between two values of one arm (the script's own comparison); the "
                "minimizer compares two arms")
    sides = [comparison.resolve(d.a), comparison.resolve(d.b)]

    def usable(run: ArmRun) -> bool:
        return run.mode == "eager" and run.graph_dir is not None

    sides.sort(key=lambda s: (not usable(s[0]), "fault" in dict(s[0].arm.knobs)))
    (ra, oa), (rb, ob) = sides
    if not usable(ra):
        reasons = {r.spec: (r.graph or {}).get("export") for r, _ in sides if r.mode == "eager"}
        why = "; ".join(f"{s}: {r}" for s, r in reasons.items() if r and r != "ok")
        return "no eager arm recorded a complete op graph" + (f" ({why})" if why else "")
    if oa.node is None:
        return "no recorded op computed the diverging value"
    if oa.value is None or ob.value is None:
        return "the diverging values were too large to keep"
    return ra, ra.arm, rb.arm, oa, ob


def _record_values(p: ReductionProblem, cone: frozenset[str], path: Path,
                   options: MinimizeSettings) -> dict[str, str] | str:
    """Arm A computes the cone once; its values become every sub-graph's recorded inputs."""
    plan = p.graph.plan(cone)
    header, _ = p.a.request(dict(plan.request(), cmd="prepare", path=str(path)), options.query_timeout_s * 4)
    if not header.get("ok"):
        return f"{p.a.arm.spec} could not replay its own op graph: {header.get('lost') or header.get('error')}"
    p.a.state.append({"cmd": "load_values", "path": str(path)})
    header_b, _ = p.b.request({"cmd": "load_values", "path": str(path)}, options.query_timeout_s, keep_state=True)
    if not header_b.get("ok"):
        return f"{p.b.arm.spec} could not load the recorded values: {header_b.get('lost') or header_b.get('error')}"
    return header.get("digests", {})
