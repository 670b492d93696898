"""Stage 5: the verdict ladder.  The first rung that holds wins; each verdict names the
section of PyTorch's numerical accuracy note it rests on and suggests labels (never
``high priority``, never a close)."""
from __future__ import annotations

import ast
import dataclasses
import math
from typing import Any

import numpy as np

from triage import policy
from triage.audit import Evidence, audit, inconclusive
from triage.compare import side_of, summarize
from triage.model import (
    AGREEING_OUTCOMES,
    Ablation,
    ArmRun,
    Comparison,
    Divergence,
    Observable,
    ReportedArm,
    ReportedValue,
    Repro,
    Side,
    Verdict,
    compared_runs,
)
from triage.numerics.errors import ulp
from triage.reported import reported_judgement, reported_lines

KINDS = ("could-not-run", "crash-one-arm", "nondeterministic", "not-reproduced", "nonfinite-flip",
         "expected-rounding", "expected-precision-mode", "expected-ill-conditioned", "likely-bug", "inconclusive")


def _verdict(kind: str, expected: bool | None, section: policy.Section, labels: list[str],
             summary: str, evidence: list[str] | None = None) -> Verdict:
    return Verdict(kind=kind, expected=expected, policy_section=section.title, policy_url=section.url,
                   labels=[policy.LABELS[k] for k in labels], summary=summary, evidence=evidence or [])


def classify(repro: Repro, comparison: Comparison | None, ablations: list[Ablation] | None = None,
             replay: dict[str, Any] | None = None, reported: ReportedArm | None = None) -> Verdict:
    """The ladder's verdict with everything it rests on, then audited against the raw
    evidence (triage/audit.py): a verdict that conflicts with it becomes `inconclusive`.
    `replay`: the minimizer's replay of the recorded op graph on the two arms, if it ran;
    `reported`: the reporter's posted values, judged (they stand in for an arm not run here)."""
    ablations = ablations or []
    verdict = _ladder(repro, comparison, ablations, reported)
    upcast = [f"with `aten.{a.switch.partition('=')[2]}` alone computed in float64 on both arms the divergence "
              f"disappears ({a.detail}): it starts in that op's {_precision_of(comparison)} arithmetic"
              for a in ablations if a.supports == "evidence" and a.outcome in AGREEING_OUTCOMES]
    verdict = dataclasses.replace(verdict, evidence=verdict.evidence + upcast,
                                  summary=verdict.summary + _stopped_sentence(comparison)
                                  + _releases_sentence(comparison))
    conflicts = audit(verdict, Evidence(comparison, replay)) if comparison is not None else []
    return inconclusive(verdict, conflicts) if conflicts else verdict


def _stopped_sentence(comparison: Comparison | None) -> str:
    """Where every arm raised after producing values, the verdict is on those values, and
    says where the script stopped."""
    runs = [r for r in (comparison.arms if comparison else []) if r.status != "unavailable"]
    if not runs or any(r.completed for r in runs) or not all(r.raised_after_values for r in runs):
        return ""
    first = runs[0]
    n = sum(1 for o in first.observables if o.kind != "final")
    return (f" The script did not finish: {'every arm' if len(runs) > 1 else f'`{first.spec}`'} stopped with "
            f"{first.failure}, after producing {n} value{'s' if n != 1 else ''}; those values are what is judged here.")


def _releases_sentence(comparison: Comparison | None) -> str:
    """Which torch each arm ran, where the arms ran different releases: said in the verdict's
    summary, since what a release changed is the point of such a comparison."""
    if comparison is None:
        return ""
    releases = {r.spec: torch_of(r) for r in comparison.arms}
    if len(set(releases.values())) < 2:
        return ""
    return " Torch releases: " + ", ".join(f"`{spec}` ran {version}" for spec, version in releases.items()) + "."


def torch_of(run: ArmRun) -> str:
    """The torch version the arm's collect_env names, else its spec's release, else "this"."""
    from triage.extract import parse_environment

    found = parse_environment(run.environment).get("PyTorch version") if run.environment else None
    return found or (run.spec.partition("@")[2] or "the running release")


def _precision_of(comparison: Comparison | None) -> str:
    d = comparison.divergence if comparison else None
    return d.dtype if d else "working-precision"


def _ladder(repro: Repro, comparison: Comparison | None, ablations: list[Ablation],
            reported: ReportedArm | None = None) -> Verdict:
    if repro.problem is not None or comparison is None:
        return _verdict("could-not-run", None, policy.NONE, ["repro"],
                        f"triage could not run the script: {repro.problem}.")
    runs = [r for r in comparison.arms if r.status != "unavailable"]
    if not runs:
        why = "; ".join(f"{r.spec}: {r.failure}" for r in comparison.arms)
        return _verdict("could-not-run", None, policy.NONE, ["repro"], f"No arm could run on this machine ({why}).")
    missing = [r for r in comparison.arms if r.status == "unavailable"]
    partial = _ladder_of_runs(repro, comparison, ablations, runs)
    judged = _with_reported(partial, reported) if reported is not None else None
    if judged is not None:
        return dataclasses.replace(judged, summary=judged.summary + _device_disagreement(reported))
    verdict = _not_tested(missing, runs, partial) if missing else partial
    return dataclasses.replace(verdict, evidence=verdict.evidence + reported_lines(reported)) if reported else verdict


# What the runs here decided that a posted value cannot overturn: the script did not run, one
# arm crashed, or it disagrees with itself (a posted value of a random program is one draw).
_RUNS_DECIDE = {"could-not-run", "crash-one-arm", "nondeterministic", "inconclusive"}


def _with_reported(here: Verdict, reported: ReportedArm) -> Verdict | None:
    """The verdict with the reporter's posted values as an arm (None: none could be judged,
    or what ran here decides alone). A value this machine printed too is the runs' business.
    Outside every rounding of the computation: on their GPU, a bug to confirm on that
    hardware; on their CPU, where this CPU is inside, a difference of release or build (fixed
    since, or never in this build). Inside: the explanation of the runs here, which ran the
    same computation, holds for their numbers too."""
    judged = reported.judged
    if not judged or here.kind in _RUNS_DECIDE:
        return None
    evidence = reported_lines(reported) + here.evidence
    basis = f"Judged from the numbers the reporter posted ({reported.source}), not re-run on their hardware: "
    differ = [v for v in judged if not v.same_as_here]
    outside = [v for v in differ if v.judgement.zone == "outside"]
    # A value the output does not place (a CPU tensor may hold what their GPU computed) counts
    # as their GPU's where the script uses one: the bug, if any, is to confirm there.
    on_gpu = [v for v in outside if v.device == "cuda" or (v.device is None and reported.device == "cuda")]
    racy = [v for v in on_gpu if v.order_dependent]
    if racy:
        v = racy[0]
        ops = ", ".join(f"`{op}`" for op in v.order_dependent)
        return _verdict("nondeterministic", True, policy.GENERAL, ["reproducibility", "gpu_confirmation"],
                        basis + f"{_posted(v)} is outside every rounding of this computation on their GPU as modelled "
                        f"here ({reported_judgement(v.judgement)}), and the computation goes through {ops}, whose CUDA "
                        "kernels add or write in an order the hardware picks (with repeated indices the result "
                        "changes from run to run): a testing-method problem, not a numerical one. To tell, run it "
                        "on their GPU twice, and with `torch.use_deterministic_algorithms(True)`.", evidence)
    if on_gpu:
        v = on_gpu[0]
        # inf/nan on their side only, where no rounding gives it: the ladder's non-finite rung, not expected.
        kind = "nonfinite-flip" if v.nonfinite_flip else "likely-bug"
        labels = (["nonfinite"] if v.nonfinite_flip else []) + ["silent", "review", "gpu_confirmation"]
        return _verdict(kind, False, policy.NONE, labels,
                        basis + f"{_posted(v)} is outside every rounding of this computation on their GPU as "
                        f"modelled here ({reported_judgement(v.judgement)}). Unless their build or settings differ "
                        "from the script's, their GPU computed something else; confirm it there: "
                        "`triage run repro.py --arms cpu,cuda`.", evidence)
    if outside and here.kind != "likely-bug":
        v = outside[0]
        release = (f"their torch {reported.torch}, here {reported.here_torch or 'this release'}" if reported.torch
                   else "their collect_env is not in the report")
        return _verdict("not-reproduced", None, policy.NONE, ["repro"],
                        basis + f"{_posted(v)} is outside every rounding of this computation "
                        f"({reported_judgement(v.judgement)}), but the CPU here computes it inside its spread: the "
                        f"difference does not reproduce on this release and build ({release}); it was fixed since, "
                        "or comes from their build. " + here.summary, evidence)
    if here.kind == "likely-bug" or not differ:
        why = ("the posted values are inside their spread, but the run here is not" if here.kind == "likely-bug"
               else "the posted values are the ones printed here")
        return dataclasses.replace(here, summary=basis + why + ". " + here.summary, evidence=evidence)
    v = differ[0]
    device = {"cuda": "GPU", "cpu": "CPU"}.get(v.device or reported.device, "machine")
    inside = (f"{_posted(v)} is inside the rounding spread of this computation on their {device} as modelled here"
              f"{f' (and {len(differ) - 1} more)' if len(differ) > 1 else ''}. ")
    if any(x.nonfinite_flip for x in differ):
        # inf/nan on one machine only, and the posted value inside its spread: the ladder's
        # non-finite rung, explained as the runs here explain the computation.
        labels = list(dict.fromkeys(here.labels + [policy.LABELS["nonfinite"]]))
        return dataclasses.replace(here, kind="nonfinite-flip", expected=True, labels=labels, evidence=evidence,
                                   summary=basis + inside + here.summary)
    if here.kind == "not-reproduced":
        wide = [x for x in differ if x.judgement.wide or x.judgement.computational_zero]
        if wide:
            return _verdict("expected-ill-conditioned", True, policy.GENERAL, ["numerical"],
                            basis + inside + f"The computation itself keeps few digits of {wide[0].label} "
                            f"({reported_judgement(wide[0].judgement)}): another device's rounding moves it that far.",
                            evidence)
        return _verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                        basis + inside + "It differs from the value printed here only as another device's rounding "
                        "of the same computation does, which the accuracy note does not guarantee bitwise.", evidence)
    return dataclasses.replace(here, summary=basis + inside + here.summary, evidence=evidence)


