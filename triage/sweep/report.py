"""The sweep report: what a sweep found, as markdown (a GitHub issue or a job summary) and as one
self-contained HTML page.

Both are rendered from a `SweepReport` built by `build_report`: the results grouped per verdict
kind, the items that changed between torch builds ("reproduces on 2.13.0, not on 2.15.0"), the
items that no longer reproduce with the evidence that says so, the duplicate buckets and their
near matches (triage/sweep/buckets.py), why items could not run, and the items triage failed on.

Titles, summaries, evidence, keys and errors come from issues and scripts, so every one is
hostile text. The markdown passes them through triage/report/markdown.py's escaping (`md`, `cell`,
`code`: entities, backslash escapes, defused @mentions, #refs and autolinks), and its items are
never links: a link to an issue from an issue is a cross-reference in that issue's timeline, and
a sweep of a few hundred issues would post one in each. The HTML page escapes every value
(jinja2's autoescape, after `visible` writes out control characters) and links each issue; its
Content-Security-Policy runs only the page's own script and style, by their hashes, and fetches
nothing, so even a value that escaped its escaping could not run or load anything.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import importlib.resources
import math
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jinja2
from markupsafe import Markup, escape

from triage.classify.ladder import KINDS
from triage.report.comment import COMMENT_LIMIT, cut_to_fit
from triage.report.markdown import CODE_SPAN, breakable, cell, code, finalize, md, one_line, visible
from triage.sweep.buckets import UNBUCKETED_VERDICTS, DivergenceSignature, NearMatch, bucket
from triage.sweep.model import ItemResult

__all__ = ["BucketRows", "BuildChange", "CouldNotRun", "Row", "SweepReport", "VerdictGroup", "build_report",
           "render_html", "render_markdown"]

# The verdicts a triager acts on first (not explained by the accuracy note), then the expected
# ones in the ladder's order, then those with nothing to look at; a kind this triage does not
# know (a newer one's store) comes last.
_FIRST = ("likely-bug", "nonfinite-flip", "crash-one-arm", "inconclusive", "nondeterministic")
_LAST = ("not-reproduced", "could-not-run")
VERDICT_ORDER = _FIRST + tuple(k for k in KINDS if k not in _FIRST + _LAST) + _LAST
# The markdown's caps, tried in turn until it fits its limit: characters of a title or summary
# cell, evidence lines per item that no longer reproduces, rows per table (None: every row).
_MARKDOWN_CAPS = ((400, 6, None), (200, 2, 200), (120, 1, 50), (80, 0, 10))
_TITLE_WIDTH = 120
_BUCKET_MEMBERS_SHOWN = 12


@dataclass(frozen=True)
class Row:
    """One result as the report's tables show it."""

    key: str
    title: str
    url: str | None  # http(s) only: what the HTML page may link
    verdict: str  # the verdict kind; "failed" where triage produced no report
    expected: bool | None
    arms: str
    torch_build: str
    seconds: float
    summary: str
    evidence: tuple[str, ...]
    anchor: str  # the row's id on the HTML page
    error: str | None = None
    node: str | None = None
    # What the reporter posted, as a judged arm (triage/reported/): "2 of 3 judged", or "—"
    # where the item has none (its arms all ran here).
    reported: str = "—"


@dataclass
class VerdictGroup:
    kind: str
    rows: list[Row]


@dataclass
class BuildChange:
    """One item (same text, same arms) that diverges on some torch builds and not on others."""

    key: str
    title: str
    url: str | None
    reproduces_on: list[str]
    not_on: list[str]

    @property
    def line(self) -> str:
        return f"reproduces on {', '.join(self.reproduces_on)}, not on {', '.join(self.not_on)}"


@dataclass
class BucketRows:
    """A duplicate bucket with its members as rows (the HTML page links each to its row)."""

    id: str
    signature: DivergenceSignature
    rows: list[Row]

    @property
    def items(self) -> int:
        """Distinct items: one report swept on two torch builds is one item, not a duplicate."""
        return len({row.key for row in self.rows})


@dataclass
class CouldNotRun:
    """The items that could not run for one reason (the verdict's summary)."""

    reason: str
    rows: list[Row]


@dataclass
class SweepReport:
    """What the markdown and the HTML page show, in the order they show it: counts per verdict,
    the changes between builds, the buckets and near matches, a group of rows per verdict kind,
    what no longer reproduces per build, why items could not run, and the failed items."""

    title: str
    torch_builds: list[str]
    sources: list[str]
    started: str  # ISO 8601, UTC
    seconds: float
    results: int
    items: int  # distinct keys
    counts: dict[str, int]  # results per verdict kind in VERDICT_ORDER, then "failed"
    groups: list[VerdictGroup]
    build_changes: list[BuildChange]
    no_longer_reproduces: list[tuple[str, list[Row]]]  # (torch build, its not-reproduced rows), per build
    buckets: list[BucketRows]
    near_matches: list[NearMatch]
    could_not_run: list[CouldNotRun]
    failed: list[Row] = field(default_factory=list)


