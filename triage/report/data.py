"""Stage 6's data: a Report as report.json, and report.schema.json, the closed description of
what `triage post` accepts from a job that ran untrusted code.
"""
from __future__ import annotations

import functools
import importlib.resources
import json
from typing import Any

from triage.model import Report, to_jsonable

SCHEMA_ID = "triage.report/1"


@functools.lru_cache(maxsize=1)
def template_texts() -> dict[str, str]:
    """The comment template and the schema, read once, before any arm runs (the CLI preloads
    them): nothing read after a repro ran comes from a file a repro could have written."""
    folder = importlib.resources.files("triage.templates")
    return {name: folder.joinpath(name).read_text(encoding="utf-8") for name in ("comment.md.j2", "report.schema.json")}


def report_json(report: Report) -> dict[str, Any]:
    data = to_jsonable(report)
    comparison = data.pop("comparison") or {}
    runs = comparison.pop("arms", [])
    observables = []
    for run in runs:
        for o in run.pop("observables", []):
            observables.append(dict(o, arm=run["spec"]))
    return {
        "schema": SCHEMA_ID,
        "verdict": data["verdict"],
        "arms": runs,
        "observables": observables,
        "repro": data["repro"],
        "comparison": comparison,
        "arms_requested": data["arms_requested"],
        "notes": data["notes"],
        "minimal": data["minimal"],
        "localization": data["localization"],
        "issue": data["issue"],
        "ablations": data["ablations"],
        "triage_version": data["triage_version"],
        "seconds": data["seconds"],
        "isolation": data["isolation"],
        "reported": data["reported"],
    }


def write_json(data: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, allow_nan=False)
        f.write("\n")


def load_schema() -> dict[str, Any]:
    return json.loads(template_texts()["report.schema.json"])


def validate_report(data: Any) -> list[str]:
    """Every way `data` breaks report.schema.json (strict types, enums, sizes), as
    `path: message` lines; empty when it is a report this renderer may read."""
    import jsonschema

    # JSON Schema's integer admits 7.0; an issue number read from JSON as a float is not one
    # (PyGithub asserts int), so an integer here is an int that is not a bool.
    strict = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=strict)(load_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {_short(e.message)}" for e in errors[:20]]


def _short(message: str) -> str:
    return message if len(message) <= 200 else message[:200] + "…"
