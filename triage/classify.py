"""Stage 4: the verdict ladder.  The first rung that holds wins; each verdict names the
section of PyTorch's numerical accuracy note it rests on and suggests labels (never
``high priority``, never a close)."""
from __future__ import annotations

from typing import Any

from triage import policy
from triage.compare import summarize
from triage.model import ArmRun, Comparison, Divergence, Repro, Side, Verdict

KINDS = ("could-not-run", "crash-one-arm", "nondeterministic", "not-reproduced", "nonfinite-flip",
         "expected-rounding", "expected-precision-mode", "expected-ill-conditioned", "likely-bug")


def _verdict(kind: str, expected: bool | None, section: policy.Section, labels: list[str],
             summary: str, evidence: list[str] | None = None) -> Verdict:
    return Verdict(kind=kind, expected=expected, policy_section=section.title, policy_url=section.url,
                   labels=[policy.LABELS[k] for k in labels], summary=summary, evidence=evidence or [])


def classify(repro: Repro, comparison: Comparison | None) -> Verdict:
    if repro.problem is not None or comparison is None:
        return _verdict("could-not-run", None, policy.NONE, ["repro"],
                        f"triage could not run the script: {repro.problem}.")
    runs = [r for r in comparison.arms if r.status != "unavailable"]
    if not runs:
        why = "; ".join(f"{r.spec}: {r.failure}" for r in comparison.arms)
        return _verdict("could-not-run", None, policy.NONE, ["repro"], f"No arm could run on this machine ({why}).")
    completed = [r for r in runs if r.completed]
    failed = [r for r in runs if not r.completed]
    if not completed:
        return _could_not_run(failed)
    if failed:
        return _crash_one_arm(completed, failed)
    d = comparison.divergence
    rung = _nondeterministic(comparison, d)
    if rung is not None:
        return rung
    if d is None:
        return _not_reproduced(comparison, completed)
    if d.nonfinite_mismatch > 0:
        return _nonfinite_flip(comparison, d)
    if d.b is not None and d.within_tolerance:
        return _rounding(d)
    # Ill-conditioning explains more than "both arms are equally far from float64" does.
    conditioned = _ill_conditioning(comparison, d)
    if d.b is not None and not conditioned and (d.fp64_rule or "").startswith("pass"):
        return _rounding(d)
    if conditioned:
        return _verdict("expected-ill-conditioned", True, policy.LINALG, ["numerical", "linalg"],
                        f"{_where(d)} differs beyond tolerance, but it depends on {conditioned}. "
                        "On such inputs results may vary between devices and backends.", _evidence(d))
    return _likely_bug(d)


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
    if d.source == "claim" and d.b is not None and not differing:
        differing = _distinct_draws(c, d)
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


def _distinct_draws(c: Comparison, d: Divergence) -> list[dict[str, Any]]:
    """Within one arm, two operands computed from *different* random/uninitialized leaves of
    the same shapes (a fresh nn.Linear per call)."""
    run = next(r for r in c.arms if r.spec == d.a.arm)
    xa = next(o for o in run.observables if o.index == d.a.observable).ancestors
    xb = next(o for o in run.observables if o.index == d.b.observable).ancestors
    only_a = [run.leaves[i] for i in xa if i not in xb and i < len(run.leaves)]
    only_b = [run.leaves[i] for i in xb if i not in xa and i < len(run.leaves)]
    shapes_b = [(leaf["fingerprint"] or {}).get("shape") for leaf in only_b]
    out = []
    for leaf in only_a:
        shape = (leaf["fingerprint"] or {}).get("shape")
        if leaf["kind"] in ("random", "uninitialized") and shape in shapes_b:
            out.append({"index": leaf["index"], "kind": leaf["kind"], "op": leaf.get("op"),
                        "line": leaf.get("line"), "shape": shape, "differs": True})
    return out


def _not_reproduced(c: Comparison, completed: list[ArmRun]) -> Verdict:
    n = sum(len(r.observables) for r in completed)
    if n == 0:
        return _verdict("not-reproduced", None, policy.NONE, ["repro"],
                        "The script ran on every arm but never produced a tensor triage could observe "
                        "(no module output, no printed or compared tensor): there is nothing numerical to compare.")
    singular = [x for x in c.conditioning if x.get("singular")]
    nonfinite_ok = [(r, o) for r in completed for o in r.observables
                    if o.fingerprint and (o.fingerprint.get("nan") or o.fingerprint.get("posinf") or o.fingerprint.get("neginf"))
                    and set(o.conditioning) and any(r.conditioning[i].get("singular") for i in o.conditioning)]
    if len(completed) == 1 and singular and nonfinite_ok:
        run, o = nonfinite_ok[0]
        note = singular[0]
        return _verdict("expected-ill-conditioned", True, policy.LINALG, ["numerical", "linalg"],
                        f"Only `{run.spec}` could run here. Its {o.label} (line {o.line}) is {summarize(o.fingerprint)}, which agrees "
                        f"with the float64 reference: the matrix fed to `{note['op']}` at line {note['line']} is singular "
                        f"({_cond_text(note)}). A finite value from another device is rounding noise.",
                        [_cond_text(note, full=True)])
    if len(completed) == 1:
        return _verdict("not-reproduced", None, policy.GENERAL, ["repro"],
                        f"Only `{completed[0].spec}` ran. Every one of its {n} observed values agrees with the float64 "
                        "reference and no comparison the script makes fails: nothing diverges here.")
    return _verdict("not-reproduced", None, policy.GENERAL, ["repro"],
                    f"The arms agree bitwise on all {c.aligned} aligned observables and every comparison the "
                    "script makes holds: the reported divergence does not reproduce here.")


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
                    "cover this: likely a bug.", evidence)


def _rounding(d: Divergence) -> Verdict:
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
def _singular_upstream(c: Comparison, d: Divergence) -> dict[str, Any] | None:
    for s in (d.a, d.b):
        if s is None:
            continue
        run = next((r for r in c.arms if r.spec == s.arm), None)
        o = next((o for o in run.observables if o.index == s.observable), None) if run else None
        for i in (o.conditioning if o else []):
            if run.conditioning[i].get("singular") or run.conditioning[i].get("ill_conditioned"):
                return run.conditioning[i]
    return None


def _ill_conditioning(c: Comparison, d: Divergence) -> str | None:
    note = _singular_upstream(c, d)
    if note:
        return f"`{note['op']}` of a matrix with {_cond_text(note)} (line {note['line']})"
    over = [s for s in (d.a, d.b) if s is not None and s.overflow_to_inf]
    if over:
        return f"a value beyond the {over[0].dtype} range ({over[0].reference_summary} in float64)"
    return None


def _cond_text(note: dict[str, Any], full: bool = False) -> str:
    parts = []
    if note.get("exact_singular"):
        parts.append("determinant exactly 0 in rational arithmetic")
    if note.get("rank") is not None:
        parts.append(f"rank {note['rank']} of {note['order']}")
    if note.get("cond") is not None:
        parts.append(f"cond = {note['cond']:.3g}")
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
    what = {"arms": "between arms", "claim": "in the script's own comparison", "reference": "against float64"}[d.source]
    return f"{d.observable_label}{line} {what}"


def _pair(d: Divergence) -> str:
    if d.b is None:
        return f"`{d.a.arm}` and float64"
    if d.a.arm == d.b.arm:
        return f"{d.a.label} and {d.b.label} (arm `{d.a.arm}`)"
    return f"`{d.a.arm}` and `{d.b.arm}`"


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.3g}"


def _evidence(d: Divergence) -> list[str]:
    out = []
    for s in (d.a, d.b):
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
