"""Stage 2b, the reported arm: what the reporter's machine printed, judged on a machine without it.

Most numerics reports are about a GPU the triage machine does not have, and most hold half
the answer: the number the reporter's GPU printed. triage runs the same program on the CPU
(every CUDA call collapsed onto it) with its rounding simulated as the reporter's device
would round (`RunSettings.rounding_model`: every reduction order possible, TF32 where that
device's defaults or the script enable it, fp16/bf16 accumulation where its kernels were not
measured, the measured per-op errors of that device where triage has them, else a stated
conservative bound). Then each printed value of the reporter's is

1. parsed as an interval (`printed`),
2. lined up with the same value printed here and the observable that computed it (`align`),
3. judged against that observable's spread (`judge_reported`): a possible rounding of this
   computation on that device, or not.

Such a verdict is marked as judged from the posted numbers; a value that cannot be lined up
is listed, never guessed.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from triage.arms.spec import mentions_cuda
from triage.judge import RoundingSpread, judge_value
from triage.judge.describe import spread_text
from triage.model import ArmRun, Judgement, Observable, ReportedArm, ReportedValue
from triage.reported.align import find_observable, pair_groups, positions_of, prints_as
from triage.reported.printed import PrintedGroup, PrintedNumber, parse_output

__all__ = ["judge_reported", "model_words", "reported_judgement", "reported_lines", "reporter_device"]

MAX_REPORTED_CHARS = 1_000_000
# The printed values lined up and judged, in order: an output block of 50,000 bracketed
# values would make a report of tens of megabytes, every value with its line.
MAX_REPORTED_VALUES = 1000
SHOWN_CHARS = 200
MAX_EVIDENCE_VALUES = 12  # a verdict's evidence holds at most 50 lines (report.schema.json)


def reporter_device(text: str, environment: dict[str, str], script: str | None) -> tuple[str, str]:
    """The device the reporter's numbers came from, and what says so."""
    for g in (g for r in parse_output(text[:MAX_REPORTED_CHARS]) for g in r.groups):
        if g.device and g.device.startswith("cuda"):
            return "cuda", f"their output prints `device='{g.device}'`"
    gpu = environment.get("GPU models and configuration", "")
    if gpu and "could not collect" not in gpu.lower() and environment.get("Is CUDA available", "").lower() == "true":
        return "cuda", "their collect_env names a GPU"
    if mentions_cuda(script):
        return "cuda", "the script runs on CUDA"
    return "cpu", "nothing in the report or the script names a GPU"


def model_words(device: str, kernels: str | None) -> str:
    """The rounding model, in one sentence."""
    if device == "cuda":
        measured = (f"each op's CUDA kernel error as {kernels}, and for an op not measured there 16 units of "
                    "roundoff and fp16/bf16 reductions accumulating in fp16/bf16"
                    if kernels and not kernels.startswith("no ")
                    else "no measured CUDA kernel errors, so each library op may be off by 16 units of roundoff "
                         "and fp16/bf16 reductions may accumulate in fp16/bf16")
        return ("CUDA's rounding as modelled on the CPU: every reduction order possible, TF32 where the script or "
                f"the defaults enable it (cuDNN convolutions), reduced-precision fp16/bf16 GEMMs, {measured}")
    return "the CPU's rounding with every reduction order possible, at the measured error of each op's CPU kernel"


