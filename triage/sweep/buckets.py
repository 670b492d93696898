"""Duplicate buckets: a sweep's results grouped by the signature of their divergence.

A backlog holds the same bug many times over (the textbook `acosh` lowering reported from five
models), and a triager wants each bug once, with its reports beside it. As in FuzzManager,
results whose signatures are equal share a bucket; a signature is what the divergence is (the
culprit ops, their dtypes, what was compared, the verdict and what explained it), never the
reporter's wording. Near misses are not merged: the same op diverging in float16 and in float64,
or explained by another switch, may be two bugs or one, and only a person can say which. Such
pairs of buckets are listed as near matches, naming what they share and what differs, for that
person to merge by hand.
"""
from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import astuple, dataclass, field
from typing import Any

from triage import policy
from triage.model import AGREEING_OUTCOMES, ArmSpec
from triage.sweep.model import ItemResult

# Verdicts that say nothing diverged here: nothing to bucket.
UNBUCKETED_VERDICTS = ("not-reproduced", "could-not-run")
# An FX node name is the op's name and overload, lowercased and joined by "_", with a "_N"
# suffix from the second node on ("acosh_default_1" is aten.acosh.default). Only the common
# overload names below are taken off: anything else may be part of the op's own name.
_NODE_NAME = re.compile(r"(?P<op>.+?)(?:_(?:default|tensor_mode|scalar_tensor|dim_intlist|tensor|scalar|self|int|dim))?"
                        r"(?:_\d+)?")
# Nodes that name no op of their own (a tuple element, an input).
_NOT_OPS = {"getitem", "output"}
_LEAF_NODE = re.compile(r"leaf\d*")


@dataclass(frozen=True)
class DivergenceSignature:
    """What a divergence is, as the bucket's key. `ops` are aten ops ("aten.acosh"), sorted;
    `dtypes` the dtypes of the diverging values, sorted; `arm_kinds` what was compared
    ("eager-vs-compile", "cpu-vs-cuda", "vs-float64", "vs-threads=1", "script-comparison");
    `verdict` the verdict kind; `cause` the ablation switches that made the sides agree
    ("threads=1"), else the accuracy note's section the verdict rests on, else ""."""

    ops: tuple[str, ...]
    dtypes: tuple[str, ...]
    arm_kinds: tuple[str, ...]
    verdict: str
    cause: str

    @property
    def id(self) -> str:
        """A short name that stays the same from sweep to sweep for the same signature."""
        return "b-" + hashlib.sha256(repr(astuple(self)).encode("utf-8", "surrogatepass")).hexdigest()[:8]


@dataclass
class Bucket:
    signature: DivergenceSignature
    members: list[ItemResult] = field(default_factory=list)


@dataclass
class NearMatch:
    """Two buckets with the same culprit ops whose signatures differ elsewhere. `shares` and
    `differs` name signature fields: "ops", "dtype", "arms", "verdict", "cause"."""

    a: Bucket
    b: Bucket
    shares: tuple[str, ...]
    differs: tuple[str, ...]


# Signature fields as a near match names them.
_FIELD_NAMES = (("ops", "ops"), ("dtypes", "dtype"), ("arm_kinds", "arms"), ("verdict", "verdict"),
                ("cause", "cause"))


def signature(result: ItemResult) -> DivergenceSignature | None:
    """The signature of a result's divergence; None where nothing diverged to bucket (a failed
    item, a could-not-run or not-reproduced verdict, no report)."""
    report = result.report
    verdict = result.verdict_kind or ((report or {}).get("verdict") or {}).get("kind")
    if result.outcome != "triaged" or report is None or not verdict or verdict in UNBUCKETED_VERDICTS:
        return None
    divergence = (report.get("comparison") or {}).get("divergence")
    return DivergenceSignature(ops=_culprit_ops(report, divergence), dtypes=_dtypes(report, divergence),
                               arm_kinds=_arm_kinds(report, divergence), verdict=str(verdict),
                               cause=_cause(report))


def bucket(results: list[ItemResult]) -> tuple[list[Bucket], list[NearMatch]]:
    """Results with equal signatures in one bucket, largest bucket first (ties in the order of
    their first member in `results`; members in the order of `results`), and the near matches
    between buckets, in bucket order. Results without a signature are in no bucket."""
    by_signature: dict[DivergenceSignature, Bucket] = {}
    for result in results:
        sig = signature(result)
        if sig is not None:
            by_signature.setdefault(sig, Bucket(sig)).members.append(result)
    buckets = sorted(by_signature.values(), key=lambda b: -len(b.members))  # sorted() is stable
    near = []
    for a, b in itertools.combinations(buckets, 2):
        # Empty ops say nothing about the culprit: two such buckets are not near each other.
        if a.signature.ops and a.signature.ops == b.signature.ops:
            same = [name for attr, name in _FIELD_NAMES if getattr(a.signature, attr) == getattr(b.signature, attr)]
            differs = [name for attr, name in _FIELD_NAMES if name not in same]
            near.append(NearMatch(a, b, shares=tuple(same), differs=tuple(differs)))
    return buckets, near


