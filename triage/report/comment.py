"""Stage 6's comment: report data → the GitHub comment (templates/comment.md.j2), its hidden
marker and digest, and the size caps.

The comment is rendered from report.json's data, never from live objects, so `triage run`
and the Action's privileged `triage post` (which holds a token and reads a report written by
a job that ran untrusted code) share one renderer; every string goes through `markdown`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import jinja2
from markupsafe import Markup

from triage import policy
from triage.report.data import template_texts
from triage.report.markdown import cell, code, fence, fence_in_view, finalize, html_code, html_text, md
from triage.report.views import (
    LOCALIZATION_ROWS,
    ablation_row,
    figure,
    localized_row,
    real,
    reported_view,
    rounding_view,
)

COMMENT_LIMIT = 65536
SUMMARY_LIMIT_BYTES = 1_000_000  # $GITHUB_STEP_SUMMARY refuses more than 1 MiB per step
MARKER = "<!-- triage:report"  # the hidden first line of the bot's comment: MARKER + digest + " -->"


@functools.lru_cache(maxsize=1)
def template_environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.DictLoader(template_texts()), autoescape=False,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined, finalize=finalize)
    env.filters.update(fence=fence, fence_in_view=fence_in_view, code=code, cell=cell, md=md, html=html_text,
                       html_code=html_code)
    return env


def comment_digest(data: dict[str, Any]) -> str:
    """A digest of what the comment says, without timings: a re-run with the same outcome has
    the same digest, so the posted comment is left alone."""
    stable = {k: data.get(k) for k in ("verdict", "notes", "arms_requested")}
    stable["repro"] = (data.get("repro") or {}).get("source")
    stable["arms"] = [(a.get("spec"), a.get("status"), a.get("failure")) for a in data.get("arms", [])]
    divergence = (data.get("comparison") or {}).get("divergence") or {}
    stable["divergence"] = [(s or {}).get("summary") for s in (divergence.get("a"), divergence.get("b"))]
    minimal = data.get("minimal") or {}
    stable["minimal"] = (minimal.get("ops"), minimal.get("script"), minimal.get("verified"))
    stable["localization"] = [(r.get("op"), r.get("role")) for r in data.get("localization") or []]
    stable["ablations"] = [(a.get("switch"), a.get("outcome")) for a in data.get("ablations") or []]
    # The simulation is seeded, so its figures only change when the outcome does.
    stable["rounding"] = rounding_view(data)
    blob = json.dumps(stable, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def marker_line(data: dict[str, Any]) -> str:
    return f"{MARKER} digest={comment_digest(data)} -->"


def render_comment(data: dict[str, Any], limit: int = COMMENT_LIMIT, size: Callable[[str], int] = len, *,
                   full_report: str | None = None) -> str:
    """The comment for report data, shrinking the collapsible parts until `size(text)` fits
    `limit` (GitHub's 65,536 characters for a comment; bytes for a job summary).

    `full_report` says where the comment's reader finds report.json, as prose with `code`
    spans ("`report.json`"); None where none was written, and the comment then points to none."""
    for caps in ((20000, 4000, 12000), (6000, 1500, 4000), (2000, 600, 1200), (500, 200, 0)):
        text = _render(data, *caps, full_report=full_report)
        if size(text) <= limit:
            return text
    where = f"; the full report is in {md(full_report)}" if full_report else ""
    return cut_to_fit(text, f"\n… (truncated to fit GitHub's limit{where})\n", limit, size)


def cut_to_fit(text: str, notice: str, limit: int, size: Callable[[str], int] = len) -> str:
    """`text` cut at a line (never inside a code block's fence, see `_cut`) and `notice`
    appended, short enough that `size` of the whole is within `limit`."""
    keep = len(text)
    while True:
        keep -= max(1000, keep // 10)
        shortened = _cut(text, max(0, keep)) + notice
        if size(shortened) <= limit or keep <= 0:
            return shortened


def _cut(text: str, keep: int) -> str:
    """The whole lines of a rendered comment within its first `keep` characters, with the code
    fence and the <details> blocks still open there closed, so that what follows shows as prose."""
    head = text[:keep]
    head = head[: head.rfind("\n") + 1]
    fence, open_details = "", 0
    for line in head.splitlines():
        if fence:
            if re.fullmatch(rf"{fence}`*\s*", line):
                fence = ""
        elif m := re.match(r"`{3,}", line):
            fence = m.group()
        elif line.startswith("<details>"):  # values never start a line with "<": _escape writes &lt;
            open_details += 1
        elif line.startswith("</details>"):
            open_details -= 1
    return head + (fence + "\n" if fence else "") + "\n</details>\n" * open_details


def _error_of(side: dict[str, Any]) -> str:
    """A side's distance from its float64 reference, as the arms' table shows it."""
    if real(side.get("max_rel_error")) is not None:
        return f"rel {figure(side['max_rel_error'], '.2g')}, {figure(side.get('max_ulps') or 0, '.3g')} ulp"
    if side.get("reference_summary"):
        return f"float64 {side['reference_summary']}"
    return "—"


def _render(data: dict[str, Any], source_cap: int, output_cap: int, env_cap: int, full_report: str | None) -> str:
    v = data["verdict"]
    runs = data.get("arms") or []
    divergence = (data.get("comparison") or {}).get("divergence") or {}
    sides: dict[str, list[dict[str, Any]]] = {}
    for s in (divergence.get("a"), divergence.get("b")):
        if isinstance(s, dict) and "arm" in s:
            sides.setdefault(s["arm"], []).append(s)
    arms_rows = []
    for r in runs:
        own = sides.get(r["spec"]) or []
        # Two values of one arm (the script's own comparison): each by its name, the value first
        # shown being the computed one, not whichever side was read last.
        named = len(own) > 1
        value = "; ".join(f"{s.get('label')} {s.get('summary')}" if named else str(s.get("summary")) for s in own) \
            if own else (r.get("failure") or "—") if r["status"] != "ok" else "—"
        error = "; ".join(f"{s.get('label')} {_error_of(s)}" if named else _error_of(s) for s in own) if own else "—"
        elapsed = r.get("elapsed_s")
        arms_rows.append({"spec": r["spec"], "status": r["status"], "value": value, "error": error,
                          "time": f"{figure(elapsed, '.2f')} s" if real(elapsed) is not None else "—"})
    details = []
    for r in runs:
        flags = r.get("flags_end") or r.get("flags_start")
        details.append({"spec": r["spec"], "failure": r.get("failure"),
                        "stdout": _cap(r.get("stdout"), output_cap),
                        "exception": _cap((r.get("exception") or {}).get("traceback"), output_cap),
                        "flags": json.dumps(flags, indent=1) if flags else ""})
    # One collect_env per installation: arms on another torch release have their own.
    environments: dict[str, list[str]] = {}
    for r in runs:
        if r.get("environment"):
            environments.setdefault(r["environment"], []).append(r["spec"])
    section = next((s for s in vars(policy).values()
                    if isinstance(s, policy.Section) and s.title == v["policy_section"]), None)
    minimal = data.get("minimal")
    repro = data.get("repro") or {}
    issue = data.get("issue") or {}
    extraction = issue.get("extraction") or {}
    return template_environment().get_template("comment.md.j2").render(
        marker=Markup(marker_line(data)), v=v, section=section,
        policy_url=Markup(section.url) if section else None, arms=arms_rows,
        headline_label=divergence.get("observable_label") or "value",
        notes=data.get("notes") or [], repro_name=repro.get("name") or "repro.py",
        repro_source=_cap(repro.get("source"), source_cap), arm_details=details,
        environments=[{"text": _cap(text, env_cap), "arms": specs} for text, specs in environments.items()]
        if env_cap else [], version=data.get("triage_version") or "?",
        seconds=data.get("seconds") or 0, arms_requested=data.get("arms_requested") or [],
        isolation=data.get("isolation"), shortened=source_cap < 20000, full_report=full_report,
        minimal=minimal, minimal_script=_cap(minimal["script"], source_cap) if minimal else "",
        localization=[localized_row(r) for r in (data.get("localization") or [])[:LOCALIZATION_ROWS]],
        ablations=[ablation_row(a) for a in data.get("ablations") or [] if a["outcome"] != "skipped"],
        reporter_env=extraction.get("environment_fields") or {},
        reporter_observed=_cap("\n\n".join(extraction.get("observed") or []), output_cap),
        rounding=rounding_view(data), reported=reported_view(data),
    )


def _cap(text: str | None, cap: int) -> str:
    if not text:
        return ""
    return text if len(text) <= cap else text[: cap // 2] + "\n[…]\n" + text[-cap // 2:]