def _device_disagreement(reported: ReportedArm) -> str:
    """Where an arm of the reporter's device ran here too: the posted values it does not
    reproduce (a bug fixed since, another build) — evidence in itself."""
    differ = [v for v in reported.values if v.device_agrees is False]
    if not differ:
        return ""
    v = differ[0]
    return (f" The {reported.device} arm here prints `{v.device_here}` where they posted `{v.printed}`"
            f"{f' (and {len(differ) - 1} more)' if len(differ) > 1 else ''}: a bug fixed since, or another build "
            f"or device{f' (their torch {reported.torch})' if reported.torch else ''}.")


def _posted(v: ReportedValue) -> str:
    where = f" (line {v.line})" if v.line else ""
    return f"{v.label or 'the value'}{where} = `{v.printed}` on their side (`{v.here}` here)"


def _not_tested(missing: list[ArmRun], ran: list[ArmRun], partial: Verdict) -> Verdict:
    """A requested arm that could not run here: the comparison asked for was not made, which
    is never a reproduction, a pass or a verdict on the numbers."""
    lines = [f"`{r.spec}`: {r.failure}" for r in missing]
    asked = ",".join(r.spec for r in ran + missing)
    return _verdict("could-not-run", None, policy.NONE, ["repro"],
                    f"Not tested here: the comparison asked for needs {', '.join(f'`{r.spec}`' for r in missing)}, "
                    f"which this machine cannot run ({'; '.join(lines)}). On a machine that has it, run "
                    f"`triage run repro.py --arms {asked}`. What did run: {', '.join(f'`{r.spec}`' for r in ran)} — "
                    f"{partial.kind}: {partial.summary}", lines + partial.evidence)


def _ladder_of_runs(repro: Repro, comparison: Comparison, ablations: list[Ablation], runs: list[ArmRun]) -> Verdict:
    completed = compared_runs(runs)
    failed = [r for r in runs if r not in completed]
    if not completed:
        return _could_not_run(failed)
    if failed:
        return _crash_one_arm(completed, failed)
    d = comparison.divergence
    agree = [a for a in ablations if a.explains]
    # Randomness is not rounding: a switch that makes the draws agree explains a divergence
    # whatever the judge would say of the values.
    random_agree = [a for a in agree if a.supports == "nondeterministic"]
    rung = (_repeated_call(comparison, d, agree) or _rerun(comparison, d) or _nondeterministic(comparison, d)
            or _ablated(comparison, d, random_agree))
    if rung is not None:
        return rung
    wrong = _wrong_kernel(comparison, completed)
    if wrong is not None:
        return wrong
    if d is None:
        return (_unseeded_runs(completed, repro.source) or _exact_equality(completed, repro.source)
                or _not_reproduced(comparison, completed))
    if d.bit_difference is not None:
        return _rounding(d)
    sides = [s for s in (d.a, d.b) if s is not None]
    if len(d.judgements) == len(sides) and all(j.status == "judged" for j in d.judgements):
        return _judged(comparison, d, agree)
    # No simulated rounding for these values (no reference, a random compiled region, over
    # budget): the float64 figures and the per-op notes decide, and the verdict says so.
    fallback = _by_float64(comparison, d, agree)
    why = "; ".join(sorted({f"`{j.arm}` {j.label}: {j.reason}" for j in d.judgements if j.status != "judged"}))
    if why:
        fallback.evidence.append(f"not judged by simulated rounding — {why}; the verdict rests on the float64 "
                                 "reference and per-op conditioning figures instead")
    return fallback


def _by_float64(comparison: Comparison, d: Divergence, agree: list[Ablation]) -> Verdict:
    """The ladder without simulated rounding: tolerance, dynamo's float64 rule, conditioning."""
    rung = _ablated(comparison, d, agree)
    if rung is not None:
        return rung
    if d.nonfinite_mismatch > 0:
        return _nonfinite_flip(comparison, d)
    if d.b is not None and d.within_tolerance:
        return _rounding(d)
    # Ill-conditioning explains more than "both arms are equally far from float64" does.
    conditioned = _ill_conditioning(comparison, d)
    if d.b is not None and not conditioned and (d.fp64_rule or "").startswith("pass"):
        return _rounding(d)
    if conditioned:
        note = _singular_upstream(comparison, d) or {}
        matrix = "figure" not in note
        section = policy.LINALG if matrix else policy.EXTREMAL if "overflow" in note.get("kind", "") else policy.GENERAL
        return _verdict("expected-ill-conditioned", True, section, ["numerical"] + (["linalg"] if matrix else []),
                        f"{_where(d)} differs beyond tolerance, but it depends on {conditioned}. "
                        "On such inputs results may vary between devices and backends.",
                        _evidence(d) + ([_cond_text(note, full=True)] if note else []))
    return _likely_bug(d)


# -- an independent answer: the kernel against exact arithmetic ----------------------------
def _wrong_kernel(c: Comparison, completed: list[ArmRun]) -> Verdict | None:
    """A linalg kernel farther from the exact answer on its recorded input (rational
    arithmetic, mpmath) than a correct kernel's rounding at that precision reaches, with an
    observed value that depends on it far from the reference: a kernel bug, whether or not
    the arms agree — two arms calling one LAPACK share its bug, and so may the float64 replay."""
    for run in completed:
        for o in run.observables:
            notes = [run.conditioning[i] for i in o.conditioning if i < len(run.conditioning)]
            note = next((n for n in notes if n.get("kernel_disagrees") is True), None)
            if note is None or side_of(run, o).agrees_with_reference is not False:
                continue
            both = [r.spec for r in completed if r is not run and any(
                x.get("kernel_disagrees") is True and x.get("op") == note["op"] and x.get("line") == note.get("line")
                for x in r.conditioning)]
            return _verdict("likely-bug", False, policy.NONE, ["silent", "linalg", "review"],
                            _wrong_kernel_text(run, o, note, both), [_cond_text(note, full=True)])
    return None


def _wrong_kernel_text(run: ArmRun, o: Observable, note: dict[str, Any], also: list[str]) -> str:
    shape = "×".join(map(str, note.get("shape") or []))
    text = (f"`aten.{note['op']}` at line {note.get('line')} (`{run.spec}`, {shape} {note.get('dtype')}) returns "
            f"{_num(note.get('kernel_value'))} where the exact answer on the very input it was given is "
            f"{_num(note.get('kernel_exact'))} ({note.get('independent')}): off by {_num(note.get('kernel_error'), 2)} "
            f"of the answer's scale, where a correct kernel at {note.get('dtype')} stays within "
            f"{_num(note.get('kernel_bound'), 2)} ({policy.INDEPENDENT_SAFETY:g}× the backward-stable bound, conditioning "
            f"included). {o.shown} (line {o.line}) depends on it and is far from the float64 value.")
    if also:
        text += f" {', '.join(f'`{a}`' for a in also)} returns the same wrong answer: the arms share the kernel."
    if note.get("float64_disagrees") is True:
        text += (" The float64 replay, which runs the same library, is off too "
                 f"({_num(note.get('float64_error'), 2)} where float64 allows {_num(note.get('float64_bound'), 2)}): "
                 "the reference continues from the exact answer.")
    return text + " A kernel bug, shown by an independent computation, not rounding and not conditioning."


def _num(x: Any, digits: int = 9) -> str:
    return f"{x:.{digits}g}" if isinstance(x, (int, float)) else str(x)


