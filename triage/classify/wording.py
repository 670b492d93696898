"""Stage 5's sentences: what each rung of the ladder says, and the evidence lines under it.

Everything here turns facts the ladder already decided on into text (the summary, the
evidence, the conditioning figure, the setter a script would call); nothing here chooses a
rung. `make_verdict` is the one place a Verdict is built.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import numpy as np

from triage import policy
from triage.classify.facts import (
    cancellation_sites,
    notes_upstream,
    settings_between,
    singular_upstream,
    torch_of,
    written_sites,
)
from triage.model import (
    Ablation,
    ArmRun,
    ArmSpec,
    Comparison,
    Divergence,
    Observable,
    ReportedArm,
    ReportedValue,
    Side,
    Verdict,
)
from triage.worker.knob_calls import SETTERS


def make_verdict(kind: str, expected: bool | None, section: policy.Section, labels: list[str],
             summary: str, evidence: list[str] | None = None) -> Verdict:
    return Verdict(kind=kind, expected=expected, policy_section=section.title, policy_url=section.url,
                   labels=[policy.LABELS[k] for k in labels], summary=summary,
                   evidence=list(dict.fromkeys(evidence or [])))  # a note two values share, once


def stopped_sentence(comparison: Comparison | None) -> str:
    """Where every arm raised after producing values, the verdict is on those values, and
    says where the script stopped."""
    runs = [r for r in (comparison.arms if comparison else []) if r.status != "unavailable"]
    if not runs or any(r.completed for r in runs) or not all(r.raised_after_values for r in runs):
        return ""
    first = runs[0]
    n = sum(1 for o in first.observables if o.kind != "final")
    return (f" The script did not finish: {'every arm' if len(runs) > 1 else f'`{first.spec}`'} stopped with "
            f"{first.failure}, after producing {n} value{'s' if n != 1 else ''}; those values are what is judged here.")


def releases_sentence(comparison: Comparison | None) -> str:
    """Which torch each arm ran, where the arms ran different releases: said in the verdict's
    summary, since what a release changed is the point of such a comparison."""
    if comparison is None:
        return ""
    releases = {r.spec: torch_of(r) for r in comparison.arms}
    if len(set(releases.values())) < 2:
        return ""
    return " Torch releases: " + ", ".join(f"`{spec}` ran {version}" for spec, version in releases.items()) + "."


def device_disagreement(reported: ReportedArm) -> str:
    """Where an arm of the reporter's device ran here too: the posted values it does not
    reproduce (a bug fixed since, another build) — evidence in itself."""
    differ = [v for v in reported.values if v.device_agrees is False]
    if not differ:
        return ""
    v = differ[0]
    return (f" The {reported.device} arm here prints `{v.device_here}` where they posted `{v.printed}`"
            f"{f' (and {len(differ) - 1} more)' if len(differ) > 1 else ''}: a bug fixed since, or another build "
            f"or device{f' (their torch {reported.torch})' if reported.torch else ''}.")


def posted_text(v: ReportedValue) -> str:
    where = f" (line {v.line})" if v.line else ""
    return f"{v.label or 'the value'}{where} = `{v.printed}` on their side (`{v.here}` here)"


def wrong_kernel_text(run: ArmRun, o: Observable, note: dict[str, Any], also: list[str]) -> str:
    shape = "×".join(map(str, note.get("shape") or []))
    where = f"`aten.{note['op']}` at line {note.get('line')} (`{run.spec}`, {shape} {note.get('dtype')})"
    if note.get("kernel_allowed"):
        text = (f"{where} returns rank {_num(note.get('kernel_value'))} where a correct driver returns "
                f"{_range(note['kernel_allowed'])} on the very input it was given, at its cutoff rcond = "
                f"{_num(note.get('kernel_cutoff'), 3)} ({note.get('independent')}, the backward error "
                f"{policy.INDEPENDENT_SAFETY:g}× its bound): the exact numerical rank there is "
                f"{_num(note.get('kernel_exact'))}.")
    else:
        text = (f"{where} returns {_num(note.get('kernel_value'))} where the exact answer on the very input it was "
                f"given is {_num(note.get('kernel_exact'))} ({note.get('independent')}): off by "
                f"{_num(note.get('kernel_error'), 2)} of the answer's scale, where a correct kernel at "
                f"{note.get('dtype')} stays within {_num(note.get('kernel_bound'), 2)} "
                f"({policy.INDEPENDENT_SAFETY:g}× the backward-stable bound, conditioning included).")
    text += f" {o.shown} (line {o.line}) depends on it and is far from the float64 value."
    if also:
        text += f" {', '.join(f'`{a}`' for a in also)} returns the same wrong answer: the arms share the kernel."
    if note.get("float64_disagrees") is True:
        off = (f"rank {_num(note.get('float64_value'))} where float64 allows {_range(note['float64_allowed'])}"
               if note.get("float64_allowed") else
               f"{_num(note.get('float64_error'), 2)} where float64 allows {_num(note.get('float64_bound'), 2)}")
        text += f" The float64 replay, which runs the same library, is off too ({off}): the reference continues from the exact answer."
    return text + " A kernel bug, shown by an independent computation, not rounding and not conditioning."


def _range(allowed: list[int]) -> str:
    low, high = allowed
    return f"rank {low}" if low == high else f"a rank from {low} to {high}"


def _num(x: Any, digits: int = 9) -> str:
    return f"{x:.{digits}g}" if isinstance(x, (int, float)) else str(x)


# The largest denominator of a ratio of whole numbers two single values are said to differ by.
SMALL_DENOMINATOR = 64


def difference_shape(a: np.ndarray, b: np.ndarray, names: tuple[str, str]) -> str:
    """A constant factor or a constant offset between the float64 values, where there is one."""
    if a.size == 1 and float(a.flat[0]) != 0 and float(b.flat[0]) != 0:
        # One value against one: any two have a ratio, but one within 1e-9 of a whole number
        # (a mean divided by the element count instead of the batch size) is no chance.
        ratio = float(a.flat[0]) / float(b.flat[0])
        for k, text in ((ratio, f"{names[0]} = {{k}} × {names[1]}"), (1 / ratio, f"{names[0]} = {names[1]} / {{k}}")):
            whole = round(k)
            if whole >= 2 and abs(k - whole) <= 1e-9 * k:
                return f", by a factor of exactly {whole}: " + text.format(k=whole)
        # Or a ratio of small whole numbers (a mean over all 32 targets where the loss averages
        # the 21 it does not ignore: 21/32), as little a chance within 1e-9.
        fraction = Fraction(ratio).limit_denominator(SMALL_DENOMINATOR)
        if fraction.denominator > 1 and fraction != 1 and 0 < abs(fraction.numerator) <= SMALL_DENOMINATOR ** 2 \
                and abs(ratio - float(fraction)) <= 1e-9 * abs(ratio):
            return (f", by a factor of exactly {fraction.numerator}/{fraction.denominator}: "
                    f"{names[0]} = {fraction.numerator}/{fraction.denominator} × {names[1]}")
        return ""
    if a.size >= 2:
        nonzero = (np.abs(b) > 0) & (np.abs(a) > 0)
        if nonzero.sum() >= 2:
            ratio = a[nonzero] / b[nonzero]
            mid = float(np.median(ratio))
            if abs(mid - 1) > 1e-3 and np.all(np.abs(ratio - mid) <= 1e-3 * abs(mid)):
                # A whole divisor said as one (a gradient of a mean over 32 rows: `b / 32`, not 0.03125 ×).
                # A ratio that underflowed (1e-300 / 1e300) has no divisor to say.
                inverse = 1 / mid if mid else math.inf
                divisor = round(inverse) if math.isfinite(inverse) else 0
                exact = (f"{names[1]} / {divisor}" if abs(divisor) >= 2 and abs(inverse - divisor) <= 1e-9 * abs(divisor)
                         else f"{mid:.6g} × {names[1]}")
                return (f", by a constant factor: {names[0]} = {exact} in every element"
                        if np.all(np.abs(ratio - mid) <= 1e-9 * abs(mid)) else
                        f", by a nearly constant factor: {names[0]} ≈ {mid:.6g} × {names[1]} "
                        f"({float(ratio.min()):.8g}–{float(ratio.max()):.8g})")
        offset = a - b
        mid = float(np.median(offset))
        if mid != 0 and np.all(np.abs(offset - mid) <= 1e-6 * max(abs(mid), 1e-300)):
            return f", by a constant offset: {names[0]} = {names[1]} + {mid:.6g} in every element"
        if _transposed(a, b):
            return (f", transposed: {names[0]} is {names[1]} with its last two dimensions swapped, in every element "
                    "(a matrix product's operands swapped or one transposed: (AᵀB)ᵀ = BᵀA)")
        shifted = _shift(a, b)
        if shifted is not None:
            x, y = (n.strip("`") for n in names)
            if len(shifted) == 1:
                (axis, step), = shifted
                along = "" if a.ndim == 1 else f" along dimension {axis}"
                return (f", shifted by one element{along}: `{x}[i] = {y}[i {'-' if step > 0 else '+'} 1]` wherever "
                        "both exist (an off-by-one index)")
            (axis, step), (axis2, step2) = shifted
            return (f", shifted by one element along dimensions {axis} and {axis2}: `{x}[i, j] = "
                    f"{y}[i {'-' if step > 0 else '+'} 1, j {'-' if step2 > 0 else '+'} 1]` wherever both exist (an "
                    "off-by-one index or padding on one side only, in both)")
    return ""


def _transposed(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether square matrices `a` and `b` (their last two dimensions) are each other's
    transposes, their float64 values equal to 1e-9 relative, and not symmetric."""
    if a.ndim < 2 or a.shape != b.shape or a.shape[-1] != a.shape[-2] or a.shape[-1] < 2:
        return False
    scale = float(np.abs(b).max())
    return not np.allclose(a, b, rtol=1e-9, atol=1e-12 * scale) and np.allclose(
        a, np.swapaxes(b, -1, -2), rtol=1e-9, atol=1e-12 * scale)


