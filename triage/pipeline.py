"""The stages in order: the one function the CLI, the Action and tests call."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time

from triage import __version__
from triage.ablate import ablate
from triage.arms.run import forking_workers, run_arms
from triage.arms.spec import calls_compile, cuda_present, mentions_cuda
from triage.classify.facts import torch_of
from triage.classify.ladder import classify
from triage.compare import compare, name_from_source
from triage.extract import extract_repro
from triage.minimize import MinimizeResult, minimize_divergence
from triage.model import (
    Ablation,
    ArmRun,
    ArmSpec,
    Comparison,
    Issue,
    IssueRepro,
    Report,
    ReportedArm,
    ReporterOutput,
    Repro,
)
from triage.reported import judge_reported, reporter_device
from triage.reporter import QUIET, Reporter
from triage.sandbox import isolation
from triage.sandbox.caches import claim_compile_cache, release_compile_cache, trim_compile_cache
from triage.settings import AblationSettings, MinimizeSettings, RunSettings, Settings
from triage.untrusted import remove_tree
from triage.worker.knob_calls import SETTERS, knob_call_note, overrides, recordable
from triage.worker.limits import MAX_CONDITIONING, MAX_LEAVES


def triage_script(path: str, arms: list[ArmSpec], settings: Settings, reporter: Reporter = QUIET,
                  notes: list[str] | None = None, posted: ReporterOutput | None = None) -> Report:
    """`notes`: the caller's own, first among the report's; `posted`: what the reporter's
    machine printed, judged as the reported arm."""
    start = time.monotonic()
    options = settings.run
    repro = extract_repro(path)
    comparison = None
    reduced = MinimizeResult()
    ablations = []
    reported = None
    if repro.problem is None:
        # One compile cache for the whole run: what the arms compiled warms the ablations, the
        # minimizer's workers and the verification of the minimal script.
        claimed = options.compile_cache is None
        options = dataclasses.replace(options, compile_cache=options.compile_cache
                                      or claim_compile_cache(repro.source, options.cache_dir))
        try:
            with forking_workers(repro, arms, options):
                runs, reported = _run_with_reported(repro, arms, options, reporter, posted)
                try:
                    comparison = compare(runs, repro.source)
                    ablations, reduced = _explain(repro, comparison, options, reporter,
                                                  settings.ablation, settings.minimize)
                finally:
                    for run in runs:
                        if run.graph_dir:
                            remove_tree(os.path.dirname(run.graph_dir))
        finally:
            if claimed:
                release_compile_cache(options.compile_cache)
            else:
                trim_compile_cache(options.compile_cache)
    try:
        ablations = ablations + reduced.ablations
        verdict = classify(repro, comparison, ablations, reduced.replay, reported)
        report_notes = list(notes or [])
        if comparison is not None:
            report_notes.extend(_run_notes(comparison, options, repro.source))
        report_notes.extend(reduced.notes)
        return Report(repro=repro, arms_requested=[a.spec for a in arms], comparison=comparison, verdict=verdict,
                      triage_version=__version__, seconds=round(time.monotonic() - start, 3), notes=report_notes,
                      minimal=reduced.minimal, localization=reduced.localization,
                      minimal_dir=reduced.script_dir, ablations=ablations, isolation=_isolation(options),
                      reported=reported)
    except BaseException:
        # No report will carry the minimal script's directory to the caller that removes it.
        if reduced.script_dir and not settings.minimize.directory:
            remove_tree(reduced.script_dir)
        raise


def _run_with_reported(repro: Repro, arms: list[ArmSpec], options: RunSettings, reporter: Reporter,
                       posted: ReporterOutput | None) -> tuple[list[ArmRun], ReportedArm | None]:
    """The arms, and beside them (where the reporter posted output) the CPU arm whose rounding
    is simulated as the reporter's device rounds: the reported arm is judged on its spreads."""
    if posted is None or not posted.text.strip():
        return run_arms(repro, arms, options, reporter), None
    device, evidence = reporter_device(posted.text, posted.environment, repro.source)
    modelled = dataclasses.replace(options, rounding_model=device, export_graphs=False)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="triage-reported") as pool:
        model_run = pool.submit(run_arms, repro, [ArmSpec("cpu")], modelled, QUIET)
        runs = run_arms(repro, arms, options, reporter)
        model = model_run.result()[0]
    if model.graph_dir:
        remove_tree(os.path.dirname(model.graph_dir))
    name_from_source(model, repro.source)
    same_device = next((r for r in runs if r.device.startswith(device) and r.mode == "eager" and r.completed), None)
    return runs, judge_reported(model, posted.text, posted.source, device, evidence, posted.environment,
                                same_device)