# -- the judged ladder: each side against its own simulated rounding -----------------------
def _judged(c: Comparison, d: Divergence, agree: list[Ablation]) -> Verdict:
    """Inside its own spread is rounding of this very computation, whatever float64 says;
    outside it is another computation, which only a switch that brings both sides inside
    their spreads (an ablation) can excuse."""
    js = d.judgements
    outside = [j for j in js if j.zone == "outside"]
    # The judgements themselves are the report's rounding table; the evidence adds what they do not say.
    evidence = _unstable_lines(js) + _unmeasured_lines(js) + _evidence(d, sides=False)
    redrawn = _different_computations(c, d)
    if redrawn is not None:
        return redrawn
    if outside:
        precision = [a for a in agree if a.supports == "expected-precision-mode"]
        if precision:
            verdict = _ablated(c, d, precision)
            verdict.evidence = evidence + verdict.evidence[len(_evidence(d)):]
            return verdict
        return _outside(c, d, outside, evidence)
    cancels = _cancellation_hint(c, d)
    if d.nonfinite_mismatch > 0:
        return _nonfinite_inside(c, d, evidence)
    wide = [j for j in js if j.wide]
    if not wide and _matrix_upstream(c, d):
        # An ill-conditioned matrix upstream (close eigenvalues, near-singular) whose figure
        # shows in some elements of the value, though not in a typical one: those elements
        # carry no digits to be rounding-accurate in. (A cancelling matmul element is not
        # one: every model has a few.)
        wide = [j for j in js if j.poorly_determined]
    if wide:
        return _ill_conditioned(c, d, wide, evidence, cancels)
    envelope = [j for j in js if j.zone == "envelope"]
    inside = " and ".join(f"`{j.arm}` {j.label}" if d.source == "claim" else f"`{j.arm}`" for j in js)
    digits = _digits_text(js)
    how = _difference_text(d)
    if envelope:
        e = envelope[0]
        summary = (f"{_where(d)} {how}. `{e.arm}` lies outside the unbiased rounding spread of its computation but "
                   "inside the envelope of rounding every operation the same way (all up or all down): an "
                   "order-dependent, biased accumulation such as stagnation in a long running sum, which floating "
                   f"point allows. Accumulating in a wider type (or with a compensated sum) removes it.{digits}")
    else:
        both = "both" if len(js) == 2 else "its value is"
        summary = (f"{_where(d)} {how}, and {both} inside {'their' if len(js) == 2 else 'its'} own rounding spread "
                   f"({inside}): replaying the recorded computation with every operation rounded at the "
                   f"{'arms’' if len(js) == 2 and d.source == 'arms' else 'arm’s'} own precision gives differences this "
                   f"large. Ordinary floating-point rounding, which the accuracy note does not guarantee bitwise.{digits}")
    return _verdict("expected-rounding", True, policy.GENERAL, ["numerical"], summary, evidence)


def _different_computations(c: Comparison, d: Divergence) -> Verdict | None:
    """Two values whose float64 values themselves differ, beyond both rounding spreads, are
    not one quantity computed twice, whatever each side's own spread says.  Within one arm
    (a claim) with random numbers reaching them only through Python values (a shuffling
    DataLoader's `randperm` turned into indices), the sides were computed from different
    draws; between two arms, the arms ran different code."""
    if d.b is None or len(d.judgements) != 2 or d.source not in ("claim", "arms"):
        return None
    (run_a, oa), (run_b, ob) = c.resolve(d.a), c.resolve(d.b)
    ra, rb = oa.reference_value, ob.reference_value
    if ra is None or rb is None or ra.shape != rb.shape or not oa.spread or not ob.spread:
        return None
    both = np.isfinite(ra) & np.isfinite(rb)
    shapes_match = oa.spread["sig"].shape == ra.shape and ob.spread["sig"].shape == rb.shape
    width = np.sqrt(oa.spread["sig"] ** 2 + ob.spread["sig"] ** 2) if shapes_match else None
    if width is None or not both.any():
        return None
    gap = np.abs(ra.astype(np.float64) - rb.astype(np.float64))[both]
    limit = 8 * width[both] + 1e-12 * np.abs(ra)[both]
    if d.source == "arms":
        if any(j.zone != "inside" for j in d.judgements):
            return None  # a side outside its own spread is judged as such
        # Between arms the references are replays of two recorded graphs, which may carry a
        # rounding of the working precision (a constant or an input captured at float32): a
        # gap counts only past 16 units of that precision too.
        unit = max(policy.unit_roundoff(j.dtype) for j in d.judgements)
        limit = np.maximum(limit, 16 * unit * np.abs(ra)[both])
    if not (gap > limit).any():
        return None
    spreads = (f"float64 values of the two sides differ by up to {float(gap.max()):.3g}; rounding spreads "
               f"±{float(np.max(oa.spread['sig'])):.2g} and ±{float(np.max(ob.spread['sig'])):.2g}")
    if d.source == "arms":
        return _arms_differ(run_a, run_b, d, float(gap.max()), spreads)
    ancestors = set(oa.ancestors) | set(ob.ancestors)
    draws = [leaf for leaf in run_a.leaves if leaf["kind"] == "random" and leaf["index"] not in ancestors]
    calls = sorted({leaf.get("call_line") for leaf in draws if leaf.get("call_line") is not None})
    if not draws or len(calls) < 2:
        return _different_functions(d, ra, rb, both, spreads)
    first = next((leaf for leaf in draws if leaf.get("op") == "randperm"), draws[0])
    how = (" — a `DataLoader(shuffle=True)` draws it for every pass over the data" if first.get("op") == "randperm"
           else "")
    return _verdict("nondeterministic", True, policy.GENERAL, ["random"],
                    f"{_where(d)}: the two sides are different computations, not one computed twice — even in "
                    f"float64 they differ by {float(gap.max()):.3g}, far beyond both rounding spreads. Random "
                    f"numbers drawn anew for each side reach them through Python values: `aten.{first.get('op')}` at "
                    f"line {first.get('line')}{how}, drawn for the calls at lines "
                    f"{', '.join(str(x) for x in calls[:4])}. This is a testing-method problem, not a numerical one. "
                    "Fix: seed each run identically (`torch.manual_seed(…)` before each, or pass a seeded "
                    "`generator=` to the DataLoader).",
                    [spreads]
                    + [f"random draw `aten.{x.get('op')}` line {x.get('line')}, for the call at line {x.get('call_line')}"
                       for x in draws[:4]])


def _different_functions(d: Divergence, ra: np.ndarray, rb: np.ndarray, both: np.ndarray, spreads: str) -> Verdict:
    """Two values the script compares whose float64 replays differ beyond both spreads, with
    no random draw between them: the two paths compute different functions.  Said with the
    float64 difference, its shape (a constant factor, a constant offset) and where the two
    computations part in the op graph.  A side that is a constant (the value the script
    expects) is the one case this cannot settle: the float64 replay runs the same kernels as
    the arm, so a kernel wrong in every precision agrees with itself."""
    a64, b64 = ra.astype(np.float64)[both], rb.astype(np.float64)[both]
    gap = float(np.abs(a64 - b64).max())
    paths = d.paths or {}
    names = (d.a.label, d.b.label)
    shape = _difference_shape(a64, b64, names)
    if paths.get("constant_a") or paths.get("constant_b"):
        computed, fixed = (d.b, d.a) if paths.get("constant_a") else (d.a, d.b)
        return _verdict("inconclusive", None, policy.NONE, ["review"],
                        f"{_where(d)}: {computed.label} differs from the value the script expects ({fixed.label}) "
                        f"by {gap:.3g}, and its float64 replay differs from it just as much{shape}: not rounding. "
                        "But the float64 reference runs the same kernels as the arm, so triage cannot tell whether "
                        "the kernel is wrong in every precision or the expected value is; a maintainer should "
                        "check the expected value.", [spreads])
    return _verdict("likely-bug", False, policy.NONE, ["review"],
                    f"{_where(d)}: the two sides compute different functions, not one quantity rounded twice — "
                    f"replayed in float64 they still differ by up to {gap:.3g}{shape}, far beyond both rounding "
                    f"spreads. Rounding does not explain it: one of the two paths computes something else "
                    f"(a different formula, a wrong constant or gradient, a custom kernel).{_parting_text(paths, names)}",
                    [spreads] + [f"only in {name}: {_ops_text(paths[key], paths.get(key + '_count'))}"
                                 for key, name in (("only_a", names[0]), ("only_b", names[1])) if paths.get(key)])


def _difference_shape(a: np.ndarray, b: np.ndarray, names: tuple[str, str]) -> str:
    """A constant factor or a constant offset between the float64 values, where there is one."""
    if a.size >= 2:
        nonzero = (np.abs(b) > 0) & (np.abs(a) > 0)
        if nonzero.sum() >= 2:
            ratio = a[nonzero] / b[nonzero]
            mid = float(np.median(ratio))
            if abs(mid - 1) > 1e-3 and np.all(np.abs(ratio - mid) <= 1e-3 * abs(mid)):
                return (f", by a constant factor: {names[0]} = {mid:.6g} × {names[1]} in every element"
                        if np.all(np.abs(ratio - mid) <= 1e-9 * abs(mid)) else
                        f", by a nearly constant factor: {names[0]} ≈ {mid:.6g} × {names[1]} "
                        f"({float(ratio.min()):.8g}–{float(ratio.max()):.8g})")
        offset = a - b
        mid = float(np.median(offset))
        if mid != 0 and np.all(np.abs(offset - mid) <= 1e-6 * max(abs(mid), 1e-300)):
            return f", by a constant offset: {names[0]} = {names[1]} + {mid:.6g} in every element"
    return ""