# Shifts along two axes at once are tried on values up to this size (a pass over the value each).
PAIRED_SHIFT_ELEMENTS = 1 << 20


def _shift(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int]] | None:
    """[(axis, +1)] where a[i] = b[i - 1] along an axis, [(axis, -1)] where a[i] = b[i + 1], or
    two such along two axes at once (an image padded on one side only: a[i, j] = b[i + 1, j + 1]);
    the float64 values equal to 1e-9 relative (two orders of one sum differ far less), at least
    three elements along each axis and not a constant."""
    if a.shape != b.shape:
        return None
    axes = [axis for axis in range(a.ndim) if a.shape[axis] >= 3]
    pairs = [] if a.size > PAIRED_SHIFT_ELEMENTS else [
        [(p, sp), (q, sq)] for p, q in itertools.combinations(axes, 2) for sp in (1, -1) for sq in (1, -1)]
    for shifts in [[(axis, step)] for axis in axes for step in (1, -1)] + pairs:
        x, y = a, b
        for axis, step in shifts:
            n = a.shape[axis]
            x = np.take(x, range(1, n) if step > 0 else range(n - 1), axis=axis)
            y = np.take(y, range(n - 1) if step > 0 else range(1, n), axis=axis)
        if np.ptp(y) > 0 and np.allclose(x, y, rtol=1e-9, atol=1e-12 * float(np.abs(y).max())):
            return shifts
    return None


