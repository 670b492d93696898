"""Stage 6: render a report as the GitHub comment (jinja2), report.json and the terminal view.

The comment is rendered from report.json's data, never from live objects, so `triage run`
and the Action's privileged `triage post` (which holds a token and reads a report written by
a job that ran untrusted code) share one renderer. Every string in that data is treated as
hostile: it reaches the markdown only through `_fence` (code blocks), `_code` (inline code)
or `_md` (prose), and the template's finalize applies `_md` to anything else, so a value
cannot open HTML, a link, an image, a mention, a cross-reference or a commit link in someone
else's issue. `visible` writes out control and invisible characters (terminal escapes, bidi
overrides) as escapes, in the comment and in the terminal view alike.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import html
import importlib.resources
import json
import math
import re
from collections.abc import Callable
from typing import Any

import jinja2
from markupsafe import Markup

from triage import policy
from triage.judge.describe import spread_text
from triage.model import Judgement, Report, to_jsonable

SCHEMA_ID = "triage.report/1"
COMMENT_LIMIT = 65536
SUMMARY_LIMIT_BYTES = 1_000_000  # $GITHUB_STEP_SUMMARY refuses more than 1 MiB per step
LOCALIZATION_ROWS = 8
OTHER_JUDGEMENTS = 6  # lines for the other divergences' judged values; report.json has them all
ROUNDING_NOTES = 4  # unstable decisions and cancellation hints not already in the evidence
MARKER = "<!-- triage:report"  # the hidden first line of the bot's comment: MARKER + digest + " -->"
ZWSP = "\u200b"
# The characters of a code line that fit GitHub's narrowest comment column: 780 px, less the
# padding, hold about 100 at GitHub's 85% monospace. A wider line scrolls its block sideways.
COLUMN = 100
# Code runs at least this long without a space may break after a dot or a slash.
LONG_CODE_RUN = 16


# Characters that act instead of showing: C0/C1 controls but tab and newline (ESC starts
# terminal sequences: a clipboard write, a title change), DEL, line/paragraph separators, the
# invisible format characters (Unicode Cf: bidi embeddings, overrides and isolates that reorder
# what is shown, zero-width characters, tags), and lone surrogates (JSON's "\\ud800", which
# no UTF-8 file or terminal can hold).
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f]")


def _escape_sequence(m: re.Match[str]) -> str:
    code = ord(m.group())
    if code == 0x0D:
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str) -> str:
    """`text` as it reads, never as it acts: every control or invisible format character is
    written out as its escape (ESC as `\\x1b`, RIGHT-TO-LEFT OVERRIDE as `\\u202e`), tabs and
    newlines kept (CRLF read as a newline). Every script- or issue-derived string passes through
    this before it reaches a comment or a terminal."""
    return _INVISIBLE.sub(_escape_sequence, text.replace("\r\n", "\n"))


def _visible_copy(obj: Any) -> Any:
    """`obj` (a report, its parts, or report data) with `visible` applied to every string in it."""
    if isinstance(obj, str):
        return visible(obj)
    if isinstance(obj, list):
        return [_visible_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_visible_copy(v) for v in obj)
    if isinstance(obj, dict):
        return {_visible_copy(k): _visible_copy(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _visible_copy(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def _fence(text: str, lang: str = "") -> Markup:
    """A code fence longer than any backtick run inside `text`, so nothing escapes it."""
    text = visible(text)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return Markup(f"{fence}{lang}\n{text.rstrip()}\n{fence}")


def _fence_in_view(text: str, lang: str, summary: str) -> Markup:
    """A code block in the comment's visible part. GitHub scrolls a line wider than the comment
    column sideways, and wrapping it would change the code, so a block with such a line is
    folded into <details> under `summary`: the reader opens it knowing it is wide."""
    widest = max((len(line.expandtabs()) for line in visible(text).splitlines()), default=0)
    if widest <= COLUMN:
        return _fence(text, lang)
    return Markup(f"<details><summary>{_html(summary)} (lines up to {widest} characters: expand to read)"
                  f"</summary>\n\n{_fence(text, lang)}\n</details>")


_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_PUNCTUATION = re.compile(r"([\\`*_\[\]|~!{}])")
# What would open a list where the text starts a line (`- {{ e }}` makes "- x" a nested list).
_LIST_MARKER = re.compile(r"^([-+]|\d{1,9}[.)])(?=\s|$)")


def _defuse(text: str) -> str:
    """A zero-width space that stops @mentions, #refs, GH-refs and autolinks from firing:
    GitHub finds them in the text of the rendered HTML, raw HTML blocks included."""
    text = text.replace("@", "@" + ZWSP).replace("#", "#" + ZWSP).replace("://", ":" + ZWSP + "//")
    return re.sub(r"(?i)\b(gh|www)(?=[-.])", lambda m: m.group(1) + ZWSP, text)


def _escape(text: str) -> str:
    """Plain text as inert markdown: HTML entities, backslash-escaped punctuation and list
    markers, and `_defuse`."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    text = _PUNCTUATION.sub(r"\\\1", text)
    text = _LIST_MARKER.sub(lambda m: m.group()[:-1] + "\\" + m.group()[-1], text)
    return _defuse(text)