def _parting_text(paths: dict[str, Any], names: tuple[str, str]) -> str:
    if not paths:
        return ""
    parts = []
    for key, name in (("only_a", names[0]), ("only_b", names[1])):
        if paths.get(key):
            parts.append(f"{name} computes {_ops_text(paths[key], paths.get(key + '_count'), 3)}")
    text = (" Where they part: " + "; ".join(parts) + ", with no counterpart on the other side.") if parts else ""
    hints = paths.get("hints") or []
    return text + "".join(f" {h}." for h in hints)


def _ops_text(ops: list[dict[str, Any]] | None, count: int | None, limit: int = 6) -> str:
    listed = ", ".join(f"`{o['op']}` (line {o['line']})" for o in (ops or [])[:limit])
    more = (count or 0) - min(len(ops or []), limit)
    return listed + (f" and {more} more" if more > 0 else "")


def _arms_differ(run_a: ArmRun, run_b: ArmRun, d: Divergence, gap: float, spreads: str) -> Verdict:
    """Each arm is consistent with its own recorded computation, but the two computations
    differ in exact arithmetic: not rounding, whichever side is nearer anything."""
    nodes = [(r.graph or {}).get("nodes") for r in (run_a, run_b)]
    graphs = (f" The arms recorded different graphs ({nodes[0]} and {nodes[1]} ops): the script takes a different "
              "path on each (a branch on the device, the thread count or the build), or an op dispatched to a "
              "different formula." if None not in nodes and nodes[0] != nodes[1] else
              " Their recorded graphs have the same size, so an op computes a different formula on one arm "
              "(a kernel or dispatch difference), or the script feeds the arms different data.")
    summary = (f"{_where(d)}: `{run_a.spec}` and `{run_b.spec}` ran different computations — each value is inside the "
               f"rounding spread of its own arm's computation, but replayed in float64 those computations differ by "
               f"{gap:.3g}, far beyond both spreads. Rounding does not explain it.{graphs}")
    return _verdict("likely-bug", False, policy.NONE, ["silent", "review"], summary, [spreads])


def _outside(c: Comparison, d: Divergence, outside: list, evidence: list[str]) -> Verdict:
    j = outside[0]
    inside = [x for x in d.judgements if x.zone != "outside"]
    contrast = f", while `{inside[0].arm}` {inside[0].label} is inside its own (p = {inside[0].p:.2f})" if inside else ""
    if j.nonfinite and j.nonfinite.startswith("outside"):
        what = j.nonfinite.removeprefix("outside: ")
        summary = (f"{_where(d)}: `{j.arm}` {j.label} has {what}{contrast}. The recorded computation, rounded at "
                   f"the arm's own precision with its range emulated, does not produce that. A different computation "
                   "(a kernel or compiler bug, a different formula that overflows or cancels) — not rounding, and not "
                   "an extremal input.")
        return _verdict("nonfinite-flip", False, policy.NONE, ["nonfinite", "silent", "review"], summary,
                        evidence + _hazards(c, d))
    away = (f"{j.statistic:.3g}σ from the float64 value" if j.statistic is not None and j.statistic != float("inf")
            else "away from the float64 value where no simulated rounding moves it")
    summary = (f"{_where(d)}: `{j.arm}` {j.label} lies outside its own rounding spread — {away}, where "
               f"{j.samples} simulated roundings of the same computation at {j.dtype} reach at most "
               f"{(j.max_sample_stat or 0):.3g}σ (p = {j.p:.2f}){contrast}. The arm computes something other than "
               "the recorded formula at its precision (a kernel or compiler bug, a different formula, or a precision "
               "mode no ablation explains).")
    kind = "nonfinite-flip" if d.nonfinite_mismatch > 0 else "likely-bug"
    labels = ["nonfinite", "silent", "review"] if kind == "nonfinite-flip" else ["silent", "review"]
    return _verdict(kind, False, policy.NONE, labels, summary, evidence + _hazards(c, d))


def _nonfinite_inside(c: Comparison, d: Divergence, evidence: list[str]) -> Verdict:
    """Inf/NaN on one side only, with both sides inside their spreads: rounding alone reaches
    the nonfinite value here (an exactly singular matrix, a value at the edge of the range)."""
    who = _who_is_right(d, [], [])
    exact = [s for s in (d.a, d.b) if s is not None and s.agrees_with_reference and s.nonfinite_vs_reference == 0]
    note = _singular_upstream(c, d)
    if exact and any(s.summary != (exact[0].summary) for s in (d.a, d.b) if s is not None):
        who += f" `{exact[0].arm}` {exact[0].label} equals the exact answer ({exact[0].reference_summary})."
    if note and "figure" not in note:
        section, labels = policy.LINALG, ["nonfinite", "linalg"]
        why = (f" The matrix fed to `{note['op']}` at line {note['line']} is singular ({_cond_text(note)}), so the "
               "exact answer is not finite and any finite value is rounding noise.")
    elif note:
        section = policy.EXTREMAL if "overflow" in note.get("kind", "") else policy.GENERAL
        labels = ["nonfinite", "numerical"]
        why = f" At `aten.{note['op']}` (line {note['line']}) {note['figure']}."
    else:
        section, labels, why = policy.EXTREMAL, ["nonfinite", "numerical"], ""
        over = [s for s in (d.a, d.b) if s is not None and s.overflow_to_inf]
        if over:
            why = (f" The float64 value ({over[0].reference_summary}) lies beyond the largest finite {over[0].dtype}, "
                   f"so `inf` is the correctly rounded {over[0].dtype} answer: range overflow.")
    both = "Both sides are" if d.b is not None else "The value is"
    return _verdict("nonfinite-flip", True, section, labels,
                    f"{who}{why} {both} inside the rounding spread of their own computation: replaying it with every "
                    "operation rounded at the arm's precision (its range emulated) reaches the same non-finite "
                    "values, so this is where rounding and the dtype's range lead, not a bug.",
                    evidence + ([_cond_text(note, full=True)] if note else []))


def _ill_conditioned(c: Comparison, d: Divergence, wide: list, evidence: list[str], hint: str) -> Verdict:
    j = wide[0]
    note = _singular_upstream(c, d) or {}
    matrix = bool(note) and "figure" not in note
    section = policy.LINALG if matrix else policy.EXTREMAL if "overflow" in note.get("kind", "") else policy.GENERAL
    if j.computational_zero:
        state = (f"`{j.arm}` {j.label} is a computational zero at {j.dtype}: its simulated roundings scatter "
                 f"around 0 by ±{j.sigma:.2g}, so every digit of it is rounding noise")
    elif j.wide:
        state = (f"its rounding spread is wide — `{j.arm}` {j.label} keeps only {j.digits:.1f} significant digits "
                 f"at {j.dtype} (±{j.sigma:.2g})")
    else:
        state = (f"{j.poorly_determined} of the {j.numel} elements of `{j.arm}` {j.label} keep almost none of "
                 f"{j.dtype}'s digits (the fewest: {j.fewest_digits or 0:.1f}), though a typical element keeps "
                 f"{j.digits or 0:.1f}")
    behind = _ill_conditioning(c, d) or _cancellation_site(c, d)
    figure = f" The figure behind it: {behind}." if behind else ""
    return _verdict("expected-ill-conditioned", True, section, ["numerical"] + (["linalg"] if matrix else []),
                    f"{_where(d)} {_difference_text(d)}, and {'every side is' if d.b is not None else 'it is'} "
                    "inside its own rounding spread, but "
                    f"{state}.{figure}{hint} On such a computation results may differ between devices, backends and "
                    "orders of evaluation; neither side is a bug.",
                    evidence + ([_cond_text(note, full=True)] if note else []))


def _cancellation_sites(c: Comparison, d: Divergence) -> list[dict[str, Any]]:
    """The additions/subtractions upstream of the sides that lose the most digits to
    cancellation (found by the rounding simulation's unperturbed replay)."""
    sites = []
    for s in (d.a, d.b):
        found = c.find(s)
        sites += ((found[1].rounding or {}).get("cancellations") or []) if found else []
    return sites


def _cancellation_site(c: Comparison, d: Divergence) -> str | None:
    sites = _cancellation_sites(c, d)
    if not sites:
        return None
    top = sites[0]
    lost = top["digits_lost"]
    lost = "every digit" if lost in ("inf", float("inf")) else f"{float(lost):.1f} digits"
    return f"`{top['op']}` at line {top['line']} cancels its operands, losing {lost}"