# What the accuracy note's batched section makes of one side computed over the whole batch and
# the other per slice: where the float64 values agree, the difference it allows; where they
# differ, not the cause (a wrong `in_dims`, a missing transpose).
BATCHED_ALLOWS = ": the accuracy note's \"Batched computations or slice computations\" says the two need not agree bitwise"
BATCHED_NOT_THE_CAUSE = (". Batching changes only how a value rounds (the accuracy note's \"Batched computations or "
                         "slice computations\"), not its float64 value, which differs here: the difference is in what "
                         "one of the two computes, not in the batching")


def parting_text(paths: dict[str, Any], names: tuple[str, str], functions_differ: bool = False,
                 largest: float | None = None) -> str:
    """Where two sides' op graphs part, and what the parting tells (`triage.paths.part_ways`);
    `functions_differ`: their float64 replays differ beyond rounding; `largest`: the largest
    magnitude the sides hold, which an integer cast's exact limit is said against."""
    if not paths:
        return ""
    parts = []
    for key, name in (("only_a", names[0]), ("only_b", names[1])):
        if paths.get(key):
            parts.append(f"{name} computes {ops_text(paths[key], paths.get(key + '_count'), 3)}")
    both = paths.get("on_both") or []
    also = (f" (both call {', '.join(f'`{t}`' for t in both[:3])}, each on inputs the other's call does not have)"
            if both else "")
    text = (" Where they part: " + "; ".join(parts) + f", with no counterpart on the other side{also}.") if parts else ""
    cast = paths.get("integer_cast") or {}
    hints = ([cast["text"]] if largest is not None and cast.get("limit") and largest > cast["limit"] else []) \
        + list(paths.get("hints") or [])
    if paths.get("batched"):
        hints.append(paths["batched"] + (BATCHED_NOT_THE_CAUSE if functions_differ else BATCHED_ALLOWS))
    return text + "".join(f" {h}." for h in hints)


def ops_text(ops: list[dict[str, Any]] | None, count: int | None, limit: int = 6) -> str:
    listed = ", ".join(f"`{o['op']}` (line {o['line']})" for o in (ops or [])[:limit])
    more = (count or 0) - min(len(ops or []), limit)
    return listed + (f" and {more} more" if more > 0 else "")


def cancellation_site(c: Comparison, d: Divergence) -> str | None:
    sites = cancellation_sites(c, d)
    if not sites:
        return None
    # The site losing the most, whichever side it is on (a manual distance's exact difference
    # beside cdist's matmul path, which loses more).
    # A subtraction or addition the script's values go through is named before a function
    # found ill-conditioned at its inputs (`written_sites`).
    written = written_sites(c, d) or sites
    # A difference exactly 0 at every element (`row - mean` where the mean is that row: a
    # first running update) loses "every digit" of nothing: another site, losing digits at
    # typical elements, says more of what the value keeps.
    top = max(written, key=lambda site: (not _zero_everywhere(site), float(site.get("digits_lost") or 0.0)))
    lost = top["digits_lost"]
    lost = "every digit" if lost in ("inf", float("inf")) else f"{float(lost):.1f} digits"
    if top.get("kind") == "absorbs":
        return f"`{top['op']}` at line {top['line']} rounds away {lost} of its smaller operand before a logarithm reads it"
    if top.get("kind") == "amplifies":
        return (f"`{top['op']}` at line {top['line']} is ill-conditioned at its inputs: its result is far smaller than "
                f"they are, so their rounding reaches it amplified, losing {lost}")
    said = f"`{top['op']}` at line {top['line']} cancels its operands, losing {lost}"
    typical = top.get("typical_digits_lost")
    if not isinstance(typical, (int, float)):
        return said
    if top["digits_lost"] in ("inf", float("inf")):
        # Exactly 0 at a few elements: what the value keeps a trace of is the others' loss.
        return f"{said} where they are equal and {typical:.1f} digits at a typical element"
    if float(top["digits_lost"]) - typical >= 1:
        return f"{said} at its worst element and {typical:.1f} at a typical one"
    return said


def _zero_everywhere(site: dict) -> bool:
    """A cancellation note whose difference is 0 at every element (no typical loss)."""
    return site.get("kind") == "cancels" and site.get("digits_lost") in ("inf", float("inf")) \
        and "typical_digits_lost" in site and site["typical_digits_lost"] is None