def build_report(results: list[ItemResult], *, title: str, torch_builds: list[str], sources: list[str],
                 started: str, seconds: float) -> SweepReport:
    """The report of a sweep's `results` (one per item, torch build and arms: the store's latest),
    its builds listed in `torch_builds` order (a build only the results name comes after them)."""
    builds = list(dict.fromkeys(list(torch_builds) + sorted({r.torch_build for r in results} - set(torch_builds))))
    build_rank = {b: i for i, b in enumerate(builds)}
    ordered = sorted(results, key=lambda r: (r.key, build_rank[r.torch_build], r.arms))
    rows = {id(r): _row(r) for r in ordered}
    triaged = [r for r in ordered if r.outcome == "triaged"]

    by_kind: dict[str, list[Row]] = {}
    for r in triaged:
        by_kind.setdefault(rows[id(r)].verdict, []).append(rows[id(r)])
    kinds = [k for k in VERDICT_ORDER if k in by_kind] + sorted(set(by_kind) - set(VERDICT_ORDER))
    groups = [VerdictGroup(k, by_kind[k]) for k in kinds]
    failed = [rows[id(r)] for r in ordered if r.outcome != "triaged"]

    not_reproduced = [(b, [row for row in by_kind.get("not-reproduced", []) if row.torch_build == b]) for b in builds]
    reasons: dict[str, list[Row]] = {}
    for row in by_kind.get("could-not-run", []):
        reasons.setdefault(row.summary, []).append(row)

    buckets, near = bucket(triaged)
    return SweepReport(
        title=title, torch_builds=builds, sources=list(sources), started=started, seconds=seconds,
        results=len(results), items=len({r.key for r in results}),
        counts={**{g.kind: len(g.rows) for g in groups}, **({"failed": len(failed)} if failed else {})},
        groups=groups, build_changes=_build_changes(triaged, rows, build_rank),
        no_longer_reproduces=[(b, rs) for b, rs in not_reproduced if rs],
        buckets=sorted((BucketRows(b.signature.id, b.signature, [rows[id(m)] for m in b.members]) for b in buckets),
                       key=lambda b: -b.items),
        near_matches=near,
        could_not_run=[CouldNotRun(reason, rs) for reason, rs in sorted(reasons.items(), key=lambda kv: -len(kv[1]))],
        failed=failed)