def _cancellation_hint(c: Comparison, d: Divergence) -> str:
    """A textbook rewrite for a cancelling formula the sides' graphs contain."""
    texts = []
    for site in _cancellation_sites(c, d):
        if site.get("hint") and site["hint"] not in texts:
            texts.append(site["hint"])
    return (" " + " ".join(texts)) if texts else ""


def _unstable_lines(js: list) -> list[str]:
    return [f"decision unstable under rounding (`{j.arm}` {j.label}): {u}" for j in js for u in j.unstable][:4]


def _unmeasured_lines(js: list) -> list[str]:
    """The library ops whose kernel error no measurement covers: the spread used the
    conservative bound for them, which a verdict resting on it must say."""
    ops = sorted({op for j in js for op in j.unmeasured})
    if not ops:
        return []
    shown = ", ".join(f"`{op}`" for op in ops[:6]) + (f" and {len(ops) - 6} more" if len(ops) > 6 else "")
    return [f"no measured kernel error for {shown} at this release, device and dtype: the simulation gave "
            f"{'it' if len(ops) == 1 else 'them'} a conservative {policy.UNMEASURED_U:g} u bound (`triage calibrate` "
            "measures the kernels of this machine)"]


def _digits_text(js: list) -> str:
    same_arm = len({j.arm for j in js}) < len(js)
    parts = [f"{j.label if same_arm else '`' + j.arm + '`'} keeps {j.digits:.1f} significant digits at {j.dtype}"
             for j in js if j.digits is not None and not j.computational_zero]
    return (" (" + "; ".join(parts) + ")") if parts else ""


def _difference_text(d: Divergence) -> str:
    if d.b is None:
        return f"is {d.a.summary} on `{d.a.arm}` where float64 gives {d.a.reference_summary or 'no value'}"
    if d.max_abs_diff is None:
        return f"differs between {_pair(d)}"
    tol = f"within {d.dtype} tolerance" if d.within_tolerance else f"beyond {d.dtype} tolerance"
    return f"differs between {_pair(d)} by {d.max_abs_diff:.3g} ({tol})"


# -- rungs --------------------------------------------------------------------------------
def _could_not_run(failed: list[ArmRun]) -> Verdict:
    kinds = {(r.status, (r.exception or {}).get("type")) for r in failed}
    same = "the same way" if len(kinds) == 1 else "(not all the same way)"
    lines = [f"`{r.spec}`: {r.failure}" for r in failed]
    return _verdict("could-not-run", None, policy.NONE, ["repro"],
                    f"Every arm failed {same} before the script produced a result to compare: {lines[0]}",
                    lines)


def _crash_one_arm(completed: list[ArmRun], failed: list[ArmRun]) -> Verdict:
    bad = failed[0]
    good = ", ".join(f"`{r.spec}`" for r in completed)
    labels = ["review"] + (["compile"] if bad.mode == "compile" else [])
    return _verdict("crash-one-arm", False, policy.NONE, labels,
                    f"`{bad.spec}` fails ({bad.failure}) while {good} runs the same program to the end. "
                    "The accuracy note allows different numbers, not a failure on one configuration.",
                    [f"`{r.spec}`: {r.failure}" for r in failed])


def _nondeterministic(c: Comparison, d: Divergence | None) -> Verdict | None:
    """The values differ because their inputs differ, not because the arithmetic does."""
    if d is None:
        return None
    differing = [a for a in d.ancestors if a["differs"] and a["kind"] in ("random", "uninitialized")]
    differing = differing or d.distinct_draws  # a claim's operands drawn separately (compare finds them)
    if differing:
        leaf = differing[0]
        if leaf["kind"] == "uninitialized":
            cause = (f"`torch.{leaf['op'] or 'empty'}` at line {leaf['line']} returns uninitialized memory, "
                     "which differs from call to call")
            fix = "initialize the tensor (torch.zeros/torch.randn under a seed) instead of torch.empty"
        else:
            cause = (f"the random op `aten.{leaf['op']}` at line {leaf['line']} draws new numbers "
                     "for each side")
            fix = ("create modules and random inputs once, outside the compared computation, under "
                   "torch.manual_seed(…), and call model.eval() before comparing")
        return _verdict("nondeterministic", True, policy.GENERAL, ["random"],
                        f"The two sides of {_where(d)} start from different values: {cause}. "
                        f"This is a testing-method problem, not a numerical one. Fix: {fix}.",
                        _evidence(d) + [f"differing leaf: {leaf['kind']} `{leaf['op'] or 'data'}` line {leaf['line']}, shape {leaf['shape']}"])
    compile_runs = [r for r in c.arms if r.mode == "compile" and r.compiled_random_ops]
    if d.source == "arms" and compile_runs:
        ops = ", ".join(sorted(set(compile_runs[0].compiled_random_ops)))
        return _verdict("nondeterministic", True, policy.GENERAL, ["random", "compile"],
                        f"{_where(d)} differs between eager and compiled runs, and the compiled region draws "
                        f"random numbers ({ops}): inductor's generator differs from eager's. Compare with "
                        "`torch._inductor.config.fallback_random = True`, or move random draws out of the compiled function.",
                        _evidence(d))
    return None


SETTING_NAMES = {"num_threads": "torch.set_num_threads({})", "deterministic": "torch.use_deterministic_algorithms({})",
                 "mkldnn": "torch.backends.mkldnn.enabled = {}",
                 "float32_matmul_precision": "torch.set_float32_matmul_precision({!r})",
                 "cuda_matmul_tf32": "torch.backends.cuda.matmul.allow_tf32 = {}",
                 "cudnn_tf32": "torch.backends.cudnn.allow_tf32 = {}", "cudnn_benchmark": "torch.backends.cudnn.benchmark = {}",
                 "default_dtype": "torch.set_default_dtype({})",
                 "autocast_cpu": "autocast(\"cpu\", dtype={})", "autocast_cuda": "autocast(\"cuda\", dtype={})"}


def _repeated_call(c: Comparison, d: Divergence | None, agree: list[Ablation]) -> Verdict | None:
    """One module, same weights, bit-identical input, called twice: why the answers differ."""
    if d is None or d.how != "repeat":
        return None
    (run, first), (_, later) = c.resolve(d.a), c.resolve(d.b)
    ma, mb = first.module or {}, later.module or {}
    name = ma.get("variable") or "the model"
    calls = f"{first.label} (line {first.line}) and {later.label} (line {later.line})"
    evidence = _evidence(d) + [f"both calls: module instance {ma.get('instance')}, weights unchanged, "
                               "bit-identical inputs"]
    layers = ma.get("train_layers") or mb.get("train_layers") or []
    if layers:
        listing = "; ".join(f"`{name}.{x['path']}` ({x['type']}) {x['effect']}" for x in layers[:4])
        modes = ""
        if ma.get("training") != mb.get("training"):
            modes = (f" The first call ran in {'training' if ma.get('training') else 'eval'} mode, the second in "
                     f"{'training' if mb.get('training') else 'eval'} mode.")
        return _verdict("nondeterministic", True, policy.GENERAL, ["reproducibility"],
                        f"`{name}` gives different outputs for the same input in {calls}: it has layers that behave "
                        f"differently in training mode — {listing}.{modes} This is the model's mode, not numerics. "
                        f"Fix: call `{name}.eval()` before comparing outputs (and use `torch.no_grad()`).",
                        evidence + [f"train-mode layer `{x['path']}`: {x['type']}" for x in layers[:8]])
    moved = [name for name, version in (ma.get("buffers") or {}).items()
             if (mb.get("buffers") or {}).get(name, version) != version]
    if moved:
        return _state_changed(run, first, later, name, moved, evidence)
    sa, sb = ma.get("settings") or {}, mb.get("settings") or {}
    changed = [k for k in sa if sa.get(k) != sb.get(k)]
    if changed:
        lines = "; ".join(f"`{SETTING_NAMES.get(k, k + '={}').format(sa[k])}` → `{SETTING_NAMES.get(k, k + '={}').format(sb[k])}`"
                          for k in changed)
        tf32 = any("tf32" in k or k == "float32_matmul_precision" for k in changed)
        pinned = next((a for a in agree if a.supports == "expected-precision-mode"), None)
        shown = (f" With `{pinned.switch}` held for the whole script ({pinned.setting}) the two calls "
                 f"{_agree_text(pinned)}." if pinned else "")
        how = (f"within {d.dtype} tolerance (max |diff| {d.max_abs_diff:.3g})" if d.within_tolerance
               else f"by {d.max_abs_diff:.3g}" if d.max_abs_diff is not None else "")
        return _verdict("expected-precision-mode", True, policy.TF32 if tf32 else policy.GENERAL,
                        ["numerical", "reproducibility"] + (["tf32"] if tf32 else []),
                        f"`{name}` gives different outputs for the same input and weights in {calls} {how}, and the "
                        f"script changes a numerics setting between the calls: {lines}. Kernels pick different "
                        "blocking and reduction orders for different settings, so the rounding differs; PyTorch does "
                        f"not promise bitwise-identical results across such settings.{shown}",
                        evidence + [f"setting at the first call: {k}={sa[k]}; at the second: {k}={sb[k]}" for k in changed])
    return _verdict("nondeterministic", None, policy.GENERAL, ["reproducibility", "review"],
                    f"`{name}` gives different outputs in {calls} although the weights, the input bits and the "
                    "numerics settings are the same and no layer depends on training mode: a kernel is "
                    "nondeterministic run to run. Re-run with `torch.use_deterministic_algorithms(True)` "
                    "(arm knob `deterministic=on`) to find it.", evidence)


