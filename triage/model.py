"""The plain data objects that flow between pipeline stages (all JSON-serialisable)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triage import policy


@dataclass
class Repro:
    """A reporter's script, read and checked, ready to run (or the reason it cannot)."""

    path: str
    name: str
    source: str
    problem: str | None = None  # why no arm can run it (missing file, syntax error)
    problem_line: int | None = None


@dataclass
class IssueRepro:
    """What an issue body yields: the script to run (or why there is none) and what the
    reporter saw (printed output, traceback, pasted collect_env)."""

    script: str | None
    problem: str | None = None  # no runnable repro: the reason, in one sentence
    observed: list[str] = field(default_factory=list)
    traceback: str | None = None
    environment: str | None = None
    environment_fields: dict[str, str] = field(default_factory=dict)  # "PyTorch version" -> "2.1.0+cu121", …
    notes: list[str] = field(default_factory=list)  # how the script was put together


@dataclass
class Issue:
    """The GitHub issue a report is about; `body_sha256` lets the posting job check that the
    body it answers is the body that was run."""

    repo: str
    number: int
    title: str
    url: str
    author: str
    body_sha256: str
    extraction: IssueRepro


@dataclass(frozen=True)
class ArmSpec:
    """One execution configuration: device, eager or compile (with a backend), knobs, and the
    torch release it runs on (None: the torch triage runs with; else a version such as
    "2.15.0", run from its own cached installation, sandbox/torch_envs.py)."""

    device: str
    mode: str = "eager"
    backend: str | None = None
    knobs: tuple[tuple[str, str], ...] = ()
    torch: str | None = None

    @property
    def spec(self) -> str:
        parts = [self.device]
        if self.mode == "compile":
            parts.append(f"compile={self.backend}" if self.backend else "compile")
        parts.extend(f"{k}={v}" for k, v in self.knobs)
        return "/".join(parts) + (f"@{self.torch}" if self.torch else "")

    @classmethod
    def read(cls, text: str) -> ArmSpec:
        """`text` as `spec` writes it, read back without checking anything: a spec a report or a
        hand-built run holds need not be one this machine accepts (the fault knob is refused
        outside triage's tests). What a user types goes through `triage.arms.spec.parse_arm`, which
        checks every part and normalises it."""
        text, at, release = text.partition("@")
        device, *parts = text.split("/")
        mode, backend, knobs = "eager", None, []
        for part in parts:
            name, eq, value = part.partition("=")
            if name == "compile":
                mode, backend = "compile", value or None
            elif eq:
                knobs.append((name, value))
        return cls(device, mode, backend, tuple(knobs), release if at else None)

    def to_job(self) -> dict[str, Any]:
        return {"spec": self.spec, "device": self.device, "mode": self.mode,
                "backend": self.backend, "knobs": dict(self.knobs)}


@dataclass
class Observable:
    index: int
    kind: str  # call | readback | claim | final
    label: str
    line: int | None
    fingerprint: dict[str, Any] | None
    reference: dict[str, Any] | None  # {"fingerprint", "note", "approximate"}
    ancestors: list[int] = field(default_factory=list)  # leaf indices
    conditioning: list[int] = field(default_factory=list)  # ArmRun.conditioning indices upstream
    claim: dict[str, Any] | None = None
    node: str | None = None  # the op-graph node that computed it (arm's own recording)
    call_line: int | None = None  # the top-level script line whose call led to it
    # The script's own expression for the value (`mine`, `x.mean().item()`: triage/operands.py),
    # where its source says so unambiguously; `label` stays the worker's (the alignment key).
    name: str | None = None
    # Root module calls: which module instance (and the script's name for it), its training
    # flag and train-mode layers, input digests, and the numerics settings at the call.
    module: dict[str, Any] | None = None
    # The simulated rounding of this value on its arm (triage/worker/rounding.py): status,
    # sample count, each sample's statistic, flipped decisions; the arrays stay out of JSON.
    rounding: dict[str, Any] | None = None
    # A readback's call as the worker saw the script spell it (`a.item()`); untrusted until
    # compare.name_from_source finds it on that line of the source.
    expression: str | None = None
    # Whether the value reads bytes a `torch.empty` left uninitialized (worker/session.py); None: not known.
    uninitialized: bool | None = None
    # The script line of a `torch.compile`d call the value comes through (worker/session.py); None: none.
    compiled_line: int | None = None
    # The check of torch's own (`gradcheck`) whose internal comparison this claim operand is
    # (compare.name_from_source); None where the script's code made the comparison.
    library_check: str | None = field(default=None, metadata={"json": False})
    value: np.ndarray | None = field(default=None, repr=False, metadata={"json": False})
    reference_value: np.ndarray | None = field(default=None, repr=False, metadata={"json": False})
    spread: dict[str, np.ndarray] | None = field(default=None, repr=False, metadata={"json": False})
    # The judge's reading of `spread` (triage/judge/spread.py), made once: its per-element
    # figures are passes over the arrays, which the comparison, the ladder and the audit reread.
    spread_reading: Any = field(default=None, repr=False, compare=False, metadata={"json": False})

    @property
    def shown(self) -> str:
        """What people read for this value: the script's name for it, else triage's label."""
        return self.name or self.label