def cancellation_hint(c: Comparison, d: Divergence) -> str:
    """A textbook rewrite for a cancelling formula the sides' graphs contain."""
    texts = []
    for site in cancellation_sites(c, d):
        if site.get("hint") and site["hint"] not in texts:
            texts.append(site["hint"])
    return (" " + " ".join(texts)) if texts else ""


def unstable_lines(js: list) -> list[str]:
    return [f"decision unstable under rounding (`{j.arm}` {j.label}): {u}" for j in js for u in j.unstable][:4]


def unmeasured_lines(js: list) -> list[str]:
    """The library ops whose kernel error no measurement covers: the spread used the
    conservative bound for them, which a verdict resting on it must say."""
    ops = sorted({op for j in js for op in j.unmeasured})
    lines = []
    for wide in (False, True):  # a float64 kernel is "aten.sin (float64)": calibrate measures none
        these = [op for op in ops if op.endswith(")") == wide]
        if not these:
            continue
        shown = ", ".join(f"`{op.partition(' (')[0]}`" for op in these[:6]) + (
            f" and {len(these) - 6} more" if len(these) > 6 else "")
        it = "it" if len(these) == 1 else "them"
        lines.append(f"no measured float64 kernel error for {shown} (triage measures float32, float16 and bfloat16 "
                     f"kernels): the simulation gave {it} a conservative {policy.UNMEASURED_U:g} u bound, "
                     f"{policy.UNMEASURED_U * 2.0 ** -53:.1g} of each result" if wide else
                     f"no measured kernel error for {shown} at this release, device and dtype: the simulation gave "
                     f"{it} a conservative {policy.UNMEASURED_U:g} u bound (`triage calibrate` measures the kernels of "
                     "this machine)")
    return lines


def digits_text(js: list) -> str:
    same_arm = len({j.arm for j in js}) < len(js)
    parts = [f"{j.label if same_arm else '`' + j.arm + '`'} keeps {j.digits:.1f} significant digits at {j.precision_text}"
             for j in js if j.digits is not None and not j.computational_zero and not policy.discrete(j.dtype)]
    return (" (" + "; ".join(parts) + ")") if parts else ""


def atol_hides(d: Divergence) -> str:
    """How far apart relatively two values are that meet the tolerance only through its atol."""
    x = d.hidden_by_atol or 0.0
    return f"relatively {x:.0%} apart" if x >= 0.01 else f"relatively {x:.2g} apart"


def difference_text(d: Divergence) -> str:
    if d.b is None:
        return f"is {d.a.summary} on `{d.a.arm}` where float64 gives {d.a.reference_summary or 'no value'}"
    if d.max_abs_diff is None:
        return f"differs between {pair_text(d)}"
    if policy.discrete(d.dtype) and d.differing is not None:  # indices or counts: which, not how far
        return f"differs between {pair_text(d)} in {d.differing} of {d.numel} elements ({d.dtype}: compared exactly)"
    tol = f"within {d.dtype} tolerance" if d.within_tolerance else f"beyond {d.dtype} tolerance"
    if d.hidden_by_atol is not None:
        tol = f"within {d.dtype} tolerance only through its absolute term, atol={d.atol:g}: {atol_hides(d)}"
    # A value computed at float32 and held in float64 (`y32.double()`): the tolerance is the
    # dtype the values are held in, not the precision they carry.
    narrower = [j for j in d.judgements if j.stored and j.stored != j.dtype]
    if narrower and not d.within_tolerance:
        tol += (f", the dtype both are held in; {narrower[0].label} was computed at {narrower[0].dtype}"
                if len({j.label for j in d.judgements}) > 1 else f"; it was computed at {narrower[0].dtype}")
        tol += _check_finer_than_computed(d, narrower[0].dtype)
    return f"differs between {pair_text(d)} by {d.max_abs_diff:.3g} ({tol}{asked_text(d)})"


def _check_finer_than_computed(d: Divergence, computed: str) -> str:
    """Where the script's failing check asks for a relative tolerance below the unit roundoff
    of the precision a side was computed at (a float16 `std` cast to float32 and checked with
    rtol=1e-5; a bfloat16 group norm cast back and checked at `assert_close`'s float32
    defaults, which it takes from the dtype the values are held in): said, with that
    precision's own `assert_close` tolerance."""
    u = policy.unit_roundoff(computed)
    if d.claim_tolerance:
        if not d.fails_asked:
            return ""
        rtol, whose = d.claim_tolerance["rtol"], f"the check's rtol={d.claim_tolerance['rtol']:g}"
    elif d.how == "torch.testing.assert_close":
        rtol, atol = policy.tolerance(d.dtype)
        whose = f"the check's rtol={rtol:g} (`assert_close`'s {d.dtype} default, from the dtype the values are held in)"
    else:
        return ""
    if not rtol or rtol >= u or computed not in policy.TOLERANCES:
        return ""
    own_rtol, own_atol = policy.tolerance(computed)
    return (f": {whose} is below {computed}'s unit roundoff, {u:.2g}, which no {computed} result is promised to meet "
            f"(`assert_close`'s {computed} tolerance is rtol={own_rtol:g}, atol={own_atol:g})")