# A bare commit hash (7 to 40 hex digits with a letter and a digit: neither a word nor a
# number) that GitHub would turn into a link to a commit — one pushed to any fork shows as this
# repository's. Not inside a word or after a decimal point, and not a float's mantissa (`…e-07`).
_COMMIT_LIKE = re.compile(r"(?<![\w.])(?=[0-9]*[a-fA-F])(?=[a-fA-F]*[0-9])[0-9a-fA-F]{7,40}(?!\w)(?![-+]\d)")


def _prose(text: str) -> str:
    """Escaped prose with commit-like hashes in <code>, where GitHub links nothing."""
    return _COMMIT_LIKE.sub(lambda m: f"<code>{m.group()}</code>", _escape(text))


def _one_line(text: str) -> str:
    """The lines of `text` joined by single spaces, blank ones dropped (linear: a regex such
    as `\\s*[\\r\\n]+\\s*` backtracks quadratically over long whitespace runs)."""
    return " ".join(line for line in (part.strip() for part in text.split("\n")) if line)


def _breakable(code: str) -> str:
    """Escaped code with a line-break opportunity after each dot and slash of a long run without
    a space (<wbr>: GitHub keeps it, a copy leaves it out). A name such as
    `torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction` or an arm such as
    `cuda/compile/deterministic=on` cannot wrap otherwise, and widens its table past the
    comment column."""
    return re.sub(rf"\S{{{LONG_CODE_RUN},}}", lambda m: re.sub(r"(?<=[./])(?=\S)", "<wbr>", m.group()), code)


def _md(text: Any) -> Markup:
    """Prose from the report: one line, its `code spans` kept as <code> and everything escaped."""
    text = _one_line(visible(str(text)))
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_prose(text[pos:m.start()]))
        out.append(f"<code>{_breakable(_escape(m.group(2).strip() or m.group(2)))}</code>")
        pos = m.end()
    out.append(_prose(text[pos:]))
    return Markup("".join(out))


def _code(text: Any) -> Markup:
    one_line = visible(str(text)).replace("\n", " ")
    return Markup(f"<code>{_breakable(_escape(one_line))}</code>")


def _html(text: Any) -> Markup:
    """Text inside a raw HTML block (a <summary> line), where GitHub reads no markdown, so a
    backslash escape would show: HTML entities only, one line (a blank line would end the
    block), `_defuse`d, commit-like hashes in <code>."""
    escaped = html.escape(_defuse(_one_line(visible(str(text)))), quote=False)
    return Markup(_COMMIT_LIKE.sub(lambda m: f"<code>{m.group()}</code>", escaped))


def _html_code(text: Any) -> Markup:
    """Inline code inside a raw HTML block (see `_html`)."""
    return Markup(f"<code>{_breakable(html.escape(_defuse(_one_line(visible(str(text)))), quote=False))}</code>")


