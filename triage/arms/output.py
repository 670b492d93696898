"""What an arm's worker hands back, checked before triage's own process believes any of it.

The reporter's script runs in the worker's interpreter: it can rewrite ``result.json`` and
``values.npz`` (by reaching into the worker's modules), write to the control pipe, and leave
anything at all in the arm's directory.  Forged *values* cannot be told from real ones (the README says so); forged
*structure* can, and must never crash, hang or bloat triage's process.  Everything read here
is held to the shape triage's worker writes (`RESULT`, plus the cross-references the
comparison follows); anything else is an `UntrustedOutput`, which the caller turns into a
crashed arm.  The limits mirror report.schema.json where a field is copied into the report.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from triage.untrusted import (
    Check,
    UntrustedOutput,
    all_of,
    array,
    boolean,
    described,
    either,
    integer,
    load_npz,
    mapping,
    maybe,
    named,
    number,
    one_of,
    read_json,
    record,
    text,
)
from triage.worker.claims import MAX_OPERANDS, OPERAND_BUDGET_SHARE
from triage.worker.knob_calls import MATMUL_PRECISIONS, MAX_KNOB_CALLS, MAX_THREADS, SETTERS
from triage.worker.limits import MAX_CONDITIONING, MAX_LEAVES
from triage.worker.protocol import CHECK_OPERAND, OBSERVED, REFERENCE, SPREAD_ARRAYS, VALUE_ARRAYS

MAX_RESULT_BYTES = 64 << 20  # as large as a report `triage post` accepts, which carries most of it
# The worker keeps at most 2,000 observables (triage/worker/observe.py); a looser cap here only
# bounds what the parent reads.
MAX_OBSERVABLES = 10000
VALUE_ARRAY = re.compile(rf"({'|'.join(VALUE_ARRAYS + (CHECK_OPERAND,))})(0|[1-9][0-9]{{0,5}})")  # a name and an index


def values_budget(value_budget_bytes: int) -> int:
    """Bytes of values.npz triage reads for an arm given the worker's value budget: the observed
    values (the budget), their float64 references (up to 4× that, for half precision), the
    rounding spreads (the budget again) and a failing check's operands (a share of it)."""
    return int((6 + OPERAND_BUDGET_SHARE) * value_budget_bytes)


# -- result.json ----------------------------------------------------------------------------
# Where a field is copied into report.json, its limits are report.schema.json's (closed records
# included): a result that passes here makes a report that validates.
COUNT = named("count", integer(0, 1 << 63))
LINE = named("line", integer(0, 100_000_000, nullable=True))
NAME = text(200)
OPTIONAL_NAME = text(200, nullable=True)
OP = text(200, pattern=r"[^\r\n]*")
DTYPE = text(40, pattern=r"[a-z][a-z0-9_]*")
NOTE = text(4000, nullable=True)
NONFINITE = one_of("nan", "inf", "-inf")  # how the worker writes a nonfinite sample value
SCALAR = named("scalar", either(text(1000, nullable=True), number(), boolean()))


FLAT = named("record", mapping(either(SCALAR, array(SCALAR, 64)), 64, key_pattern=r"[A-Za-z_][A-Za-z0-9_]{0,63}"),
             "A flat record the comment never reads (a numerics flag set, a conditioning note, settings): capped, "
             "not described key by key.")
FLAT_OR_NULL = maybe(FLAT)


FINGERPRINT = named("fingerprint", record({
    "shape": array(COUNT, 64),
    "dtype": DTYPE,
    "numel": COUNT,
    "sha256": text(64, pattern=r"[0-9a-f]+"),
    "nan": COUNT, "posinf": COUNT, "neginf": COUNT,
    "min": number(nullable=True), "max": number(nullable=True), "norm": number(nullable=True),
    "sample": array(either(number(), boolean(), NONFINITE, array(either(number(), NONFINITE), 2, min_items=2)), 64),
}, required=("shape", "dtype", "numel", "sha256"), closed=True, nullable=True),
    "A tensor's shape, dtype, a hash of its bits, nonfinite counts and a few values (triage/worker/fingerprint.py).")