@dataclass
class ArmRun:
    """Everything one arm's isolated run produced, whether or not it finished."""

    spec: str
    device: str
    mode: str
    status: str  # ok | raised | crashed | timeout | unavailable
    elapsed_s: float | None = None
    wall_s: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    failure: str | None = None  # one line, for people, when status is not ok
    exception: dict[str, Any] | None = None
    exit_note: str | None = None
    stdout: str = ""
    stderr: str = ""
    output_dropped: int = 0
    environment: str | None = None
    environment_error: str | None = None
    flags_start: dict[str, Any] | None = None
    flags_end: dict[str, Any] | None = None
    observables: list[Observable] = field(default_factory=list)
    leaves: list[dict[str, Any]] = field(default_factory=list)
    conditioning: list[dict[str, Any]] = field(default_factory=list)
    # Leaves and conditioning notes the worker did not write, to keep within its limits (a
    # report note says so).
    left_out: dict[str, int] | None = field(default=None, metadata={"json": False})
    graph: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    random_before_seed: dict[str, Any] | None = None
    compiled_random_ops: list[str] = field(default_factory=list)
    rounding: dict[str, Any] | None = None  # the simulation's cost and sample count
    # The script's own calls that set what the arm's knobs set (said in the report's notes).
    knob_calls: list[dict[str, Any]] = field(default_factory=list, metadata={"json": False})
    # The floats the script's failing check read by name (worker/claims.py), each {name, dtype,
    # value: an array of that shape}: what a check compared recorded values with (a NumPy result).
    check_operands: list[dict[str, Any]] = field(default_factory=list, metadata={"json": False})
    torch_import_s: float | None = None
    graph_dir: str | None = field(default=None, metadata={"json": False})  # exported op graph
    # The arm as parsed (`spec` is its text, which report.json keeps): ablations and the
    # minimizer derive their variants from it without parsing the text again. arms/run.py gives
    # it; a run built from its spec alone (the tests' hand-made runs) reads it back from `spec`.
    arm: ArmSpec = field(default=None, metadata={"json": False})  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.arm is None:
            self.arm = ArmSpec.read(self.spec)

    @property
    def completed(self) -> bool:
        """The script ran to its end, or stopped on its own check (an assert that failed)."""
        return self.status == "ok" or (self.status == "raised" and bool(self.exception and self.exception.get("claim")))

    @property
    def script_backends(self) -> list[dict[str, Any]]:
        """The script's own compile backends this arm compiled with (`name`, `line`), as the
        worker recorded them: the script's code, not PyTorch's, where its values go wrong."""
        return [b for b in ((self.graph or {}).get("backends") or []) if b.get("name")]

    @property
    def raised_after_values(self) -> bool:
        """The script raised (a typo on its last line, an error after its prints) once it had
        produced values: those values are a result, whatever came after."""
        return self.status == "raised" and any(o.kind != "final" for o in self.observables)


def compared_runs(runs: list[ArmRun]) -> list[ArmRun]:
    """The arms whose values are compared: those that completed, or — where none did and
    every arm raised after producing values — all of them, as far as they got."""
    completed = [r for r in runs if r.completed]
    if completed:
        return completed
    ran = [r for r in runs if r.status != "unavailable"]
    return ran if ran and all(r.raised_after_values for r in ran) else []


@dataclass
class Side:
    """One of the two values a divergence compares: an arm's observable (or a claim operand)."""

    arm: str
    observable: int
    label: str
    line: int | None
    dtype: str
    summary: str
    max_abs_error: float | None = None  # vs float64 reference
    max_rel_error: float | None = None
    max_ulps: float | None = None
    rmse: float | None = None
    nonfinite_vs_reference: int = 0  # elements whose finiteness differs from the reference
    overflow_to_inf: int = 0  # of those, ±inf where float64's value is beyond the dtype's range
    agrees_with_reference: bool | None = None
    reference_summary: str | None = None
    kind: str | None = None  # the observable's kind: call | readback | claim | final