def asked_text(d: Divergence) -> str:
    """Where the script's check asks for a tolerance tighter than what the values' dtype can
    hold and fails on values within that dtype's tolerance: said, since that check, not the
    values, is what fails. A relative tolerance below the unit roundoff (rtol=1e-8 of float32
    values, whose unit roundoff is 6e-8) no computation at that precision is promised to meet;
    one tighter than `assert_close`'s defaults (rtol=1e-6, atol=1e-7 of a float32 sum whose
    terms cancel) fails where the defaults, which allow for such sums, pass."""
    asked = d.claim_tolerance
    if not asked or not d.within_tolerance or policy.discrete(d.dtype) or d.max_abs_diff is None:
        return ""
    u = policy.unit_roundoff(d.dtype)
    own = f"; not within the script's own rtol={asked['rtol']:g}, atol={asked['atol']:g}"
    if asked["rtol"] < u:
        return f"{own}: that rtol is below {d.dtype}'s unit roundoff, {u:.2g}, which no {d.dtype} result is promised to meet"
    rtol, atol = policy.tolerance(d.dtype)
    if d.fails_asked and (asked["rtol"] < rtol or asked["atol"] < atol):
        return (f"{own}, tighter than `assert_close`'s {d.dtype} defaults (rtol={rtol:g}, atol={atol:g}), which it "
                "meets: the check asks for more than its dtype's computations are held to")
    return ""

SETTING_NAMES = {"num_threads": "torch.set_num_threads({})", "deterministic": "torch.use_deterministic_algorithms({})",
                 "mkldnn": "torch.backends.mkldnn.enabled = {}",
                 "float32_matmul_precision": "torch.set_float32_matmul_precision({!r})",
                 "cuda_matmul_tf32": "torch.backends.cuda.matmul.allow_tf32 = {}",
                 "cudnn_tf32": "torch.backends.cudnn.allow_tf32 = {}", "cudnn_benchmark": "torch.backends.cudnn.benchmark = {}",
                 "default_dtype": "torch.set_default_dtype({})",
                 "autocast_cpu": "autocast(\"cpu\", dtype={})", "autocast_cuda": "autocast(\"cuda\", dtype={})"}

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


def agree_text(a: Ablation) -> str:
    return "agree bitwise" if a.outcome == "agree-bitwise" else f"agree within tolerance ({a.detail})"


def code_at(source: str, line: int) -> str:
    lines = source.splitlines()
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return f" (`{text}`)" if text and len(text) <= 120 else ""


def printed_mix(run: ArmRun, usual: set[int], odd: set[int]) -> str:
    """A value the script prints that depends on both kinds of draw, when ancestry shows one."""
    for o in run.observables:
        if o.kind in ("readback", "claim") and set(o.ancestors) & usual and set(o.ancestors) & odd:
            return f" ({o.shown} at line {o.line} compares the two)"
    return ""


def wraparound_sentence(note: dict[str, Any]) -> str:
    """An integer op that wrapped around (`integer-wraparound` note: the arm's output, read
    with `.get`, as a forged note may lack a field), with the fix."""
    fix = ("Compute in floating point (`x.double()`), which holds such magnitudes to 16 digits, or in Python "
           "integers, which do not overflow" if note.get("dtype") == "int64" else
           "Compute in a dtype wide enough for the exact result before that op (`x.to(torch.int64)`, "
           "`x.sum(dtype=torch.int64)`)")
    return (f"`aten.{note.get('op')}` at line {note.get('line')} overflows {note.get('dtype')}: {note.get('figure')}. "
            f"{fix}.")


def check_note(run: ArmRun) -> str:
    e = run.exception or {}
    return run.exit_note or f"{e.get('type')} at line {e.get('line')}"


def identical_copies(run: ArmRun) -> str:
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
            # On an arm without CUDA, the script's CUDA calls ran on its CPU: a "GPU" value
            # here was computed on the CPU, not moved there (new user m24).
            why = ("" if not moved else ": moving a tensor between devices copies its bits exactly"
                   if run.device.startswith("cuda") else
                   f": both were computed on `{run.spec}` (the script's CUDA calls ran there), so this says nothing "
                   "of what a GPU computes")
            return f" {names} are bit-identical ({'×'.join(map(str, shape))} {dtype}){why}."
    return ""


def hazards(c: Comparison, d: Divergence) -> list[str]:
    """Hazards upstream that do not make the input ill-conditioned but point at how an
    implementation can fail on it (acosh's x² overflowing in the textbook formula)."""
    out: list[str] = []
    for note in notes_upstream(c, d):
        text = cond_text(note, full=True) if "figure" in note and not note.get("ill_conditioned") else None
        if text and text not in out:
            out.append(text)
    return out[:3]


def ill_conditioning(c: Comparison, d: Divergence) -> str | None:
    note = singular_upstream(c, d)
    if note and "figure" in note:
        return f"`aten.{note['op']}` at line {note['line']}, where {note['figure']}"
    if note:
        return f"`{note['op']}` of a matrix with {cond_text(note)} (line {note['line']})"
    over = [s for s in (d.a, d.b) if s is not None and s.overflow_to_inf]
    if over:
        return f"a value beyond the {over[0].dtype} range ({over[0].reference_summary} in float64)"
    return None


# The arm's numerics flags (worker/envinfo.py) that kernels choose their blocking and
# reduction order by, as SETTING_NAMES names them.
ORDER_FLAGS = {"num_threads": "num_threads", "mkldnn_enabled": "mkldnn", "deterministic_algorithms": "deterministic",
               "float32_matmul_precision": "float32_matmul_precision", "cuda_matmul_allow_tf32": "cuda_matmul_tf32",
               "cudnn_allow_tf32": "cudnn_tf32"}


