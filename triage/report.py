"""Stage 5: render a `Report` as the GitHub comment (jinja2), report.json and the terminal view."""
from __future__ import annotations

import importlib.resources
import json
import re
from typing import Any

import jinja2

from triage.model import LocalizedOp, Report, to_jsonable

SCHEMA_ID = "triage.report/1"
COMMENT_LIMIT = 65536
LOCALIZATION_ROWS = 8
MARKER = "<!-- triage:report -->"


def _fence(text: str, lang: str = "") -> str:
    """A code fence longer than any backtick run inside `text`, so nothing escapes it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _environment() -> jinja2.Environment:
    folder = importlib.resources.files("triage.templates")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), autoescape=False,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["fence"] = _fence
    return env


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
        "triage_version": data["triage_version"],
        "seconds": data["seconds"],
    }


def write_json(report: Report, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report_json(report), f, indent=1, allow_nan=False)
        f.write("\n")


def render_comment(report: Report, limit: int = COMMENT_LIMIT) -> str:
    """The comment, shrinking the collapsible parts until it fits GitHub's limit."""
    for caps in ((20000, 4000, 12000), (6000, 1500, 4000), (2000, 600, 1200), (500, 200, 0)):
        text = _render(report, *caps)
        if len(text) <= limit:
            return text
    return text[: limit - 200] + "\n\n… (truncated to fit GitHub's comment limit)\n"


def _render(report: Report, source_cap: int, output_cap: int, env_cap: int) -> str:
    c, v = report.comparison, report.verdict
    runs = c.arms if c else []
    d = c.divergence if c else None
    headline = d.observable_label if d else "value"
    arms_rows = []
    for r in runs:
        side = None
        if d is not None:
            side = next((s for s in (d.a, d.b) if s is not None and s.arm == r.spec), None)
        value = side.summary if side else (r.failure or "—" if r.status != "ok" else "—")
        if side and side.max_rel_error is not None:
            error = f"rel {side.max_rel_error:.2g}, {side.max_ulps:.3g} ulp"
        elif side and side.reference_summary:
            error = f"float64 {side.reference_summary}"
        else:
            error = "—"
        arms_rows.append({"spec": r.spec, "status": r.status, "value": _cell(value), "error": _cell(error),
                          "time": f"{r.elapsed_s:.2f} s" if r.elapsed_s is not None else "—"})
    details = []
    for r in runs:
        exc = r.exception["traceback"] if r.exception else ""
        details.append({"spec": r.spec, "failure": _cell(r.failure) if r.failure else None,
                        "stdout": _cap(r.stdout, output_cap), "exception": _cap(exc, output_cap),
                        "flags": json.dumps(r.flags_end or r.flags_start, indent=1) if (r.flags_end or r.flags_start) else ""})
    env_run = next((r for r in runs if r.environment), None)
    from triage import policy

    quote = next((s.quote for s in vars(policy).values()
                  if isinstance(s, policy.Section) and s.title == v.policy_section), "")
    truncated = "collapsible sections shortened to fit" if source_cap < 20000 else "full report in report.json"
    return _environment().get_template("comment.md.j2").render(
        marker=MARKER, v=v, quote=quote, arms=arms_rows, headline_label=_cell(headline),
        notes=report.notes, repro_name=report.repro.name, repro_source=_cap(report.repro.source, source_cap),
        arm_details=details, environment=_cap(env_run.environment, env_cap) if env_run and env_cap else "",
        environment_arm=env_run.spec if env_run else None, version=report.triage_version,
        seconds=report.seconds, arms_requested=report.arms_requested, truncated=truncated,
        minimal=report.minimal, minimal_script=_cap(report.minimal.script, source_cap) if report.minimal else "",
        localization=[_localized_row(r) for r in report.localization[:LOCALIZATION_ROWS]],
    )


def _localized_row(r: LocalizedOp) -> dict[str, str]:
    return {"op": r.op, "line": str(r.line) if r.line is not None else "—",
            "role": ("first to differ; " if r.first else "") + r.role,
            "local": _cell(_errors(r.local)), "end_to_end": _cell(_errors(r.end_to_end))}


def _errors(e: dict[str, Any] | None) -> str:
    if not e:
        return "—"
    if e["kind"] == "equal":
        return "bitwise equal"
    if e["kind"] in ("nonfinite", "raises"):
        return f"{e['kind']} ({e.get('detail')})"
    return f"{e['kind']}: {e.get('max_ulps') or 0:.3g} ulp, abs {e.get('max_abs') or 0:.3g}"


def _cap(text: str | None, cap: int) -> str:
    if not text:
        return ""
    return text if len(text) <= cap else text[: cap // 2] + "\n[…]\n" + text[-cap // 2:]


def _cell(text: str) -> str:
    """Table cells: no newlines, no pipes, no HTML."""
    return re.sub(r"[\r\n]+", " ", text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")[:300]


def render_terminal(report: Report, console: Any) -> None:
    """The rich terminal summary: verdict first, then the arms table and the evidence."""
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    v = report.verdict
    colour = {True: "green", False: "red", None: "yellow"}[v.expected]
    expected = {True: "expected", False: "NOT expected", None: "undetermined"}[v.expected]
    console.print(Panel(f"[bold]{v.kind}[/bold] ({expected})\n\n{escape(v.summary)}",
                        title=f"triage: {report.repro.name}", border_style=colour))
    c = report.comparison
    if c and c.arms:
        table = Table(title="arms")
        for col in ("arm", "status", "script s", "observed", "reference"):
            table.add_column(col)
        for r in c.arms:
            ref = r.reference["status"] if r.reference else "—"
            table.add_row(r.spec, escape(r.status if not r.failure else f"{r.status}: {r.failure}"),
                          f"{r.elapsed_s:.2f}" if r.elapsed_s is not None else "—",
                          str(len(r.observables)), ref)
        console.print(table)
    for e in v.evidence:
        console.print(f" • {e}", markup=False, highlight=False)
    m = report.minimal
    if m:
        state = "verified in fresh arms" if m.verified else "NOT verified: " + m.verification
        console.print(f"minimal repro: {len(m.ops)} op(s) ({', '.join(m.ops[:8])}) of {m.original_ops}, "
                      f"{m.queries} queries, {m.seconds:.1f} s, {state}", markup=False, highlight=False)
        from rich.syntax import Syntax

        console.print(Syntax(m.script, "python", word_wrap=True))
    if report.localization:
        table = Table(title="where it diverges (top ops)")
        for col in ("op", "line", "role", "local error", "end to end"):
            table.add_column(col)
        for row in [_localized_row(r) for r in report.localization[:LOCALIZATION_ROWS]]:
            table.add_row(row["op"], row["line"], row["role"], row["local"], row["end_to_end"])
        console.print(table)
    for n in report.notes:
        console.print(f" · {n}", markup=False, highlight=False)
    console.print(f"policy: {v.policy_section} {v.policy_url}", markup=False, highlight=False)
    if v.labels:
        console.print("suggested labels: " + ", ".join(v.labels), markup=False, highlight=False)
