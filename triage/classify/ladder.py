"""Stage 5, which rung holds: Comparison + Ablations (+ the reported arm) → Verdict.

The first rung that holds wins; each verdict names the section of PyTorch's numerical accuracy
note it rests on and suggests labels (never ``high priority``, never a close). A rung decides
from the comparison's facts (`facts.py`) and has its sentences written by `wording.py`; the
verdict is then audited against the raw evidence (triage/audit.py).
"""
from __future__ import annotations

import ast
import dataclasses
import math
import re
from typing import Any, NamedTuple

import numpy as np

from triage import policy
from triage.audit import Evidence, audit, inconclusive
from triage.classify.facts import (
    COMPILED_NOTHING,
    assigned_at,
    cancellation_sites,
    compiled_nothing,
    equality_checks,
    flush_notes,
    holds,
    lacks_device,
    length_checks,
    masks,
    matrix_upstream,
    names_at,
    nonfinite_side,
    notes_upstream,
    precision_of,
    range_note,
    recorded_operand,
    reduced_counts,
    reduced_matmul_notes,
    singular_upstream,
    site_key,
    state_key,
    threshold_checks,
    written_sites,
)
from triage.classify.wording import (
    CAUSES,
    SETTING_NAMES,
    agree_text,
    atol_hides,
    cancellation_hint,
    cancellation_site,
    check_note,
    code_at,
    computed_at,
    cond_text,
    conditioning_caveat,
    device_disagreement,
    difference_shape,
    difference_text,
    digits_text,
    evidence_lines,
    hazards,
    identical_copies,
    ill_conditioning,
    make_verdict,
    ops_text,
    pair_text,
    parting_text,
    posted_text,
    printed_mix,
    releases_sentence,
    rounding_cause,
    short_figure,
    stopped_sentence,
    unmeasured_lines,
    unstable_lines,
    where_text,
    who_is_right,
    wraparound_sentence,
    wrong_kernel_text,
)
from triage.compare import side_of, summarize, unrecorded_inputs
from triage.judge.decide import FINITE_UNDER_SOME
from triage.model import (
    AGREEING_OUTCOMES,
    Ablation,
    ArmRun,
    Comparison,
    Divergence,
    Judgement,
    Observable,
    ReportedArm,
    Repro,
    Side,
    Verdict,
    compared_runs,
)
from triage.numerics.constants import NAMED_CONSTANTS, NEAR_NAMED
from triage.numerics.errors import ulp
from triage.numerics.literals import held_in
from triage.paths import STEP_VERBS
from triage.reported import reported_judgement, reported_lines
from triage.worker.claims import BLOCKS, callee, equated_pairs

# A fingerprint's counts of non-finite elements.
NONFINITE_COUNTS = ("nan", "posinf", "neginf")
KINDS = ("could-not-run", "crash-one-arm", "nondeterministic", "not-reproduced", "nonfinite-flip",
         "expected-rounding", "expected-precision-mode", "expected-ill-conditioned", "likely-bug", "inconclusive")


def classify(repro: Repro, comparison: Comparison | None, ablations: list[Ablation] | None = None,
             replay: dict[str, Any] | None = None, reported: ReportedArm | None = None) -> Verdict:
    """The ladder's verdict with everything it rests on, then audited against the raw
    evidence (triage/audit.py): a verdict that conflicts with it becomes `inconclusive`.
    `replay`: the minimizer's replay of the recorded op graph on the two arms, if it ran;
    `reported`: the reporter's posted values, judged (they stand in for an arm not run here)."""
    ablations = ablations or []
    verdict = _ladder(repro, comparison, ablations, reported)
    upcast = [f"with `aten.{a.switch.partition('=')[2]}` alone computed in float64 on both arms the divergence "
              f"disappears ({a.detail}): it starts in that op's {precision_of(comparison)} arithmetic"
              for a in ablations if a.supports == "evidence" and a.outcome in AGREEING_OUTCOMES]
    bound = (threshold_by_rounding(comparison.arms, repro.source) or _difference_bound(comparison, repro.source)) \
        if comparison is not None and verdict.kind.startswith("expected-") else ""
    verdict = dataclasses.replace(verdict, evidence=verdict.evidence + upcast,
                                  summary=verdict.summary + bound + stopped_sentence(comparison)
                                  + releases_sentence(comparison))
    conflicts = audit(verdict, Evidence(comparison, replay)) if comparison is not None else []
    return inconclusive(verdict, conflicts) if conflicts else verdict


def _ladder(repro: Repro, comparison: Comparison | None, ablations: list[Ablation],
            reported: ReportedArm | None = None) -> Verdict:
    if repro.problem is not None or comparison is None:
        return make_verdict("could-not-run", None, policy.NONE, ["repro"],
                        f"triage could not run the script: {repro.problem}.")
    missing = [m for r in comparison.arms if (m := _not_run_as_asked(r)) is not None]
    missed = {m.spec for m in missing}
    runs = [r for r in comparison.arms if r.spec not in missed]
    if not runs:
        why = "; ".join(f"{r.spec}: {r.failure}" for r in missing)
        return make_verdict("could-not-run", None, policy.NONE, ["repro"], f"No arm could run on this machine ({why}).")
    partial = _with_reduced_matmul_named(comparison, _with_flush_named(
        comparison, _ladder_of_runs(repro, comparison, ablations, runs)))
    judged = _with_reported(partial, reported) if reported is not None else None
    if judged is not None:
        return dataclasses.replace(judged, summary=judged.summary + device_disagreement(reported))
    verdict = _not_tested(missing, runs, partial) if missing else partial
    return dataclasses.replace(verdict, evidence=verdict.evidence + reported_lines(reported)) if reported else verdict


def _not_run_as_asked(r: ArmRun) -> ArmRun | None:
    """The arm, its failure saying why, where it did not run as its spec asks here: unavailable,
    a GPU arm whose script addressed a device this machine lacks, or a compile arm that compiled
    nothing; None for an arm that did."""
    if r.status == "unavailable":
        return r
    if compiled_nothing(r):
        return dataclasses.replace(r, failure=COMPILED_NOTHING)
    if lacks_device(r):
        return dataclasses.replace(r, failure=f"{r.failure}{LACKS_DEVICE}")
    return None


def _with_flush_named(c: Comparison, verdict: Verdict) -> Verdict:
    """An expected verdict of a script that turned on flush-to-zero names that setting: the
    replay flushed as the arm did, so zeros where float64 has tiny values are the mode the
    script chose, not rounding's doing."""
    notes = flush_notes(c)
    if not notes or verdict.expected is not True:
        return verdict
    note = notes[0]
    named = (f"The script turns on flush-to-zero at line {note['line']} (`torch.set_flush_denormal(True)`): the "
             "CPU's results below the smallest normal value become 0 there, which the simulation did too")
    evidence = verdict.evidence + [cond_text(note, full=True)]
    d = c.divergence
    sides = [s for s in (d.a, d.b) if s is not None] if d is not None else []
    beyond = any(s.agrees_with_reference is False for s in sides)
    if verdict.kind == "expected-rounding" and (beyond or _flushed_zeros(c, sides)):
        # Rounding that keeps its digits does not move a value beyond tolerance of float64, nor
        # make a zero of a subnormal: the flushed zeros did, and the script asked for them.
        where = ("beyond tolerance of its float64 value but inside the spread of its own computation replayed with "
                 "flush-to-zero" if beyond else "with zeros where its float64 value is below the smallest normal "
                 f"{d.dtype}, inside the spread of its own computation replayed with flush-to-zero")
        return make_verdict("expected-precision-mode", True, policy.GENERAL, ["numerical"],
                            f"{where_text(d)} {difference_text(d)}, {where}. {named}: PyTorch's float64 reference "
                            "keeps those tiny values, the arm zeros them, as the script asked.",
                            evidence)
    return dataclasses.replace(verdict, summary=f"{verdict.summary} {named}.", evidence=evidence)


def _with_reduced_matmul_named(c: Comparison, verdict: Verdict) -> Verdict:
    """An expected verdict of a script whose CPU matmuls oneDNN computed from bfloat16 inputs
    (`torch.set_float32_matmul_precision("medium")` on a CPU with bfloat16 arithmetic) names
    that setting: the replay read those inputs as bfloat16 too, so a value beyond tolerance of
    float64 but inside that spread is the precision the script chose, not rounding of float32
    arithmetic (the note's TF32 section covers the same trade on CUDA)."""
    notes = reduced_matmul_notes(c)
    if not notes or verdict.expected is not True or verdict.kind == "expected-precision-mode":
        return verdict
    note = notes[0]
    where = f" (the first at line {note['line']})" if note.get("line") else ""
    named = (f"The script's float32 matmul precision has oneDNN compute `{note['op']}` and the other float32 matmuls "
             f"of `{note['arm']}`{where} from bfloat16 inputs (8-bit significands) on this CPU, which the simulation "
             "did too")
    evidence = verdict.evidence + [cond_text(note, full=True)]
    d = c.divergence
    sides = [s for s in (d.a, d.b) if s is not None] if d is not None else []
    if verdict.kind == "expected-rounding" and any(s.agrees_with_reference is False for s in sides):
        return make_verdict("expected-precision-mode", True, policy.GENERAL, ["numerical"],
                            f"{where_text(d)} {difference_text(d)}, beyond tolerance of its float64 value but inside "
                            f"the spread of its own computation replayed with bfloat16 matmul inputs. {named}: "
                            "`torch.set_float32_matmul_precision('highest')` keeps float32's.",
                            evidence)
    return dataclasses.replace(verdict, summary=f"{verdict.summary} {named}.", evidence=evidence)


def _flushed_zeros(c: Comparison, sides: list[Side]) -> bool:
    """A side holds 0 where its float64 value is a nonzero below its dtype's smallest normal
    value: what flush-to-zero makes of a subnormal result, and no rounding does."""
    for s in sides:
        found = c.find(s)
        o = found[1] if found else None
        if o is None or o.value is None or o.reference_value is None or np.iscomplexobj(o.value):
            continue
        v, r = np.asarray(o.value, np.float64), np.asarray(o.reference_value, np.float64)
        if v.shape == r.shape and bool(((v == 0) & (r != 0) & (np.abs(r) < policy.MIN_NORMAL.get(s.dtype, 0.0))).any()):
            return True
    return False


LACKS_DEVICE = (" — the script addresses a CUDA device this machine does not have (a device index past its GPUs, "
                "or a CUDA_VISIBLE_DEVICES the script sets)")


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
        return make_verdict("nondeterministic", True, policy.GENERAL, ["reproducibility", "gpu_confirmation"],
                        basis + f"{posted_text(v)} is outside every rounding of this computation on their GPU as modelled "
                        f"here ({reported_judgement(v.judgement)}), and the computation goes through {ops}, whose CUDA "
                        "kernels add or write in an order the hardware picks (with repeated indices the result "
                        "changes from run to run): a testing-method problem, not a numerical one. To tell, run it "
                        "on their GPU twice, and with `torch.use_deterministic_algorithms(True)`.", evidence)
    if on_gpu:
        v = on_gpu[0]
        # inf/nan on their side only, where no rounding gives it: the ladder's non-finite rung, not expected.
        kind = "nonfinite-flip" if v.nonfinite_flip else "likely-bug"
        labels = (["nonfinite"] if v.nonfinite_flip else []) + ["silent", "review", "gpu_confirmation"]
        return make_verdict(kind, False, policy.NONE, labels,
                        basis + f"{posted_text(v)} is outside every rounding of this computation on their GPU as "
                        f"modelled here ({reported_judgement(v.judgement)}). Unless their build or settings differ "
                        "from the script's, their GPU computed something else; confirm it there: "
                        "`triage run repro.py --arms cpu,cuda`.", evidence)
    if outside and here.kind != "likely-bug":
        v = outside[0]
        release = (f"their torch {reported.torch}, here {reported.here_torch or 'this release'}" if reported.torch
                   else "their collect_env is not in the report")
        return make_verdict("not-reproduced", None, policy.NONE, ["repro"],
                        basis + f"{posted_text(v)} is outside every rounding of this computation "
                        f"({reported_judgement(v.judgement)}), but the CPU here computes it inside its spread: the "
                        f"difference does not reproduce on this release and build ({release}); it was fixed since, "
                        "or comes from their build. " + here.summary, evidence)
    if here.kind == "likely-bug" or not differ:
        why = ("the posted values are inside their spread, but the run here is not" if here.kind == "likely-bug"
               else "the posted values are the ones printed here")
        return dataclasses.replace(here, summary=basis + why + ". " + here.summary, evidence=evidence)
    v = differ[0]
    device = {"cuda": "GPU", "cpu": "CPU"}.get(v.device or reported.device, "machine")
    inside = (f"{posted_text(v)} is inside the rounding spread of this computation on their {device} as modelled here"
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
            return make_verdict("expected-ill-conditioned", True, policy.GENERAL, ["numerical"],
                            basis + inside + f"The computation itself keeps few digits of {wide[0].label} "
                            f"({reported_judgement(wide[0].judgement)}): another device's rounding moves it that far.",
                            evidence)
        return make_verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                        basis + inside + "It differs from the value printed here only as another device's rounding "
                        "of the same computation does, which the accuracy note does not guarantee bitwise.", evidence)
    return dataclasses.replace(here, summary=basis + inside + here.summary, evidence=evidence)


def _not_tested(missing: list[ArmRun], ran: list[ArmRun], partial: Verdict) -> Verdict:
    """A requested arm that could not run here: the comparison asked for was not made, which
    is never a reproduction, a pass or a verdict on the numbers."""
    lines = [f"`{r.spec}`: {r.failure}" for r in missing]
    asked = ",".join(r.spec for r in ran + missing)
    if all(compiled_nothing(r) for r in missing):
        why = (f"which did not compile anything ({'; '.join(lines)}). Compile the model or function in the script "
               "(`torch.compile(model)`): the compile arm compiles what the script compiles")
    else:
        why = (f"which this machine cannot run ({'; '.join(lines)}). On a machine that has it, run "
               f"`triage run repro.py --arms {asked}`")
    return make_verdict("could-not-run", None, policy.NONE, ["repro"],
                    f"Not tested here: the comparison asked for needs {', '.join(f'`{r.spec}`' for r in missing)}, "
                    f"{why}. What did run: {', '.join(f'`{r.spec}`' for r in ran)} — "
                    f"{partial.kind}: {partial.summary}", lines + partial.evidence)


def _ladder_of_runs(repro: Repro, comparison: Comparison, ablations: list[Ablation], runs: list[ArmRun]) -> Verdict:
    completed = compared_runs(runs)
    failed = [r for r in runs if r not in completed]
    if not completed:
        return _length_by_rounding(failed, repro.source) or _could_not_run(failed)
    if failed:
        return _crash_one_arm(completed, failed)
    d = comparison.divergence
    agree = [a for a in ablations if a.explains]
    # Randomness is not rounding: a switch that makes the draws agree explains a divergence
    # whatever the judge would say of the values.
    random_agree = [a for a in agree if a.supports == "nondeterministic"]
    drawn = _nondeterministic(comparison, d)
    if drawn is not None and d is not None and d.distinct_draws:
        # Two operands drawn separately, where the script reseeds some runs and not another:
        # the unseeded run is the cause to name.
        drawn = _unseeded_runs(completed, repro.source) or drawn
    rung = (_repeated_call(comparison, d, agree, repro.source) or _carried(comparison, d) or _rerun(comparison, d) or drawn
            or _ablated(comparison, d, random_agree) or _uninitialized_divergence(comparison, d))
    if rung is not None:
        return rung
    wrong = _wrong_kernel(comparison, completed)
    if wrong is not None:
        return wrong
    if d is None:
        return (_uninitialized_reads(completed) or _unseeded_runs(completed, repro.source)
                or _exact_equality(completed, repro.source) or _length_by_rounding(completed, repro.source)
                or _outside_value(completed, repro.source) or _not_reproduced(comparison, completed, repro.source))
    if d.bit_difference is not None:
        return _rounding(d)
    sides = [s for s in (d.a, d.b) if s is not None]
    if len(d.judgements) == len(sides) and all(j.status == "judged" for j in d.judgements):
        return _judged(comparison, d, agree, repro.source)
    # No simulated rounding for these values (no reference, a random compiled region, over
    # budget): the float64 figures and the per-op notes decide, and the verdict says so.
    fallback = _by_float64(comparison, d, agree)
    why = "; ".join(sorted({f"`{j.arm}` {j.label}: {j.reason}" for j in d.judgements if j.status != "judged"}))
    if why:
        fallback.evidence.append(f"not judged by simulated rounding — {why}" + (
            "" if fallback.kind == "inconclusive"
            else "; the verdict rests on the float64 reference and per-op conditioning figures instead"))
    return fallback