# Op names (as a substring of `aten.NAME`) whose kernels add terms: where the parting ops
# include one, the order of additions is the likely reason two computations round apart.
ADDING_OPS = ("add", "sub", "sum", "mean", "mm", "matmul", "dot", "conv", "var", "std", "norm", "softmax",
              "logsumexp", "linear", "einsum", "lerp", "cumsum", "cumprod", "prod", "bincount", "histc",
              "quantile", "median", "trapz", "trapezoid", "scatter", "index_add", "embedding_bag", "loss")


def _why_orders_differ(paths: dict[str, Any]) -> str:
    """Why other operations round apart: additions in another order where either side adds
    terms, else each op's own rounding, made in other places (a round-half of a product, a
    branch cut's side): "addition is not associative" read as a stock phrase there."""
    listed = (paths.get("only_a") or []) + (paths.get("only_b") or [])
    complete = len(listed) >= (paths.get("only_a_count") or 0) + (paths.get("only_b_count") or 0)
    names = [str(o.get("op", "")).split(".")[1 if "." in str(o.get("op", "")) else 0] for o in listed]  # aten.NAME.overload
    if not complete or any(word in name for name in names for word in ADDING_OPS):
        return "floating-point addition is not associative"
    return "each operation rounds its own result, and the two sides round at different steps"


def rounding_cause(d: Divergence, run: ArmRun | None, runs: list[ArmRun] = ()) -> str:
    """Why two values the script compares, both rounding of their own computation, round
    apart: another precision, other operations for one value (where the op graphs part), or
    the same operations under a numerics setting the script changes while it runs. Empty
    where none of these shows."""
    a, b = d.a, d.b
    if b is None:
        return ""
    if d.source == "arms":
        return _arms_cause(a.arm, b.arm, runs)
    if d.source != "claim":
        return ""
    (low_bits, low, coarse), (high_bits, high, fine) = sorted(
        ((policy.FLOAT_FORMATS.get(p, (0, 0))[0], p, x) for x in (a, b) for p in [computed_at(d, x)]),
        key=lambda t: t[0])
    if low != high and low_bits and high_bits:
        return (f" The two are computed at different precisions ({coarse.label} in {low}, {fine.label} in "
                f"{high}): their difference is {low}'s rounding ({low_bits}-bit significand).")
    paths = d.paths or {}
    same_ops = paths.get("precisions")
    if same_ops:
        (low_bits, low, coarse), (_, high, fine) = sorted(
            ((policy.FLOAT_FORMATS.get(same_ops[k], (53, 0))[0], same_ops[k], x) for k, x in (("a", a), ("b", b))),
            key=lambda t: t[0])
        return (f" The two are the same operations at different precisions ({coarse.label} computed in {low}, "
                f"{fine.label} in {high}): their difference is {low}'s rounding ({low_bits}-bit significand), not "
                "a different formula.")
    if paths.get("only_a") or paths.get("only_b"):
        return (" Their float64 replays agree within their rounding spreads: the two are one value computed by "
                f"different operations, which round differently ({_why_orders_differ(paths)})."
                + parting_text(paths, (a.label, b.label), largest=_largest_held(run, d)))
    compiled = [(s, o.compiled_line) for s in (a, b) if run is not None
                for o in run.observables if o.index == s.observable and o.compiled_line is not None]
    if len(compiled) == 1:
        side, line = compiled[0]
        other = b if side is a else a
        return (f" {side.label} comes through the `torch.compile`d call at line {line}, which runs the captured graph "
                f"as its backend compiled it ({_fused_rounding(computed_at(d, side))}); {other.label} is computed by "
                "eager operations.")
    between = settings_between(run, d)
    if between is not None:
        calls, line_a, line_b = between
        shown = ", ".join(f"`{SETTERS[c['setter']][1].format(c['value'])}` at line {c['line']}" for c in calls)
        return (f" The same operations on the same inputs, but the script changes a numerics setting between them: "
                f"{shown}, after {a.label if line_a < line_b else b.label} (line {min(line_a, line_b)}) and before "
                f"{b.label if line_a < line_b else a.label} (line {max(line_a, line_b)}). Kernels split and order their "
                "work by it (a reduction's order, a convolution's algorithm), which can make the same operations "
                "round differently.")
    start, end = (run.flags_start or {}, run.flags_end or {}) if run is not None else ({}, {})
    changed = [(k, name) for k, name in ORDER_FLAGS.items() if k in start and k in end and start[k] != end[k]]
    if changed:
        lines = "; ".join(f"`{SETTING_NAMES.get(name, name + '={}').format(start[k])}` at the start, "
                          f"`{SETTING_NAMES.get(name, name + '={}').format(end[k])}` at the end" for k, name in changed)
        return (" The same operations on the same inputs, but the script changes a numerics setting while it runs "
                f"({lines}): kernels split and order their work by it (a reduction's order), which can make the same "
                "operations round differently.")
    return ""


def _largest_held(run: ArmRun | None, d: Divergence) -> float | None:
    """The largest finite magnitude either side of a claim holds on its arm; None unknown."""
    held = [np.abs(np.asarray(o.value, dtype=np.float64)) for s in (d.a, d.b) if s is not None and run is not None
            for o in run.observables if o.index == s.observable and o.value is not None]
    finite = [float(h[np.isfinite(h)].max()) for h in held if np.isfinite(h).any()]
    return max(finite) if finite else None