def _cell(text: Any, width: int = 300) -> Markup:
    """A table cell: one line, at most `width` characters of the original text."""
    text = str(text)
    return _md(text if len(text) <= width else text[: width - 1] + "…")


def _finalize(value: Any) -> Any:
    return value if isinstance(value, Markup) else _md("" if value is None else value)


@functools.lru_cache(maxsize=1)
def _template_texts() -> dict[str, str]:
    """The comment template and the schema, read once, before any arm runs (the CLI preloads
    them): nothing read after a repro ran comes from a file a repro could have written."""
    folder = importlib.resources.files("triage.templates")
    return {name: folder.joinpath(name).read_text(encoding="utf-8") for name in ("comment.md.j2", "report.schema.json")}


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.DictLoader(_template_texts()), autoescape=False,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined, finalize=_finalize)
    env.filters.update(fence=_fence, fence_in_view=_fence_in_view, code=_code, cell=_cell, md=_md, html=_html,
                       html_code=_html_code)
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
    return json.loads(_template_texts()["report.schema.json"])


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
    where = f"; the full report is in {_md(full_report)}" if full_report else ""
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


def _render(data: dict[str, Any], source_cap: int, output_cap: int, env_cap: int, full_report: str | None) -> str:
    v = data["verdict"]
    runs = data.get("arms") or []
    divergence = (data.get("comparison") or {}).get("divergence") or {}
    sides = {s["arm"]: s for s in (divergence.get("a"), divergence.get("b")) if isinstance(s, dict) and "arm" in s}
    arms_rows = []
    for r in runs:
        side = sides.get(r["spec"])
        value = side.get("summary") if side else (r.get("failure") or "—") if r["status"] != "ok" else "—"
        if side and _real(side.get("max_rel_error")) is not None:
            error = f"rel {_figure(side['max_rel_error'], '.2g')}, {_figure(side.get('max_ulps') or 0, '.3g')} ulp"
        elif side and side.get("reference_summary"):
            error = f"float64 {side['reference_summary']}"
        else:
            error = "—"
        elapsed = r.get("elapsed_s")
        arms_rows.append({"spec": r["spec"], "status": r["status"], "value": value, "error": error,
                          "time": f"{_figure(elapsed, '.2f')} s" if _real(elapsed) is not None else "—"})
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
    return _environment().get_template("comment.md.j2").render(
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
        localization=[_localized_row(r) for r in (data.get("localization") or [])[:LOCALIZATION_ROWS]],
        ablations=[_ablation_row(a) for a in data.get("ablations") or [] if a["outcome"] != "skipped"],
        reporter_env=extraction.get("environment_fields") or {},
        reporter_observed=_cap("\n\n".join(extraction.get("observed") or []), output_cap),
        rounding=rounding_view(data), reported=reported_view(data),
    )


def reported_view(data: dict[str, Any]) -> dict[str, Any] | None:
    """The reported arm as the comment shows it: each posted value beside the value printed
    here and the spread it was judged by."""
    reported = data.get("reported")
    if not reported:
        return None
    rows = []
    for v in reported.get("values") or []:
        j = v.get("judgement") or {}
        judged = j.get("status") == "judged"
        row = _judgement_row(j) if judged else {"spread": "—", "reference": "—"}
        if judged and j.get("nonfinite") and _real(j.get("reference")) is not None \
                and not math.isfinite(_real(j.get("reference"))):
            row["spread"] = str(j["nonfinite"]).partition(": ")[2]  # no σ around an infinite value
        rows.append({"posted": v.get("printed") or "", "here": v.get("here") or "—",
                     "value": f"{v.get('label')} (line {v.get('line')})" if v.get("observable") is not None else "—",
                     "reference": row["reference"], "spread": row["spread"],
                     "conclusion": _zone_text(j).replace("its own rounding spread", "the modelled rounding spread")
                     if judged else f"not judged: {v.get('why') or j.get('reason') or 'no reason given'}"})
    return {"source": reported.get("source"), "device": reported.get("device"), "model": reported.get("model"),
            "rows": rows[:OTHER_JUDGEMENTS], "left_out": max(0, len(rows) - OTHER_JUDGEMENTS)}