def _references_apart(c: Comparison, d: Divergence) -> Verdict | None:
    """Two values whose float64 values themselves differ beyond the coarser dtype's tolerance
    are not one quantity rounded twice, however close each side is to its own float64 value
    (dynamo's rule then passes: it compares each side with its own). Without a rounding spread
    triage cannot tell a different formula from one so ill-conditioned that float64 parts too,
    and says so rather than call it rounding."""
    if d.b is None:
        return None
    (_, oa), (_, ob) = c.resolve(d.a), c.resolve(d.b)
    ra, rb = oa.reference_value, ob.reference_value
    if ra is None or rb is None or np.shape(ra) != np.shape(rb):
        return None
    # A complex value is compared as `assert_close` does, by the modulus of the difference.
    held = np.complex128 if np.iscomplexobj(ra) or np.iscomplexobj(rb) else np.float64
    ra, rb = np.asarray(ra, dtype=held), np.asarray(rb, dtype=held)
    both = np.isfinite(ra) & np.isfinite(rb)
    coarser = min((d.a.dtype, d.b.dtype), key=lambda t: policy.FLOAT_FORMATS.get(t, (53, 0.0))[0])
    rtol, atol = policy.tolerance(coarser)
    gap = np.abs(ra - rb)[both]
    if not both.any() or not (gap > atol + rtol * np.abs(rb)[both]).any():
        return None
    return make_verdict("inconclusive", None, policy.NONE, ["review"],
                        f"{where_text(d)}: the float64 values of the two sides themselves differ by up to "
                        f"{float(gap.max()):.3g}, beyond {coarser} tolerance (rtol={rtol:g}, atol={atol:g}). That is "
                        "not one quantity rounded twice: one side computes a different formula, or the computation "
                        "is so ill-conditioned that float64 parts too. Without a simulated rounding spread triage "
                        "cannot tell which.", evidence_lines(d))


def _by_float64(comparison: Comparison, d: Divergence, agree: list[Ablation]) -> Verdict:
    """The ladder without simulated rounding: tolerance, dynamo's float64 rule, conditioning."""
    rung = _ablated(comparison, d, agree)
    if rung is not None:
        return rung
    if d.nonfinite_mismatch > 0:
        flip = _nonfinite_flip(comparison, d)
        return _far_unjudged(d) if d.b is None and flip.expected is False else flip
    apart = _references_apart(comparison, d)
    if apart is not None:
        return apart
    if d.b is not None and d.within_tolerance:
        return _rounding(d)
    # Ill-conditioning explains more than "both arms are equally far from float64" does.
    conditioned = ill_conditioning(comparison, d)
    if d.b is not None and not conditioned and (d.fp64_rule or "").startswith("pass"):
        return _rounding(d)
    if conditioned:
        note = singular_upstream(comparison, d) or {}
        matrix = "figure" not in note
        section = policy.LINALG if matrix else policy.EXTREMAL if range_note(note) else policy.GENERAL
        return make_verdict("expected-ill-conditioned", True, section, ["numerical"] + (["linalg"] if matrix else []),
                        f"{where_text(d)} differs beyond tolerance, but it depends on {conditioned}. "
                        "On such inputs results may vary between devices and backends.",
                        evidence_lines(d) + ([cond_text(note, full=True)] if note else []))
    if d.b is None:
        return _far_unjudged(d)
    return _likely_bug(d)


def _far_unjudged(d: Divergence) -> Verdict:
    """One arm's value far from its float64 value, where its rounding was not simulated: the
    per-op figures flag what they model (a cancellation, a singular matrix, a range), not what
    a long chain of ops accumulates at low precision, nor an input written past its dtype's
    digits. A correct fp16 LogSoftmax of inputs near -20,000 (spacing 16) was called a bug
    so when the simulation ran out of time: no claim without the spread."""
    s = d.a
    why = "; ".join(sorted({j.reason for j in d.judgements if j.status != "judged" and j.reason}))
    hint = " A larger `--rounding-budget` lets it run." if "budget" in why else ""
    far = (f"has {s.nonfinite_vs_reference} non-finite element(s) where the float64 value has not (or the reverse)"
           if s.nonfinite_vs_reference else
           f"is far from the float64 value (max rel. error {short_figure(s.max_rel_error)})")
    return make_verdict(
        "inconclusive", None, policy.NONE, ["review"],
        f"{where_text(d)}: `{s.arm}` {s.label} {far}, and no per-op conditioning figure explains it. But the rounding "
        f"of this computation was not simulated ({why or 'no simulated rounding'}): without its spread triage cannot "
        f"tell a kernel's error from the rounding its ops accumulate at {s.dtype}, and makes no claim.{hint}",
        evidence_lines(d))


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
            return make_verdict("likely-bug", False, policy.NONE, ["silent", "linalg", "review"],
                            wrong_kernel_text(run, o, note, both), [cond_text(dict(note, arm=run.spec), full=True)])
    return None


# -- the judged ladder: each side against its own simulated rounding -----------------------
def _unrecorded_lines(c: Comparison, js: list[Judgement]) -> list[str]:
    """What the judgement of a side does not cover: the values it continues from that were
    computed where triage records no ops."""
    lines = []
    for j in js:
        n = unrecorded_inputs(c, j)
        if n:
            lines.append(f"`{j.arm}` {j.label} continues from {n} value(s) computed where triage records no ops "
                         "(compiled kernels, such as an inductor backward's fused ones): its float64 reference and "
                         "rounding spread start from the arm's own values there, so they vouch only for what follows")
    return lines


def _judged(c: Comparison, d: Divergence, agree: list[Ablation], source: str) -> Verdict:
    """Inside its own spread is rounding of this very computation, whatever float64 says;
    outside it is another computation, which only a switch that brings both sides inside
    their spreads (an ablation) can excuse."""
    js = d.judgements
    outside = [j for j in js if j.zone == "outside" and not _within_noise(j)]
    # The judgements themselves are the report's rounding table; the evidence adds what they do not say.
    evidence = unstable_lines(js) + unmeasured_lines(js) + evidence_lines(d, sides=False) + _unrecorded_lines(c, js)
    redrawn = _different_computations(c, d, source)
    if redrawn is not None:
        return redrawn
    if outside:
        precision = [a for a in agree if a.supports == "expected-precision-mode"]
        if precision:
            verdict = _ablated(c, d, precision)
            verdict.evidence = evidence + verdict.evidence[len(evidence_lines(d)):]
            return verdict
        return _outside(c, d, outside, evidence)
    cancels = cancellation_hint(c, d)
    if d.nonfinite_mismatch > 0:
        return _nonfinite_inside(c, d, evidence)
    decided = _decided_by_rounding(c, d, js, evidence)
    if decided is not None:
        return decided
    wide = [j for j in js if j.wide]
    if not wide and matrix_upstream(c, d):
        # An ill-conditioned matrix upstream (close eigenvalues, near-singular) whose figure
        # shows in some elements of the value, though not in a typical one: those elements
        # carry no digits to be rounding-accurate in. (A cancelling matmul element is not
        # one: every model has a few.)
        wide = [j for j in js if j.poorly_determined]
    if not wide and any(_loses_every_digit(site) for site in written_sites(c, d)):
        # An addition upstream rounds away every digit of its smaller operand (`1 + p` for a
        # p below float32's unit roundoff, then `log`), or a subtraction cancels all of them:
        # the elements it reaches keep none in every rounding, all alike, so a typical
        # element's digits (or the samples' agreement) say nothing of them.
        wide = [j for j in js if j.poorly_determined]
    if not wide:
        # The sides differ most at an element its computation keeps almost no digits of: the
        # divergence is that element's conditioning, whatever a typical element keeps.
        wide = [j for j in js if j.poor_where_differ]
    if wide and not _conditioning_shown(c, d, wide, cancels):
        # Digits lost to a long accumulation (250,000 float32 terms added one by one into each
        # bin: 4 digits kept), with nothing ill-conditioned behind it: rounding, said with the
        # digits each side keeps.
        wide = []
    if wide:
        return _ill_conditioned(c, d, wide, evidence, cancels)
    envelope = [j for j in js if j.zone == "envelope"]
    inside = " and ".join(f"`{j.arm}` {j.label}" if d.source == "claim" else f"`{j.arm}`" for j in js)
    digits = digits_text(js)
    how = difference_text(d)
    if envelope and envelope[0].nearest:
        e = envelope[0]
        summary = (f"{where_text(d)} {how}. `{e.arm}` lies outside the unbiased rounding spread of its computation, "
                   "and where a replay that rounds every operation to nearest, as the arm does, lands: rounding to "
                   "nearest is biased here (a step that drops the same part of an ulp each time, such as `t = t + h` "
                   f"in a loop), which random rounding does not model and floating point allows.{digits}")
    elif envelope:
        e = envelope[0]
        # Where the two sides are one computation rounded two ways (a compiled call's generated
        # kernel against eager's), that is the order to name, not a generic example.
        cause = rounding_cause(d, next((r for r in c.arms if r.spec == d.a.arm), None), c.arms)
        summary = (f"{where_text(d)} {how}. `{e.arm}` lies outside the unbiased rounding spread of its computation but "
                   "inside the envelope of rounding every operation the same way (all up or all down): an "
                   f"order-dependent, biased accumulation{'' if cause else ' such as stagnation in a long running sum'}"
                   f", which floating point allows.{cause} Accumulating in a wider type (or with a compensated sum) "
                   f"removes it.{digits}")
    else:
        both = "both" if len(js) == 2 else "its value is"
        summary = (f"{where_text(d)} {how}, and {both} inside {'their' if len(js) == 2 else 'its'} own rounding spread "
                   f"({inside}): replaying the recorded computation with every operation rounded at the "
                   f"{'arms’' if len(js) == 2 and d.source == 'arms' else 'arm’s'} own precision gives differences this "
                   f"large. Ordinary floating-point rounding, which the accuracy note does not guarantee bitwise."
                   f"{rounding_cause(d, next((r for r in c.arms if r.spec == d.a.arm), None), c.arms)}{digits}")
    section = policy.BATCHED if (d.paths or {}).get("batched") and not envelope else policy.GENERAL
    return make_verdict("expected-rounding", True, section, ["numerical"], summary, evidence)


# Significant digits a float32 or float64 value keeps at the least after the longest
# accumulation a script runs: a sequential float32 sum of n terms keeps about 7.2 − log10(√n)
# typically, 2 only at n ≈ 1e10.
LONG_SUM_DIGITS = 2.0


def _loses_every_digit(site: dict[str, Any]) -> bool:
    """A note of the script's own arithmetic (`written_sites`) whose op keeps no digit of
    what it reads: an absorbed operand, or a difference of operands equal to the last bit."""
    return site.get("kind") == "absorbs" or site.get("digits_lost") in ("inf", math.inf)

def _conditioning_shown(c: Comparison, d: Divergence, wide: list[Judgement], cancels: str) -> bool:
    """Something makes the computation ill-conditioned, not merely long: a side keeping no
    digit (typically, or where the sides differ most), or a float32/float64 side keeping fewer than LONG_SUM_DIGITS (no accumulation a
    script runs loses that many: 250,000 float32 terms a bin kept 4), a singular or
    ill-conditioned matrix upstream, a cancellation, or a conditioning figure the arms recorded."""
    return (any(j.computational_zero or (j.digits is not None and j.digits < 1) or _within_noise(j)
                or (j.digits is not None and j.digits < LONG_SUM_DIGITS and j.dtype in ("float32", "float64"))
                # (not where the script's flush-to-zero decides that element: a mode it chose)
                or j.poor_where_differ and j.digits_where_differ is not None and j.digits_where_differ < 1
                and not flush_notes(c)
                for j in wide)
            or bool(cancels) or singular_upstream(c, d) is not None or matrix_upstream(c, d)
            or ill_conditioning(c, d) is not None or bool(written_sites(c, d)))


def _within_noise(j: Judgement) -> bool:
    """Called outside a spread that keeps no significant digit, where the sides part too, and
    not beyond that noise by policy.NOISE_MARGIN (`Judgement.outside_without_digits`): every
    value within it is as good as another, so none is outside it (a float32 polynomial fit of
    condition 1e8, 19σ of the simulated roundings, whose model of the solver's backward error
    is narrower than the kernel's). The computation's conditioning explains the divergence."""
    return j.outside_without_digits and (j.poor_where_differ or j.differ_element is None)


def _different_computations(c: Comparison, d: Divergence, source: str) -> Verdict | None:
    """Two values whose float64 values themselves differ, beyond both rounding spreads, are
    not one quantity computed twice, whatever each side's own spread says.  Within one arm
    (a claim) with random numbers reaching them only through Python values (a shuffling
    DataLoader's `randperm` turned into indices), the sides were computed from different
    draws; between two arms, the arms ran different code."""
    if d.b is None or len(d.judgements) != 2 or d.source not in ("claim", "arms"):
        return None
    (run_a, oa), (run_b, ob) = c.resolve(d.a), c.resolve(d.b)
    measured = _float64_gap(c, d)
    if measured is None:
        return None
    ra, rb, both, width, gap, limit = measured
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
    # Quoted where the difference is widest against the spreads there (the largest spreads sit
    # elsewhere, and quoted beside the largest difference they read as its match).
    # (A spread of no width: an exact value, integer arithmetic; the gap there is infinitely wide.)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        against = np.where(gap > 0, gap / width[both], 0.0)
    at = int(np.argmax(against))
    sig_a, sig_b = (float(np.asarray(o.spread["sig"], dtype=np.float64)[both][at]) for o in (oa, ob))
    combined = float(width[both][at])
    times = (f"{float(gap[at]) / combined:.3g}× their combined width" if combined > 0 else
             "values no rounding moves")
    spreads = (f"float64 values of the two sides differ by up to {float(gap.max()):.3g}; where they differ most "
               f"against their rounding, by {float(gap[at]):.3g} against spreads ±{sig_a:.2g} and ±{sig_b:.2g} "
               f"({times})")
    if d.source == "arms":
        return _arms_differ(run_a, run_b, d, float(gap.max()), spreads)
    ancestors = set(oa.ancestors) | set(ob.ancestors)
    # Draws made before anything the sides are computed from cannot have been made for them
    # (a script's data, drawn before the `gradcheck` it then runs on an input of its own).
    began = min(ancestors, default=-1)
    draws = [leaf for leaf in run_a.leaves if leaf["kind"] == "random" and leaf["index"] not in ancestors
             and leaf["index"] > began]
    calls = sorted({leaf.get("call_line") for leaf in draws if leaf.get("call_line") is not None})
    if not draws or len(calls) < 2:
        return _different_functions(d, ra, rb, both, spreads, _one_change_text(c, d, source) + _wraparound_text(c, d))
    first = next((leaf for leaf in draws if leaf.get("op") == "randperm"), draws[0])
    how = (" — a `DataLoader(shuffle=True)` draws it for every pass over the data" if first.get("op") == "randperm"
           else "")
    return make_verdict("nondeterministic", True, policy.GENERAL, ["random"],
                    f"{where_text(d)}: the two sides are different computations, not one computed twice — even in "
                    f"float64 they differ by {float(gap.max()):.3g}, far beyond both rounding spreads. Random "
                    f"numbers drawn anew for each side reach them through Python values: `aten.{first.get('op')}` at "
                    f"line {first.get('line')}{how}, drawn for the calls at lines "
                    f"{', '.join(str(x) for x in calls[:4])}. This is a testing-method problem, not a numerical one. "
                    "Fix: seed each run identically (`torch.manual_seed(…)` before each, or pass a seeded "
                    "`generator=` to the DataLoader).",
                    [spreads] + _draw_lines(draws))


class _Float64Gap(NamedTuple):
    """The two sides' float64 values (`ra`, `rb`, as real parts), the elements finite on both
    (`both`), their spreads' combined width, and over those elements the gap between the float64
    values and the most of it one quantity rounded twice allows (`limit`: eight widths, float64's
    own error at a site that cancels or absorbs, and 1e-12 of the value)."""

    ra: np.ndarray
    rb: np.ndarray
    both: np.ndarray
    width: np.ndarray
    gap: np.ndarray
    limit: np.ndarray


def _float64_gap(c: Comparison, d: Divergence) -> _Float64Gap | None:
    """The sides' `_Float64Gap`; None where a side has no float64 value or spread of the
    other's shape."""
    (_, oa), (_, ob) = c.resolve(d.a), c.resolve(d.b)
    if oa.reference_value is None or ob.reference_value is None or not oa.spread or not ob.spread:
        return None
    ra, rb = _parts(oa.reference_value), _parts(ob.reference_value)
    if ra.shape != rb.shape:
        return None
    both = np.isfinite(ra) & np.isfinite(rb)
    # An element either side computed as inf or nan has no finite spread to measure the gap
    # against (every rounding of an fp16 log-density overflowing gives a spread of 0).
    for o in (oa, ob):
        if o.value is not None and _parts(o.value).shape == ra.shape:
            both &= np.isfinite(_parts(o.value))
    shapes_match = oa.spread["sig"].shape == ra.shape and ob.spread["sig"].shape == rb.shape
    width = np.sqrt(oa.spread["sig"] ** 2 + ob.spread["sig"] ** 2) if shapes_match else None
    if width is None or not both.any():
        return None
    gap = np.abs(ra.astype(np.float64) - rb.astype(np.float64))[both]
    # The float64 replays are no more exact than float64's own rounding where a side cancels
    # or absorbs: a gap within that error (log(1 + e⁻⁴⁰) is 0 in float64 as in float32) is no
    # sign of a different function. As wide as a spread of that error.
    reference = max((float(site.get("reference_error") or 0.0) for site in cancellation_sites(c, d)), default=0.0)
    limit = 8 * (width[both] + reference) + 1e-12 * np.abs(ra)[both]
    return _Float64Gap(ra, rb, both, width, gap, limit)


def _parts(x: np.ndarray) -> np.ndarray:
    """A complex array as its real and imaginary parts (a last axis of 2), as a complex value's
    rounding spread is kept; a real one as it is."""
    return np.stack((x.real, x.imag), axis=-1) if np.iscomplexobj(x) else x