def judge_reported(run: ArmRun | None, text: str, source: str, device: str, device_evidence: str,
                   environment: dict[str, str], device_run: ArmRun | None = None) -> ReportedArm:
    """Every value in `text` (the reporter's output) lined up with `run` (the CPU arm with the
    reporter's rounding model) and judged against its spread; and, where an arm of the
    reporter's device ran here too (`device_run`: a lent GPU), set beside what it printed."""
    kernels = (run.rounding or {}).get("kernels") if run is not None else None
    reported = ReportedArm(source=source, device=device, device_evidence=device_evidence,
                           model=model_words(device, kernels), kernels=kernels,
                           torch=environment.get("PyTorch version"),
                           gpu=environment.get("GPU models and configuration"),
                           here_torch=_torch_version(run))
    records = parse_output(str(text)[:MAX_REPORTED_CHARS])
    if run is None or not run.completed:
        reported.status = "not-judged"
        reported.why = ("the run that models the reporter's device did not finish"
                        + (f" ({run.failure})" if run is not None and run.failure else ""))
    here = parse_output(run.stdout) if run is not None else []
    on_device = {id(p.reported): p.here for p in pair_groups(records, parse_output(device_run.stdout))} \
        if device_run is not None and device_run.completed else {}
    observables = [o for o in run.observables if o.kind != "claim"] if run is not None else []
    tied: list[tuple[ReportedValue, PrintedGroup, PrintedGroup | None, Observable, list[int]]] = []
    unprinted: list[tuple[ReportedValue, PrintedGroup]] = []
    after = -1
    pairs = pair_groups(records, here)
    if len(pairs) > MAX_REPORTED_VALUES:
        reported.source += f" (its first {MAX_REPORTED_VALUES:,} of {len(pairs):,} printed values)"
    for pair in pairs[:MAX_REPORTED_VALUES]:
        value = ReportedValue(printed=_shown(pair.reported.text), record=_shown(pair.record.text),
                              numbers=len(pair.reported.numbers), how=pair.how,
                              device=_value_device(pair.reported, pair.context))
        reported.values.append(value)
        same_device = on_device.get(id(pair.reported))
        if same_device is not None:
            value.device_here = _shown(same_device.text)
            value.device_agrees = _overlap(pair.reported, same_device)
        if reported.status != "judged":
            value.why = reported.why
        elif pair.here is None:
            value.why = "no value printed by this machine's run lines up with it"
            unprinted.append((value, pair.reported))
        elif (found := find_observable(pair.here, observables, after)) is None:
            value.here = _shown(pair.here.text)
            value.why = ("this machine printed it, but no value the script computed with torch prints so "
                         "(computed outside torch: numpy, Python)")
        else:
            value.here = _shown(pair.here.text)
            after = found[0].index
            tied.append((value, pair.reported, pair.here, *found))
    tied += _displayed(unprinted, observables, {o.index for _, _, _, o, _ in tied})
    for value, group, printed_here, o, positions in tied:
        flat = np.asarray(o.value, dtype=np.float64).reshape(-1)
        ours = printed_here.numbers if printed_here is not None else None
        value.observable, value.label, value.line = o.index, o.shown, o.line
        value.same_as_here = (all(_same(a, b) for a, b in zip(group.numbers, ours, strict=False)) if ours is not None
                              else all(prints_as(flat[at], a) for a, at in zip(group.numbers, positions, strict=False)))
        value.nonfinite_flip = any(bool(np.isfinite(a.value)) != bool(np.isfinite(flat[at]))
                                   for a, at in zip(group.numbers, positions, strict=False))
        value.judgement, value.why = _judge(group, ours, positions, o)
        value.order_dependent = list((o.rounding or {}).get("order_dependent") or [])
    return reported


def _displayed(unprinted: list[tuple[ReportedValue, PrintedGroup]], observables: list[Observable],
               used: set[int]) -> list[tuple[ReportedValue, PrintedGroup, None, Observable, list[int]]]:
    """A `>>>` transcript's displayed values, which the script run here evaluates without
    printing: the posted values no printed line took, against the script's bare expressions
    (observed as readbacks named by their own text) in program order, where both are as many
    and every one fits its expression's shape."""
    expressions = [o for o in observables if o.kind == "readback" and o.label.startswith("`") and o.index not in used
                   and o.value is not None]
    if not unprinted or len(unprinted) != len(expressions):
        return []
    out = []
    for (value, group), o in zip(unprinted, expressions, strict=False):
        positions = positions_of(group, o)
        if positions is None:
            return []
        value.how, value.here, value.why = "displayed", "(displayed, not printed here)", None
        out.append((value, group, None, o, positions))
    return out


def _torch_version(run: ArmRun | None) -> str | None:
    from triage.extract import parse_environment

    return parse_environment(run.environment).get("PyTorch version") if run is not None and run.environment else None


def _value_device(group: PrintedGroup, record: str) -> str | None:
    """Where the reporter's machine computed one printed value, where the output says: a
    tensor repr that names a GPU (`device='cuda:0'`), or the line's own words (`CPU logdet:`,
    `GPU:`). None: it does not say (a CPU tensor may hold what a GPU computed, `.cpu()`)."""
    if group.kind == "tensor" and group.device and group.device.startswith("cuda"):
        return "cuda"
    return _named_device(record)


@functools.lru_cache(maxsize=64)
def _named_device(record: str) -> str | None:
    """The device a printed line's own words name, once per line: every value of a long line
    (an output block of 50,000 bracketed values) asks for the same one."""
    cpu = re.search(r"\bCPU\b", record, re.IGNORECASE) is not None
    gpu = re.search(r"\b(GPU|CUDA)\b", record, re.IGNORECASE) is not None
    return "cpu" if cpu and not gpu else "cuda" if gpu and not cpu else None