def _rerun(c: Comparison, d: Divergence | None) -> Verdict | None:
    """The script runs one computation twice (compare._reruns) and the runs differ: each drew
    random numbers of its own, and nothing else differs between them."""
    if d is None or d.how != "rerun":
        return None
    (run, first), (_, later) = c.resolve(d.a), c.resolve(d.b)
    draws = [leaf for leaf in run.leaves if leaf.get("kind") == "random"
             and leaf.get("call_line") in (first.call_line, later.call_line)]
    shuffled = next((leaf for leaf in draws if leaf.get("op") == "randperm"), None)
    top = shuffled or draws[0]
    how = (" — a `DataLoader(shuffle=True)` draws a new order of the data for every pass" if shuffled else "")
    ops = ", ".join(sorted({f"`aten.{x.get('op')}` (line {x.get('line')})" for x in draws})[:4])
    return _verdict("nondeterministic", True, policy.GENERAL, ["random", "reproducibility"],
                    f"The script runs the same computation twice — the calls at lines {first.call_line} and "
                    f"{later.call_line} — from the same inputs and weights, and {first.shown} (line {first.line}) "
                    f"differs between them ({d.a.summary} vs {d.b.summary}): each run consumes fresh random numbers "
                    f"from the global generator, `aten.{top.get('op')}` at line {top.get('line')}{how}. A "
                    "testing-method problem, not a numerical one. Fix: seed each run identically "
                    "(`torch.manual_seed(…)` before each, or a seeded `generator=` for the DataLoader and samplers).",
                    _evidence(d) + [f"random ops drawn in both runs: {ops}",
                                    "both runs read the same leaf tensors (inputs, weights)"])


def _state_changed(run: ArmRun, first: Observable, later: Observable, name: str, moved: list[str],
                   evidence: list[str]) -> Verdict:
    """Same module, same weights, same input — but its buffers (BatchNorm's running
    statistics) were updated in between, by a call in training mode: the module's state
    changed, so the second call computes with other statistics."""
    instance = (first.module or {}).get("instance")
    between = [o for o in run.observables if first.index < o.index < later.index and o.kind == "call"
               and (o.module or {}).get("instance") == instance and (o.module or {}).get("training")]
    shown = [b for b in moved if not b.endswith("num_batches_tracked")] or moved
    buffers = ", ".join(f"`{name}.{b}`" for b in shown[:4])
    cause = (f"the training-mode call {between[0].label} at line {between[0].line} updated {buffers}"
             f" (`torch.no_grad()` does not stop that: running statistics are buffers, not gradients)"
             if between else f"{buffers} changed between the calls")
    return _verdict("nondeterministic", True, policy.GENERAL, ["reproducibility"],
                    f"`{name}` gives different outputs for the same input and weights in {first.label} (line "
                    f"{first.line}) and {later.label} (line {later.line}) because its state changed in between: "
                    f"{cause}. The module computes with other statistics, not other rounding. Fix: keep `{name}` in "
                    "`eval()` for extra forward passes, or save and restore its `state_dict()` around them.",
                    evidence + [f"buffers changed between the calls: {', '.join(moved[:8])}"]
                    + [f"training-mode call between them: {o.label} (line {o.line})" for o in between[:2]])


CAUSES = {
    "threads": "how the work is split across threads (the reduction order)",
    "mkldnn": "oneDNN's kernels, which block and accumulate differently",
    "tf32": "TF32 tensor cores, which read only 10 bits of each fp32 input's mantissa",
    "reduced_precision": "fp16/bf16 GEMMs accumulating in reduced precision",
    "cudnn_benchmark": "cuDNN's benchmark choosing a different algorithm",
    "emulate_precision_casts": "inductor keeping fp16/bf16 intermediates in fp32 where eager rounds at every cast",
    "fallback_random": "inductor's own random number generator, which draws other numbers than eager's",
    "deterministic": "a nondeterministic kernel",
}


def _agree_text(a: Ablation) -> str:
    return "agree bitwise" if a.outcome == "agree-bitwise" else f"agree within tolerance ({a.detail})"


def _ablated(c: Comparison, d: Divergence | None, agree: list[Ablation]) -> Verdict | None:
    """A switch under which the divergence disappears names its cause (and an ill-conditioned
    input, where there is one, says why that switch matters this much)."""
    if d is None or not agree:
        return None
    conditioned = _ill_conditioning(c, d) if not d.within_tolerance else None
    why_big = f" It matters this much because the value depends on {conditioned}." if conditioned else ""
    a = agree[0]
    knob = a.switch.partition("=")[0]
    section = next(s for s in vars(policy).values() if isinstance(s, policy.Section) and s.title == a.section)
    labels = {"tf32": ["numerical", "tf32"], "fallback_random": ["random", "compile"],
              "deterministic": ["reproducibility", "review"]}.get(knob, ["numerical"])
    others = ", ".join(f"`{x.switch}`" for x in agree[1:])
    size = (f" (max |diff| {d.max_abs_diff:.3g}{', within ' + d.dtype + ' tolerance' if d.within_tolerance else ''})"
            if d.max_abs_diff is not None else "")
    on = ("on both arms, which then are one configuration: the arms differ only in this setting"
          if len(a.arms) == 2 and a.arms[0] == a.arms[1] else "on " + ", ".join(f"`{s}`" for s in a.arms))
    return _verdict(a.supports, True if a.supports == "expected-precision-mode" or knob == "fallback_random" else None,
                    section, labels,
                    f"{_where(d)} differs between {_pair(d)}{size}. With `{a.switch}` {on} — the sides "
                    f"{_agree_text(a)}{' (so do they under ' + others + ')' if others else ''}. The difference comes from "
                    f"{CAUSES.get(knob, knob)}; PyTorch does not promise bitwise-identical results across such "
                    f"settings.{why_big} To get the same numbers, set `{a.setting}`.",
                    _evidence(d) + [f"ablation `{x.switch}` ({', '.join(x.arms)}): {x.outcome}, {x.detail}" for x in agree])


def _unseeded_runs(completed: list[ArmRun], source: str) -> Verdict | None:
    """The script seeds some runs of a random computation and not others (the article's
    'two seeded runs agree; an unseeded run does not'): one random site is drawn several
    times, some draws reproduced exactly by reseeding, another from a different generator
    state. The top-level call that made the odd draw is the unseeded run."""
    for run in completed:
        sites: dict[tuple, list[dict[str, Any]]] = {}
        for leaf in run.leaves:
            if leaf.get("kind") == "random" and leaf.get("seed") is not None:
                sites.setdefault(_site(leaf), []).append(leaf)
        for leaves in sites.values():
            states = [_state(x) for x in leaves]
            usual_state = max(set(states), key=states.count)
            if states.count(usual_state) < 2 or len(set(states)) < 2:
                continue
            usual = [x for x in leaves if _state(x) == usual_state]
            odd = [x for x in leaves if _state(x) != usual_state]
            leaf, seed_at = odd[0], usual[0]["seed"]
            where = (f"`torch.manual_seed({seed_at['value']})` at line {seed_at['line']}" if seed_at.get("line")
                     else "the start of the script")
            state = leaf["seed"]
            drift = (f"{state['draws'] - seed_at['draws']} random ops later than that" if state.get("line") == seed_at.get("line")
                     else f"from the generator as {'line ' + str(state['line']) if state.get('line') else 'triage'} seeded it")
            seeded_calls = sorted({x.get("call_line") for x in usual if x.get("call_line")})
            odd_calls = sorted({x.get("call_line") for x in odd if x.get("call_line")})
            code = _code_at(source, odd_calls[0]) if odd_calls else ""
            printed = _printed_mix(run, {x["index"] for x in usual}, {x["index"] for x in odd})
            return _verdict(
                "nondeterministic", True, policy.GENERAL, ["reproducibility", "random"],
                f"The script reseeds to reproduce a random computation, and one run is not reseeded. "
                f"`aten.{leaf['op']}` (line {leaf['line']}) is drawn for the calls at line"
                f"{'s' if len(seeded_calls) > 1 else ''} {', '.join(map(str, seeded_calls)) or '?'} right after {where} "
                f"— identical draws — but for the call at line {', '.join(map(str, odd_calls)) or '?'}{code} {drift}: that "
                f"run is not seeded, so its results differ from the seeded runs'{printed}. Fix: call "
                "`torch.manual_seed(…)` before every run that must reproduce (or pass a `torch.Generator`).",
                [f"`aten.{x['op']}` line {x['line']}, top-level line {x.get('call_line')}: {x['seed'].get('draws')} "
                 f"draws after seed {x['seed'].get('value')} (line {x['seed'].get('line')})" for x in (usual[0], leaf)])
    return None