@dataclass
class Judgement:
    """One value judged against the simulated rounding of its own computation on its arm."""

    arm: str
    observable: int
    label: str
    line: int | None
    dtype: str
    status: str  # judged | not-judged
    zone: str | None = None  # inside | envelope | outside
    p: float | None = None  # Monte Carlo p-value of the value's deviation among the samples'
    samples: int = 0
    statistic: float | None = None  # T: max over elements of |value - float64| / σ
    max_sample_stat: float | None = None
    element: int | None = None  # the (flat) element where T is reached
    value: float | None = None  # at that element
    reference: float | None = None
    sigma: float | None = None
    envelope: list[float] | None = None  # directed replays at that element
    # In the envelope zone: by the replay rounding every op to nearest (a biased rounding
    # the arm reproduces), not by the directed replays.
    nearest: bool = False
    digits: float | None = None  # significant digits of a typical element at the arm's precision
    fewest_digits: float | None = None  # of the element with the fewest
    computational_zero: bool = False
    zeros: int = 0
    numel: int = 0
    wide: bool = False  # the computation itself loses most of the precision
    poorly_determined: int = 0  # elements that keep too few digits (WIDE_DIGITS_LOST lost), zeros included
    # Two sides compared: the element where they differ most, and the digits this side keeps
    # there (0 for a computational zero); `poor_where_differ` when that is too few (as
    # `poorly_determined` counts): the divergence lives where the computation keeps no digits.
    differ_element: int | None = None
    digits_where_differ: float | None = None
    sigma_where_differ: float | None = None
    poor_where_differ: bool = False
    unmeasured: list[str] = field(default_factory=list)  # library ops with no measured kernel error
    nonfinite: str | None = None
    unstable: list[str] = field(default_factory=list)
    # Of the decisions rounding switches, the selections that picked among exactly equal values
    # (`aten.topk` (line 5)): the order among them is the op's choice, not rounding's.
    ties: list[str] = field(default_factory=list)
    strip: str = ""
    reason: str | None = None  # why not judged
    # The value's own dtype where it is wider than `dtype`, the precision its computation ran
    # at (`y32.double()`): its digits are that computation's.
    stored: str | None = None

    @property
    def precision_text(self) -> str:
        """'float32', or 'float32 (held in float64)' for a wider value computed at float32."""
        if not self.stored or self.stored == self.dtype:
            return self.dtype
        return f"{self.dtype} (held in {self.stored})"

    @property
    def outside_without_digits(self) -> bool:
        """Called outside a spread that keeps no significant digit (every digit of it is
        rounding noise), and not beyond that noise by policy.NOISE_MARGIN: nothing to be
        outside of (the audit withdraws a bug verdict that rests on it)."""
        if self.zone != "outside" or self.nonfinite:
            return False
        beyond_noise = (self.statistic is not None and bool(self.max_sample_stat) and math.isfinite(self.statistic)
                        and self.statistic > policy.NOISE_MARGIN * self.max_sample_stat)
        return (self.computational_zero or (self.digits is not None and self.digits < 1)) and not beyond_noise


@dataclass
class Divergence:
    """The headline difference: what differs, between which sides, and how."""

    source: str  # arms | claim | reference
    observable_label: str
    line: int | None
    a: Side
    b: Side | None  # None when one side is compared with its float64 reference alone
    dtype: str
    bitwise_equal: bool
    within_tolerance: bool
    rtol: float
    atol: float
    max_abs_diff: float | None
    nonfinite_mismatch: int
    numel: int
    fp64_rule: str | None = None
    # Within tolerance only through atol, a typical element being smaller than it (1 - cos(x) of
    # a tiny x): the largest relative difference, max |a - b| / max(|a|, |b|), it hides.
    hidden_by_atol: float | None = None
    ancestors: list[dict[str, Any]] = field(default_factory=list)
    # claims: the script's function, "implicit", "repeat" (one module called twice on one input)
    # or "rerun" (one function of the script called twice from the top level, compare._reruns)
    how: str | None = None
    bit_difference: str | None = None  # equal values, different bits: "signed-zero" or "nan-bits"
    claim_tolerance: dict[str, float] | None = None  # the rtol and atol the script's check asked for
    # Whether the values fail that rtol and atol (None where the check asked for none, or the
    # values cannot be compared element by element).
    fails_asked: bool | None = None
    differing: int | None = None  # two values of one shape: the elements that differ
    judgements: list[Judgement] = field(default_factory=list)  # each side against its own rounding
    # Two values of one arm: the ops of each side's computation with no counterpart in the
    # other's (triage/paths.py), where the arm's op graph was recorded.
    paths: dict[str, Any] | None = None
    # A claim's two operands computed from *different* random or uninitialized leaves of the
    # same shapes (a fresh nn.Linear per call): no switch changes that (ablate) and it makes the
    # claim nondeterministic (classify). Found once, by compare, as leaf records shaped like
    # `ancestors`' entries; report.json keeps `ancestors` only.
    distinct_draws: list[dict[str, Any]] = field(default_factory=list, metadata={"json": False})
    # Two values of one arm: the script's line of the op that computed each (a, b), from the
    # arm's op graph, which is gone by the time the ladder reads this.
    computed_at: tuple[int | None, int | None] | None = field(default=None, metadata={"json": False})