OBSERVABLE_ROUNDING = record({
    "status": one_of("judged", "not-judged"),
    "reason": NOTE,
    "samples": integer(0),
    "sample_stats": array(number(), 10000),
    "sample_unmoved": described("Of each sample: its elements off the float64 value where no other sample is (its "
                                "statistic is inf there), which orders two infinite statistics.",
                                array(integer(0), 10000)),
    "flips": array(record({"node": OPTIONAL_NAME, "op": OP, "line": integer(nullable=True), "replays": integer(0),
                           "of": integer(0),
                           "ties": described("The op picked among exactly equal values (which comes first among "
                                             "them is its own choice).", boolean())},
                          required=("op", "replays", "of"), closed=True), 16),
    "cancellations": array(record({"node": OPTIONAL_NAME, "op": OP, "line": integer(nullable=True),
                                   "kind": one_of("cancels", "absorbs", "amplifies"),
                                   "digits_lost": number(), "hint": text(2000, nullable=True),
                                   "reference_error": described(
                                       "The largest error float64 itself makes there, u64·(|a| + |b|): the float64 "
                                       "replay's own error, which no difference of float64 values below it outgrows.",
                                       number()),
                                   "typical_digits_lost": described(
                                       "The median digits a cancellation loses over the elements whose difference is "
                                       "not 0 (`digits_lost` is the worst element's).", number(nullable=True))},
                                  required=("op", "digits_lost"), closed=True), 16),
    "overflow": described("The first op upstream whose replay leaves its dtype's range (±inf or nan from finite"
                          " inputs), where the value is not finite.",
                          record({"node": OPTIONAL_NAME, "op": OP, "line": integer(nullable=True), "dtype": DTYPE,
                                  "largest": number(), "kind": one_of("overflow", "nan"),
                                  "zeros": described("Whether an input of that op holds zeros (log(0), x/0): a "
                                                     "non-finite result from a zero, not from a value past the "
                                                     "largest.", boolean()),
                                  "underflow": described(
                                      "The op upstream that rounded a nonzero value to 0, where the op leaving the "
                                      "range read zeros (log(0) after an exp underflowed).",
                                      record({"op": OP, "line": integer(nullable=True),
                                              "smallest": number(nullable=True)},
                                             required=("op",), closed=True, nullable=True))},
                                 required=("op", "dtype", "largest", "kind"), closed=True, nullable=True)),
    "precision": text(40, nullable=True),
    "unmeasured": array(OP, 64),
    "spread_of": described("The observable whose spread arrays this one shares: the same recorded value, observed"
                           " again.", integer(0, nullable=True)),
    "order_dependent": described("Ops of the value's computation whose CUDA kernels are nondeterministic"
                                 " (atomic adds, scattered writes: torch.use_deterministic_algorithms), where the value is modelled on CUDA.", array(OP, 64)),
}, required=("status",), closed=True, nullable=True)

MODULE = named("module_call", record({
    "instance": COUNT,
    "variable": text(300, nullable=True),
    "training": boolean(),
    "train_layers": array(record({"path": text(1000), "type": text(300), "effect": text(1000)},
                                 required=("path", "type", "effect"), closed=True), 64),
    "inputs": array(text(64, pattern=r"[0-9a-f]+", nullable=True), 10000),
    "weights_version": COUNT,
    "buffers": described("A digest of each buffer's bytes at the call (or its version counter, 'v<n>', for a large one): "
                         "running statistics moved by a train-mode forward.", mapping(text(24, pattern=r"[0-9a-fv?-]+"), 64)),
    "settings": FLAT,
}, required=("instance",), closed=True, nullable=True),
    "A root module call: which instance, its training state, input digests and numerics settings "
    "(triage/worker/observe.py).")