def _draw_lines(draws: list[dict[str, Any]]) -> list[str]:
    """One evidence line per random op and line, with every call it was drawn for (a data
    loader's `randperm` and `random_`, once per epoch and per run: one line each, not one per draw)."""
    calls: dict[tuple[Any, Any], list[Any]] = {}
    for x in draws:
        seen = calls.setdefault((x.get("op"), x.get("line")), [])
        if x.get("call_line") is not None and x.get("call_line") not in seen:
            seen.append(x.get("call_line"))
    return [f"random draw `aten.{op}` line {line}" + (
        f", for the call{'s' if len(at) > 1 else ''} at line{'s' if len(at) > 1 else ''} "
        f"{', '.join(str(c) for c in sorted(at))}" if at else "") for (op, line), at in list(calls.items())[:4]]


# Scans whose element i includes the i-th term (torch's, NumPy's and `itertools.accumulate`'s),
# with the exclusive form a start offset or a prefix before each term is often written as.
INCLUSIVE_SCANS = {"cumsum": "`torch.cumsum(x, dim) - x`", "cumprod": "`torch.cumprod(x, dim) / x` (x nonzero)"}


def _inclusive_scan_text(ops: list[dict[str, Any]], shape: str, computed: Side, expected: Side) -> str:
    """Where the computed side ends in a cumulative sum or product and is the expected value
    shifted one element ahead (`offsets[i] = expected[i + 1]`): the expected value is likely
    the exclusive scan (each start offset without its own term), which torch's inclusive one
    is not."""
    scan = next((x["op"].split(".")[1] for x in reversed(ops) if x.get("op", "").count(".") >= 2
                 and x["op"].split(".")[1] in INCLUSIVE_SCANS), None)
    ahead = f"`{computed.label.strip('`')}[i] = {expected.label.strip('`')}[i + 1]`"
    if scan is None or ahead not in shape:
        return ""
    return (f" A likely cause: `torch.{scan}` is inclusive — its element i takes in the i-th term too — where the "
            f"expected value looks like the exclusive scan, element i from the terms before it "
            f"({INCLUSIVE_SCANS[scan]}).")


def _largest(*values: np.ndarray) -> float | None:
    """The largest finite magnitude among `values`."""
    finite = [np.abs(v[np.isfinite(v)]).max() for v in (np.asarray(x, dtype=np.float64) for x in values)
              if np.isfinite(v).any()]
    return float(max(finite)) if finite else None


def _different_functions(d: Divergence, ra: np.ndarray, rb: np.ndarray, both: np.ndarray, spreads: str,
                         change: str = "") -> Verdict:
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
    # In their own shape where every element is finite: a shift along a tensor's last axis is
    # no shift of its flattened elements (a row's end meets the next row's start).
    whole = both.all()
    shape = difference_shape(ra.astype(np.float64) if whole else a64, rb.astype(np.float64) if whole else b64, names)
    if paths.get("constant_a") or paths.get("constant_b"):
        computed, fixed = (d.b, d.a) if paths.get("constant_a") else (d.a, d.b)
        trip = paths.get("round_trip_b" if paths.get("constant_a") else "round_trip_a")
        ratio = (b64, a64) if paths.get("constant_a") else (a64, b64)
        scaled = _round_trip_scaled(trip, *ratio, (computed.label, fixed.label), where_text(d), spreads)
        if scaled is not None:
            return scaled
        own = paths.get("only_b" if paths.get("constant_a") else "only_a") or []
        return make_verdict("inconclusive", None, policy.NONE, ["review"],
                        f"{where_text(d)}: {computed.label} differs from the value the script expects ({fixed.label}) "
                        f"by {gap:.3g}, and its float64 replay differs from it just as much{shape}: not rounding. "
                        "But the float64 reference runs the same kernels as the arm, so triage cannot tell whether "
                        "the kernel is wrong in every precision or the expected value is; a maintainer should "
                        f"check the expected value.{_inclusive_scan_text(own, shape, computed, fixed)}", [spreads])
    # What "something else" may be, where the one change that explains it was not found: a
    # custom kernel only where a side runs one.
    custom = any("is a custom op" in h for h in paths.get("hints") or [])
    causes = "" if change else (" (a different formula, a wrong constant or gradient"
                                + (", a custom kernel)" if custom else ")"))
    return make_verdict("likely-bug", False, policy.NONE, ["review"],
                    f"{where_text(d)}: the two sides compute different functions, not one quantity rounded twice — "
                    f"replayed in float64 they still differ by up to {gap:.3g}{shape}, far beyond both rounding "
                    f"spreads. Rounding does not explain it: one of the two paths computes something else"
                    f"{causes}.{change}{parting_text(paths, names, functions_differ=True, largest=_largest(ra, rb))}",
                    [spreads] + [f"only in {name}: {ops_text(paths[key], paths.get(key + '_count'))}"
                                 for key, name in (("only_a", names[0]), ("only_b", names[1])) if paths.get(key)])


def _wrapped(note: dict[str, Any]) -> bool:
    """An `integer-wraparound` note with its figure (the arm's output: a note without one
    carries no line or figure to cite, and is not read)."""
    return note.get("kind") == "integer-wraparound" and isinstance(note.get("figure"), str)


def _wraparound_text(c: Comparison, d: Divergence) -> str:
    """Where a side's integer arithmetic wrapped around (the worker's `integer-wraparound`
    note upstream): the op, and the fix, said as the difference."""
    note = next((n for n in notes_upstream(c, d) if _wrapped(n)), None)
    return f" {wraparound_sentence(note)}" if note else ""


def _one_change_text(c: Comparison, d: Divergence, source: str) -> str:
    """The one change to a side's ops the worker found that makes the two sides one function
    in float64 (triage/worker/counterfactual.py), said as the mistake it points at."""
    for side, other in ((d.a, d.b), (d.b, d.a)):
        found = c.find(side) if side is not None else None
        change = ((found[1].reference or {}).get("one_change") if found else None)
        if change and other is not None:
            return change_text(change, side.label, other.label, _library_step(change, source))
    return ""


# The operator a script writes for each scaling or shift the counterfactual takes away.
STEP_OPERATORS = {"mul": "*", "div": "/", "add": "+", "sub": "-"}


def _library_step(change: dict[str, Any], source: str) -> bool:
    """A step taken away (`without`) that its line does not write: neither its number nor its
    operator appears there (`H = hessian(f)(x)` computes x³'s second derivative 6x as 3x²'s
    derivative times 2), so a library call on that line took it — PyTorch's own arithmetic,
    which a hand-written formula on the other side is likelier to lack."""
    if change.get("kind") != "without" or not isinstance(change.get("line"), int):
        return False
    lines = source.splitlines()
    line = lines[change["line"] - 1] if 0 < change["line"] <= len(lines) else ""
    op = change["op"].split(".")[-1].rstrip("_")
    if not line or op not in STEP_OPERATORS or op in line:
        return False
    code = line.split("#", 1)[0]
    try:
        numbers = {float(n.value) for n in ast.walk(ast.parse(code.strip(), mode="exec"))
                   if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)}
    except SyntaxError:  # a line that is part of a longer statement: not judged
        return False
    return STEP_OPERATORS[op] not in code and not (isinstance(change.get("was"), (int, float))
                                                   and float(change["was"]) in numbers)


def change_text(change: dict[str, Any], side: str, other: str, library_step: bool = False) -> str:
    """One change (triage/worker/counterfactual.py) to the ops of `side` that makes it equal
    `other` in float64, said as the mistake it points at (each name as the summary shows it;
    `library_step`: the step taken away is a library call's, not written on its line)."""
    where = f"`{change['op']}`" + (f" at line {change['line']}" if change.get("line") is not None else "")
    also = change.get("also") or []
    if (change.get("places") or 1) > 1 and change["kind"] not in ("swapped", "exchanged", "shifted") \
            and change.get("line") is not None and all(o == {"op": change["op"], "line": change["line"]} for o in also):
        where += f" (each of its {change['places']} repeats, a loop's steps)"
    then = f"{side} equals {other} in float64"
    if change.get("residual"):
        then = (f"{side} agrees with {other} to {change['residual']:.1g} in float64 (the rounding of "
                "the narrower inputs they read)")
    written = change.get("written")
    if written:
        at = f" at line {written['line']}" if written.get("line") is not None else ""
        step = f"the step at line {change['line']}" if change.get("line") is not None else f"{where}'s step"
        return (f" {where} reads a value that `{written['op']}`{at} had already changed in place, and "
                f"{other} reads that change too: without {step}, {then}. The in-place `{written['op']}`{at} "
                "is the likelier mistake: it changed the value both sides start from before this line read it "
                "(work on a copy, or use the out-of-place op).")
    was, to = change["was"], change["to"]
    if change["kind"] == "constant":
        digits = -math.log10(abs(was - to) / abs(to))
        return (f" {where} takes {was!r}, {change['named']} to {digits:.0f} digits: with {change['named']} "
                f"({to!r}) there, {then} — the constant is the difference.")
    if change["kind"] == "moved":
        now, instead = ("after", "before") if change["argument"] == "before" else ("before", "after")
        return (f" {where} adds {was!r} {now} `{change.get('around')}`: added {instead} it instead, {then} — where "
                f"the {was!r} goes is the difference.")
    if change["kind"] == "without" and library_step:
        return (f" {where} {STEP_VERBS.get(change['op'].split('.')[-1], 'applies')} {was!r}, a step of the library "
                f"call on that line (the line writes no such step): without it, {then} on this input — the likelier "
                f"mistake is that {other} leaves this step out (one a hand-written formula drops), not that PyTorch "
                "takes it.")
    if change["kind"] == "without":
        # Taking a step away agrees on this input, which does not say the step is the mistake:
        # the other side may undo it (0.5·d² against 0.5·d²/β with β = 0.5).
        return (f" {where} {STEP_VERBS.get(change['op'].split('.')[-1], 'applies')} {was!r}: without that step, "
                f"{then} on this input — that step is where they part: it should not be there, or the other side "
                "has a step that undoes it here.")
    operand = _made_by(change.get("operand"))
    if change["kind"] == "sign":
        verb, other_verb = ("adds", "subtracting") if was == "add" else ("subtracts", "adding")
        return (f" {where} {verb} its second operand{operand}: {other_verb} it instead, {then} — the sign is the "
                "difference.")
    if change["kind"] == "opposite":
        verb, other_verb = ("adds", "subtracting") if change["op"].split(".")[-1].startswith("add") else (
            "subtracts", "adding")
        return f" {where} {verb} {was!r}: {other_verb} it instead, {then} — the sign of that step is the difference."
    if change["kind"] == "dropped":
        term = "its second operand" if change["argument"] == "other" else "its first operand"
        verb = "adds" if was == "add" else "subtracts"
        return (f" {where} {verb} a term, {term}{operand}: without that term, {then} on this input — that term "
                "is where they part: it should not be there, the other side lacks it, or what it is made of differs "
                "(a weight or an index computed otherwise, which is zero on the other side here).")
    if change["kind"] == "negated":
        return (f" {where} reads its `{change['argument']}`{operand} as it is: negated, {then} — the mask's sense is "
                "the difference (a boolean `attn_mask` of `scaled_dot_product_attention` is True where a position "
                "takes part; `masked_fill`'s mask and `key_padding_mask` are True where it is dropped).")
    if change["argument"] == "scale" and change["op"].split(".")[-1].startswith(("_scaled_dot_product",
                                                                                 "scaled_dot_product")):
        return (f" {where} scales the scores by 1/√d, its default `scale`: with `scale=1.0`, {then} — the other "
                "side's missing 1/√d is the difference.")
    if change["kind"] in ("transposed", "conjugated"):
        nth = f"`{change['argument']}` operand"
        done, what = (("transposed", "the operand's orientation is the difference (a matrix `W` where `W.T` is "
                       "meant, or the reverse)") if change["kind"] == "transposed" else
                      ("conjugated", "the conjugate is the difference (`X * X` where `X * X.conj()` is meant)"))
        return f" {where} takes its {nth}{operand} as it is: {done}, {then} — {what}."
    if change["kind"] == "inputs":
        first, second = _made_by(change.get("operand")), _made_by(change.get("exchanged_with"))
        return (f" {side} reads two input tensors of one shape, one{first} and one{second}: exchanged wherever "
                f"{side}'s own ops read them, {then} — the two inputs' roles are the difference (each used where "
                "the other is meant).")
    if change["kind"] in ("swapped", "exchanged"):
        count = change.get("places") or 1
        repeats = f" (and its {count - 1} repeats on that line, a loop's steps)" if change["kind"] == "swapped" \
            and count > 1 else f" (in each of the line's {count // 2} repeats, a loop's steps)" if count > 2 else ""
        if change["kind"] == "swapped":
            return (f" {where} takes its two operands in this order{repeats}: exchanged, {then} — the operands' "
                    "order is the difference.")
        first, second = _made_by(change.get("operand")), _made_by(change.get("exchanged_with"))
        return (f" {where} and the `{change['op']}` beside it on that line{repeats}: with the first's operand"
                f"{first} and the second's operand{second} exchanged, {then} — which term each applies to is the "
                "difference (a gate or a weight on the wrong term).")
    if change["kind"] == "triangle":
        kept, flipped = ("lower", "upper") if change["op"].endswith("tril") else ("upper", "lower")
        return (f" {where} keeps the {kept} triangle from diagonal {was!r}: the {flipped} triangle from diagonal "
                f"{to!r} instead, {then} — the mask's triangle is the difference.")
    if change["kind"] == "shifted":
        count = change.get("places") or 1
        step = to - was
        if count > 1:
            return (f" {where} and the other {count - 1} slices along the same dimension: with each "
                    f"`{change['argument']}` {'one less' if step < 0 else 'one more'}, {then} — an index off by "
                    "one, in every slice, is the difference.")
        return (f" {where} takes `{change['argument']}={was!r}`: with {to!r}, {then} — an index off by one is "
                "the difference.")
    if change["argument"] == "dim":
        also = "".join(f" and `{o['op']}`" + (f" at line {o['line']}" if o.get("line") is not None else "")
                       for o in change.get("also") or [])
        if also:
            return (f" {where}{also} reduce over dims {was!r}: over {to!r} instead, in all of them, {then} — the "
                    "axes are the difference.")
        return f" {where} reduces over dim {was!r}: over dim {to!r} instead, {then} — the axis is the difference."
    return (f" {where} takes `{change['argument']}={was!r}`: with `{change['argument']}={to!r}`, {then} — that "
            "argument is the difference.")


def _made_by(operand: dict[str, Any] | None) -> str:
    if not operand:
        return ""
    return f" (from `{operand['op']}`" + (f" at line {operand['line']}" if operand.get("line") is not None else "") + ")"


def _round_trip_scaled(trip: dict[str, Any] | None, computed: np.ndarray, expected: np.ndarray,
                       names: tuple[str, str], where: str, spreads: str) -> Verdict | None:
    """A value the script expects back from a forward and an inverse DFT, off by n^p in every
    element, where the two transforms' `norm=` arguments leave that power p of the transform
    length n (paths.py `_round_trip`): the kernels compute what they were asked, and the
    expectation assumes matching normalizations."""
    power = (trip or {}).get("power")
    nonzero = (np.abs(expected) > 0) & (np.abs(computed) > 0)
    if not power or not nonzero.any():
        return None
    ratio = computed[nonzero] / expected[nonzero]
    r = float(np.median(ratio))
    if r <= 0 or not np.all(np.abs(ratio - r) <= 1e-9 * r):
        return None
    n = r ** (1 / power)
    if round(n) < 2 or abs(n - round(n)) > 1e-6 * n:
        return None
    n = round(n)
    forward, inverse = trip["forward"], trip["inverse"]
    factor = {1: "n", -1: "1/n", 0.5: "√n", -0.5: "1/√n"}.get(power, f"n^{power:g}")
    return make_verdict(
        "likely-bug", False, policy.NONE, ["review"],
        f"{where}: {names[0]} is {r:.6g} × {names[1]} in every element, {factor} for the transform length n = {n}: "
        f"what the two DFTs computing it are asked for. `{forward['op']}` (line {forward['line']}) runs with "
        f"norm=\"{forward['norm']}\" and `{inverse['op']}` (line {inverse['line']}) with norm=\"{inverse['norm']}\": "
        f"their normalizations leave a factor of {factor}, so the round trip is not the identity the script expects. "
        "The kernels compute what these arguments ask for; the script's expectation is what is wrong. Pass the same `norm=` to both transforms (the default \"backward\" on both).",
        [spreads, f"forward: `{forward['op']}` line {forward['line']}, norm=\"{forward['norm']}\"; inverse: "
                  f"`{inverse['op']}` line {inverse['line']}, norm=\"{inverse['norm']}\""])


def _arms_differ(run_a: ArmRun, run_b: ArmRun, d: Divergence, gap: float, spreads: str) -> Verdict:
    """Each arm is consistent with its own recorded computation, but the two computations
    differ in exact arithmetic: not rounding, whichever side is nearer anything."""
    nodes = [(r.graph or {}).get("nodes") for r in (run_a, run_b)]
    graphs = (f" The arms recorded different graphs ({nodes[0]} and {nodes[1]} ops): the script takes a different "
              "path on each (a branch on the device, the thread count or the build), or an op dispatched to a "
              "different formula." if None not in nodes and nodes[0] != nodes[1] else
              " Their recorded graphs have the same size, so an op computes a different formula on one arm "
              "(a kernel or dispatch difference), or the script feeds the arms different data.")
    summary = (f"{where_text(d)}: `{run_a.spec}` and `{run_b.spec}` ran different computations — each value is inside the "
               f"rounding spread of its own arm's computation, but replayed in float64 those computations differ by "
               f"{gap:.3g}, far beyond both spreads. Rounding does not explain it.{graphs}")
    return make_verdict("likely-bug", False, policy.NONE, ["silent", "review"], summary, [spreads])