def _fused_rounding(dtype: str) -> str:
    """How inductor's kernels round otherwise than eager's, at the compiled value's precision:
    in float16 and bfloat16 a fused chain computes in float32 and rounds once, where eager
    rounds each op's result (a chain of pointwise ops has no reduction to reorder)."""
    if dtype in ("float16", "bfloat16"):
        return (f"inductor, the default, fuses operations into generated kernels that compute a {dtype} chain in "
                f"float32 and round to {dtype} once, at the kernel's output, where eager rounds every operation's "
                "result; and it may order a reduction differently from eager's")
    return ("inductor, the default, fuses operations into generated kernels that may evaluate a chain's "
            "expressions in other steps and order a reduction differently from eager's")


def computed_at(d: Divergence, side: Side) -> str:
    """The precision a side was computed at: its judgement's (the least precise dtype of its
    computation), not the dtype it was read back in (`out16.float()` is bfloat16's rounding)."""
    return next((j.dtype for j in d.judgements if (j.arm, j.observable) == (side.arm, side.observable)
                 and j.status == "judged"), side.dtype)


def _arms_cause(a: str, b: str, runs: list[ArmRun] = ()) -> str:
    """What the two arms' specs change that makes the same program round apart (`runs`: the
    arms' runs, whose compile arm may have compiled with the script's own backend)."""
    sa, sb = ArmSpec.read(a), ArmSpec.read(b)
    if sa.device.partition(":")[0] != sb.device.partition(":")[0]:
        return " The arms run on different devices, whose kernels block and accumulate differently."
    texts = []
    for arm, own, other in ((a, sa, sb), (b, sb, sa)):
        if own.torch and own.torch != other.torch:
            texts.append(f"`{arm}` runs torch {own.torch}, whose kernels need not round as this release's do")
        script = [x["name"] for r in runs if r.spec == arm for x in r.script_backends]
        if own.mode == "compile" and other.mode != "compile" and script:
            texts.append(f"`{arm}` runs the graph as the script's own compile backend `{script[0]}` rewrites it")
        elif own.mode == "compile" and other.mode != "compile":
            texts.append(f"`{arm}` runs {own.backend or 'inductor'}'s compiled graph"
                         + (", whose generated kernels fuse operations: they compute a fused chain in other steps "
                            "than eager's (in float32 for float16 and bfloat16 values, rounded once at the kernel's "
                            "output) and may order a reduction differently" if (own.backend or "inductor") == "inductor"
                            else ""))
        for knob, value in own.knobs:
            if (knob, value) not in other.knobs and knob in CAUSES:
                texts.append(f"`{arm}` changes {CAUSES[knob]}")
    return "".join(f" {t}." for t in texts)


def conditioning_caveat(notes: list[dict[str, Any]]) -> tuple[str, policy.Section]:
    """Where nothing diverges here but an observed value comes from an ill-conditioned
    computation (a singular or ill-conditioned matrix, cancelling terms): what another
    machine may give instead (a host with other kernels reports what this one does not
    show), and the accuracy note's section for it. The worst note: a singular matrix, else
    the largest condition number."""
    ranked = sorted((n for n in notes if n.get("singular") or n.get("ill_conditioned")),
                    key=lambda n: (not n.get("singular"), -(n.get("cond") or 0.0)))
    if not ranked:
        return "", policy.GENERAL
    note = ranked[0]
    where = f"`{note['op']}` at line {note['line']}"
    elsewhere = "Another machine's kernels (a CPU of another vector width, a GPU{}) need not agree"
    if "figure" in note:
        return (f" {elsewhere.format('')}: {where} is ill-conditioned ({note['figure']}), and a result that differs "
                "by what that allows is one PyTorch's numerical accuracy note allows."), policy.GENERAL
    elsewhere = elsewhere.format(", another LAPACK")
    spread = (note.get("cond") or math.inf) * (note.get("eps") or 0.0) / 2  # eps is the spacing at 1: u = eps/2
    if note.get("singular") or spread >= 1:
        return (f" {elsewhere}: {where} is given a matrix with {cond_text(note)}, so its result keeps no reliable "
                "digit, and a different value elsewhere is just as much rounding noise."), policy.LINALG
    return (f" {elsewhere}: {where} is given a matrix with {cond_text(note)} (cond·u = {spread:.2g} at "
            f"{note.get('dtype', 'its dtype')}), so a result elsewhere may differ by up to about that relative "
            "amount, which PyTorch's numerical accuracy note allows for ill-conditioned linear algebra."), policy.LINALG

def _arm_of(note: dict[str, Any]) -> str:
    """", arm SPEC" where the note says which arm it is of (a run's own notes do not)."""
    return f", arm {note['arm']}" if note.get("arm") else ""