def _explain(repro: Repro, comparison: Comparison, options: RunSettings,
             reporter: Reporter, ablation: AblationSettings,
             minimize: MinimizeSettings) -> tuple[list[Ablation], MinimizeResult]:
    """The ablations and the minimizer, side by side where the CPU budget has room for both:
    each needs only the comparison, and each spends much of its time waiting on processes
    (a fresh arm's start, the slower arm, a compile) that the other can use."""
    if (options.jobs or os.cpu_count() or 1) < 2:
        return (ablate(repro, comparison, options, ablation, reporter),
                minimize_divergence(comparison, options, minimize, reporter, repro.source))
    with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="triage-explain") as pool:
        ablating = pool.submit(ablate, repro, comparison, options, ablation, reporter)
        minimizing = pool.submit(minimize_divergence, comparison, options, minimize, reporter, repro.source)
        concurrent.futures.wait([ablating, minimizing])
    if ablating.exception() is not None and minimizing.exception() is None:
        # No report will carry the minimal script's directory to the caller that removes it.
        script_dir = minimizing.result().script_dir
        if script_dir and not minimize.directory:
            remove_tree(script_dir)
    return ablating.result(), minimizing.result()


def triage_issue(issue: Issue, workdir: str, arms: list[ArmSpec], settings: Settings,
                 reporter: Reporter = QUIET, notes: list[str] | None = None) -> Report:
    """`triage_script` on the repro extracted from an issue (written to `workdir/repro.py`),
    or a could-not-run report that says why the issue has no runnable repro."""
    extraction = issue.extraction
    report_notes = list(notes or []) + [f"From the issue: {n}." for n in extraction.notes]
    if extraction.problem is not None or extraction.script is None:
        repro = Repro(path="", name="repro.py", source=extraction.script or "",
                      problem=f"no runnable repro in {issue.repo}#{issue.number}: {extraction.problem}")
        return Report(repro=repro, arms_requested=[a.spec for a in arms], comparison=None,
                      verdict=classify(repro, None), triage_version=__version__, seconds=0.0,
                      notes=report_notes, issue=issue, isolation=_isolation(settings.run))
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "repro.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(extraction.script.rstrip("\n") + "\n")
    report = triage_script(path, arms, settings, reporter, report_notes, _posted_for_missing_arms(extraction, arms))
    report.issue = issue
    if report.comparison is not None:
        report.notes.extend(_environment_notes(extraction.environment_fields, report.comparison))
    return report


def _posted_for_missing_arms(extraction: IssueRepro, arms: list[ArmSpec]) -> ReporterOutput | None:
    """The output the reporter posted, to be judged as their arm, where the script runs on a
    device this machine lacks (its CUDA calls collapse onto the CPU here, or a requested CUDA
    arm cannot run)."""
    if not extraction.observed:
        return None
    uses_missing = (mentions_cuda(extraction.script) or any(a.device.startswith("cuda") for a in arms)) \
        and not cuda_present()
    if not uses_missing:
        return None
    return ReporterOutput(text="\n".join(extraction.observed), source="the issue body",
                          environment=extraction.environment_fields)


def _isolation(options: RunSettings) -> dict[str, str]:
    how = isolation(options.isolation)
    return {"kind": how.kind, "detail": how.detail}


def _environment_notes(reporter: dict[str, str], comparison) -> list[str]:  # noqa: ANN001 - Comparison
    """Where the reporter's collect_env and triage's differ in what decides the numbers."""
    from triage.extract import parse_environment

    ours = next((parse_environment(r.environment) for r in comparison.arms if r.environment), {})
    differ = [f"{key}: reporter `{reporter[key]}`, triage `{ours.get(key) or 'n/a'}`"
              for key in ("PyTorch version", "CUDA used to build PyTorch", "GPU models and configuration")
              if reporter.get(key) and reporter.get(key) != ours.get(key)]
    return ["The reporter's environment differs from triage's — " + "; ".join(differ) + "."] if differ else []