@dataclass(frozen=True)
class DivergenceKind:
    """What the minimizer must preserve: how two arms' values (or outcomes) differ.

    kind: ``raises`` (one arm raises; detail names the arm side and exception type),
    ``nonfinite`` (detail: which side holds which nonfinite values the other does not, e.g.
    ``b:+inf``), ``mismatch`` (beyond the dtype's assert_close tolerance), ``rounding``
    (different bits, within tolerance).
    """

    kind: str
    detail: str = ""

    def describe(self) -> str:
        if self.kind == "raises":
            side, _, exc = self.detail.partition(":")
            return f"arm {side.upper()} raises {exc}"
        if self.kind == "nonfinite":
            parts = [f"{p.split(':')[1]} on arm {p.split(':')[0].upper()}" for p in self.detail.split(",")]
            return "nonfinite values on one side only (" + ", ".join(parts) + ")"
        return {"mismatch": "values differ beyond the dtype's tolerance",
                "rounding": "values differ in their bits, within the dtype's tolerance"}[self.kind]


@dataclass
class Comparison:
    arms: list[ArmRun]
    aligned: int
    alignment_note: str | None
    leaves_identical: bool | None
    leaves_note: str | None
    divergence: Divergence | None
    divergences: int
    claims: list[dict[str, Any]]
    conditioning: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    others: list[Divergence] = field(default_factory=list)  # the other divergences, judged too

    def run(self, spec: str) -> ArmRun | None:
        """The run of the arm `spec` names (None: no such arm ran)."""
        return next((r for r in self.arms if r.spec == spec), None)

    def resolve(self, side: Side | Judgement) -> tuple[ArmRun, Observable]:
        """The run and the observable a side of one of this comparison's divergences names.
        Those sides were made from these runs, so a miss is a bug: LookupError."""
        found = find_side(self.arms, side)
        if found is None:
            raise LookupError(f"no observable {side.observable} on arm {side.arm!r} in this comparison")
        return found

    def find(self, side: Side | Judgement | None) -> tuple[ArmRun, Observable] | None:
        """`resolve`, for a side that may be absent (a divergence's missing `b`): None then."""
        return find_side(self.arms, side)


def find_side(runs: list[ArmRun], side: Side | Judgement | None) -> tuple[ArmRun, Observable] | None:
    """The run and the observable `side` names among `runs` (compare resolves its sides before
    the Comparison exists); None where `side` is None or names what the runs do not hold."""
    if side is None:
        return None
    run = next((r for r in runs if r.spec == side.arm), None)
    observable = next((o for o in run.observables if o.index == side.observable), None) if run else None
    return (run, observable) if observable is not None else None


# Ablation outcomes where the sides agree once the switch is changed.
AGREEING_OUTCOMES = ("agree-bitwise", "within-tolerance")


@dataclass
class Ablation:
    """One switch changed on the arms involved in a divergence, and what happened to it."""

    switch: str  # the arm knob, e.g. "threads=1"
    arms: list[str]  # the ablated arm specs
    outcome: str  # agree-bitwise | within-tolerance | still-diverges | not-comparable | skipped
    detail: str
    section: str  # the accuracy note's section the switch belongs to
    setting: str  # the line a user sets
    supports: str  # the verdict kind it supports when the sides agree
    seconds: float = 0.0
    # Agreeing sides explain the divergence only inside their rounding spread (garbage agreeing
    # with garbage explains nothing): None where there was no spread to judge them by.
    inside_spread: bool | None = None

    @property
    def explains(self) -> bool:
        """This ablation explains the divergence: the sides agree with the switch changed, not
        outside the original rounding spread, and it is a switch (a float64 re-run of one op,
        supports "evidence", says where the divergence starts, not why). sweep/buckets.py
        applies the same rule to report.json's dicts (`explains`, tested against this)."""
        return (self.outcome in AGREEING_OUTCOMES and self.supports != "evidence"
                and self.inside_spread is not False)