def cond_text(note: dict[str, Any], full: bool = False) -> str:
    if "figure" in note:
        text = note["figure"]
        return (f"{note['kind']} at `aten.{note['op']}` ({'×'.join(map(str, note['shape']))} {note['dtype']}, "
                f"line {note['line']}{_arm_of(note)}): {text}") if full else text
    parts = []
    if note.get("exact_singular"):
        parts.append("determinant exactly 0 in rational arithmetic")
    cutoff = note.get("cutoff")
    if note.get("rank") is not None:
        at = f" at its cutoff, {_num(cutoff, 3)} of the largest singular value" if isinstance(cutoff, (int, float)) else ""
        parts.append(f"rank {note['rank']} of {note['order']}{at}")
    if note.get("cond") is not None:
        parts.append(f"cond = {note['cond']:.3g}")
    if note.get("cutoff_at_rounding") is True and isinstance(note.get("cutoff_nearest"), (int, float)):
        # A pseudoinverse's rank cutoff within the arm's rounding of a singular value: which
        # side it falls on is rounding's choice, and the result changes with it.
        parts.append(f"the singular value nearest that cutoff, {_num(note['cutoff_nearest'], 3)} of the largest, lies "
                     f"within {note.get('dtype')}'s rounding of it ({_num(note.get('cutoff_margin'), 2)} units of "
                     "roundoff of the largest away): under another rounding the rank, and the result with it, differ")
    for side, whose in (("kernel", "the arm's kernel"), ("float64", "the float64 replay's kernel")):
        if note.get(f"{side}_disagrees") is True:
            off = (f"{whose} returns rank {_num(note.get(f'{side}_value'))} where a correct one returns "
                   f"{_range(note[f'{side}_allowed'])} ({note.get('independent')})" if note.get(f"{side}_allowed") else
                   f"{whose} {_num(note.get(f'{side}_error'), 2)} off the exact answer ({note.get('independent')}), "
                   f"beyond the {_num(note.get(f'{side}_bound'), 2)} a correct one reaches")
            parts.append(off + ("; the reference continues from the exact answer" if side == "float64" else ""))
    text = ", ".join(parts)
    if full:
        text = (f"conditioning of `{note['op']}` input ({'×'.join(map(str, note['shape']))} {note['dtype']}, "
                f"line {note['line']}{_arm_of(note)}): {text}")
    return text


def who_is_right(d: Divergence, right: list[Side], wrong: list[Side]) -> str:
    if d.b is None:
        s = d.a
        return (f"{where_text(d)}: `{s.arm}` gives {s.summary}, the float64 reference {s.reference_summary}.")
    text = f"{where_text(d)}: `{d.a.arm}` {d.a.label} gives {d.a.summary}, `{d.b.arm}` {d.b.label} gives {d.b.summary}."
    if right and wrong:
        text += f" The float64 reference ({right[0].reference_summary}) agrees with `{right[0].arm}` {right[0].label}."
    elif wrong and len(wrong) == 2:
        text += f" Neither matches the float64 reference ({wrong[0].reference_summary})."
    return text


def where_text(d: Divergence) -> str:
    line = f" (line {d.line})" if d.line else ""
    what = {"arms": " between arms", "claim": " in the script's own comparison", "reference": ""}[d.source]
    if d.how == "printed":  # two values printed side by side, not compared in code
        lines = f" (lines {d.a.line}–{d.b.line})" if d.b and d.a.line and d.b.line and d.a.line != d.b.line else line
        return f"{d.observable_label} printed side by side{lines}"
    return f"{d.observable_label}{line}{what}"


def pair_text(d: Divergence) -> str:
    if d.b is None:
        return f"`{d.a.arm}` and float64"
    if d.a.arm == d.b.arm:
        return f"{d.a.label} and {d.b.label} (arm `{d.a.arm}`)"
    return f"`{d.a.arm}` and `{d.b.arm}`"


def short_figure(x: float | None) -> str:
    return "?" if x is None else f"{x:.3g}"


def evidence_lines(d: Divergence, sides: bool = True) -> list[str]:
    """The float64 figures of each side (unless a judgement line already gives them) and the
    difference between the sides."""
    out = []
    for s in (d.a, d.b) if sides else ():
        if s is None:
            continue
        err = "" if s.max_abs_error is None else (f"; vs float64: max abs {s.max_abs_error:.3g}, max rel "
                                                   f"{short_figure(s.max_rel_error)}, {short_figure(s.max_ulps)} ulp")
        nf = f"; {s.nonfinite_vs_reference} element(s) non-finite where float64 is not, or vice versa" if s.nonfinite_vs_reference else ""
        out.append(f"`{s.arm}` {s.label} (line {s.line}): {s.summary}; float64: {s.reference_summary or 'unavailable'}{err}{nf}")
    if d.b is not None and d.max_abs_diff is not None:
        out.append(f"max |difference| between the sides over elements finite on both: {d.max_abs_diff:.3g} "
                   f"({d.dtype} tolerance rtol={d.rtol:g}, atol={d.atol:g})")
    if d.fp64_rule:
        # Dynamo's rule compares the two sides' distances from float64 with each other; where
        # the rounding simulation judged both, that judgement decides, and the line says so
        # (a "fail" under an expected verdict read as a contradiction).
        judged = [j for j in d.judgements if j.status == "judged"]
        aside = " (for comparison: the verdict rests on each side's own rounding)" if len(judged) == 2 else ""
        if aside and d.fp64_rule.startswith("fail") and all(j.zone in ("inside", "envelope") for j in judged):
            aside = (" (for comparison: it weighs one side's distance from float64 against three times the "
                     "other's, and fails where the other lands much nearer float64 than its rounding need; both "
                     "sides are inside their own rounding, on which the verdict rests)")
        out.append(f"dynamo float64 rule{aside}: {d.fp64_rule}")
    return out