OBSERVABLE_FIELDS: dict[str, Check] = {
    "index": COUNT,
    "kind": one_of("call", "readback", "claim", "final"),
    "label": text(300),
    "line": LINE,
    "fingerprint": FINGERPRINT,
}
STREAMED_OBSERVABLE = record(OBSERVABLE_FIELDS, required=tuple(OBSERVABLE_FIELDS), closed=True)
# Two sides whose float64 values differ: the one change to a side's ops that makes it equal
# the other in float64 (triage/worker/counterfactual.py).
ONE_CHANGE = record({
    "op": OP, "line": integer(nullable=True),
    "kind": one_of("constant", "without", "moved", "argument", "sign", "dropped", "transposed", "shifted",
                   "triangle", "conjugated", "negated", "opposite", "swapped", "exchanged", "inputs"),
    "argument": text(100), "around": maybe(OP),
    "was": either(number(), boolean(), array(integer(), 8), text(20)),
    "to": either(number(), boolean(), array(integer(), 8), text(20)),
    "named": text(40, nullable=True),
    "operand": described("The op that made the operand changed (dropped, transposed); null for an input.",
                         record({"op": OP, "line": integer(nullable=True)}, required=("op",), closed=True,
                                nullable=True)),
    "exchanged_with": described("Of two ops' operands exchanged: the op that made the second op's operand; null "
                                "for an input.",
                                record({"op": OP, "line": integer(nullable=True)}, required=("op",), closed=True,
                                       nullable=True)),
    "also": described("The other ops changed alike (dims several reductions share, the slices of one "
                      "dimension), the first 8.",
                      array(record({"op": OP, "line": integer(nullable=True)}, required=("op",), closed=True), 8)),
    "places": described("How many ops the change touches.", integer(nullable=True)),
    "residual": described("The changed side's remaining relative gap where it is above float64's noise (inputs "
                          "held at a narrower dtype); null: none.", number(nullable=True)),
    "written": described("An in-place op both sides read, which wrote the changed op's input before it read it; "
                         "null: none.",
                         record({"op": OP, "line": integer(nullable=True)}, required=("op",), closed=True,
                                nullable=True)),
}, required=("op", "kind", "argument", "was", "to"), closed=True)
OBSERVABLE = record({
    **OBSERVABLE_FIELDS,
    "node": OPTIONAL_NAME,
    "call_line": described("The top-level script line whose call led to this value (a function the script calls "
                           "twice: two call lines).", LINE),
    "claim": record({"id": COUNT, "func": text(300), "operand": one_of(0, 1), "holds": boolean(nullable=True),
                     "measure": described("The readback of the script's own error measure of the two operands.",
                                          COUNT),
                     "tolerance": described("The rtol and atol the check asked for (allclose, isclose; "
                                            "assert_close given both).",
                                            record({"rtol": number(), "atol": number()}, required=("rtol", "atol"),
                                                   closed=True))},
                    required=("id", "func", "operand"), closed=True, nullable=True),
    "module": MODULE,
    "expression": described("A readback's call as the script's source spells it (`a.item()`): the worker's "
                            "word, used only where the source has it on that line (compare.name_from_source).",
                            text(300, nullable=True)),
    "ancestors": array(COUNT, 10000),
    "conditioning": array(COUNT, 10000),
    "compiled_line": described("The script line of a `torch.compile`d call the value comes through (its op "
                               "graph ran as the backend compiled it); null: none.", LINE),
    "reference": record({"fingerprint": FINGERPRINT, "note": NOTE, "approximate": boolean(),
                         "one_change": described(
                             "A claim's operand whose float64 value differs from the other's: the one change to its "
                             "ops that makes the two equal in float64 (triage/worker/counterfactual.py).",
                             ONE_CHANGE)},
                        closed=True, nullable=True),
    "uninitialized": described("Whether the value reads bytes a `torch.empty` left uninitialized (a float64 replay "
                               "with them NaN makes it NaN); null: not known.", boolean(nullable=True)),
    "rounding": OBSERVABLE_ROUNDING,
}, required=tuple(OBSERVABLE_FIELDS), closed=True)