def _code_at(source: str, line: int) -> str:
    lines = source.splitlines()
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return f" (`{text}`)" if text and len(text) <= 120 else ""


def _site(leaf: dict[str, Any]) -> tuple:
    return leaf.get("op"), leaf.get("line"), tuple((leaf.get("fingerprint") or {}).get("shape") or ())


def _printed_mix(run: ArmRun, usual: set[int], odd: set[int]) -> str:
    """A value the script prints that depends on both kinds of draw, when ancestry shows one."""
    for o in run.observables:
        if o.kind in ("readback", "claim") and set(o.ancestors) & usual and set(o.ancestors) & odd:
            return f" ({o.shown} at line {o.line} compares the two)"
    return ""


def _state(leaf: dict[str, Any]) -> tuple:
    seed = leaf.get("seed") or {}
    return seed.get("line"), seed.get("value"), seed.get("draws")


def _exact_equality(completed: list[ArmRun], source: str) -> Verdict | None:
    """The script's failing check compares a computed float with a literal using == (or !=):
    `assert cdf[-1].item() == 1.0`. Where the float64 replay of the value reaches the literal
    within the value's own rounding spread, and the value is inside that spread, the literal is
    the exact answer and the check fails by rounding alone: no computation in floating point
    promises to land on it."""
    from triage.judge import judge_observable

    for run in completed:
        e = run.exception or {}
        if not e.get("claim") or e.get("line") is None:
            continue
        for text, literal, equal in equality_checks(source, int(e["line"])):
            o = next((o for o in run.observables if o.line == e["line"] and o.name == f"`{text}`"
                      and o.value is not None and np.asarray(o.value).size == 1), None)
            if o is None:
                continue
            j = judge_observable(run, o)
            if j.status != "judged" or j.zone not in ("inside", "envelope") or j.reference is None:
                continue
            value = float(np.asarray(o.value, dtype=np.float64).reshape(-1)[0])
            sigma = j.sigma or 0.0
            reach = policy.FRAGILE_MARGIN * sigma + policy.unit_roundoff(j.dtype) * abs(literal)
            if (value == literal) == equal or abs(literal - j.reference) > reach:
                continue
            op = "==" if equal else "!="
            ulps = abs(value - literal) / float(ulp(np.float64(literal), j.dtype)) if literal else math.inf
            return _verdict(
                "expected-rounding", True, policy.GENERAL, ["numerical"],
                f"The script's own check fails on `{run.spec}` at line {e['line']}: it compares `{text}` with the "
                f"literal {literal!r} using `{op}`. The value is {value!r} ({j.dtype}), {ulps:.3g} ulp from "
                f"{literal!r}; the float64 replay of the same computation gives {j.reference:.10g}, and the value is "
                f"inside its own rounding spread (±{sigma:.2g}, p = {j.p or 0:.2f}). {literal!r} is the exact answer and "
                f"{j.dtype} rounding lands next to it: floating-point results are not promised to equal it "
                f"exactly. Compare with a tolerance (`math.isclose(x, {literal!r}, rel_tol=...)`, `torch.isclose`), "
                "or where the exact value matters, set it (normalize by the computed total, clamp).",
                [f"`{run.spec}` {o.shown} (line {o.line}): {value!r}; float64 replay: {j.reference!r}; rounding spread "
                 f"±{sigma:.3g} at {j.dtype} ({j.samples} samples)", f"the check: `{text} {op} {literal!r}`"])
    return None


def equality_checks(source: str, line: int) -> list[tuple[str, float, bool]]:
    """(expression, literal, True for ==) of each `expr == number` / `expr != number` on `line`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or node.lineno != line or len(node.ops) != 1:
            continue
        if not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            continue
        left, right = node.left, node.comparators[0]
        for expr, other in ((left, right), (right, left)):
            literal = _number(other)
            text = ast.get_source_segment(source, expr)
            if literal is not None and text and _number(expr) is None:
                out.append((text, literal, isinstance(node.ops[0], ast.Eq)))
    return out


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _not_reproduced(c: Comparison, completed: list[ArmRun]) -> Verdict:
    n = sum(len(r.observables) for r in completed)
    if n == 0:
        return _verdict("not-reproduced", None, policy.NONE, ["repro"],
                        "The script ran on every arm but never produced a tensor triage could observe "
                        "(no module output, no printed or compared tensor): there is nothing numerical to compare.")
    singular = [x for x in c.conditioning if x.get("singular") and "figure" not in x]
    nonfinite_ok = [(r, o) for r in completed for o in r.observables
                    if o.fingerprint and (o.fingerprint.get("nan") or o.fingerprint.get("posinf") or o.fingerprint.get("neginf"))
                    and set(o.conditioning) and any(r.conditioning[i].get("singular") for i in o.conditioning)]
    if len(completed) == 1 and singular and nonfinite_ok:
        run, o = nonfinite_ok[0]
        note = singular[0]
        return _verdict("expected-ill-conditioned", True, policy.LINALG, ["numerical", "linalg"],
                        f"Only `{run.spec}` could run here. Its {o.shown} (line {o.line}) is {summarize(o.fingerprint)}, which agrees "
                        f"with the float64 reference: the matrix fed to `{note['op']}` at line {note['line']} is singular "
                        f"({_cond_text(note)}). A finite value from another device is rounding noise.",
                        [_cond_text(note, full=True)])
    same = _identical_copies(completed[0])
    if len(completed) == 1:
        return _verdict("not-reproduced", None, policy.GENERAL, ["repro"],
                        f"Only `{completed[0].spec}` ran. Every one of its {n} observed values agrees with the float64 "
                        f"reference and no comparison the script makes fails: nothing diverges here.{same}")
    checks = [r for r in completed if r.exception and r.exception.get("claim")]
    if not checks:
        return _verdict("not-reproduced", None, policy.GENERAL, ["repro"],
                        f"The arms agree bitwise on all {c.aligned} aligned observables and every comparison the "
                        "script makes holds: the reported divergence does not reproduce here.")
    # The script's own check failed although the arms agree: it checks something true of
    # neither arm's values (often the reported wrong result itself, `assert torch.isinf(out)`).
    which = "every arm" if len(checks) == len(completed) else ", ".join(f"`{r.spec}`" for r in checks)
    return _verdict("not-reproduced", None, policy.GENERAL, ["repro"],
                    f"The arms agree bitwise on all {c.aligned} aligned observables, but the script's own check "
                    f"fails on {which} ({_check_note(checks[0])}): what it asserts holds for neither arm's values here. "
                    "Where it asserts the reported wrong result, the reported divergence does not reproduce here.")


def _check_note(run: ArmRun) -> str:
    e = run.exception or {}
    return run.exit_note or f"{e.get('type')} at line {e.get('line')}"


def _identical_copies(run: ArmRun) -> str:
    """Two of the script's named tensors holding the same bits (weights before and after a
    device move): said outright, because that is usually what the reporter doubted."""
    groups: dict[tuple, list[Observable]] = {}
    for o in run.observables:
        fp = o.fingerprint or {}
        if o.kind == "final" and fp.get("numel", 0) > 1 and fp.get("sha256"):
            groups.setdefault((tuple(fp.get("shape") or ()), fp.get("dtype"), fp["sha256"]), []).append(o)
    for (shape, dtype, _), same in groups.items():
        if len(same) >= 2:
            names = " and ".join(o.label.replace(" at exit", "") for o in same[:3])
            moved = any(k in o.label.lower() for o in same for k in ("gpu", "cuda", "device"))
            why = ": moving a tensor between devices copies its bits exactly" if moved else ""
            return f" {names} are bit-identical ({'×'.join(map(str, shape))} {dtype}){why}."
    return ""


def _nonfinite_flip(c: Comparison, d: Divergence) -> Verdict:
    sides = [s for s in (d.a, d.b) if s is not None]
    wrong = [s for s in sides if s.agrees_with_reference is False and s.nonfinite_vs_reference]
    right = [s for s in sides if s.agrees_with_reference]
    singular = _singular_upstream(c, d)
    evidence = _evidence(d)
    who = _who_is_right(d, right, wrong)
    overflowed = [s for s in sides if s.overflow_to_inf and s.overflow_to_inf == s.nonfinite_vs_reference]
    if overflowed and not wrong:
        s = overflowed[0]
        return _verdict("nonfinite-flip", True, policy.EXTREMAL, ["nonfinite", "numerical"],
                        f"{who} The float64 value ({s.reference_summary}) lies beyond the largest finite {s.dtype}, "
                        f"so `inf` is the correctly rounded {s.dtype} answer: expected range overflow, not a bug.",
                        evidence)
    if singular and "figure" in singular:
        section = policy.EXTREMAL if "overflow" in singular["kind"] else policy.GENERAL
        return _verdict("nonfinite-flip", True, section, ["nonfinite", "numerical"],
                        f"{who} At `aten.{singular['op']}` (line {singular['line']}) {singular['figure']}, so a "
                        "non-finite value on one side is the input's doing, not a kernel's.",
                        evidence + [_cond_text(singular, full=True)])
    if singular:
        return _verdict("nonfinite-flip", True, policy.LINALG, ["nonfinite", "linalg"],
                        f"{who} The matrix fed to `{singular['op']}` at line {singular['line']} is singular "
                        f"({_cond_text(singular)}), so the exact answer is not finite and any finite value is rounding noise.",
                        evidence + [_cond_text(singular, full=True)])
    if not wrong and not right:
        return _verdict("nonfinite-flip", None, policy.NONE, ["nonfinite", "review"],
                        f"{_where(d)} is non-finite on one side only, and there is no float64 reference to say which "
                        "side is right.", evidence)
    return _verdict("nonfinite-flip", False, policy.NONE, ["nonfinite", "silent", "review"],
                    f"{who} The input is well-conditioned and within range, so the accuracy note does not "
                    "cover this: likely a bug.", evidence + _hazards(c, d))


def _rounding(d: Divergence) -> Verdict:
    if d.bit_difference == "signed-zero":
        return _verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                        f"{_where(d)}: {_pair(d)} hold equal values that differ only in the sign of a zero "
                        f"({d.a.summary} vs {d.b.summary}). IEEE 754 defines -0 == +0; which sign a computation "
                        "ends with depends on the order of its operations, which the accuracy note does not fix.",
                        _evidence(d))
    if d.bit_difference == "nan-bits":
        return _verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                        f"{_where(d)}: {_pair(d)} hold the same values with NaN in the same places; only the bits "
                        "of those NaNs (sign or payload) differ, which no comparison can observe.", _evidence(d))
    how = (f"within {d.dtype} tolerance (rtol={d.rtol:g}, atol={d.atol:g}; max |diff| {d.max_abs_diff:.3g})"
           if d.within_tolerance else f"by dynamo's float64 rule ({d.fp64_rule})")
    return _verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                    f"{_where(d)} differs between {_pair(d)} {how}. Both are about equally close to the float64 "
                    "value: ordinary floating-point rounding, which the accuracy note does not guarantee bitwise.",
                    _evidence(d))


def _likely_bug(d: Divergence) -> Verdict:
    sides = [s for s in (d.a, d.b) if s is not None]
    far = [s for s in sides if s.agrees_with_reference is False]
    near = [s for s in sides if s.agrees_with_reference]
    if far and near:
        what = (f"`{far[0].arm}` {far[0].label} is far from the float64 value (max rel. error "
                f"{_fmt(far[0].max_rel_error)}) while `{near[0].arm}` {near[0].label} agrees with it")
    elif far:
        what = f"`{far[0].arm}` {far[0].label} is far from the float64 value (max rel. error {_fmt(far[0].max_rel_error)})"
    else:
        what = f"{_pair(d)} differ beyond tolerance"
    return _verdict("likely-bug", False, policy.NONE, ["silent", "review"],
                    f"{_where(d)}: {what}. The input is well-conditioned and in range, so neither rounding nor an "
                    "ill-conditioned input explains it.", _evidence(d))


# -- helpers ------------------------------------------------------------------------------
def _notes_upstream(c: Comparison, d: Divergence) -> list[dict[str, Any]]:
    """The conditioning notes of the ops each side's value depends on, tagged with the arm."""
    notes = []
    for s in (d.a, d.b):
        found = c.find(s)
        if found is None:
            continue
        run, o = found
        notes += [dict(run.conditioning[i], arm=run.spec) for i in o.conditioning if i < len(run.conditioning)]
    return notes


