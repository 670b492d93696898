"""report.schema.json is one description (issue 28 item 5): where report.json carries what an
arm's worker wrote, the schema is generated from the checks that admitted it
(triage/arms/output.py), and the committed file is what the generator writes."""
import dataclasses
import json

import jsonschema
import pytest

from triage.arms.output import CONDITIONING, FINGERPRINT, LEAF, MODULE, OBSERVABLE, RESULT
from triage.model import ArmRun, Observable
from triage.report.schema import (
    ARM_FIELDS_FROM_RESULT,
    ARM_FIELDS_OF_PARENT,
    OBSERVABLE_FIELDS_OF_PARENT,
    committed_path,
    generated,
    main,
    render,
)

COMMITTED = json.loads(committed_path().read_text(encoding="utf-8"))


def test_the_committed_schema_is_what_the_generator_writes():
    assert render(generated(COMMITTED)) == committed_path().read_text(encoding="utf-8")
    assert main(["--check"]) == 0


def _json_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("json", True)}


# result.json fields that do not reach report.json as an arm's field, and why.
RESULT_FIELDS_ELSEWHERE = {
    "status": "the process's own status (crashed, timeout) may replace it",
    "unavailable": "becomes the arm's `failure`",
    "observables": "report_json moves every arm's observables into one list",
    "observables_truncated": "said in the report's notes",
    "left_out": "said in the report's notes",
    "knob_calls": "said in the report's notes",
    "check_operands": "read by the ladder only (a failing check's operands, which the verdict quotes)",
}


def test_every_field_of_an_arm_in_the_report_is_either_copied_from_a_check_or_set_by_triage():
    assert _json_fields(ArmRun) == set(ARM_FIELDS_FROM_RESULT) | set(ARM_FIELDS_OF_PARENT) | {"observables"}
    assert set(RESULT.fields) == set(ARM_FIELDS_FROM_RESULT) | set(RESULT_FIELDS_ELSEWHERE)


def test_every_field_of_an_observable_in_the_report_is_either_checked_or_set_by_triage():
    assert _json_fields(Observable) | {"arm"} == set(OBSERVABLE.fields) | set(OBSERVABLE_FIELDS_OF_PARENT)


def test_a_field_the_worker_starts_writing_without_a_place_in_the_report_is_refused():
    schema = json.loads(json.dumps(COMMITTED))
    del schema["properties"]["arms"]["items"]["properties"]["stdout"]
    with pytest.raises(ValueError, match="does not describe"):
        generated(schema)


def test_every_reference_resolves():
    refs = []

    def walk(x):
        if isinstance(x, dict):
            if "$ref" in x:
                refs.append(x["$ref"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(COMMITTED)
    assert refs and all(r.startswith("#/$defs/") and r.removeprefix("#/$defs/") in COMMITTED["$defs"] for r in refs)


FINGERPRINT_OK = {"shape": [2], "dtype": "float32", "numel": 2, "sha256": "ab12", "nan": 0, "min": -1.5,
                  "sample": [1.0, "inf", [0.5, 2.0]]}
CASES = [
    (FINGERPRINT, FINGERPRINT_OK),
    (FINGERPRINT, None),
    (FINGERPRINT, {**FINGERPRINT_OK, "sha256": "XYZ"}),  # not hex
    (FINGERPRINT, {**FINGERPRINT_OK, "dtype": "Float32"}),  # not a dtype's name
    (FINGERPRINT, {**FINGERPRINT_OK, "planted": 1}),  # closed
    (FINGERPRINT, {k: v for k, v in FINGERPRINT_OK.items() if k != "numel"}),  # required
    (FINGERPRINT, {**FINGERPRINT_OK, "sample": [[1.0]]}),  # a pair of two
    (LEAF, {"index": 0, "kind": "random", "seed": {"draws": 3, "line": None}}),
    (LEAF, {"index": -1, "kind": "random"}),
    (LEAF, {"index": 0, "kind": "random", "seed": {"line": 2}}),
    (LEAF, {"index": 0, "kind": "x" * 41}),
    (MODULE, {"instance": 1, "buffers": {"running_mean": "v12"}, "settings": {"tf32": True, "dims": [1, 2]}}),
    (MODULE, {"instance": 1, "buffers": {"running_mean": "not hex!"}}),
    (MODULE, {"instance": 1, "settings": {"not a name": 1}}),
    (MODULE, {"instance": 1, "settings": {f"k{i}": i for i in range(65)}}),
    (CONDITIONING, {"op": "linalg_solve", "shape": [2, 2], "dtype": "float32", "cond": 1e3, "extra_note": "kept"}),
    (CONDITIONING, {"op": "linalg_solve", "shape": [2, 2]}),
    (CONDITIONING, {"op": "linalg_solve", "shape": [2, 2], "dtype": "float32", "nested": {"a": 1}}),
]


@pytest.mark.parametrize("check, value", CASES)
def test_the_generated_schema_admits_what_the_check_admits_and_nothing_else(check, value):
    """The form is the check: the schema `triage post` applies to report.json and the check
    `triage run` applies to result.json take and refuse the same values."""
    validator = jsonschema.Draft202012Validator({"$defs": COMMITTED["$defs"], **check.form})
    assert (check(value) is None) == validator.is_valid(value), (check(value), list(validator.iter_errors(value)))
