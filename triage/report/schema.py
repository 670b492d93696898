"""report.schema.json, generated where report.json carries what an arm's worker wrote.

What triage's own process makes (the verdict, the comparison, the judgements, ablations,
the minimal script) is described in templates/report.schema.json itself. What report.json
copies from an arm's result.json (observables, leaves, fingerprints, module calls, an arm's
flags, graph, float64 reference, rounding cost) was admitted by the checks of
triage/arms/output.py, so its part of the schema is generated from those checks
(`Check.form`): the two cannot drift apart, and a field the worker starts writing either has
its place in report.json or fails a test here.

    python -m triage.report.schema           # rewrite templates/report.schema.json
    python -m triage.report.schema --check   # exit 1 when the committed file is not what it would write
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from triage.arms.output import COUNT, FINGERPRINT, FLAT, LEAF, LINE, MODULE, OBSERVABLE, RESULT, SCALAR
from triage.untrusted import Check

# Shapes defined once in arms/output.py and referred to by name across the schema.
WORKER_DEFINITIONS: dict[str, Check] = {"count": COUNT, "line": LINE, "scalar": SCALAR, "record": FLAT,
                                        "fingerprint": FINGERPRINT, "module_call": MODULE, "leaf": LEAF}
# An arm in report.json (model.ArmRun): the fields arms/run.py copies from result.json as they
# were checked, and those triage's own process sets (how the process ended, its output).
ARM_FIELDS_FROM_RESULT = ("elapsed_s", "torch_import_s", "environment", "environment_error", "flags_start",
                          "flags_end", "exception", "exit_note", "leaves", "conditioning", "graph", "reference",
                          "random_before_seed", "compiled_random_ops", "rounding")
ARM_FIELDS_OF_PARENT = ("spec", "device", "mode", "status", "wall_s", "exit_code", "signal", "failure", "stdout",
                        "stderr", "output_dropped")
# An observable in report.json: result.json's, plus the arm it belongs to (report_json moves
# every arm's observables into one list) and the script's name for it (operands.py).
OBSERVABLE_FIELDS_OF_PARENT = ("arm", "name")


def committed_path() -> Path:
    import triage.templates

    return Path(triage.templates.__file__).parent / "report.schema.json"


def generated(committed: dict[str, Any]) -> dict[str, Any]:
    """`committed` with every part that describes worker output written from the checks."""
    schema = copy.deepcopy(committed)
    defs = schema["$defs"]
    for name, check in WORKER_DEFINITIONS.items():
        defs[name] = check.definition
    arm = schema["properties"]["arms"]["items"]
    _fill(arm, "an arm", RESULT, ARM_FIELDS_FROM_RESULT, ARM_FIELDS_OF_PARENT)
    observable = defs["observable"]
    _fill(observable, "an observable", OBSERVABLE, tuple(OBSERVABLE.fields), OBSERVABLE_FIELDS_OF_PARENT)
    observable["required"] = ["arm", *OBSERVABLE.form["required"]]
    return schema


def _fill(target: dict[str, Any], what: str, check: Check, copied: tuple[str, ...], own: tuple[str, ...]) -> None:
    fields = check.fields  # type: ignore[attr-defined]
    unknown = [f for f in copied if f not in fields]
    if unknown:
        raise ValueError(f"{what}: {unknown} are not fields of result.json (triage/arms/output.py)")
    properties = {name: target["properties"][name] for name in own if name in target["properties"]}
    missing = [name for name in own if name not in properties]
    if missing:
        raise ValueError(f"{what}: templates/report.schema.json does not describe {missing}")
    # The schema's order: the process's own fields first, then the copied ones as checked.
    target["properties"] = properties | {name: fields[name].form for name in copied}


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    path = committed_path()
    text = path.read_text(encoding="utf-8")
    fresh = render(generated(json.loads(text)))
    if "--check" in argv:
        if fresh != text:
            print(f"{path} is not what `python -m triage.report.schema` writes: run it and commit the result",
                  file=sys.stderr)
            return 1
        return 0
    path.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