def _outside(c: Comparison, d: Divergence, outside: list, evidence: list[str]) -> Verdict:
    j = outside[0]
    inside = [x for x in d.judgements if x.zone != "outside"]
    contrast = f", while `{inside[0].arm}` {inside[0].label} is inside its own (p = {inside[0].p:.2f})" if inside else ""
    run = c.run(j.arm)
    own = run.script_backends if run is not None else []
    backend = (f"the script's own compile backend `{own[0]['name']}` (line {own[0].get('line')}), which this arm "
               "compiles with: the place to look is what it does to the graph, not PyTorch's kernels") if own else ""
    # A script's own backend is the script's code: no PyTorch correctness label.
    silent = [] if own else ["silent"]
    if j.nonfinite and j.nonfinite.startswith("outside"):
        what = j.nonfinite.removeprefix("outside: ")
        summary = (f"{where_text(d)}: `{j.arm}` {j.label} has {what}{contrast}. The recorded computation, rounded at "
                   f"the arm's own precision with its range emulated, does not produce that. A different computation "
                   f"({backend or 'a kernel or compiler bug, a different formula that overflows or cancels'}) — not "
                   "rounding, and not an extremal input.")
        return make_verdict("nonfinite-flip", False, policy.NONE, ["nonfinite"] + silent + ["review"], summary,
                            evidence + hazards(c, d))
    away = (f"{j.statistic:.3g}σ from the float64 value" if j.statistic is not None and j.statistic != float("inf")
            else "away from the float64 value where no simulated rounding moves it")
    cause = backend or "a kernel or compiler bug, a different formula, or a precision mode no ablation explains"
    summary = (f"{where_text(d)}: `{j.arm}` {j.label} lies outside its own rounding spread — {away}, where "
               f"{j.samples} simulated roundings of the same computation at {j.precision_text} reach at most "
               f"{(j.max_sample_stat or 0):.3g}σ (p = {j.p:.2f}){contrast}. The arm computes something other than "
               f"the recorded formula at its precision ({cause}).")
    kind = "nonfinite-flip" if d.nonfinite_mismatch > 0 else "likely-bug"
    labels = ["nonfinite"] + silent + ["review"] if kind == "nonfinite-flip" else silent + ["review"]
    return make_verdict(kind, False, policy.NONE, labels, summary, evidence + hazards(c, d))


def _nonfinite_inside(c: Comparison, d: Divergence, evidence: list[str]) -> Verdict:
    """Inf/NaN on one side only, with both sides inside their spreads: rounding alone reaches
    the nonfinite value here (an exactly singular matrix, a value at the edge of the range)."""
    apart = _nonfinite_in_float64_too(c, d, evidence) if singular_upstream(c, d, nonfinite_side(d)) is None else None
    if apart is not None:
        return apart
    who = who_is_right(d, [], [])
    exact = [s for s in (d.a, d.b) if s is not None and s.agrees_with_reference and s.nonfinite_vs_reference == 0]
    note = singular_upstream(c, d, nonfinite_side(d))
    if exact and any(s.summary != (exact[0].summary) for s in (d.a, d.b) if s is not None):
        who += f" `{exact[0].arm}` {exact[0].label} equals the exact answer ({exact[0].reference_summary})."
    if note and "figure" not in note:
        section, labels = policy.LINALG, ["nonfinite", "linalg"]
        why = (f" The matrix fed to `{note['op']}` at line {note['line']} is singular ({cond_text(note)}), so the "
               "exact answer is not finite and any finite value is rounding noise.")
    else:
        # Where the values leave the range explains an inf or a nan; a cancellation upstream
        # (the conditioning figure) explains lost digits, not a non-finite value.
        section, labels, why = policy.EXTREMAL, ["nonfinite", "numerical"], ""
        over = [s for s in (d.a, d.b) if s is not None and s.overflow_to_inf]
        written = _written_beyond_range(c, d)
        if written:
            leaf, dtype = written
            why = (f" The number written at line {leaf['line']} ({leaf['literal_beyond_range']:g}) lies beyond the "
                   f"largest finite {dtype}: the tensor holds inf before any op runs, and what is computed from it "
                   "follows.")
        elif over:
            why = (f" The float64 value ({over[0].reference_summary}) lies beyond the largest finite {over[0].dtype}, "
                   f"so `inf` is the correctly rounded {over[0].dtype} answer: range overflow.")
        elif (left := _first_overflow(c, d)) is not None:
            result = "±inf" if left["kind"] == "overflow" else "nan"
            at = '' if left.get('line') is None else ' at line ' + str(left['line'])
            under = left.get("underflow")
            if under:
                # An exp(-200) that float32 rounds to 0, then its log: the inf comes from below.
                smallest = f" ({under['smallest']:.3g})" if under.get("smallest") is not None else ""
                where = '' if under.get('line') is None else ' at line ' + str(under['line'])
                why = (f" `{under['op']}`{where} underflows: values below {left['dtype']}'s smallest positive "
                       f"value{smallest} round to 0, and `{left['op']}`{at} turns the 0 into {result}; what is "
                       "computed from it follows.")
                if under["op"] in ("aten._softmax", "aten.softmax") and left["op"] == "aten.log":
                    why += (" `torch.log_softmax` computes the logarithm as x − max − log Σ exp, without forming the "
                            "probabilities that underflow.")
            elif left.get("zeros"):
                # log(1 - p) where float16 rounds p to 1: the 0 comes from a cancellation (or is the
                # script's own), and ±inf is the op's exact answer at it, not a value past the range.
                site = next((x for x in written_sites(c, d) if _loses_every_digit(x)), None)
                source = (f" `{site['op']}` at line {site['line']} cancels its operands to 0 at {left['dtype']}, and "
                          f"`{left['op']}`{at} turns the 0 into" if site else f" `{left['op']}`{at} reads 0 and returns")
                why = (f"{source} {result}, its exact answer at 0 (not a value past {left['dtype']}'s range); what is "
                       "computed from it follows.")
            else:
                why = (f" `{left['op']}`{at} is where the values leave {left['dtype']}'s range: its result is "
                       f"{result} from finite inputs (the largest finite {left['dtype']} is {left['largest']:.6g}), "
                       "and what is computed from it follows.")
        elif note:
            section = policy.EXTREMAL if range_note(note) else policy.GENERAL
            why = f" At `aten.{note['op']}` (line {note['line']}) {note['figure']}."
    both = "Both sides are" if d.b is not None else "The value is"
    return make_verdict("nonfinite-flip", True, section, labels,
                    f"{who}{why} {both} inside the rounding spread of their own computation: replaying it with every "
                    "operation rounded at the arm's precision (its range emulated) reaches the same non-finite "
                    "values, so this is where rounding and the dtype's range lead, not a bug.",
                    evidence + ([cond_text(note, full=True)] if note else []))


# Ops that normalize over a dimension: over a slice whose every entry is −inf (a mask that
# allows no key) they compute 0/0, undefined; fused attention kernels return 0 there instead.
NORMALIZING_OPS = ("aten._softmax", "aten._log_softmax", "aten.softmax", "aten.log_softmax")


def _nonfinite_in_float64_too(c: Comparison, d: Divergence, evidence: list[str]) -> Verdict | None:
    """Two sides, each at its own float64 value, where those float64 values themselves part in
    finiteness: one side is nan (or ±inf) in exact arithmetic too where the other is finite. No
    rounding or range made the difference: the two compute different things at those elements
    (a hand-written softmax over a fully masked row, 0/0, against a fused attention kernel that
    returns 0 there)."""
    if d.b is None or not all(s.agrees_with_reference for s in (d.a, d.b)):
        return None
    (_, oa), (_, ob) = c.resolve(d.a), c.resolve(d.b)
    ra, rb = oa.reference_value, ob.reference_value
    if ra is None or rb is None or np.shape(ra) != np.shape(rb) or np.iscomplexobj(ra) or np.iscomplexobj(rb):
        return None
    fa, fb = np.isfinite(np.asarray(ra, dtype=np.float64)), np.isfinite(np.asarray(rb, dtype=np.float64))
    if (fa == fb).all():
        return None
    nonfinite, finite, ref = (d.a, d.b, np.asarray(ra)) if (~fa & fb).sum() >= (fa & ~fb).sum() else (d.b, d.a, np.asarray(rb))
    count = int((fa != fb).sum())
    nan = bool(np.isnan(ref[~np.isfinite(ref)]).any())
    own = ((d.paths or {}).get("only_a" if nonfinite is d.a else "only_b") or [])
    normalized = next((x for x in own if str(x.get("op", "")).rsplit(".", 1)[0] in NORMALIZING_OPS), None)
    masked = (f" `{normalized['op'].rsplit('.', 1)[0]}`" + (f" at line {normalized['line']}" if normalized.get("line")
                                                             is not None else "")
              + " normalizes over a slice: where every entry of a slice is −inf (a mask that allows no key), that is "
              "0/0, undefined, and nan in exact arithmetic; fused attention (`scaled_dot_product_attention`) returns "
              "0 for such a row instead. Mask or drop the rows that have nothing to attend to, or compare only the "
              "others." if normalized is not None and nan else "")
    return make_verdict(
        "nonfinite-flip", True, policy.GENERAL, ["nonfinite", "numerical"],
        f"{where_text(d)}: {nonfinite.label} is {'nan' if nan else 'non-finite'} at {count} element(s) where "
        f"{finite.label} is finite, and each agrees with its own float64 replay there: in exact arithmetic too, "
        f"{nonfinite.label} is {'nan' if nan else 'non-finite'} and {finite.label} finite at those elements. The two "
        f"sides compute different things there — not rounding, not a value past the dtype's range.{masked}",
        evidence)


def _first_overflow(c: Comparison, d: Divergence) -> dict[str, Any] | None:
    """The first op upstream of the side that is not finite whose replay left its dtype's range
    (the simulation's `overflow`), if the simulation noted one."""
    for side in sorted((s for s in (d.a, d.b) if s is not None), key=lambda s: not s.nonfinite_vs_reference):
        found = c.find(side)
        left = ((found[1].rounding or {}).get("overflow") if found else None)
        if left:
            return left
    return None


def _written_beyond_range(c: Comparison, d: Divergence) -> tuple[dict[str, Any], str] | None:
    """A leaf upstream of a side that the script wrote as a number its dtype's range does not
    reach (`Leaf.literal`), with that leaf's dtype."""
    for side in (d.a, d.b):
        found = c.find(side) if side is not None else None
        if found is None:
            continue
        leaf = next(iter(_written_leaves(*found, "literal_beyond_range")), None)
        if leaf is not None:
            return leaf, (leaf.get("fingerprint") or {}).get("dtype") or side.dtype
    return None


def _written_leaves(run: ArmRun, o: Observable, figure: str) -> list[dict[str, Any]]:
    """The leaves `o` depends on that the script wrote as Python numbers its dtype misses,
    with this `figure` of it (`literal_rounding`, `literal_beyond_range`: worker/session.py)."""
    return [x for x in run.leaves if x["index"] in o.ancestors and x.get(figure)]


def _article(dtype: str) -> str:
    return "an" if dtype[:1] in "aeio" else "a"  # an int64, a bool, a uint8


def _decided_by_rounding(c: Comparison, d: Divergence, js: list, evidence: list[str]) -> Verdict | None:
    """A discrete value (a count of differing elements, an index, a mask) inside its spread,
    whose own comparisons rounding switches: its float64 value is one outcome of many, not the
    answer, and no digit count describes it (a count of `a != b` between two formulas is the
    number of elements where their roundings happen to differ)."""
    sides = [s for s in (d.a, d.b) if s is not None]
    if not sides or any(s.dtype.startswith(("float", "bfloat", "complex")) or s.dtype == "?" for s in sides):
        return None
    flips = [u for j in js for u in j.unstable if not u.endswith(FINITE_UNDER_SOME)]
    if not flips or any(j.zone == "outside" for j in js):
        return None
    inside = " and ".join(f"`{j.arm}` {j.label}" for j in js)
    ties = list(dict.fromkeys(t for j in js for t in j.ties))
    # Sides computed at two precisions: the narrower one's rounding may be what made the values
    # equal (logits 2.0001 and 2.0004 are one float16, 2.0): that precision is the cause.
    if ties and len({computed_at(d, s) for s in sides}) == 1:
        # Equal values, not rounded ones: the replays round them apart, which is how the tie shows.
        return make_verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                            f"{where_text(d)} {difference_text(d)}. It is {_article(sides[0].dtype)} {sides[0].dtype} "
                            f"value chosen among exactly equal values: {' and '.join(ties)} "
                            f"{'picks' if len(ties) == 1 else 'pick'} among values that tie, and which of them comes "
                            "first is each op's own choice — `torch.sort` orders ties as it likes unless "
                            "`stable=True`, and `topk`, `argmax` and `max(dim)` promise no particular one. Compare "
                            "the values rather than the indices, or break the ties explicitly. Not a bug (replays that "
                            "round the equal values apart choose otherwise too, which is how the tie shows here).",
                            evidence)
    return make_verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                        f"{where_text(d)} {difference_text(d)}. It is {_article(sides[0].dtype)} {sides[0].dtype} value "
                        f"decided by comparing floating-point values, and rounding alone decides those comparisons "
                        f"(replayed with random rounding at the arm's precision, {flips[0]}); {inside} "
                        f"{'are' if len(js) > 1 else 'is'} inside the spread they give."
                        f"{rounding_cause(d, next((r for r in c.arms if r.spec == d.a.arm), None), c.arms)} "
                        "Its float64 value is one outcome of many, not the answer: ordinary floating-point rounding, "
                        "which the accuracy note does not guarantee bitwise.", evidence)


def _underflow(c: Comparison, j: Judgement) -> str | None:
    """Where the side keeping the fewest digits has a float64 value below its computation
    dtype's smallest normal where the sides differ most: the dtype's range, not a cancellation,
    takes its digits (a float16 gradient of a loss scaled by 1e-8 lies at 1e-8, where float16
    holds it to its spacing of 6e-8, or as 0)."""
    tiny = policy.MIN_NORMAL.get(j.dtype)
    found = c.find(j)
    reference = found[1].reference_value if found else None
    if tiny is None or reference is None or j.differ_element is None or np.iscomplexobj(reference):
        return None
    flat = np.asarray(reference, dtype=np.float64).reshape(-1)
    if not 0 <= j.differ_element < flat.size or not 0 < abs(flat[j.differ_element]) < tiny:
        return None
    bits, _ = policy.FLOAT_FORMATS[j.dtype]
    return (f"{j.label}'s float64 value there, {flat[j.differ_element]:.2g}, lies below {j.dtype}'s smallest normal "
            f"value ({tiny:.2g}), where {j.dtype} is spaced by {tiny * 2.0 ** (1 - bits):.2g} and rounds what is "
            "below half of that to 0: the values underflow. Scaling them up (for gradients, a loss scale: `torch.amp.GradScaler`) "
            "or computing in a wider dtype keeps their digits")