@dataclass
class Verdict:
    kind: str
    expected: bool | None
    policy_section: str
    policy_url: str
    labels: list[str]
    summary: str
    evidence: list[str] = field(default_factory=list)
    # An inconclusive verdict (triage/audit.py): what conflicts, and the kind it withdrew.
    conflicts: list[str] = field(default_factory=list)
    withdrawn: str | None = None


@dataclass
class LocalizedOp:
    """One op of the diverging value's cone: its end-to-end difference between the arms and
    its local error (the op alone on arm B, from arm A's recorded inputs)."""

    node: str
    op: str
    line: int | None
    role: str  # introduced | propagated
    first: bool  # the first op, in execution order, whose output differs end to end
    end_to_end: dict[str, Any] | None
    local: dict[str, Any] | None


@dataclass
class Minimal:
    """The minimized divergence and its standalone repro (``verified``: re-run in fresh arms)."""

    ops: list[str]
    script: str
    verified: bool
    queries: int
    seconds: float
    arms: list[str]
    kind: str
    reliability: str
    original_ops: int
    verification: str
    inputs_file: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step (startup, reduce, verify…)


@dataclass
class ReporterOutput:
    """What the reporter posted that their machine printed, to be judged as an arm."""

    text: str
    source: str  # "the issue body", or the file's name
    environment: dict[str, str] = field(default_factory=dict)  # their collect_env's fields


@dataclass
class ReportedValue:
    """One value the reporter posted, lined up with the value this machine's run printed in
    the same place, and judged against that value's rounding spread under the reporter's
    device model (triage/reported/)."""

    printed: str  # the reporter's text for the value
    record: str  # the reporter's line it is on
    here: str | None = None  # the same value as this machine's run printed it
    observable: int | None = None  # what computed it, in the model arm's run
    label: str | None = None
    line: int | None = None
    numbers: int = 0  # printed numbers in it
    how: str | None = None  # line | segment | order | displayed (a transcript's): how it was lined up
    same_as_here: bool = False  # every printed number equals this machine's
    nonfinite_flip: bool = False  # inf/nan on one side only, element for element
    device: str | None = None  # where the reporter's machine computed it, where their output says: cpu | cuda
    order_dependent: list[str] = field(default_factory=list)  # its ops whose CUDA kernels are order-dependent
    # Where an arm of the reporter's device ran here too (a lent GPU): what it printed in its place.
    device_here: str | None = None
    device_agrees: bool | None = None
    judgement: Judgement | None = None
    why: str | None = None  # not lined up, or not judged: why


@dataclass
class ReportedArm:
    """The numbers a reporter posted, as an arm: judged from what was posted, not re-run on
    the reporter's hardware."""

    source: str  # "the issue body", or the file given with --reported
    device: str  # the reporter's device: cuda | cpu
    device_evidence: str  # why triage thinks so
    model: str  # the rounding model the values were judged under, in words
    torch: str | None = None  # the reporter's torch, from their collect_env
    gpu: str | None = None
    kernels: str | None = None  # where the model's per-op errors come from
    here_torch: str | None = None  # the torch release the model arm ran here
    values: list[ReportedValue] = field(default_factory=list)
    status: str = "judged"  # judged | not-judged (the model arm failed: `why`)
    why: str | None = None

    @property
    def judged(self) -> list[ReportedValue]:
        return [v for v in self.values if v.judgement is not None and v.judgement.status == "judged"]


@dataclass
class Report:
    repro: Repro
    arms_requested: list[str]
    comparison: Comparison | None
    verdict: Verdict
    triage_version: str
    seconds: float
    notes: list[str] = field(default_factory=list)
    minimal: Minimal | None = None
    localization: list[LocalizedOp] = field(default_factory=list)
    minimal_dir: str | None = field(default=None, metadata={"json": False})  # minimal.py + inputs file
    issue: Issue | None = None
    ablations: list[Ablation] = field(default_factory=list)
    # How the arms were isolated: {"kind": "namespace" | "process", "detail": what enforces it}.
    isolation: dict[str, str] | None = None
    reported: ReportedArm | None = None  # what the reporter posted, judged (triage/reported/)


def to_jsonable(obj: Any) -> Any:
    """dataclasses -> dicts, dropping fields marked ``metadata={"json": False}``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.metadata.get("json", True)}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, float) and obj != obj:
        return "nan"
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    return obj