def _ablation_row(a: dict[str, Any]) -> dict[str, Any]:
    """An ablation as its row shows it: the arms the switch changed, named as they were compared
    (the row names the switch once: `cuda/compile/reduced_precision=off` repeats it and widens
    the table), or every arm where no arm names the switch (a float64 re-run of one op)."""
    suffix = "/" + a["switch"]
    changed = [spec.removesuffix(suffix) for spec in a["arms"] if spec.endswith(suffix)]
    return dict(a, arms=changed or a["arms"])


def _localized_row(r: dict[str, Any]) -> dict[str, str]:
    return {"op": r["op"], "line": str(r["line"]) if r.get("line") is not None else "—",
            "role": ("first to differ; " if r.get("first") else "") + r["role"],
            "local": _errors(r.get("local")), "end_to_end": _errors(r.get("end_to_end"))}


def _errors(e: dict[str, Any] | None) -> str:
    if not e:
        return "—"
    if e["kind"] == "equal":
        return "bitwise equal"
    if e["kind"] in ("nonfinite", "raises"):
        return f"{e['kind']} ({e.get('detail')})"
    return f"{e['kind']}: {_figure(e.get('max_ulps') or 0, '.3g')} ulp, abs {_figure(e.get('max_abs') or 0, '.3g')}"


def rounding_view(data: dict[str, Any]) -> dict[str, Any]:
    """What the comment and the terminal show of the rounding judge, from report data: a row
    and a strip per side of the headline divergence, a capped list of the other judged values,
    and the unstable decisions and cancellation hints the verdict does not already quote."""
    comparison = data.get("comparison") or {}
    headline = (comparison.get("divergence") or {}).get("judgements") or []
    shown = {(j.get("arm"), j.get("observable")) for j in headline}
    others = []
    for d in comparison.get("others") or []:
        for j in d.get("judgements") or []:
            key = (j.get("arm"), j.get("observable"))
            if key not in shown:  # one value judged once, however many divergences it is part of
                shown.add(key)
                others.append(_other_line(j))
    v = data.get("verdict") or {}
    quoted = " ".join([v.get("summary") or ""] + list(v.get("evidence") or []))
    notes = [f"decision unstable under rounding (`{j.get('arm')}` {j.get('label')}): {u}"
             for j in headline for u in j.get("unstable") or [] if u not in quoted]
    notes += [line for hint, line in _cancellation_hints(data, headline) if hint not in quoted]
    # A claim compares two different values: each row then names its own.
    headline_label = (comparison.get("divergence") or {}).get("observable_label")
    rows = [dict(_judgement_row(j), label=str(j.get("label")) if j.get("label") != headline_label else "")
            for j in headline]
    return {"rows": rows,
            # The strip names only the arm: a claim's two values on one arm need their labels.
            "strips": [(f"{row['label']}:\n" if row["label"] else "") + j["strip"]
                       for j, row in zip(headline, rows, strict=False) if _drawable(j)],
            "others": others[:OTHER_JUDGEMENTS], "others_left_out": max(0, len(others) - OTHER_JUDGEMENTS),
            "notes": list(dict.fromkeys(notes))[:ROUNDING_NOTES]}


_JUDGEMENT_REALS = ("p", "statistic", "max_sample_stat", "value", "reference", "sigma", "digits")


def _as_judgement(j: dict[str, Any]) -> Judgement:
    """A judgement back from report data (floats written as "inf"/"nan" strings read back)."""
    known = {f.name for f in dataclasses.fields(Judgement)}
    fields = {k: (_real(v) if k in _JUDGEMENT_REALS else v) for k, v in j.items() if k in known}
    return Judgement(**fields)


def _real(x: Any) -> float | None:
    """A real from report data: a number, or one of the strings JSON writes inf and nan as."""
    if isinstance(x, str):
        return float(x) if x in ("inf", "-inf", "nan") else None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        return float(x)
    except OverflowError:  # an integer beyond float's range
        return math.copysign(math.inf, x)