def _culprit_ops(report: dict[str, Any], divergence: dict[str, Any] | None) -> tuple[str, ...]:
    """The minimal graph's ops, else the ops the localization found to introduce the
    difference, else the op that computed the diverging value."""
    minimal = report.get("minimal") or {}
    ops = [str(op) for op in minimal.get("ops") or []]
    if not ops:
        ops = [str(r.get("op")) for r in report.get("localization") or []
               if r.get("role") == "introduced" and r.get("op")]
    if not ops and divergence:
        ops = _diverging_value_ops(report, divergence)
    return tuple(sorted({_normalized_op(op) for op in ops if op.strip()}))


def _diverging_value_ops(report: dict[str, Any], divergence: dict[str, Any]) -> list[str]:
    nodes = {(o.get("arm"), o.get("index")): o.get("node") for o in report.get("observables") or []}
    ops = []
    for side in (divergence.get("a"), divergence.get("b")):
        node = nodes.get(((side or {}).get("arm"), (side or {}).get("observable")))
        named = _NODE_NAME.fullmatch(node) if isinstance(node, str) else None
        if named and named["op"] not in _NOT_OPS and not _LEAF_NODE.fullmatch(named["op"]):
            ops.append(named["op"])
    return ops


def _normalized_op(op: str) -> str:
    """ "acosh", "aten.acosh" and "aten.acosh.default" as "aten.acosh"."""
    parts = op.strip().split(".")
    if len(parts) == 1:
        return "aten." + parts[0]
    return ".".join(parts[:2])


def _dtypes(report: dict[str, Any], divergence: dict[str, Any] | None) -> tuple[str, ...]:
    """The dtypes of the diverging values; without a divergence (one arm crashed, a single arm
    judged alone) the dtypes the arms computed in."""
    if divergence:
        sides = (divergence.get("a"), divergence.get("b"))
        found = [divergence.get("dtype")] + [(side or {}).get("dtype") for side in sides]
    else:
        found = [d for run in report.get("arms") or [] for d in (run.get("graph") or {}).get("dtypes") or []]
    return tuple(sorted({str(d).removeprefix("torch.") for d in found if d}))


def _arm_kinds(report: dict[str, Any], divergence: dict[str, Any] | None) -> tuple[str, ...]:
    """What was compared: the two diverging arms, or with no divergence every arm against the
    first one asked for."""
    if divergence:
        a, b = divergence.get("a") or {}, divergence.get("b") or {}
        if divergence.get("source") == "claim":
            return ("script-comparison",)
        if divergence.get("source") == "reference" or not b:
            return ("vs-float64",)
        return (_pair_kind(str(a.get("arm")), str(b.get("arm"))),)
    specs = ([str(run.get("spec")) for run in report.get("arms") or []]
             or [str(spec) for spec in report.get("arms_requested") or []])
    if len(specs) <= 1:
        return ("vs-float64",)
    return tuple(sorted({_pair_kind(specs[0], other) for other in specs[1:]}))


def _parts(spec: str) -> tuple[str, str | None, dict[str, str], str | None]:
    """(device without its index, compile backend — "inductor" where none is named — or None
    for eager, knobs, torch release or None) of an arm spec, read without checks
    (`ArmSpec.read`): a report's spec need not parse with `triage.arms.spec` on this machine (the
    fault knob is refused outside triage's tests)."""
    arm = ArmSpec.read(spec)
    backend = (arm.backend or "inductor") if arm.mode == "compile" else None
    return arm.device.split(":")[0], backend, dict(arm.knobs), arm.torch


def _pair_kind(a: str, b: str) -> str:
    """How arm `b` differs from arm `a`: "cpu-vs-cuda", "eager-vs-compile", "vs-threads=1",
    "torch-vs-2.15.0" (another release), joined by "+" where several differ; "repeat" where
    they are one arm run twice."""
    device_a, backend_a, knobs_a, release_a = _parts(a)
    device_b, backend_b, knobs_b, release_b = _parts(b)
    kinds = []
    if release_a != release_b:
        kinds.append(f"{release_a or 'torch'}-vs-{release_b or 'torch'}")
    if device_a != device_b:
        kinds.append(f"{device_a}-vs-{device_b}")
    if (backend_a is None) != (backend_b is None):
        kinds.append("eager-vs-compile")
    elif backend_a != backend_b:
        kinds.append(f"{backend_a}-vs-{backend_b}")
    changed = sorted({k for k in knobs_a.keys() | knobs_b.keys() if knobs_a.get(k) != knobs_b.get(k)})
    if changed:
        kinds.append("vs-" + ",".join(f"{k}={knobs_b.get(k, knobs_a.get(k))}" for k in changed))
    return "+".join(kinds) or "repeat"


def explains(ablation: dict[str, Any]) -> bool:
    """`model.Ablation.explains` for an ablation as report.json holds it (a dict)."""
    return (ablation.get("outcome") in AGREEING_OUTCOMES and ablation.get("supports") != "evidence"
            and ablation.get("inside_spread") is not False)


def _cause(report: dict[str, Any]) -> str:
    """The switches whose ablation made the sides agree (as classify counts them: not a float64
    re-run of one op, which says where the divergence starts, not why), else the accuracy
    note's section the verdict rests on, else ""."""
    switches = sorted({str(a.get("switch")) for a in report.get("ablations") or [] if explains(a)})
    if switches:
        return ", ".join(switches)
    section = str((report.get("verdict") or {}).get("policy_section") or "")
    return "" if section == policy.NONE.title else section