def _ill_conditioned(c: Comparison, d: Divergence, wide: list, evidence: list[str], hint: str) -> Verdict:
    # The side a reader would take for a bug first, else the one keeping the fewest digits
    # where the sides differ most.
    j = next((x for x in wide if _within_noise(x)), None) or min(
        wide, key=lambda x: x.digits_where_differ if x.poor_where_differ and x.digits_where_differ is not None
        else math.inf)
    note = singular_upstream(c, d) or {}
    matrix = bool(note) and "figure" not in note
    section = policy.LINALG if matrix else policy.EXTREMAL if range_note(note) else policy.GENERAL
    if j.computational_zero and any(u.endswith(FINITE_UNDER_SOME) for u in j.unstable):
        state = (f"`{j.arm}` {j.label} is not finite under some of its simulated roundings at {j.precision_text}, so no "
                 "finite value of it keeps a reliable digit")
    elif j.computational_zero:
        state = (f"`{j.arm}` {j.label} is a computational zero at {j.precision_text}: its simulated roundings scatter by "
                 f"±{j.sigma:.2g}, as far as the value itself reaches, so every digit of it is rounding noise")
    elif j.wide:
        # The spread quoted where the sides differ most: the statistic's element may be another
        # (a difference of 10 beside "±0.023" read as a contradiction).
        where = (f"±{j.sigma_where_differ:.2g} where they differ most" if j.sigma_where_differ is not None
                 else f"±{j.sigma:.2g}")
        state = (f"its rounding spread is wide — `{j.arm}` {j.label} keeps only {j.digits:.1f} significant digits "
                 f"at {j.precision_text} ({where})")
    elif j.poor_where_differ:
        state = (f"where they differ most (element {j.differ_element}), `{j.arm}` {j.label} keeps "
                 + ("no significant digit" if (j.digits_where_differ or 0) < 0.5 else
                    f"only {j.digits_where_differ:.1f} significant digits")
                 + f" at {j.precision_text}, though a typical element keeps {j.digits or 0:.1f}")
    else:
        state = (f"{j.poorly_determined} of the {j.numel} elements of `{j.arm}` {j.label} keep almost none of "
                 f"{j.dtype}'s digits (the fewest: {j.fewest_digits or 0:.1f}), though a typical element keeps "
                 f"{j.digits or 0:.1f}")
    if _within_noise(j):
        state += (f"; it lies {j.statistic:.3g}σ from the float64 value, beyond the {j.samples} simulated roundings "
                  f"({j.max_sample_stat:.3g}σ), whose model of its kernels' error is narrower than theirs, but a spread "
                  "that keeps no digit has no value outside it")
    behind = _underflow(c, j) or ill_conditioning(c, d) or cancellation_site(c, d)
    sums = (d.paths or {}).get("running_sums") or []
    total = min(sums, key=lambda x: policy.FLOAT_FORMATS.get(x.get("dtype"), (53,))[0]) if sums else None
    flips = [u for u in j.unstable if not u.endswith(FINITE_UNDER_SOME)]
    figure = (f" The figure behind it: {behind}." if behind else
              f" No op recorded amplifies its rounding: the value rests on decisions rounding switches — {flips[0]} "
              "(a value at a decision's edge, such as a histogram's bin edge or a threshold, goes either way): its "
              "float64 value is one outcome of many." if flips else
              f" No single op recorded explains it: {d.a.label if total['side'] == 'a' else d.b.label} adds "
              f"{total['terms']:,} terms one after another at line {total['line']} into a {total['dtype']} total, and "
              "once that total is large each addition rounds away much of what it adds (stagnation); accumulating in "
              "a wider dtype (or with `torch.sum`, which adds in blocks) keeps the digits." if total else
              " No single op recorded explains it (no cancellation, singular matrix or overflow was found): the "
              "computation as a whole amplifies its rounding (as a division by values near zero does).")
    return make_verdict("expected-ill-conditioned", True, section, ["numerical"] + (["linalg"] if matrix else []),
                    f"{where_text(d)} {difference_text(d)}, and "
                    + ("no side is outside what its conditioning allows: " if any(_within_noise(x) for x in wide) else
                       f"{'every side is' if d.b is not None else 'it is'} inside its own rounding spread, but ")
                    + f"{state}.{figure}{hint} On such a computation results may differ between devices, backends and "
                    "orders of evaluation; neither side is a bug.",
                    evidence + ([cond_text(note, full=True)] if note else []))


# -- rungs --------------------------------------------------------------------------------
def _could_not_run(failed: list[ArmRun]) -> Verdict:
    kinds = {(r.status, (r.exception or {}).get("type")) for r in failed}
    same = "the same way" if len(kinds) == 1 else "(not all the same way)"
    lines = [f"`{r.spec}`: {r.failure}" for r in failed]
    return make_verdict("could-not-run", None, policy.NONE, ["repro"],
                    f"Every arm failed {same} before the script produced a result to compare: {lines[0]}",
                    lines)


def _crash_one_arm(completed: list[ArmRun], failed: list[ArmRun]) -> Verdict:
    bad = failed[0]
    good = ", ".join(f"`{r.spec}`" for r in completed)
    labels = ["review"] + (["compile"] if bad.mode == "compile" else [])
    return make_verdict("crash-one-arm", False, policy.NONE, labels,
                    f"`{bad.spec}` fails ({bad.failure}) while {good} runs the same program to the end. "
                    "The accuracy note allows different numbers, not a failure on one configuration.",
                    [f"`{r.spec}`: {r.failure}" for r in failed])


# torch's messages for operands whose sizes do not fit together.
SIZE_MISMATCH = re.compile(r"must match the size of tensor|size mismatch|shapes cannot be multiplied|"
                           r"Sizes of tensors must match|inconsistent tensor size|expected .*size", re.IGNORECASE)


# Random ops a module draws in its forward only in train mode (dropout's masks, rrelu's
# slopes): `model.eval()` stops those, not a weight initializer's draws.
TRAINING_MODE_DRAWS = {"native_dropout", "dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout",
                       "bernoulli", "rrelu_with_noise", "rrelu"}


def _nondeterministic(c: Comparison, d: Divergence | None) -> Verdict | None:
    """The values differ because their inputs differ, not because the arithmetic does."""
    if d is None:
        return None
    differing = [a for a in d.ancestors if a["differs"] and a["kind"] in ("random", "uninitialized")]
    differing = differing or d.distinct_draws  # a claim's operands drawn separately (compare finds them)
    if differing:
        # Uninitialized memory the value reads is named whether or not its bytes happened to
        # match this time (the allocator decides that, run to run), and first: reading it is
        # the defect; a random draw may be the script's intent.
        uninitialized = [a for a in d.ancestors if a["kind"] == "uninitialized"]
        uninitialized = uninitialized or [a for a in differing if a["kind"] == "uninitialized"]
        drawn = [a for a in differing if a["kind"] == "random"]
        causes, fixes = [], []
        if uninitialized:
            leaf = uninitialized[0]
            causes.append(f"`torch.{leaf['op'] or 'empty'}` at line {leaf['line']} returns uninitialized memory, "
                          "which differs from call to call")
            fixes.append("initialize the tensor (torch.zeros/torch.randn under a seed) instead of torch.empty")
        if drawn:
            leaf = drawn[0]
            cause = f"the random op `aten.{leaf['op']}` at line {leaf['line']} draws new numbers for each side"
            fix = "create modules and random inputs once, outside the compared computation, under torch.manual_seed(…)"
            if str(leaf["op"]).rstrip("_") in TRAINING_MODE_DRAWS:
                # The module in training mode that draws it, by path, where the arm called one.
                training = next((t for t in map(_random_layers_in_training, c.arms) if t is not None), None)
                if training is not None:
                    name, layers = training
                    cause += (": `" + name + "` is in training mode, and "
                              + ", ".join(f"`{name}.{x['path']}` ({x['type']})" for x in layers[:3])
                              + " draw" + ("s" if len(layers) == 1 else "") + " new numbers on every call")
                    fix += f", and call `{name}.eval()` before comparing"
                else:
                    fix += ", and call model.eval() before comparing"
            causes.append(cause)
            fixes.append(fix)
        named = (uninitialized[:1] + drawn[:1]) or differing[:1]
        return make_verdict("nondeterministic", True, policy.GENERAL, ["random"],
                        f"The two sides of {where_text(d)} start from different values: {'; and '.join(causes)}. "
                        f"This is a testing-method problem, not a numerical one. Fix: {'; '.join(fixes)}.",
                        evidence_lines(d) + [f"differing leaf: {x['kind']} `{x['op'] or 'data'}` line {x['line']}, "
                                             f"shape {x['shape']}" for x in named])
    compile_runs = [r for r in c.arms if r.mode == "compile" and r.compiled_random_ops]
    if d.source == "arms" and compile_runs:
        ops = ", ".join(sorted(set(compile_runs[0].compiled_random_ops)))
        training = _random_layers_in_training(compile_runs[0])
        if training is not None:
            name, layers = training
            listing = "; ".join(f"`{name}.{x['path']}` ({x['type']}) {x['effect']}" for x in layers[:4])
            seeds = _reseeded_draws(c)
            if seeds:
                return make_verdict(
                    "nondeterministic", True, policy.GENERAL, ["random", "compile"],
                    f"{where_text(d)} differs between eager and compiled runs because `{name}` is in training "
                    f"mode: {listing}. The script seeds the generator before each call ({seeds}), so two eager calls "
                    f"draw the same numbers; the compiled call draws its own ({ops}) with inductor's generator, which "
                    f"differs from eager's. This is the model's mode and the compiler's random numbers, not numerics. "
                    f"Fix: call `{name}.eval()` before comparing outputs, or set "
                    "`torch._inductor.config.fallback_random = True` to make the compiled call draw as eager does.",
                    evidence_lines(d) + [f"train-mode layer `{x['path']}`: {x['type']}" for x in layers[:8]])
            return make_verdict("nondeterministic", True, policy.GENERAL, ["random", "compile"],
                            f"{where_text(d)} differs between eager and compiled runs because `{name}` is in training "
                            f"mode: {listing}, so every call draws its own numbers ({ops}), eager or compiled — two "
                            "eager calls differ too, and inductor's generator differs from eager's besides. This is "
                            f"the model's mode, not numerics. Fix: call `{name}.eval()` before comparing outputs "
                            "(`torch._inductor.config.fallback_random = True` makes a compiled call draw as an eager "
                            "one, but two calls still draw differently).",
                            evidence_lines(d) + [f"train-mode layer `{x['path']}`: {x['type']}" for x in layers[:8]])
        return make_verdict("nondeterministic", True, policy.GENERAL, ["random", "compile"],
                        f"{where_text(d)} differs between eager and compiled runs, and the compiled region draws "
                        f"random numbers ({ops}): inductor's generator differs from eager's. Compare with "
                        "`torch._inductor.config.fallback_random = True`, or move random draws out of the compiled function.",
                        evidence_lines(d))
    return None


def _reseeded_draws(c: Comparison) -> str | None:
    """Where an eager arm's training-mode draws (dropout's masks) are one set of numbers drawn
    again after the script seeded the generator before each call: the seeding lines, said."""
    for run in c.arms:
        if run.mode != "eager":
            continue
        draws = [x for x in run.leaves if x.get("kind") == "random"
                 and str(x.get("op") or "").rstrip("_") in TRAINING_MODE_DRAWS]
        seeds = [x.get("seed") or {} for x in draws]
        if len(draws) >= 2 and len({(x.get("fingerprint") or {}).get("sha256") for x in draws}) == 1 \
                and all(s.get("line") is not None for s in seeds) \
                and len({(s.get("value"), s.get("draws")) for s in seeds}) == 1 and len({s["line"] for s in seeds}) > 1:
            lines = sorted({s["line"] for s in seeds})
            return f"`torch.manual_seed({seeds[0].get('value')})` at lines {', '.join(map(str, lines[:-1]))} and {lines[-1]}"
    return None