def _figure(x: Any, spec: str) -> str:
    """A real from report data formatted with `spec` ("inf" and "nan" too), "—" for anything else."""
    value = _real(x)
    return "—" if value is None else format(value, spec)


def _number(x: Any) -> str:
    return _figure(x, ".9g")


def _outside_by_nonfinite(j: dict[str, Any]) -> bool:
    return str(j.get("nonfinite") or "").startswith("outside")


def _drawable(j: dict[str, Any]) -> bool:
    """A strip says something only about a finite value on a finite, nonzero spread, and not
    when the side is outside because of nonfinite elements the strip cannot show."""
    value, sigma = _real(j.get("value")), _real(j.get("sigma"))
    return (j.get("status") == "judged" and bool(j.get("strip")) and value is not None and sigma is not None
            and math.isfinite(value) and math.isfinite(sigma) and sigma > 0 and not _outside_by_nonfinite(j))


def _judgement_row(j: dict[str, Any]) -> dict[str, str]:
    judged = j.get("status") == "judged"
    value = _number(j.get("value"))
    if judged and j.get("element") is not None and value != "—":
        value += f" (element {j['element']})"
    p = _real(j.get("p"))
    p_text = f"{p:.2f} ({j.get('samples') or 0} samples)" if judged and p is not None else "—"
    if judged and p is not None and _outside_by_nonfinite(j):
        p_text += ", finite elements"
    return {"arm": str(j.get("arm")), "value": value if judged else "—",
            "reference": _number(j.get("reference")) if judged else "—",
            "spread": spread_text(_as_judgement(j)) if judged else "—", "p": p_text, "conclusion": _zone_text(j)}


def _zone_text(j: dict[str, Any]) -> str:
    if j.get("status") != "judged":
        return f"not judged: {j.get('reason') or 'no reason given'}"
    if _outside_by_nonfinite(j):
        return "outside: " + str(j["nonfinite"]).removeprefix("outside: ")
    zone = j.get("zone")
    if zone == "inside":
        return "inside its own rounding spread"
    if zone == "envelope":
        return "directed envelope: outside the unbiased spread, inside rounding all up / all down"
    statistic, reach = _real(j.get("statistic")), _real(j.get("max_sample_stat"))
    if statistic is None or not math.isfinite(statistic):
        return "outside: where no simulated rounding moves it at all"
    return f"outside: {statistic:.3g}σ" + (f", the samples reach {reach:.3g}σ" if reach is not None else "")


def _other_line(j: dict[str, Any]) -> dict[str, str]:
    p = _real(j.get("p"))
    if j.get("status") != "judged" or _outside_by_nonfinite(j):
        result = _zone_text(j)
    else:
        result = str(j.get("zone") or "?") + (f" (p = {p:.2f})" if p is not None else "")
    line = f" (line {j['line']})" if j.get("line") is not None else ""
    return {"arm": str(j.get("arm")), "label": str(j.get("label")) + line, "result": result}