def _run_notes(comparison, options: RunSettings, source: str) -> list[str]:  # noqa: ANN001 - Comparison
    notes = []
    if calls_compile(source) and not any(r.mode == "compile" for r in comparison.arms):
        notes.append("The script calls `torch.compile`, but no arm compiles (no `/compile` arm was asked for): on "
                     f"{', '.join(f'`{r.spec}`' for r in comparison.arms)} every `torch.compile` call returned the "
                     "function itself (a module came back wrapped as torch.compile wraps it), so the compiled code ran "
                     "eagerly. Add `cpu/compile` to compare it.")
    if len({torch_of(r) for r in comparison.arms}) > 1:
        notes.append("The arms ran different torch releases (another release runs from its own environment, built "
                      "with venv + pip). The accuracy note does not promise bitwise-equal results across releases: a "
                      "difference inside both arms' rounding spreads is expected; one beyond them means the "
                      "computation itself changed between the releases (a fix or a regression), and the arm outside "
                      "its own spread is the one that computes something else.")
    if comparison.leaves_identical:
        n = len({i for o in comparison.arms[0].observables for i in o.ancestors})
        notes.append(f"Every arm started from bit-identical weights and inputs ({n} leaf tensor{'s' if n != 1 else ''} "
                     "that the observed values read, paired by content and creation site).")
    elif comparison.leaves_note:
        notes.append(f"The arms did not start from identical leaves: {comparison.leaves_note}.")
    if comparison.alignment_note:
        notes.append(comparison.alignment_note)
    for r in comparison.arms:
        if r.random_before_seed:
            rb = r.random_before_seed
            notes.append(f"The script draws random numbers (`{rb['op']}`, line {rb['line']}) before seeding; triage seeded "
                         f"every generator with {options.seed} in every arm, so all arms drew the same numbers.")
            break
    for r in comparison.arms:
        if r.left_out and (r.left_out.get("leaves") or r.left_out.get("conditioning")):
            notes.append(_left_out_note(r.spec, r.left_out))
        if r.exit_note:
            notes.append(f"`{r.spec}`: {r.exit_note}; the values observed up to then are compared.")
        if r.reference and r.reference.get("note"):
            notes.append(f"`{r.spec}` float64 reference is {r.reference['status']}: {r.reference['note']}.")
        if r.reference and r.reference.get("approximate_ops"):
            notes.append(f"`{r.spec}`: {', '.join(r.reference['approximate_ops'])} could not run in float64; "
                         "the reference uses the arm's own precision for them.")
        notes.extend(_knob_call_notes(r))
    return notes


def _knob_call_notes(run: ArmRun) -> list[str]:
    """A note for each call of the script's that set what one of the arm's knobs set, and which
    held.  The worker's record is checked against the arm's own knobs: it comes from the jail."""
    if not run.knob_calls:
        return []
    knobs = dict(run.arm.knobs)
    notes = []
    for call in run.knob_calls:
        setter, value = call["setter"], call["value"]
        knob = SETTERS[setter][0]
        # `is`: the value exactly as the worker records it for this setter (True is not 1 here).
        if knob in knobs and recordable(setter, value) is value and overrides(setter, value, knobs[knob]):
            notes.append(knob_call_note(run.spec, knob, knobs[knob], call))
    return notes


def _left_out_note(spec: str, left_out: dict[str, int]) -> str:
    """What an arm's worker did not write (result.json holds at most MAX_LEAVES leaves)."""
    parts = []
    if left_out.get("leaves"):
        parts.append(f"{left_out['leaves']} of its recorded leaf tensors (it keeps {MAX_LEAVES}: those the observed "
                     "values read first, then the earliest)")
    if left_out.get("conditioning"):
        parts.append(f"{left_out['conditioning']} conditioning notes (it keeps {MAX_CONDITIONING})")
    return (f"`{spec}`: the script created more than triage records per arm; left out "
            f"{' and '.join(parts)}. Its observed values are kept and compared.")