# Layers that draw random numbers on every call in training mode.
RANDOM_LAYERS = {"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "RReLU"}


def _random_layers_in_training(run: ArmRun) -> tuple[str, list[dict[str, Any]]] | None:
    """A module the arm called in training mode whose layers draw random numbers on every call
    (dropout): its variable name and those layers."""
    for o in run.observables:
        m = o.module or {}
        layers = [x for x in m.get("train_layers") or [] if x.get("type") in RANDOM_LAYERS]
        if m.get("training") and layers:
            return m.get("variable") or "the model", layers
    return None


# A script's own `.train()` call: a mode it chose, not one a model was left in.
EXPLICIT_TRAIN = re.compile(r"\.train\(\s*(True\s*)?\)")
# How worker/observe.py `training_layers` describes a batch norm's training-mode effect.
BATCH_STATISTICS = "normalizes with the batch's own statistics"
# Module-call settings (worker/observe.py `numerics_settings`) that only CUDA's kernels read.
CUDA_SETTINGS = {"cuda_matmul_tf32", "cudnn_tf32", "cudnn_benchmark", "autocast_cuda"}


def _repeated_call(c: Comparison, d: Divergence | None, agree: list[Ablation], source: str = "") -> Verdict | None:
    """One module, same weights, bit-identical input, called twice: why the answers differ."""
    if d is None or d.how != "repeat":
        return None
    (run, first), (_, later) = c.resolve(d.a), c.resolve(d.b)
    ma, mb = first.module or {}, later.module or {}
    name = ma.get("variable") or "the model"
    calls = f"{first.label} (line {first.line}) and {later.label} (line {later.line})"
    evidence = evidence_lines(d) + [f"both calls: module instance {ma.get('instance')}, weights unchanged, "
                               "bit-identical inputs"]
    layers = ma.get("train_layers") or mb.get("train_layers") or []
    if layers and ma.get("training") != mb.get("training") and EXPLICIT_TRAIN.search(source or "") \
            and all(x.get("effect", "").startswith(BATCH_STATISTICS) for x in layers):
        # The script put a batch norm in training mode itself and switched it between the calls:
        # it compares the two modes, which are two functions by design (training divides by
        # the batch's biased variance, eval by the running unbiased one: paths.py names the
        # √((n − 1)/n)), and "call .eval() before comparing" misses its question. A model left in
        # training mode by default is the testing-method slip, with that fix.
        return None
    if layers:
        listing = "; ".join(f"`{name}.{x['path']}` ({x['type']}) {x['effect']}" for x in layers[:4])
        modes = ""
        if ma.get("training") != mb.get("training"):
            modes = (f" The first call ran in {'training' if ma.get('training') else 'eval'} mode, the second in "
                     f"{'training' if mb.get('training') else 'eval'} mode.")
        return make_verdict("nondeterministic", True, policy.GENERAL, ["reproducibility"],
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
    on_cpu = run.device == "cpu"
    if on_cpu and any(k not in CUDA_SETTINGS for k in changed):
        # `set_float32_matmul_precision` flips CUDA's TF32 switches too, which move nothing on a CPU.
        changed = [k for k in changed if k not in CUDA_SETTINGS]
    if changed:
        lines = "; ".join(f"`{SETTING_NAMES.get(k, k + '={}').format(sa[k])}` → `{SETTING_NAMES.get(k, k + '={}').format(sb[k])}`"
                          for k in changed)
        tf32 = not on_cpu and any("tf32" in k or k == "float32_matmul_precision" for k in changed)
        bfloat16 = [note for note in reduced_matmul_notes(c) if note["arm"] == run.spec]
        why = ("Under the lower precision oneDNN computes this CPU's float32 matmuls from bfloat16 inputs (8-bit "
               "significands), so the products differ by bfloat16's rounding" if bfloat16 and on_cpu
               and "float32_matmul_precision" in changed else
               "Kernels pick different blocking and reduction orders for different settings, so the rounding differs")
        pinned = next((a for a in agree if a.supports == "expected-precision-mode"), None)
        shown = (f" With `{pinned.switch}` held for the whole script ({pinned.setting}) the two calls "
                 f"{agree_text(pinned)}." if pinned else "")
        how = (f"within {d.dtype} tolerance (max |diff| {d.max_abs_diff:.3g})" if d.within_tolerance
               else f"by {d.max_abs_diff:.3g}" if d.max_abs_diff is not None else "")
        return make_verdict("expected-precision-mode", True, policy.TF32 if tf32 else policy.GENERAL,
                        ["numerical", "reproducibility"] + (["tf32"] if tf32 else []),
                        f"`{name}` gives different outputs for the same input and weights in {calls} {how}, and the "
                        f"script changes a numerics setting between the calls: {lines}. {why}; PyTorch does "
                        f"not promise bitwise-identical results across such settings.{shown}",
                        evidence + [f"setting at the first call: {k}={sa[k]}; at the second: {k}={sb[k]}" for k in changed])
    if _different_references(first, later):
        # The same ops on the same inputs replay to the same float64 value: these calls computed
        # different things (a keyword argument, state the module keeps outside its parameters
        # and buffers), which the judgement of the two values decides, not nondeterminism.
        return None
    return make_verdict("nondeterministic", None, policy.GENERAL, ["reproducibility", "review"],
                    f"`{name}` gives different outputs in {calls} although the weights, the input bits and the "
                    "numerics settings are the same and no layer depends on training mode: a kernel is "
                    "nondeterministic run to run. Re-run with `torch.use_deterministic_algorithms(True)` "
                    "(arm knob `deterministic=on`) to find it.", evidence)


def _carried(c: Comparison, d: Divergence | None) -> Verdict | None:
    """The script compares two values where the one computed later starts from what the
    earlier one's computation left (`paths.carried_state`): a training step on the first
    output changed what the second is computed from, or a function wrote its argument in
    place, so its second call read the first one's writes. Not two computations of one
    quantity: the inputs differ, whatever the arithmetic does."""
    carried = (d.paths or {}).get("carried") if d is not None and d.source == "claim" and d.b is not None else None
    if not carried:
        return None
    first, later = (c.resolve(d.a)[1], c.resolve(d.b)[1]) if carried["later"] == "b" else \
        (c.resolve(d.b)[1], c.resolve(d.a)[1])
    if first.library_check is not None and first.library_check == later.library_check:
        # A check of torch's own computes both sides from inputs it perturbs in place and
        # writes back (`gradcheck`'s central differences): nothing carries from one to the other.
        return None
    # Where the two float64 values agree within the sides' rounding, what the first side's
    # computation left changed nothing the second computes from (a write put back: a saved
    # copy restored with `copy_`).
    measured = _float64_gap(c, d)
    if measured is not None and not (measured.gap > measured.limit).any():
        return None
    lines = [n for n in carried.get("lines") or [] if isinstance(n, int)]
    at = (f" (line {lines[0]})" if len(lines) == 1 else f" (lines {', '.join(map(str, lines))})") if lines else ""
    if carried["via"] == "value":
        cause = (f"{later.shown} is computed from {first.shown}: the script's own code between the two{at} uses "
                 f"{first.shown} to change what {later.shown} is computed from — a training step (`backward`, an "
                 "optimizer's `step`) or another update of the state they share")
        fix = ("compute both from one state: both before the update, or the second from a copy made before it "
               "(`copy.deepcopy(model)`)")
    else:
        cause = (f"`{carried['op']}`{at} writes its input in place, once in the computation of {first.shown} and "
                 f"again in that of {later.shown}, so the second starts from the tensor the first one wrote")
        fix = ("do not write the argument in place (`x = x - 0.5`, not `x.sub_(0.5)`), or give each call its own "
               "copy (`x.clone()`)")
    return make_verdict("nondeterministic", True, policy.GENERAL, ["reproducibility"],
                        f"The two sides of {where_text(d)} do not start from the same values: {cause}. This is a "
                        f"testing-method problem, not a numerical one. Fix: {fix}.",
                        evidence_lines(d) + [f"carried from the first side: via {carried['via']}"
                                             + (f", `{carried['op']}`" if carried.get("op") else "")
                                             + (f" at line(s) {', '.join(map(str, lines))}" if lines else "")])


def _different_references(a: Any, b: Any) -> bool:
    """Two observed values whose float64 replays differ beyond float64's own rounding: the two
    ran different computations. Not bitwise: one op sequence on the same inputs replays to
    float64 values that differ in the last bits where a kernel's order follows its buffers'
    addresses (MKL's float64 GEMM rounds with their alignment: two float64 runs of one LSTM
    loop differed so)."""
    ra, rb = a.reference_value, b.reference_value
    if ra is None or rb is None or np.shape(ra) != np.shape(rb):
        return False
    ra, rb = np.asarray(ra, dtype=np.float64), np.asarray(rb, dtype=np.float64)
    same = (ra == rb) | (np.isnan(ra) & np.isnan(rb))
    if bool(same.all()):
        return False
    finite = np.isfinite(ra) & np.isfinite(rb)
    if not bool((same | finite).all()):
        return True
    scale = max(float(np.abs(ra[finite]).max(initial=0.0)), float(np.abs(rb[finite]).max(initial=0.0)))
    return bool((np.abs(ra - rb)[finite & ~same] > FLOAT64_REPLAY_RTOL * scale).any())


# How far two float64 replays of one computation may part (relative to the value's largest
# element): a few thousand float64 roundings, far below any float32 difference of formula.
FLOAT64_REPLAY_RTOL = 1e-12


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
    return make_verdict("nondeterministic", True, policy.GENERAL, ["random", "reproducibility"],
                    f"The script runs the same computation twice — the calls at lines {first.call_line} and "
                    f"{later.call_line} — from the same inputs and weights, and {first.shown} (line {first.line}) "
                    f"differs between them ({d.a.summary} vs {d.b.summary}): each run consumes fresh random numbers "
                    f"from the global generator, `aten.{top.get('op')}` at line {top.get('line')}{how}. A "
                    "testing-method problem, not a numerical one. Fix: seed each run identically "
                    "(`torch.manual_seed(…)` before each, or a seeded `generator=` for the DataLoader and samplers).",
                    evidence_lines(d) + [f"random ops drawn in both runs: {ops}",
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
    return make_verdict("nondeterministic", True, policy.GENERAL, ["reproducibility"],
                    f"`{name}` gives different outputs for the same input and weights in {first.label} (line "
                    f"{first.line}) and {later.label} (line {later.line}) because its state changed in between: "
                    f"{cause}. The module computes with other statistics, not other rounding. Fix: keep `{name}` in "
                    "`eval()` for extra forward passes, or save and restore its `state_dict()` around them.",
                    evidence + [f"buffers changed between the calls: {', '.join(moved[:8])}"]
                    + [f"training-mode call between them: {o.label} (line {o.line})" for o in between[:2]])


def _ablated(c: Comparison, d: Divergence | None, agree: list[Ablation]) -> Verdict | None:
    """A switch under which the divergence disappears names its cause (and an ill-conditioned
    input, where there is one, says why that switch matters this much)."""
    if d is None or not agree:
        return None
    conditioned = ill_conditioning(c, d) if not d.within_tolerance else None
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
    return make_verdict(a.supports, True if a.supports == "expected-precision-mode" or knob == "fallback_random" else None,
                    section, labels,
                    f"{where_text(d)} differs between {pair_text(d)}{size}. With `{a.switch}` {on} — the sides "
                    f"{agree_text(a)}{' (so do they under ' + others + ')' if others else ''}. The difference comes from "
                    f"{CAUSES.get(knob, knob)}; PyTorch does not promise bitwise-identical results across such "
                    f"settings.{why_big} To get the same numbers, set `{a.setting}`.",
                    evidence_lines(d) + [f"ablation `{x.switch}` ({', '.join(x.arms)}): {x.outcome}, {x.detail}" for x in agree])


def _uninitialized_reads(completed: list[ArmRun]) -> Verdict | None:
    """Values that agree everywhere here but read bytes a `torch.empty` left uninitialized (the
    worker's NaN-filled replay): whatever those bytes held, every replay and every arm of this
    machine read alike, so agreement here says nothing of the reporter's run, or the next."""
    for run in completed:
        reads = [o for o in run.observables if o.uninitialized and o.kind != "final"]
        if reads:
            e = run.exception or {}
            failed = (f"; the script's own check at line {e['line']} failed on the bytes this run read"
                      if e.get("claim") and e.get("line") is not None else "")
            return _uninitialized(run, reads, ": this run's arms and its float64 replay read the same bytes, so they "
                                              f"agree with one another here{failed}, and another run's bytes give "
                                              "another value")
    return None


def _uninitialized_divergence(c: Comparison, d: Divergence | None) -> Verdict | None:
    """A diverging value that reads bytes a `torch.empty` left uninitialized: it differs by
    what those bytes held (a padded buffer summed whole), which no formula and no rounding
    decides, so neither "a different function" nor "outside its spread" is the cause."""
    found = [c.resolve(s) for s in (d.a, d.b) if s is not None] if d is not None else []
    reads = [(run, o) for run, o in found if o.uninitialized]
    if not reads:
        return None
    run = reads[0][0]
    return _uninitialized(run, [o for r, o in reads if r is run], ": the difference measures those bytes, not "
                                                                   "PyTorch's arithmetic")


def _uninitialized(run: ArmRun, reads: list[Observable], consequence: str) -> Verdict:
    leaf = next((x for x in run.leaves if x.get("kind") == "uninitialized" and x.get("index") in reads[0].ancestors
                 and x.get("op") and x.get("line")), None)
    made = f"`torch.{leaf['op']}` at line {leaf['line']}" if leaf else "an uninitialized allocation"
    # One expression read on each of several calls is named once, with its count.
    named: dict[tuple[str, int | None], int] = {}
    for o in reads:
        named[(o.shown, o.line)] = named.get((o.shown, o.line), 0) + 1
    shown = ", ".join(f"{label} (line {line}{f', {n} calls' if n > 1 else ''})"
                      for (label, line), n in list(named.items())[:3]) + (
        f" and {len(named) - 3} more" if len(named) > 3 else "")
    # The script's testing method, as for random draws: `torch.empty` promises no contents.
    return make_verdict(
        "nondeterministic", True, policy.GENERAL, ["reproducibility"],
        f"{shown} {'reads' if len(reads) == 1 else 'read'} memory that {made} leaves uninitialized: replayed "
        f"with those bytes made NaN, the value becomes NaN. What it holds is whatever those bytes held"
        f"{consequence}. Fill it first (`torch.zeros`, `torch.full`) or write every element before reading.",
        [f"`{run.spec}` {label} (line {line}{f', {n} calls' if n > 1 else ''}) depends on the uninitialized bytes"
         for (label, line), n in list(named.items())[:5]])


def _unseeded_runs(completed: list[ArmRun], source: str) -> Verdict | None:
    """The script seeds some runs of a random computation and not others (the article's
    'two seeded runs agree; an unseeded run does not'): one random site is drawn several
    times, some draws reproduced exactly by reseeding, another from a different generator
    state. The top-level call that made the odd draw is the unseeded run."""
    for run in completed:
        sites: dict[tuple, list[dict[str, Any]]] = {}
        for leaf in run.leaves:
            if leaf.get("kind") == "random" and leaf.get("seed") is not None:
                sites.setdefault(site_key(leaf), []).append(leaf)
        for leaves in sites.values():
            states = [state_key(x) for x in leaves]
            usual_state = max(set(states), key=states.count)
            if states.count(usual_state) < 2 or len(set(states)) < 2:
                continue
            usual = [x for x in leaves if state_key(x) == usual_state]
            odd = [x for x in leaves if state_key(x) != usual_state]
            leaf, seed_at = odd[0], usual[0]["seed"]
            where = (f"`torch.manual_seed({seed_at['value']})` at line {seed_at['line']}" if seed_at.get("line")
                     else "the start of the script")
            state = leaf["seed"]
            drift = (f"{state['draws'] - seed_at['draws']} random ops later than that" if state.get("line") == seed_at.get("line")
                     else f"from the generator as {'line ' + str(state['line']) if state.get('line') else 'triage'} seeded it")
            seeded_calls = sorted({x.get("call_line") for x in usual if x.get("call_line")})
            odd_calls = sorted({x.get("call_line") for x in odd if x.get("call_line")})
            code = code_at(source, odd_calls[0]) if odd_calls else ""
            printed = printed_mix(run, {x["index"] for x in usual}, {x["index"] for x in odd})
            return make_verdict(
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
            o = _checked_value(run, source, int(e["line"]), text)
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
            # An ulp of 0 is the smallest subnormal: a distance in them says nothing.
            away = (f"{abs(value - literal) / float(ulp(np.float64(literal), j.dtype)):.3g} ulp" if literal
                    else f"{abs(value):.3g}")
            singular = next((run.conditioning[i] for i in o.conditioning if i < len(run.conditioning)
                             and run.conditioning[i].get("singular") and "figure" not in run.conditioning[i]), None)
            matrix = (f" The matrix fed to `{singular['op']}` at line {singular['line']} is singular "
                      f"({cond_text(singular)}), so every digit of the value is rounding noise around that answer."
                      if singular else "")
            written = _written_leaves(run, o, "literal_rounding")
            if written:  # `torch.tensor(math.pi / 2)`: the input is π/2 rounded to the dtype
                lines = ", ".join(str(x["line"]) for x in written[:3] if x.get("line") is not None)
                worst = max(x["literal_rounding"] for x in written)
                matrix += (f" Its input{'s' if len(written) > 1 else ''} written as Python numbers"
                           f"{' at line' + ('s ' if len(written) > 1 else ' ') + lines if lines else ''} "
                           f"{'are' if len(written) > 1 else 'is'} not exactly representable in {j.dtype}: rounded by "
                           f"up to {worst:.2g} relatively before any op ran, which the float64 replay does not do.")
            return make_verdict(
                "expected-ill-conditioned" if singular else "expected-rounding", True,
                policy.LINALG if singular else policy.GENERAL, ["numerical"] + (["linalg"] if singular else []),
                f"The script's own check fails on `{run.spec}` at line {e['line']}: it compares `{text}` with the "
                f"literal {literal!r} using `{op}`. The value is {value!r} ({j.dtype}), {away} from "
                f"{literal!r}; the float64 replay of the same computation gives {j.reference:.10g}, and the value is "
                f"inside its own rounding spread (±{sigma:.2g}, p = {j.p or 0:.2f}). {literal!r} is the exact answer and "
                f"{j.dtype} rounding lands next to it: floating-point results are not promised to equal it "
                f"exactly.{matrix} Compare with a tolerance (`math.isclose(x, {literal!r}, rel_tol=...)`, "
                "`torch.isclose`), or where the exact value matters, set it (normalize by the computed total, clamp).",
                [f"`{run.spec}` {o.shown} (line {o.line}): {value!r}; float64 replay: {j.reference!r}; rounding spread "
                 f"±{sigma:.3g} at {j.precision_text} ({j.samples} samples)", f"the check: `{text} {op} {literal!r}`"]
                + ([cond_text(singular, full=True)] if singular else []))
    return None


def _outside_value(completed: list[ArmRun], source: str) -> Verdict | None:
    """The script's failing check compares a recorded value with one the script computed
    outside torch (`n = np.var(x.numpy())`, `p = sum(x.tolist())`, a float64 NumPy matmul):
    a value by other code, so the one check of the float64 replay that does not run the same
    kernels. Where it lies within the recorded value's rounding reach of that replay, and the
    recorded value is inside its own spread, the two are one quantity and the check fails by
    rounding. Where it lies beyond, the two sides compute different quantities, or torch's
    kernel is wrong in every precision: said, not decided (Bessel's correction named where the
    two variances' ratio is exactly N/(N − 1) for a count the value reduces)."""
    from triage.audit import directed_reach
    from triage.judge import judge_observable

    for run in completed:
        e = run.exception or {}
        if not e.get("claim") or e.get("line") is None or not run.check_operands:
            continue
        line = int(e["line"])
        # An operand's name is the worker's word: quoted only as the script's source spells it,
        # and only printable (a script may spell a terminal escape inside its check).
        spelled = " ".join(source.split())
        found = [(x, recorded_operand(run, x["value"], x["name"])) for x in run.check_operands
                 if "`" not in x["name"] and x["name"].isprintable() and x["name"] in spelled]
        outside = [x for x, held in found if held is None]
        # Only two sides the check expects equal (`t == n`, `abs(t - n) < 1e-5`,
        # `assert_allclose(t, n)`), never a measure and its bound (`err < tol`).
        equated = equated_pairs(source, line)
        for x, held in found:
            if held is None or not outside:
                continue
            o, sign, element = held
            j = judge_observable(run, o)
            ref = np.asarray(o.reference_value, dtype=np.float64)
            sig = np.asarray(o.spread.get("sig"), dtype=np.float64)
            if j.status != "judged" or j.zone not in ("inside", "envelope") or sig.shape != ref.shape:
                continue
            directed = directed_reach(o.spread, ref.shape)
            if element is not None:  # one number of the recorded value: its element's figures
                ref, sig, directed = (a.reshape(-1)[element].reshape(()) for a in (ref, sig, directed))
            rounding = policy.FRAGILE_MARGIN * sig + 2 * policy.unit_roundoff(j.dtype) * np.abs(ref)
            # Both sides as the recorded value's sign has them (a negated read-back: negated).
            x = dict(x, value=sign * x["value"])
            for y in outside:
                # One number against a one-element array (`t.numpy()` of shape (1,) and a float).
                y = dict(y, value=sign * (y["value"].reshape(ref.shape) if y["value"].size == ref.size == 1
                                          else y["value"]))
                other = y["value"]
                if frozenset((x["name"], y["name"])) not in equated:
                    continue
                finite = np.isfinite(ref)
                if other.shape != ref.shape or not finite.any() \
                        or not np.array_equal(other[~finite], ref[~finite], equal_nan=True) \
                        or not np.isfinite(other[finite]).all() or not (x["value"] != other)[finite].any():
                    continue
                gap = np.where(finite, np.abs(other - ref), 0.0)
                # The same quantity computed wider lies within the torch value's own rounding of
                # its float64 value (its inputs' rounding at the arm's dtype included); computed
                # at that dtype by other code (NumPy's float32 sum), within the directed replays'
                # reach too: its roundings, in its own order, are as large as torch's.
                reach = rounding + (directed if held_in(other, j.dtype) else 0.0)
                sides = (_operand_text(x, o, j, source, line, sign, element),
                         _operand_text(y, None, j, source, line))
                if (gap <= reach).all():
                    return _outside_agrees(run, line, x, y, o, j, ref, sig, gap, sides)
                return _outside_differs(run, line, x, y, o, j, ref, gap, reach, sides, source)
    return None


def _operand_text(x: dict[str, Any], o: Observable | None, j: Judgement, source: str, line: int,
                  sign: int = 1, element: int | None = None) -> str:
    """A check operand as the summary names it: torch's value (negated where the script negated
    it; one element of it), or one made outside torch."""
    if o is not None:
        value = (f"torch's {o.shown}" if o.name else f"torch's value read back by {o.label}")
        value = value if sign > 0 else f"minus {value}"
        value += f", element {element}" if element is not None else ""
        where = f"line {o.line}, " if o.line is not None else ""
        if o.shown == f"`{x['name']}`":
            return f"{value} ({where}{j.precision_text})"
        return f"`{x['name']}` ({value}, {where}{j.precision_text})"
    at = assigned_at(source, x["name"], line)
    code = code_at(source, at).strip().removeprefix("(").removesuffix(")") if at is not None else ""
    return (f"`{x['name']}`, which the script computes outside torch"
            + (f" (line {at}: {code})" if code else f" (line {at})" if at is not None else ""))


def _outside_agrees(run: ArmRun, line: int, x: dict[str, Any], y: dict[str, Any], o: Observable, j: Judgement,
                    ref: np.ndarray, sig: np.ndarray, gap: np.ndarray, sides: tuple[str, str]) -> Verdict:
    apart = np.abs(x["value"] - y["value"])
    i = int(np.nanargmax(np.where(np.isfinite(apart), apart, -1.0)))
    sigma = float(sig.reshape(-1)[i])
    at = f" (element {i}, where that spread is ±{sigma:.2g})" if apart.size > 1 else ""
    rtol, atol = policy.tolerance(j.dtype)
    written = _written_leaves(run, o, "literal_rounding")  # `torch.tensor([16777217.0])` in float32
    lines = ", ".join(str(w["line"]) for w in written[:3] if w.get("line") is not None)
    literal = (f" torch's value starts from numbers the script wrote in Python{f' (line {lines})' if lines else ''} "
               f"that {j.dtype} does not hold exactly: they were rounded by up to "
               f"{max(w['literal_rounding'] for w in written):.2g} relatively before any op ran." if written else "")
    wider = not held_in(y["value"], j.dtype) and j.dtype != "float64"
    advice = ("compute the torch side in float64 (`.double()`) where agreement with a float64 result is what "
              "matters" if wider else
              "two float64 computations of one value, their roundings taken in different orders, differ by this "
              "much" if j.dtype == "float64" else
              f"both sides hold {j.dtype} numbers: two {j.dtype} computations of one value, their roundings taken "
              "in different orders, differ by this much")
    return make_verdict(
        "expected-rounding", True, policy.GENERAL, ["numerical"],
        f"The script's own check fails on `{run.spec}` at line {line}: it compares {sides[0]} with {sides[1]}. "
        f"`{y['name']}` agrees with triage's float64 replay of torch's computation "
        + ("bit for bit" if not gap.any() else f"to within {float(gap.max()):.2g}") + f" — computed by other code, so here the replay is not vouching for its own kernels — and `{x['name']}` is "
        f"inside its own {j.precision_text} rounding spread around that replay ("
        + (f"±{sigma:.2g}, " if apart.size == 1 else "") + f"p = {j.p or 0:.2f}). The two differ by "
        f"{'up to ' if apart.size > 1 else ''}{float(apart.flat[i]):.3g}{at}: {j.dtype} rounding of one "
        f"quantity, and the check asks for closer agreement than {j.dtype} holds.{literal} Compare with a tolerance at "
        f"{j.dtype}'s precision (`torch.testing.assert_close` uses rtol {_short(rtol)}, atol {_short(atol)} for "
        f"{j.dtype}); "
        f"{advice}.",
        [f"`{run.spec}` {o.shown} (line {o.line}): {summarize(o.fingerprint)}; float64 replay: "
         f"{_first(ref)!r}{' (first element)' if ref.size > 1 else ''}; rounding spread ±{j.sigma or 0:.3g} at "
         f"{j.precision_text} ({j.samples} samples)",
         f"`{y['name']}` (outside torch): largest distance from the float64 replay {float(gap.max()):.3g}"])


def _outside_differs(run: ArmRun, line: int, x: dict[str, Any], y: dict[str, Any], o: Observable, j: Judgement,
                     ref: np.ndarray, gap: np.ndarray, reach: np.ndarray, sides: tuple[str, str], source: str
                     ) -> Verdict:
    with np.errstate(divide="ignore", invalid="ignore"):
        # Where no rounding reaches (an exact value), any gap is beyond it and none is not: a
        # -0.0 against a 0.0 is no element to quote.
        beyond = np.where(reach > 0, gap / reach, np.where(gap > 0, np.inf, 0.0))
    i = int(np.argmax(beyond))
    relative = float(gap.flat[i] / abs(ref.flat[i])) if ref.flat[i] else None
    bessel = _bessel_text(run, o, ref, y["value"], j)
    if x.get("one_change") and not bessel:
        changed = change_text(x["one_change"], f"`{x['name']}`", f"`{y['name']}`")
        # The one change to torch's ops that makes its float64 value the outside one (a
        # reduction's axis), found by the worker: the two sides compute different things, and
        # torch's kernel, changed so, computes the other side's value. (Bessel's correction is
        # a definition two libraries differ on, said as such below, not a slip.)
        return make_verdict(
            "likely-bug", False, policy.NONE, ["review"],
            f"The script's own check fails on `{run.spec}` at line {line}: it compares {sides[0]} with {sides[1]}. "
            f"They compute different things, not one quantity rounded twice: `{y['name']}` differs from triage's "
            f"float64 replay of torch's computation by {float(gap.flat[i]):.3g}, where rounding at {j.dtype} reaches "
            f"±{float(reach.flat[i]):.2g}.{changed}",
            [f"`{run.spec}` {o.shown} (line {o.line}): {summarize(o.fingerprint)}; rounding spread ±{j.sigma or 0:.3g} "
             f"at {j.precision_text} ({j.samples} samples)",
             f"`{y['name']}` (outside torch): {float(gap.flat[i]):.3g} from the float64 replay at element {i}"])
    explained = bessel or _factor_text(ref, y["value"], j, y["name"]) \
        or _definition_text(run, o, source) + _short_constant_text(source, relative)
    # Another order of the same float32 roundings reaches further than torch's replays (NumPy's
    # sequential float32 cumsum), but not by orders of magnitude.
    held = "" if explained or float(gap.flat[i]) > HELD_GAP * float(reach.flat[i]) else (f" `{y['name']}` holds only {j.dtype} numbers, so it was computed at {j.dtype} or coarser by code "
            "triage does not replay: its own rounding may account for part of the gap."
            if held_in(y["value"], j.dtype) else "")
    return make_verdict(
        "inconclusive", None, policy.NONE, ["review"],
        f"The script's own check fails on `{run.spec}` at line {line}: it compares {sides[0]} with {sides[1]}. "
        f"`{x['name']}` is inside its own {j.precision_text} rounding spread around triage's float64 replay "
        f"({_first(ref.flat[i:i + 1])!r}{f' at element {i}' if ref.size > 1 else ''}); `{y['name']}` differs from "
        f"that replay by {float(gap.flat[i]):.3g}" + (f" ({relative:.2g} relative)" if relative is not None else "")
        + f", where rounding of this computation at {j.dtype} reaches ±{float(reach.flat[i]):.2g}: not one quantity "
        "rounded twice. Either the two sides compute different things, or torch's kernel is wrong in every "
        "precision — the float64 replay runs the same kernels, so it cannot tell which; a maintainer should check "
        f"what `{y['name']}` computes.{explained}{held}",
        [f"`{run.spec}` {o.shown} (line {o.line}): {summarize(o.fingerprint)}; rounding spread ±{j.sigma or 0:.3g} "
         f"at {j.precision_text} ({j.samples} samples)",
         f"`{y['name']}` (outside torch): {float(gap.flat[i]):.3g} from the float64 replay at element {i}"])


# How far beyond the torch value's rounding reach an outside value held in torch's dtype may lie
# for its own rounding to be named as a possible part of the gap.
HELD_GAP = 64


def _short(x: float) -> str:
    """1.3e-6, not 1.3e-06."""
    return f"{x:g}".replace("e-0", "e-").replace("e+0", "e+")


def _first(a: np.ndarray) -> float:
    return float(np.asarray(a, dtype=np.float64).reshape(-1)[0])


def _factor_text(ref: np.ndarray, other: np.ndarray, j: Judgement, name: str) -> str:
    """Where the outside value is the recorded value's float64 replay times one constant, to
    the two sides' rounding: that constant, by name where it is one a formula is written with
    (ln 2 between a log2 and a natural log) or a whole number or its inverse; a ratio of one
    value to one other is named only then (any two numbers have a ratio)."""
    both = (ref != 0) & (other != 0) & np.isfinite(ref) & np.isfinite(other)
    if not both.any():
        return ""
    ratios = other[both] / ref[both]
    r = float(np.median(ratios))
    tolerance = 8 * policy.unit_roundoff(j.dtype)
    if abs(r - 1) <= tolerance or not np.allclose(ratios, r, rtol=tolerance, atol=0):
        return ""
    named = [(k, c) for k, c in NAMED_CONSTANTS.items()] + [(f"1/({k})" if " " in k else f"1/{k}", 1 / c)
                                                            for k, c in NAMED_CONSTANTS.items()]
    named += [(str(n), float(n)) for n in range(2, 65)] + [(f"1/{n}", 1 / n) for n in range(2, 65)]
    for label, c in named:
        for value, text in ((c, label), (-c, f"−{label}")):
            if abs(r - value) <= tolerance * abs(value):
                return (f" `{name}` is torch's value times exactly {text}"
                        + (" in every element" if ratios.size > 1 else "")
                        + ": a constant factor no rounding gives (a logarithm's base, a unit, a normalization, "
                          "a sign).")
    if ratios.size < 2:
        return ""
    return f" `{name}` is torch's value times {r:.6g} in every element: a constant factor, which no rounding gives."


def _short_constant_text(source: str, relative: float | None) -> str:
    """The floats the script writes that are a named constant short of its digits (0.7978 for
    √(2/π)), where the two sides differ, relative, by no more than SHORT_CONSTANT_REACH times
    that shortfall: said as a possibility (which side computes with it is the script's)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    if relative is None:
        return ""
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or type(node.value) is not float or not node.value:
            continue
        for label, c in NAMED_CONSTANTS.items():
            short = abs(abs(node.value) - c) / c
            if 0 < short <= NEAR_NAMED and relative <= SHORT_CONSTANT_REACH * short:
                text = ast.get_source_segment(source, node) or repr(node.value)
                found.append(f"line {node.lineno} writes {text} where {label} is {c:.10g}…, {short:.2g} short "
                             "(relative)")
    if not found:
        return ""
    return (f" Possibly a constant written short of its digits: {'; '.join(found[:2])} — a side computed with it "
            "moves by about as much, which no rounding undoes.")


# How far past a short constant's own relative shortfall the two sides' relative difference may
# be for that constant to be named as a possible cause (a formula may amplify it some).
SHORT_CONSTANT_REACH = 10


# What torch's op defines otherwise than NumPy's or Python's namesake, or than the formula a
# reference is often written with, by the recorded op or the call on torch's value's line: said
# as a possibility (what the other side computes is the script's, not recorded).
DEFINITIONS = {
    "round": "`torch.round` rounds a half to the nearest even integer (2.5 to 2, as `np.round` and Python 3's "
             "`round`), where `math.floor(x + 0.5)` and C's `round` take every half up or away from zero",
    "floor_divide": "`torch.floor_divide` and `//` round a quotient toward −∞ (-7 // 2 is -4, as Python's `//`), where C's "
             "and CUDA's integer division and `int(a / b)` truncate toward zero, as `torch.div(a, b, "
             "rounding_mode=\"trunc\")` does",
    "median": "`torch.median` returns the lower of the two middle values of an even count, where `np.median` and "
              "`statistics.median` average them (`torch.quantile(x, 0.5)` does too)",
    "nanmedian": "`torch.nanmedian` returns the lower of the two middle values of an even count, where "
                 "`np.nanmedian` averages them",
    "fmod": "`torch.fmod` keeps the dividend's sign (C's `fmod`, `np.fmod`), where `np.mod` and Python's `%` keep "
            "the divisor's, as `torch.remainder` does",
    "remainder": "`torch.remainder` keeps the divisor's sign (`np.mod`, Python's `%`), where `np.fmod` and "
                 "`math.fmod` keep the dividend's, as `torch.fmod` does",
    "quantile": "`torch.quantile` takes q in [0, 1] (`np.percentile` takes it in [0, 100]) and picks between the two "
                "nearest values as its `interpolation` argument says (linear by default, as NumPy's `method`): another "
                "q or another method selects another value",
    "nanquantile": "`torch.nanquantile` takes q in [0, 1] (`np.nanpercentile` takes it in [0, 100]) and picks "
                   "between the two nearest values as its `interpolation` argument says (linear by default, as "
                   "NumPy's `method`): another q or another method selects another value",
    "var": "`torch.var` divides by N − 1 by default (`correction=1`), where `np.var` divides by N (`ddof=0`)",
    "std": "`torch.std` divides by N − 1 by default (`correction=1`), where `np.std` divides by N (`ddof=0`)",
    "gelu": "`F.gelu` is the exact x·Φ(x), with erf, by default (`approximate=\"none\"`); the tanh formula "
            "0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) is `approximate=\"tanh\"`, a different function",
    "layer_norm": "`F.layer_norm` divides by √(var + eps) with the variance over the normalized dimensions divided by "
                  "N (biased, as `np.var`), where a hand-written one may divide by `std + eps` or use an unbiased "
                  "variance",
    "kl_div": "`F.kl_div(input, target)` takes `input` as log-probabilities and computes Σ target·(log target − "
              "input), the divergence of `exp(input)` from `target`; its default `reduction=\"mean\"` averages over "
              "every element, where the divergence per sample is `reduction=\"batchmean\"`",
    "histc": "`torch.histc` counts into 100 equal bins by default over [min, max] (the data's range where both are "
             "0), ignoring values outside it, where `np.histogram` defaults to 10 bins",
    "interpolate": "`F.interpolate` places samples by `align_corners=False` and does not antialias by default, where "
                   "other libraries (OpenCV, PIL, SciPy) may align corners or antialias when they resize",
}


def _definition_text(run: ArmRun, o: Observable, source: str) -> str:
    """What torch's op defines otherwise than the namesake the other side may have called: the
    op by its recorded node, or a call the script makes on torch's value's line (a composite
    op such as `quantile` is recorded by the ops it is made of); with the argument that picks
    the other definition where the script passes one (`interpolation="nearest"`)."""
    parts = (o.node or "").rstrip("_").split("_")
    ops = {"_".join(parts[:k]) for k in range(1, len(parts) + 1)}  # `floor_divide_default`: floor_divide
    calls = _calls_at(source, o.line)
    ops |= {callee(c) for c in calls}
    op = next((name for name in DEFINITIONS if name in ops), None)
    if op is None:
        return ""
    even = op.endswith("median") and not any(n % 2 == 0 for n in reduced_counts(run, o))
    if even:
        return ""
    chosen = [f"`{k.arg}={ast.get_source_segment(source, k.value) or ast.unparse(k.value)}`"
              for c in calls if callee(c) == op for k in c.keywords
              if k.arg in DEFINING_ARGUMENTS and isinstance(k.value, ast.Constant)
              and k.value.value != DEFINING_ARGUMENTS[k.arg]]
    passed = f" Torch's side passes {chosen[0]} (line {o.line})." if chosen else ""
    return f"{passed} A possible difference of definition: {DEFINITIONS[op]}."


# Arguments that choose another definition than NumPy's default, with torch's default.
DEFINING_ARGUMENTS = {"interpolation": "linear", "approximate": "none", "correction": 1, "unbiased": True,
                      "reduction": "mean", "align_corners": False}


def _calls_at(source: str, line: int | None) -> list[ast.Call]:
    """The calls of the statement at `line`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return [c for node in ast.walk(tree) if isinstance(node, ast.stmt) and not isinstance(node, BLOCKS)
            and line is not None and node.lineno <= line <= (node.end_lineno or node.lineno)
            for c in ast.walk(node) if isinstance(c, ast.Call)]


# Variances and deviations: torch's default divides by N − 1 (`correction=1`), NumPy's by N.
MOMENT_NODES = {"var": 1, "std": 2}  # the power of N/(N − 1) between the two definitions


def _bessel_text(run: ArmRun, o: Observable, ref: np.ndarray, other: np.ndarray, j: Judgement) -> str:
    """Where torch's value is a variance or deviation and the other side's ratio to it is
    exactly (N/(N − 1))^(1 or 1/2) for a count N of elements the value reduces, within the
    two sides' rounding: Bessel's correction, the usual difference between torch's `var`/`std`
    and NumPy's."""
    op = (o.node or "").split("_")[0]
    power = MOMENT_NODES.get(op)
    both = (ref != 0) & (other != 0) & np.isfinite(ref) & np.isfinite(other)
    if power is None or not both.any():
        return ""
    ratios = (ref[both] / other[both]) ** power
    r = float(np.median(ratios))
    if r == 1 or not np.allclose(ratios, r, rtol=8 * policy.unit_roundoff(j.dtype), atol=0):
        return ""
    torch_larger = r > 1
    n = r / (r - 1) if torch_larger else 1 / (1 - r)
    # The ratio is known to the two sides' rounding (a few units of the dtype): N = r/(r − 1)
    # to that times N².
    slack = 8 * policy.unit_roundoff(j.dtype) * n * n
    whole = round(n)
    if whole < 2 or slack >= 0.5 or abs(n - whole) > max(slack, 1e-6 * n) or whole not in reduced_counts(run, o):
        return ""
    how = ("torch's `{op}` divides by N − 1 by default (`correction=1`, Bessel's correction) and the other side by "
           "N, as NumPy's `np.{op}` does by default (`ddof=0`)" if torch_larger else
           "torch's `{op}` here divides by N (`correction=0`) and the other side by N − 1 (Bessel's correction: "
           "NumPy's `ddof=1`, pandas' default)").format(op=op)
    return (f" The {'two variances' if power == 1 else 'squares of the two deviations'} differ by exactly N/(N − 1) "
            f"for N = "
            f"{whole}, a count of elements the value reduces: {how}. That is most likely the whole difference; "
            "for one definition on both sides pass the same `correction` (torch) and `ddof` (NumPy).")


def _checked_value(run: ArmRun, source: str, line: int, text: str) -> Observable | None:
    """The one-element value the script's check at `line` reads as `text`: observed there
    under that expression, or (`re = z[0].real.item()`, then `assert re == 0.0`) the readback
    assigned to that name."""
    o = next((o for o in run.observables if o.line == line and o.name == f"`{text}`"
              and o.value is not None and np.asarray(o.value).size == 1), None)
    at = assigned_at(source, text, line) if o is None and text.isidentifier() else None
    return o or next((o for o in run.observables if at is not None and o.line == at and o.kind == "readback"
                      and o.value is not None and np.asarray(o.value).size == 1), None)


def threshold_by_rounding(runs: list[ArmRun], source: str) -> str:
    """Where the script's failing check bounds a measure (`assert err < 1e-6`, `if err > tol:
    raise`) that its float64 replay keeps within the bound, while the arm's value is inside
    its own rounding spread and the bound lies within that spread's reach of the float64
    value: the check asks for less than this computation's rounding leaves, and a sentence
    says so (why the reporter's assert fails, which the verdict's comparison alone does not)."""
    from triage.judge import judge_observable

    for run in runs:
        e = run.exception or {}
        if not e.get("claim") or e.get("line") is None:
            continue
        line = int(e["line"])
        for text, bound, sense in threshold_checks(source, line):
            o = _checked_value(run, source, line, text)
            if o is None:
                continue
            j = judge_observable(run, o)
            if j.status != "judged" or j.zone not in ("inside", "envelope") or j.reference is None or not j.sigma:
                continue
            value = float(np.asarray(o.value, dtype=np.float64).reshape(-1)[0])
            if not math.isfinite(value) or holds(value, sense, bound) or not holds(j.reference, sense, bound) \
                    or abs(bound - j.reference) > policy.FRAGILE_MARGIN * j.sigma:
                continue
            return (f" The script's check at line {line} (`{text} {sense} {bound:g}`) asks for less than this "
                    f"computation's rounding leaves: the float64 replay gives {j.reference:.3g}, rounding at "
                    f"{j.precision_text} moves it by ±{j.sigma:.2g} (σ of the replays), and the bound {bound:g} lies "
                    f"within that spread, as does the value here ({value:.3g}). A bound for this computation has to "
                    "allow its rounding.")
    return ""


def _difference_bound(c: Comparison, source: str) -> str:
    """Where the script's failing check bounds the difference of the two values the verdict
    compares (`abs(a.item() - b.item()) < 1e-4`) and their difference, rounding by the verdict,
    passes the bound: the check asks for closer agreement than that rounding leaves, and a
    sentence says so with the bound (a bfloat16 loss of 13.9 against its float32 value, within
    1e-4: bfloat16's spacing there is 0.0625)."""
    d = c.divergence
    if d is None or d.source != "claim" or d.b is None or d.max_abs_diff is None:
        return ""
    run = next((r for r in c.arms if r.spec == d.a.arm), None)
    e = (run.exception if run is not None else None) or {}
    if not e.get("claim") or e.get("line") is None:
        return ""
    line, sides = int(e["line"]), frozenset((d.a.label.strip("`"), d.b.label.strip("`")))
    for text, bound, sense in threshold_checks(source, line):
        try:
            measure = ast.parse(text.strip(), mode="eval")
        except SyntaxError:
            continue
        differences = {frozenset((ast.get_source_segment(text.strip(), n.left), ast.get_source_segment(text.strip(), n.right)))
                       for n in ast.walk(measure) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub)}
        if sense in ("<", "<=") and sides in differences and not holds(d.max_abs_diff, sense, bound):
            return (f" The script's check at line {line} (`{text} {sense} {bound:g}`) asks the two to agree within "
                    f"{bound:g}; they differ by {d.max_abs_diff:.3g}, which that rounding leaves: a bound for this "
                    "comparison has to allow it.")
    return ""


def _length_by_rounding(runs: list[ArmRun], source: str) -> Verdict | None:
    """The script's failing check reads the length (or shape) of a value made by an `arange`
    whose length rounding decided (`torch.arange(0.1, 0.4, 0.1)` has 4 elements: the worker's
    `range-length` note), or torch stops the script on a size mismatch at a line reading such a
    value: the script expects the length of exact arithmetic, which a floating step does not
    promise, as `torch.arange`'s documentation warns."""
    for run in runs:
        e = run.exception or {}
        if e.get("line") is None:
            continue
        if e.get("claim"):
            read = {f"`{text}`" for text in length_checks(source, int(e["line"]))}
            how, stop = "reads the length of", check_note(run)
        elif SIZE_MISMATCH.search(e.get("message") or ""):
            read = {f"`{name}`" for name in names_at(source, int(e["line"]))}
            how, stop = "reads", f"torch stopped the script at line {e['line']} ({e.get('type')}: {e.get('message')})"
        else:
            continue
        for o in run.observables:
            # A value at exit is its global's name (the arms that failed were not named by compare).
            name = o.name or (o.label.removesuffix(" at exit") if o.kind == "final" else None)
            note = next((run.conditioning[i] for i in o.conditioning if 0 <= i < len(run.conditioning)
                         and run.conditioning[i].get("kind") == "range-length"), None) if name in read else None
            if note is None:
                continue
            n, start, step, figure = (note.get(k) for k in ("exact_length", "start", "step", "figure"))
            if not (isinstance(n, int) and all(isinstance(x, (int, float)) for x in (start, step))
                    and isinstance(figure, str) and figure):
                continue  # the worker's note is untrusted output: its fields are checked before use
            call = code_at(source, note["line"]) if note.get("line") else ""
            last = start + (n - 1) * step
            return make_verdict(
                "expected-rounding", True, policy.GENERAL, ["numerical"],
                f"On `{run.spec}` {stop}: it {how} {name}, which comes from `aten.arange` at line "
                f"{note['line']}{call}. {figure[0].upper()}{figure[1:]}. That is the rounding of "
                "the range's arguments, not a kernel's error: `torch.arange`'s documentation warns that a "
                "non-integer step may give such a length. For a fixed number of points use `torch.linspace`, "
                f"here `torch.linspace({start:.6g}, {last:.6g}, {n})`, or a whole-number range scaled, "
                f"`torch.arange({n}) * {step:.6g} + {start:.6g}`.",
                [cond_text(note, full=True), f"line {e['line']} {how} {name}"])
    return None


def _not_reproduced(c: Comparison, completed: list[ArmRun], source: str) -> Verdict:
    n = sum(len(r.observables) for r in completed)
    if n == 0:
        return make_verdict("not-reproduced", None, policy.NONE, ["repro"],
                        "The script ran on every arm but never produced a tensor triage could observe "
                        "(no module output, no printed or compared tensor): there is nothing numerical to compare.")
    singular = [x for x in c.conditioning if x.get("singular") and "figure" not in x]
    nonfinite_ok = [(r, o) for r in completed for o in r.observables
                    if o.fingerprint and (o.fingerprint.get("nan") or o.fingerprint.get("posinf") or o.fingerprint.get("neginf"))
                    and set(o.conditioning) and any(r.conditioning[i].get("singular") for i in o.conditioning)]
    if len(completed) == 1 and singular and nonfinite_ok:
        run, o = nonfinite_ok[0]
        note = singular[0]
        return make_verdict("expected-ill-conditioned", True, policy.LINALG, ["numerical", "linalg"],
                        f"Only `{run.spec}` could run here. Its {o.shown} (line {o.line}) is {summarize(o.fingerprint)}, which agrees "
                        f"with the float64 reference: the matrix fed to `{note['op']}` at line {note['line']} is singular "
                        f"({cond_text(note)}). A finite value from another device is rounding noise.",
                        [cond_text(note, full=True)])
    exact = _nonfinite_in_exact_arithmetic(completed, source) or _wrapped_check(completed)
    if exact is not None:
        return exact
    same = identical_copies(completed[0])
    # An observed value from an ill-conditioned matrix agrees here, but may not on the
    # reporter's machine: said, with the accuracy note's linear-algebra section.
    feeding = [r.conditioning[i] for r in completed for o in r.observables for i in o.conditioning
               if 0 <= i < len(r.conditioning)]
    caveat, section = conditioning_caveat(feeding)
    # Integer arithmetic that wrapped agrees with its replay, which wraps alike: said, since a
    # report of such a value is usually about the wrap.
    wrapped = next((note for note in feeding if _wrapped(note)), None)
    caveat += f" An observed value reads integer arithmetic that wrapped: {wraparound_sentence(wrapped)}" if wrapped else ""
    evidence = [cond_text(note, full=True) for note in feeding if note.get("singular") or note.get("ill_conditioned")]
    if len(completed) == 1:
        off = (completed[0].reference or {}).get("status") == "off"
        agrees = (f"It ran without a float64 reference (--no-reference): its {n} observed values were not checked "
                  "against one" if off else f"Every one of its {n} observed values agrees with the float64 reference")
        return make_verdict("not-reproduced", None, section, ["repro"],
                        f"Only `{completed[0].spec}` ran. {agrees} and no comparison the script makes fails: nothing "
                        f"diverges here.{same}{caveat}", evidence[:3])
    checks = [r for r in completed if r.exception and r.exception.get("claim")]
    if not checks:
        return make_verdict("not-reproduced", None, section, ["repro"],
                        f"The arms agree bitwise on all {c.aligned} aligned observables and every comparison the "
                        f"script makes holds: the reported divergence does not reproduce here.{caveat}", evidence[:3])
    # The script's own check failed although the arms agree: it checks something true of
    # neither arm's values (often the reported wrong result itself, `assert torch.isinf(out)`).
    which = "every arm" if len(checks) == len(completed) else ", ".join(f"`{r.spec}`" for r in checks)
    return make_verdict("not-reproduced", None, policy.GENERAL, ["repro"],
                    f"The arms agree bitwise on all {c.aligned} aligned observables, but the script's own check "
                    f"fails on {which} ({check_note(checks[0])}): what it asserts holds for neither arm's values here. "
                    "Where it asserts the reported wrong result, the reported divergence does not reproduce here.")


def _wrapped_check(completed: list[ArmRun]) -> Verdict | None:
    """The script's own check fails on values that agree with their replay, and a value it
    reads comes from integer arithmetic that wrapped around (`integer-wraparound`: an int64
    cumprod of 1..21 goes negative): the check expects the exact result, which the script's
    dtype cannot hold. The script's computation overflows; no kernel is wrong."""
    for run in [r for r in completed if r.exception and r.exception.get("claim")]:
        claimed = [o for o in run.observables if o.kind == "claim"]
        for o in claimed or run.observables:
            note = next((run.conditioning[i] for i in o.conditioning if 0 <= i < len(run.conditioning)
                         and _wrapped(run.conditioning[i])), None)
            if note is None:
                continue
            return make_verdict(
                "likely-bug", False, policy.NONE, ["review"],
                f"On `{run.spec}` {check_note(run)}, and its {o.shown} (line {o.line}) comes from integer arithmetic "
                f"that wrapped: {wraparound_sentence(note)} The values are what the script's dtypes compute, so the "
                "check fails on the script's own overflow, not on a kernel's error: torch's integer arithmetic is "
                "modular by design.",
                [cond_text(note, full=True), f"`{run.spec}` {o.shown} (line {o.line}): {summarize(o.fingerprint)}"])
    return None


def _nonfinite_in_exact_arithmetic(completed: list[ArmRun], source: str) -> Verdict | None:
    """The script's own check fails on arms whose values agree with float64, and one of them
    is inf/nan in its float64 replay too, at as many elements, downstream of an op that reads
    its domain's edge exactly there (log of 0.0, whose -inf is the exact answer and mpmath's):
    the nonfinite values are what the program's operations give in exact arithmetic, which the
    check expects otherwise. A gradient of a script that masks (`torch.where`, `masked_fill`)
    gets the masking pitfall: autograd multiplies the branch the mask did not take by 0, and
    0 · ∞ is nan (not said of a plain `sqrt` at 0, whose +inf gradient is the exact answer)."""
    failed = [r for r in completed if r.exception and r.exception.get("claim")]
    for run in failed:
        # The values the check reads, where it names them (an `assert`'s operands); else any.
        claimed = [o for o in run.observables if o.kind == "claim"]
        for o in claimed or run.observables:
            counts = [(o.fingerprint or {}).get(k, 0) for k in NONFINITE_COUNTS]
            reference = ((o.reference or {}).get("fingerprint") or {})
            if not any(counts) or counts != [reference.get(k, 0) for k in NONFINITE_COUNTS]:
                continue
            edge = next((run.conditioning[i] for i in o.conditioning if 0 <= i < len(run.conditioning)
                         and run.conditioning[i].get("kind") == "domain" and run.conditioning[i].get("exact_edge")
                         and not run.conditioning[i].get("float64_disagrees")), None)
            if edge is None:
                continue
            which = " and ".join(f"{n} {k.replace('posinf', '+inf').replace('neginf', '-inf')}"
                                 for k, n in zip(NONFINITE_COUNTS, counts, strict=True) if n)
            gradient = (o.name or "").rstrip("`").endswith(".grad") and masks(source)
            pitfall = (" It is a gradient: where a `torch.where` (or a mask) drops a branch, autograd still "
                       "differentiates that branch and multiplies its gradient by 0, and 0 · ∞ is nan. Give the "
                       "function an input it is finite at instead, `torch.log(torch.where(x > 0, x, 1))`, "
                       "then select." if gradient else "")
            return make_verdict(
                "nonfinite-flip", True, policy.GENERAL, ["nonfinite", "numerical"],
                f"On `{run.spec}` {check_note(run)}, where its {o.shown} (line {o.line}) has {which} — and so does "
                f"the float64 replay of the same computation, at as many elements. At `aten.{edge['op']}` (line "
                f"{edge['line']}), {edge['figure']}. The non-finite values are what the program's own operations give "
                "in exact arithmetic, not rounding and not a kernel's error; the check expects what they do not "
                f"give.{pitfall}",
                [cond_text(edge, full=True),
                 f"`{run.spec}` {o.shown} (line {o.line}): {summarize(o.fingerprint)}; float64 replay: "
                 f"{summarize(reference)}"])
    return None


def _nonfinite_flip(c: Comparison, d: Divergence) -> Verdict:
    sides = [s for s in (d.a, d.b) if s is not None]
    wrong = [s for s in sides if s.agrees_with_reference is False and s.nonfinite_vs_reference]
    right = [s for s in sides if s.agrees_with_reference]
    singular = singular_upstream(c, d, nonfinite_side(d))
    evidence = evidence_lines(d)
    who = who_is_right(d, right, wrong)
    overflowed = [s for s in sides if s.overflow_to_inf and s.overflow_to_inf == s.nonfinite_vs_reference]
    if overflowed and not wrong:
        s = overflowed[0]
        return make_verdict("nonfinite-flip", True, policy.EXTREMAL, ["nonfinite", "numerical"],
                        f"{who} The float64 value ({s.reference_summary}) lies beyond the largest finite {s.dtype}, "
                        f"so `inf` is the correctly rounded {s.dtype} answer: expected range overflow, not a bug.",
                        evidence)
    if singular and "figure" in singular:
        section = policy.EXTREMAL if range_note(singular) else policy.GENERAL
        return make_verdict("nonfinite-flip", True, section, ["nonfinite", "numerical"],
                        f"{who} At `aten.{singular['op']}` (line {singular['line']}) {singular['figure']}, so a "
                        "non-finite value on one side is the input's doing, not a kernel's.",
                        evidence + [cond_text(singular, full=True)])
    if singular:
        return make_verdict("nonfinite-flip", True, policy.LINALG, ["nonfinite", "linalg"],
                        f"{who} The matrix fed to `{singular['op']}` at line {singular['line']} is singular "
                        f"({cond_text(singular)}), so the exact answer is not finite and any finite value is rounding noise.",
                        evidence + [cond_text(singular, full=True)])
    if not wrong and not right:
        return make_verdict("nonfinite-flip", None, policy.NONE, ["nonfinite", "review"],
                        f"{where_text(d)} is non-finite on one side only, and there is no float64 reference to say which "
                        "side is right.", evidence)
    return make_verdict("nonfinite-flip", False, policy.NONE, ["nonfinite", "silent", "review"],
                    f"{who} The input is well-conditioned and within range, so the accuracy note does not "
                    "cover this: likely a bug.", evidence + hazards(c, d))


def _rounding(d: Divergence) -> Verdict:
    if d.bit_difference == "signed-zero":
        return make_verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                        f"{where_text(d)}: {pair_text(d)} hold equal values that differ only in the sign of a zero "
                        f"({d.a.summary} vs {d.b.summary}). IEEE 754 defines -0 == +0; which sign a computation "
                        "ends with depends on the order of its operations, which the accuracy note does not fix.",
                        evidence_lines(d))
    if d.bit_difference == "nan-bits":
        return make_verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                        f"{where_text(d)}: {pair_text(d)} hold the same values with NaN in the same places; only the bits "
                        "of those NaNs (sign or payload) differ, which no comparison can observe.", evidence_lines(d))
    how = (f"within {d.dtype} tolerance (rtol={d.rtol:g}, atol={d.atol:g}; max |diff| {d.max_abs_diff:.3g}"
           + (f"; only through atol: {atol_hides(d)}" if d.hidden_by_atol is not None else "") + ")"
           if d.within_tolerance else f"by dynamo's float64 rule ({d.fp64_rule})")
    return make_verdict("expected-rounding", True, policy.GENERAL, ["numerical"],
                    f"{where_text(d)} differs between {pair_text(d)} {how}. Both are about equally close to the float64 "
                    "value: ordinary floating-point rounding, which the accuracy note does not guarantee bitwise.",
                    evidence_lines(d))


def _likely_bug(d: Divergence) -> Verdict:
    sides = [s for s in (d.a, d.b) if s is not None]
    far = [s for s in sides if s.agrees_with_reference is False]
    near = [s for s in sides if s.agrees_with_reference]
    if far and near:
        what = (f"`{far[0].arm}` {far[0].label} is far from the float64 value (max rel. error "
                f"{short_figure(far[0].max_rel_error)}) while `{near[0].arm}` {near[0].label} agrees with it")
    elif far:
        what = f"`{far[0].arm}` {far[0].label} is far from the float64 value (max rel. error {short_figure(far[0].max_rel_error)})"
    else:
        what = f"{pair_text(d)} differ beyond tolerance"
    return make_verdict("likely-bug", False, policy.NONE, ["silent", "review"],
                    f"{where_text(d)}: {what}. The input is well-conditioned and in range, so neither rounding nor an "
                    "ill-conditioned input explains it.", evidence_lines(d))