def _cancellation_hints(data: dict[str, Any], headline: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(hint, line) for the rewrites the simulation suggests where the headline values lose
    digits upstream; the hint alone decides whether the verdict already quotes it."""
    wanted = {(j.get("arm"), j.get("observable")) for j in headline}
    out = []
    for o in data.get("observables") or []:
        if (o.get("arm"), o.get("index")) not in wanted:
            continue
        for site in (o.get("rounding") or {}).get("cancellations") or []:
            if not site.get("hint"):
                continue
            lost = site.get("digits_lost")
            lost = "every digit" if lost == "all" else f"{lost} digits" if isinstance(lost, (int, float)) else "digits"
            where = f" (line {site['line']})" if site.get("line") is not None else ""
            out.append((site["hint"], f"cancellation at `{site.get('op')}`{where} loses {lost}: {site['hint']}"))
    return out


def _cap(text: str | None, cap: int) -> str:
    if not text:
        return ""
    return text if len(text) <= cap else text[: cap // 2] + "\n[…]\n" + text[-cap // 2:]


def render_terminal(report: Report, console: Any) -> None:
    """The rich terminal summary: verdict first, then the arms table and the evidence."""
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    def line(text: str) -> None:
        # A URL that rich breaks at the terminal's width no longer opens or pastes: a line
        # with one is left whole, for the terminal to wrap.
        console.print(text, markup=False, highlight=False, soft_wrap=True if "://" in text else None)

    report = _visible_copy(report)  # what the script printed or raised, never a terminal sequence
    v = report.verdict
    colour = {True: "green", False: "red", None: "yellow"}[v.expected]
    expected = {True: "expected", False: "NOT expected", None: "undetermined"}[v.expected]
    # Inside the box the summary wraps (soft_wrap=False), whatever the console's default: a box
    # that cannot wrap crops it.
    console.print(Panel(f"[bold]{v.kind}[/bold] ({expected})\n\n{escape(v.summary)}",
                        title=f"triage: {report.repro.name}", border_style=colour), soft_wrap=False)
    if report.isolation and report.isolation["kind"] != "namespace":
        console.print(f"[bold red]isolation: {escape(report.isolation['detail'])}[/bold red]")
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
        line(f" • {e}")
    _terminal_rounding(report, console)
    m = report.minimal
    if m:
        state = "verified in fresh arms" if m.verified else "NOT verified: " + m.verification
        line(f"minimal repro: {len(m.ops)} op(s) ({', '.join(m.ops[:8])}) of {m.original_ops}, "
             f"{m.queries} queries, {m.seconds:.1f} s, {state}")
        from rich.syntax import Syntax

        # Code is for copying: its lines are printed whole (a wrapped line no longer runs, a
        # cropped one loses code), highlighted text without a background to fill a width with.
        code = Syntax(m.script, "python", background_color="default").highlight(m.script)
        code.rstrip()
        console.print(code, soft_wrap=True)
    if report.ablations:
        table = Table(title="ablations (one switch changed)")
        for col in ("switch", "arms", "result"):
            table.add_column(col)
        table.add_column("set with", overflow="fold")  # code: folded whole, never cut off with "…"
        for a in report.ablations:
            table.add_row(a.switch, ", ".join(a.arms), escape(f"{a.outcome}: {a.detail}"), escape(a.setting))
        console.print(table)
    if report.localization:
        table = Table(title="where it diverges (top ops)")
        for col in ("op", "line", "role", "local error", "end to end"):
            table.add_column(col)
        for row in [_localized_row(to_jsonable(r)) for r in report.localization[:LOCALIZATION_ROWS]]:
            table.add_row(row["op"], row["line"], row["role"], row["local"], row["end_to_end"])
        console.print(table)
    for n in report.notes:
        line(f" · {n}")
    line(f"policy: {v.policy_section} {v.policy_url}")
    if v.labels:
        line("suggested labels: " + ", ".join(v.labels))


def _terminal_rounding(report: Report, console: Any) -> None:
    """The rounding judgement as the comment shows it: a table, the strips, the rest as lines."""
    from rich.markup import escape
    from rich.table import Table

    view = rounding_view(report_json(report))
    if not view["rows"]:
        return
    divergence = report.comparison.divergence if report.comparison else None
    table = Table(title="rounding judgement (each side against its own simulated rounding)")
    for col in ("arm", divergence.observable_label if divergence else "value", "float64", "rounding spread", "p",
                "conclusion"):
        table.add_column(escape(col))
    for row in view["rows"]:
        arm = row["arm"] + (f" {row['label']}" if row["label"] else "")
        table.add_row(escape(arm), *(escape(row[k]) for k in ("value", "reference", "spread", "p", "conclusion")))
    console.print(table)
    for strip_picture in view["strips"]:
        console.print(strip_picture, markup=False, highlight=False, soft_wrap=True)
    for n in view["notes"]:
        console.print(f" • {n}", markup=False, highlight=False)
    for o in view["others"]:
        console.print(f" ◦ also judged: {o['arm']} {o['label']}: {o['result']}", markup=False, highlight=False)
    if view["others_left_out"]:
        console.print(f" ◦ … and {view['others_left_out']} more in report.json", markup=False, highlight=False)