def _row(result: ItemResult) -> Row:
    report = result.report or {}
    verdict = report.get("verdict") or {}
    kind = result.verdict_kind or verdict.get("kind") or ("failed" if result.outcome != "triaged" else "?")
    expected = result.expected if result.expected is not None else verdict.get("expected")
    arms = ", ".join(str(a) for a in report.get("arms_requested") or []) or result.arms or "chosen from the script"
    anchor = hashlib.sha256("\0".join(map(str, result.result_key)).encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return Row(key=result.key, title=result.title, url=_safe_url(result.url), verdict=str(kind),
               expected=expected if isinstance(expected, bool) else None, arms=arms,
               torch_build=result.torch_build, seconds=_seconds(result.seconds),
               summary=result.summary or str(verdict.get("summary") or ""),
               evidence=tuple(str(e) for e in verdict.get("evidence") or []), anchor="r-" + anchor,
               error=result.error, node=result.node, reported=_reported_text(report.get("reported")))


def _reported_text(reported: Any) -> str:
    """The reported arm in a cell: how many posted values were judged, and whether the verdict
    rests on them."""
    if not isinstance(reported, dict):
        return "—"
    values = reported.get("values") if isinstance(reported.get("values"), list) else []
    judged = sum(1 for v in values if isinstance(v, dict) and isinstance(v.get("judgement"), dict)
                 and v["judgement"].get("status") == "judged")
    return f"{judged} of {len(values)} posted values judged" if values else "no value in the posted output"


def _seconds(value: Any) -> float:
    """Seconds as a float; NaN where the store holds none (it keeps NaN as NULL)."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


# What a link may point at: http(s) only (never javascript: or data:), with every character that
# could end the URL in markdown or HTML percent-encoded.
_URL_SAFE = ":/?#@!$&*+,;=%~-._"


def _safe_url(url: str | None) -> str | None:
    if not url or not re.match(r"https?://[^/\s]", url, re.IGNORECASE):
        return None
    return urllib.parse.quote(visible(url), safe=_URL_SAFE)


def _build_changes(triaged: list[ItemResult], rows: dict[int, Row], build_rank: dict[str, int]) -> list[BuildChange]:
    """Items, by their text and arms, that diverge on one build and do not reproduce on another."""
    by_item: dict[tuple[str, str, str], list[ItemResult]] = {}
    for r in triaged:
        by_item.setdefault((r.key, r.content_sha256, r.arms), []).append(r)
    changes = []
    for same in by_item.values():
        reproduces = [r.torch_build for r in same if rows[id(r)].verdict not in UNBUCKETED_VERDICTS]
        not_on = [r.torch_build for r in same if rows[id(r)].verdict == "not-reproduced"]
        if reproduces and not_on:
            first = rows[id(same[0])]
            changes.append(BuildChange(first.key, first.title, first.url,
                                       sorted(set(reproduces), key=build_rank.__getitem__),
                                       sorted(set(not_on), key=build_rank.__getitem__)))
    return changes


# -- rendering ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _template_texts() -> dict[str, str]:
    """The templates, read once (as triage/report/comment.py reads the comment's)."""
    folder = importlib.resources.files("triage.templates")
    return {name: folder.joinpath(name).read_text(encoding="utf-8") for name in ("sweep.md.j2", "sweep.html.j2")}


def _seconds_text(seconds: float) -> str:
    return "—" if not math.isfinite(seconds) else f"{seconds:.1f}"


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "—"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _expected_text(expected: bool | None) -> str:
    return {True: "yes", False: "no", None: "—"}[expected]


def _differences(near: NearMatch) -> list[tuple[str, str, str]]:
    """(field, bucket a's value, bucket b's value) for each field a near match differs in."""
    values = {"dtype": lambda s: ", ".join(s.dtypes) or "—", "arms": lambda s: ", ".join(s.arm_kinds) or "—",
              "verdict": lambda s: s.verdict, "cause": lambda s: s.cause or "—", "ops": lambda s: ", ".join(s.ops)}
    return [(name, values[name](near.a.signature), values[name](near.b.signature)) for name in near.differs]


_HELPERS = {"seconds_text": _seconds_text, "duration": _duration, "expected_text": _expected_text,
            "differences": _differences, "members_shown": _BUCKET_MEMBERS_SHOWN}


@functools.lru_cache(maxsize=1)
def _markdown_environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.DictLoader(_template_texts()), autoescape=False, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, finalize=finalize)
    env.filters.update(code=code, cell=cell, md=md)
    env.globals.update(_HELPERS)
    return env


def render_markdown(report: SweepReport, limit: int = COMMENT_LIMIT, size: Callable[[str], int] = len) -> str:
    """The report as GitHub markdown that fits `limit` as `size` measures it: GitHub's 65,536
    characters for an issue or comment (the default), or `triage.report.comment.SUMMARY_LIMIT_BYTES`
    with `size=lambda t: len(t.encode())` for a job summary. Longer cells, evidence and tables
    are capped further until it fits; a report that still does not fit is cut at a line, with a
    line that says so."""
    text = ""
    for summary_width, evidence_lines, rows_cap in _MARKDOWN_CAPS:
        text = _markdown_environment().get_template("sweep.md.j2").render(
            report=report, summary_width=summary_width, evidence_lines=evidence_lines,
            rows_cap=rows_cap if rows_cap is not None else report.results + len(report.buckets),
            title_width=min(summary_width, _TITLE_WIDTH))
        if size(text) <= limit:
            return text
    return cut_to_fit(text, "\n… (truncated to fit the limit: the HTML report has every result)\n", limit, size)


def _html_prose(text: Any) -> Markup:
    """Report prose as HTML: one line, its `code spans` as <code>, everything escaped."""
    text = one_line(visible(str(text)))
    out, pos = [], 0
    for m in CODE_SPAN.finditer(text):
        out.append(escape(text[pos:m.start()]))
        out.append(Markup("<code>{}</code>").format(m.group(2).strip() or m.group(2)))
        pos = m.end()
    out.append(escape(text[pos:]))
    return Markup("").join(out)


def _html_breakable(text: Any) -> Markup:
    """A name without spaces (an item's key, arms, a torch build) escaped, with a line-break
    opportunity after each dot and slash of a long one, where it reads best broken."""
    return Markup(breakable(str(escape(one_line(visible(str(text)))))))


def _html_finalize(value: Any) -> Any:
    """Every value shows as it reads, control characters written out: markup (a filter's, or
    jinja2's `join` of escaped values) as it is, anything else then escaped by autoescape."""
    if isinstance(value, Markup):
        return Markup(visible(value))
    return visible("" if value is None else str(value))


@functools.lru_cache(maxsize=1)
def _html_environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.DictLoader(_template_texts()), autoescape=True,
                             undefined=jinja2.StrictUndefined, finalize=_html_finalize)
    env.filters.update(prose=_html_prose, breakable=_html_breakable)
    env.globals.update(_HELPERS)
    return env


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def render_html(report: SweepReport) -> str:
    """The report as one self-contained HTML page: inline style and script (tables sort on a
    click of their header), nothing fetched."""
    template = _html_environment().get_template("sweep.html.j2")
    # The style and script are blocks of the template: rendered alone, they give the text the
    # Content-Security-Policy's hashes are taken over.
    context = template.new_context({"report": report})
    style = "".join(template.blocks["style"](context))
    script = "".join(template.blocks["script"](context))
    csp = (f"default-src 'none'; style-src {_csp_hash(style)}; script-src {_csp_hash(script)}; "
           "base-uri 'none'; form-action 'none'")
    return template.render(report=report, csp=csp)