def _singular_upstream(c: Comparison, d: Divergence) -> dict[str, Any] | None:
    # A singular matrix explains more than a cancelling sum does; both more than nothing.
    ranked = sorted(_notes_upstream(c, d), key=lambda n: (not n.get("singular"), "figure" in n))
    return next((n for n in ranked if n.get("singular") or n.get("ill_conditioned")), None)


def _matrix_upstream(c: Comparison, d: Divergence) -> bool:
    return any((n.get("singular") or n.get("ill_conditioned")) and
               ("figure" not in n or str(n.get("kind", "")).startswith("close-")) for n in _notes_upstream(c, d))


def _hazards(c: Comparison, d: Divergence) -> list[str]:
    """Hazards upstream that do not make the input ill-conditioned but point at how an
    implementation can fail on it (acosh's x² overflowing in the textbook formula)."""
    out: list[str] = []
    for note in _notes_upstream(c, d):
        text = _cond_text(note, full=True) if "figure" in note and not note.get("ill_conditioned") else None
        if text and text not in out:
            out.append(text)
    return out[:3]


def _ill_conditioning(c: Comparison, d: Divergence) -> str | None:
    note = _singular_upstream(c, d)
    if note and "figure" in note:
        return f"`aten.{note['op']}` at line {note['line']}, where {note['figure']}"
    if note:
        return f"`{note['op']}` of a matrix with {_cond_text(note)} (line {note['line']})"
    over = [s for s in (d.a, d.b) if s is not None and s.overflow_to_inf]
    if over:
        return f"a value beyond the {over[0].dtype} range ({over[0].reference_summary} in float64)"
    return None


def _cond_text(note: dict[str, Any], full: bool = False) -> str:
    if "figure" in note:
        text = note["figure"]
        return (f"{note['kind']} at `aten.{note['op']}` ({'×'.join(map(str, note['shape']))} {note['dtype']}, "
                f"line {note['line']}, arm {note.get('arm', '?')}): {text}") if full else text
    parts = []
    if note.get("exact_singular"):
        parts.append("determinant exactly 0 in rational arithmetic")
    if note.get("rank") is not None:
        parts.append(f"rank {note['rank']} of {note['order']}")
    if note.get("cond") is not None:
        parts.append(f"cond = {note['cond']:.3g}")
    for side, whose in (("kernel", "the arm's kernel"), ("float64", "the float64 replay's kernel")):
        if note.get(f"{side}_disagrees") is True:
            parts.append(f"{whose} {_num(note.get(f'{side}_error'), 2)} off the exact answer ({note.get('independent')}), "
                         f"beyond the {_num(note.get(f'{side}_bound'), 2)} a correct one reaches"
                         + ("; the reference continues from the exact answer" if side == "float64" else ""))
    text = ", ".join(parts)
    if full:
        text = (f"conditioning of `{note['op']}` input ({'×'.join(map(str, note['shape']))} {note['dtype']}, "
                f"line {note['line']}, arm {note.get('arm', '?')}): {text}")
    return text


def _who_is_right(d: Divergence, right: list[Side], wrong: list[Side]) -> str:
    if d.b is None:
        s = d.a
        return (f"{_where(d)}: `{s.arm}` gives {s.summary}, the float64 reference {s.reference_summary}.")
    text = f"{_where(d)}: `{d.a.arm}` {d.a.label} gives {d.a.summary}, `{d.b.arm}` {d.b.label} gives {d.b.summary}."
    if right and wrong:
        text += f" The float64 reference ({right[0].reference_summary}) agrees with `{right[0].arm}` {right[0].label}."
    elif wrong and len(wrong) == 2:
        text += f" Neither matches the float64 reference ({wrong[0].reference_summary})."
    return text


def _where(d: Divergence) -> str:
    line = f" (line {d.line})" if d.line else ""
    what = {"arms": " between arms", "claim": " in the script's own comparison", "reference": ""}[d.source]
    return f"{d.observable_label}{line}{what}"


def _pair(d: Divergence) -> str:
    if d.b is None:
        return f"`{d.a.arm}` and float64"
    if d.a.arm == d.b.arm:
        return f"{d.a.label} and {d.b.label} (arm `{d.a.arm}`)"
    return f"`{d.a.arm}` and `{d.b.arm}`"


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.3g}"


def _evidence(d: Divergence, sides: bool = True) -> list[str]:
    """The float64 figures of each side (unless a judgement line already gives them) and the
    difference between the sides."""
    out = []
    for s in (d.a, d.b) if sides else ():
        if s is None:
            continue
        err = "" if s.max_abs_error is None else (f"; vs float64: max abs {s.max_abs_error:.3g}, max rel "
                                                   f"{_fmt(s.max_rel_error)}, {_fmt(s.max_ulps)} ulp")
        nf = f"; {s.nonfinite_vs_reference} element(s) non-finite where float64 is not, or vice versa" if s.nonfinite_vs_reference else ""
        out.append(f"`{s.arm}` {s.label} (line {s.line}): {s.summary}; float64: {s.reference_summary or 'unavailable'}{err}{nf}")
    if d.b is not None and d.max_abs_diff is not None:
        out.append(f"max |difference| between the sides over elements finite on both: {d.max_abs_diff:.3g} "
                   f"({d.dtype} tolerance rtol={d.rtol:g}, atol={d.atol:g})")
    if d.fp64_rule:
        out.append(f"dynamo float64 rule: {d.fp64_rule}")
    return out