LEAF = named("leaf", record({
    "index": COUNT,
    "node": NAME,
    "kind": text(40),
    "op": OPTIONAL_NAME,
    "line": LINE,
    "fingerprint": FINGERPRINT,
    "seed": record({"line": LINE, "value": integer(nullable=True), "draws": COUNT}, required=("draws",), closed=True,
                   nullable=True),
    "call_line": LINE,
    "literal_rounding": described("The largest relative rounding of the numbers the script wrote for it (Python "
                                  "floats its dtype does not hold exactly, `torch.tensor(math.pi / 2)`); null for "
                                  "any other leaf", number(nullable=True)),
    "literal_beyond_range": described("The largest number the script wrote for it that its dtype's range does not "
                                      "reach (`torch.tensor(1e40)` in float32: inf from the start); null: none",
                                      number(nullable=True)),
}, required=("index", "kind"), closed=True),
    "An input the recorded computation starts from: a weight, a random draw, a loaded tensor (worker/session.py).")

# The fields the verdict's sentences read; the rest of a note is only shown.
CONDITIONING = all_of(FLAT, record({
    "op": NAME, "shape": array(COUNT, 64), "dtype": DTYPE, "node": OPTIONAL_NAME, "line": LINE,
    "kind": NAME, "figure": text(1000),
    "singular": boolean(), "ill_conditioned": boolean(), "exact_singular": boolean(nullable=True),
    "cond": number(nullable=True), "rank": integer(nullable=True), "order": integer(nullable=True),
}, required=("op", "shape", "dtype")))

EXCEPTION = record({
    "type": text(300, pattern=r".+"),
    "qualified_type": text(1000),
    "message": text(20000),
    "traceback": text(200000),
    "line": LINE,
    "claim": boolean(),
}, required=("type", "message"), closed=True, nullable=True)

RESULT = record({
    "status": one_of("ok", "raised", "unavailable"),
    "unavailable": text(4000),
    "torch_import_s": number(nullable=True),
    "environment": text(200000, nullable=True),
    "environment_error": NOTE,
    "flags_start": FLAT_OR_NULL,
    "flags_end": FLAT_OR_NULL,
    "elapsed_s": number(nullable=True),
    "rounding": record({"seconds": number(nullable=True), "samples": integer(0, nullable=True), "note": NOTE,
                        "kernels": text(300, nullable=True), "reductions_drawn_whole": integer(0, nullable=True)},
                       closed=True, nullable=True),
    "exception": EXCEPTION,
    "check_operands": described(
        "The floats the script's failing check compared (worker/claims.py); the values of operand i are "
        "values.npz's chk<i>.",
        array(record({
            "name": described("The operand as the script's source spells it: a name (`n`) or an expression "
                              "(`sum(x.tolist())`).", text(200, pattern=r"[^\r\n]+")),
            "dtype": one_of("float16", "float32", "float64", "float128", "longdouble"),
            "shape": array(COUNT, 64),
            "one_change": described("Torch's value, where the check equates it with one computed outside torch "
                                    "and their float64 values differ: the one change to its ops that makes it "
                                    "that value.", ONE_CHANGE),
        }, required=("name", "dtype", "shape"), closed=True), MAX_OPERANDS)),
    "exit_note": text(2000, nullable=True),
    "observables": array(OBSERVABLE, MAX_OBSERVABLES),
    "observables_truncated": boolean(),
    "leaves": array(LEAF, MAX_LEAVES),
    "conditioning": array(CONDITIONING, MAX_CONDITIONING),
    # What the worker kept out of `leaves` and `conditioning` to stay within those limits.
    "left_out": record({"leaves": COUNT, "conditioning": COUNT}, closed=True, nullable=True),
    "graph": record({"nodes": COUNT, "leaves": COUNT, "compiled_graphs": COUNT, "stopped": NOTE,
                     "dtypes": array(DTYPE, 64), "export": NOTE,
                     "backends": described(
                         "Backends the script passes to torch.compile as its own callables (name, the line defining "
                         "them): the minimizer's workers compile with inductor only.",
                         array(record({"name": text(200), "line": LINE}, required=("name",), closed=True),
                               16))}, closed=True, nullable=True),
    "reference": record({"status": one_of("off", "partial", "complete"), "seconds": number(nullable=True),
                         "note": NOTE, "approximate_ops": array(NAME, 1000)}, required=("status",), closed=True,
                        nullable=True),
    "random_before_seed": record({"op": NAME, "line": LINE}, required=("op",), closed=True, nullable=True),
    "compiled_random_ops": array(NAME, 1000),
    # The script's own calls that set what the arm's knobs set (`knob_calls.SETTERS`).
    "knob_calls": array(record({"setter": one_of(*SETTERS), "line": integer(1, 100_000_000),
                                "value": either(integer(1, MAX_THREADS), boolean(), one_of(*MATMUL_PRECISIONS))},
                               required=("setter", "line", "value"), closed=True), MAX_KNOB_CALLS),
}, required=("status",))