def _judge(reported: PrintedGroup, here: list[PrintedNumber] | None, positions: list[int], o: Observable
           ) -> tuple[Judgement | None, str | None]:
    spread = RoundingSpread.of(o)
    if spread is None:
        return None, (o.rounding or {}).get("reason") or "its rounding was not simulated"
    if here is not None and len(reported.numbers) != len(here):
        return None, "the reporter's value has other elements than the one printed here"
    reference = spread.reference.reshape(-1)
    value = reference.copy()  # elements not printed: as the reference, so they cannot count
    for k, (rn, at) in enumerate(zip(reported.numbers, positions, strict=False)):
        low, high = _bounds(rn, here[k]) if here is not None else (rn.low, rn.high)
        value[at] = low if low == high else float(np.clip(reference[at], low, high))
    j = judge_value(value.reshape(spread.reference.shape), spread, "reported", o.index, o.shown, o.line,
                    zeros_exempt=False)
    return j, None


def _bounds(reported: PrintedNumber, here: PrintedNumber) -> tuple[float, float]:
    """The reported number's interval; a shortest-repr print (Python's float repr: the two
    sides show different numbers of decimals) names its value exactly."""
    if not np.isfinite(reported.value):
        return reported.value, reported.value
    if _decimals(reported.text) != _decimals(here.text) and "e" not in reported.text.lower():
        return reported.value, reported.value
    return reported.low, reported.high


def _decimals(token: str) -> int:
    return len(re.split(r"[eE]", token)[0].partition(".")[2])


def _overlap(reported: PrintedGroup, here: PrintedGroup) -> bool:
    """Every posted number's interval meets the one printed here (the same value, as far as
    both printed it)."""
    if len(reported.numbers) != len(here.numbers):
        return False
    for a, b in zip(reported.numbers, here.numbers, strict=False):
        if np.isnan(a.value) or np.isnan(b.value):
            if not (np.isnan(a.value) and np.isnan(b.value)):
                return False
        elif not (a.low <= b.high and b.low <= a.high):
            return False
    return True


def _same(a: PrintedNumber, b: PrintedNumber) -> bool:
    return a.text.lstrip("+") == b.text.lstrip("+")


def _shown(text: str) -> str:
    """`text` on one line, cut at SHOWN_CHARS: read only as far as that (a 200 KB line is
    shown for each of its values)."""
    words: list[str] = []
    length = -1
    for word in re.finditer(r"\S+", text):
        words.append(word.group())
        length += len(words[-1]) + 1
        if length > SHOWN_CHARS:
            return " ".join(words)[:SHOWN_CHARS - 1] + "…"
    return " ".join(words)


def reported_judgement(j: Judgement) -> str:
    """Where a posted value falls, in a clause: its zone, and the spread it was judged by."""
    if j.nonfinite:
        return j.nonfinite
    if j.reference is not None and not np.isfinite(j.reference):
        return f"the float64 value is {j.reference:g}"
    where = {"inside": "inside", "envelope": "where rounding every op to nearest lands" if j.nearest
             else "inside the directed envelope", "outside": "outside"}.get(j.zone or "", j.zone or "?")
    figures = (f", {j.statistic:.3g} σ from float64 {j.reference:.8g} where the samples reach "
               f"{j.max_sample_stat:.3g} σ" if j.statistic is not None and j.reference is not None
               and j.max_sample_stat is not None else "")
    return f"{where}{figures}; spread {spread_text(j)}"


def reported_lines(reported: ReportedArm) -> list[str]:
    """The evidence: each posted value, what it lined up with, and where it falls."""
    head = (f"reported arm ({reported.source}; their {reported.device}"
            + (f", torch {reported.torch}" if reported.torch else "") + (f", {reported.gpu}" if reported.gpu else "")
            + f", because {reported.device_evidence}): judged under {reported.model}")
    lines = [head]
    if reported.status != "judged":
        lines.append(f"the reported values were not judged: {reported.why}")
    for v in reported.values[:MAX_EVIDENCE_VALUES]:
        if v.device_here is not None:
            lines.append(f"reported `{v.printed}`; the {reported.device} arm here printed `{v.device_here}`: "
                         + ("the same, as far as both printed it" if v.device_agrees else
                            "they disagree — a bug fixed since, or another build or device"))
        if v.judgement is not None and v.judgement.status == "judged":
            lines.append(f"reported `{v.printed}` ↔ here `{v.here}`: {v.label} (line {v.line}), lined up by {v.how} — "
                         f"{reported_judgement(v.judgement)}")
        elif reported.status == "judged":
            lines.append(f"reported `{v.printed}` (in `{v.record}`): not judged — {v.why or v.judgement.reason}")
    if len(reported.values) > MAX_EVIDENCE_VALUES:
        lines.append(f"… and {len(reported.values) - MAX_EVIDENCE_VALUES} more reported values (report.json)")
    return lines