# Fewer samples leave the judge's significant-digit estimator undefined (its χ² quantile).
MIN_JUDGED_SAMPLES = 3


def read_result(path: Path, script_started: bool) -> dict[str, Any]:
    """result.json, held to `RESULT` and its cross-references; `script_started`: the worker had
    announced the script, so the device cannot have been found unavailable before it."""
    doc = read_json(path, MAX_RESULT_BYTES)
    problem = _where(RESULT(doc)) or _consistency_problem(doc, script_started)
    if problem:
        raise UntrustedOutput(f"{path.name}: {problem}")
    return doc


def _where(problem: str | None) -> str | None:
    """A check's problem as "path: what" (a problem with the document itself has no path)."""
    if problem is None:
        return None
    return problem[1:] if problem.startswith("/") else problem.removeprefix(": ")


def _consistency_problem(doc: dict[str, Any], script_started: bool) -> str | None:
    """What the shapes cannot say: fields that go with the status, indices that are positions,
    and every index referring to an entry."""
    status = doc["status"]
    if status == "raised" and doc.get("exception") is None:
        return "status: raised, without the exception"
    if status == "unavailable" and ("unavailable" not in doc or script_started):
        return "status: unavailable, after the script had started or without saying why"
    leaves, conditioning = doc.get("leaves", []), doc.get("conditioning", [])
    for name, entries in (("observables", doc.get("observables", [])), ("leaves", leaves)):
        for i, entry in enumerate(entries):
            if entry["index"] != i:
                return f"{name}/{i}/index: {entry['index']} is not its position {i}"
    for i, o in enumerate(doc.get("observables", [])):
        for field, entries in (("ancestors", leaves), ("conditioning", conditioning)):
            if any(k >= len(entries) for k in o.get(field, [])):
                return f"observables/{i}/{field}: an index past the {len(entries)} recorded"
        for fp in (o["fingerprint"], (o.get("reference") or {}).get("fingerprint")):
            if fp is not None and fp["numel"] != math.prod(fp["shape"]):
                return f"observables/{i}: a fingerprint whose numel is not the product of its shape"
        if not _judgeable(o.get("rounding")):
            return (f"observables/{i}/rounding: judged, but not on {MIN_JUDGED_SAMPLES} or more samples with one "
                    "statistic each")
    for i, note in enumerate(conditioning):
        if "figure" in note and not {"kind", "line"} <= note.keys():
            return f"conditioning/{i}: a figure without its kind and line"
    return None


def _judgeable(rounding: dict[str, Any] | None) -> bool:
    """Not a judged spread, or one with enough samples and a statistic per sample."""
    if not rounding or rounding["status"] != "judged":
        return True
    samples = rounding.get("samples", 0)
    return samples >= MIN_JUDGED_SAMPLES and len(rounding.get("sample_stats", [])) == samples


# -- values.npz -----------------------------------------------------------------------------
def read_values(path: Path, result: dict[str, Any], max_bytes: int) -> dict[str, np.ndarray]:
    """values.npz: numeric arrays only, within `max_bytes`, each the shape of the observable it
    belongs to.  No file is no values (the worker writes none when it kept none)."""
    if not os.path.lexists(path):
        return {}
    observables = result.get("observables", [])
    operands = result.get("check_operands", [])
    values = load_npz(path, max_bytes, max_members=(2 + len(SPREAD_ARRAYS)) * max(len(observables), 1)
                      + len(operands), wanted=VALUE_ARRAY)
    for key, value in values.items():
        kind, index = VALUE_ARRAY.fullmatch(key).groups()
        i = int(index)
        if kind == CHECK_OPERAND:
            if i >= len(operands) or list(value.shape) != operands[i]["shape"] or value.dtype != np.float64:
                raise UntrustedOutput(f"{path.name}: {key} is no float64 array of check operand {i}'s shape")
            continue
        if i >= len(observables):
            raise UntrustedOutput(f"{path.name}: {key} belongs to no observable")
        fp = observables[i]["fingerprint"]
        if kind in (OBSERVED, REFERENCE) and (fp is None or list(value.shape) != fp["shape"]):
            raise UntrustedOutput(f"{path.name}: {key} is not the shape of observable {i}")
        if kind in SPREAD_ARRAYS and value.shape != values.get(f"sig{i}", value).shape:
            raise UntrustedOutput(f"{path.name}: {key} is not the shape of sig{i}")
    return values


# -- control messages -----------------------------------------------------------------------
def streamed_observables(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The observables the worker streamed before it stopped, those of them that are well-formed
    (the rest are dropped: a crashed arm's observables are only shown)."""
    found = []
    for message in messages:
        o = message.get("observable")
        if isinstance(o, dict) and STREAMED_OBSERVABLE(o) is None:
            found.append(o)
            if len(found) >= MAX_OBSERVABLES:
                break
    return found


def worker_error_text(messages: list[dict[str, Any]]) -> str | None:
    """The traceback of the first `worker-error` message, if it carries one that is text."""
    error = next((m.get("error") for m in messages if m.get("phase") == "worker-error"), None)
    return error[-8000:] if isinstance(error, str) and error.strip() else None


# -- warm worker replies --------------------------------------------------------------------
# The warm worker runs no code from the script, but it reads the graph the arm recorded and a
# process the script left behind could reach it: its replies are held to what serve.py sends.
ERRORS = record({
    "kind": one_of("equal", "rounding", "mismatch", "nonfinite", "raises"),
    "detail": text(500, nullable=True),
    "max_abs": number(nullable=True), "max_ulps": number(nullable=True),
    "nonfinite": integer(minimum=0, nullable=True),
}, required=("kind",), closed=True, nullable=True)
ROW = record({"end_to_end": ERRORS, "local": ERRORS, "error": text(1000)})
WHOLE_FAILED = record({"error": text(1000)}, required=("error",))  # rows["__whole__"]: why the whole plan failed

REPLY = record({
    "ok": boolean(),
    "error": record({"type": text(300), "message": text(20000), "traceback": text(200000)}, required=("type",)),
    "torch": text(200),
    "values": COUNT,
    "bytes": COUNT,
    "digests": mapping(text(64), 10_000_000),
    "outputs": array(record({"name": NAME, "dtype": DTYPE}, required=("name", "dtype")), 100000),
    "rows": mapping(ROW, 10_000_000),
    "script": text(4 << 20),
    "forms": array(OP, 100000),
    # The float64 "set with" line per op: shown in the comment's code cells, one line each.
    "float64_lines": mapping(text(2000, pattern=r"[^\r\n]*"), 100000),
    "results": array(text(200, pattern=r"[A-Za-z_][A-Za-z0-9_]*"), 4),
    "dtypes": mapping(DTYPE, 100000),
    # Copied next to minimal.py under this name: a plain file name, never a path.
    "side_file": text(255, pattern=r"[A-Za-z0-9_][A-Za-z0-9_.-]*", nullable=True),
    "arrays": array(record({}), 100000),
}, required=("ok",))


def reply_problem(header: dict[str, Any]) -> str | None:
    """Why a warm worker's reply header is not one serve.py sends (None: it is)."""
    if "lost" in header:
        return "it says the worker was lost, which only triage's side says"
    problem = _where(REPLY(header))
    rows = header.get("rows")
    if problem is None and isinstance(rows, dict) and "__whole__" in rows:
        problem = _where(WHOLE_FAILED(rows["__whole__"]))
        return f"rows/__whole__: {problem}" if problem else None
    return problem
