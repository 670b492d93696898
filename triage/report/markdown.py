"""Stage 6's escaping: every string of report data reaches markdown, HTML or a terminal only
through these.

Every string in a report is treated as hostile (it may come from the script, its output, the
issue, or a report.json written by a job that ran untrusted code). It reaches the markdown
only through `fence` (code blocks), `code` (inline code) or `md` (prose), and the comment
template's `finalize` applies `md` to anything else, so a value cannot open HTML, a link, an
image, a mention, a cross-reference or a commit link in someone else's issue. `visible`
writes out control and invisible characters (terminal escapes, bidi overrides) as escapes, in
the comment, the sweep's pages and the terminal view alike. Public: the sweep's report
renders with the same functions.
"""
from __future__ import annotations

import dataclasses
import html
import re
from typing import Any

from markupsafe import Markup

ZWSP = "\u200b"
# The characters of a code line that fit GitHub's narrowest comment column: 780 px, less the
# padding, hold about 100 at GitHub's 85% monospace. A wider line scrolls its block sideways.
COLUMN = 100
# Code runs at least this long without a space may break after a dot or a slash.
LONG_CODE_RUN = 16
# Characters that act instead of showing: C0/C1 controls but tab and newline (ESC starts
# terminal sequences: a clipboard write, a title change), DEL, line/paragraph separators, the
# invisible format characters (Unicode Cf: bidi embeddings, overrides and isolates that reorder
# what is shown, zero-width characters, tags), lone surrogates (JSON's "\\ud800", which no
# UTF-8 file or terminal can hold), and the characters that are not Cf but draw nothing (Unicode's
# Default_Ignorable_Code_Point, and the blanks that look like nothing): the combining grapheme
# joiner, Hangul fillers, Khmer's inherent vowels, Mongolian's and Unicode's variation
# selectors (which can hide a whole message after a visible character), the Braille blank.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f"
    "\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180d\u180f\u2800\u3164\ufe00-\ufe0f\uffa0"
    "\U000e0000\U000e0002-\U000e001f\U000e0080-\U000e0fff]")


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


def visible_copy(obj: Any) -> Any:
    """`obj` (a report, its parts, or report data) with `visible` applied to every string in it."""
    if isinstance(obj, str):
        return visible(obj)
    if isinstance(obj, list):
        return [visible_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(visible_copy(v) for v in obj)
    if isinstance(obj, dict):
        return {visible_copy(k): visible_copy(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: visible_copy(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def fence(text: str, lang: str = "") -> Markup:
    """A code fence longer than any backtick run inside `text`, so nothing escapes it."""
    text = visible(text)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return Markup(f"{fence}{lang}\n{text.rstrip()}\n{fence}")


def fence_in_view(text: str, lang: str, summary: str) -> Markup:
    """A code block in the comment's visible part. GitHub scrolls a line wider than the comment
    column sideways, and wrapping it would change the code, so a block with such a line is
    folded into <details> under `summary`: the reader opens it knowing it is wide."""
    widest = max((len(line.expandtabs()) for line in visible(text).splitlines()), default=0)
    if widest <= COLUMN:
        return fence(text, lang)
    return Markup(f"<details><summary>{html_text(summary)} (lines up to {widest} characters: expand to read)"
                  f"</summary>\n\n{fence(text, lang)}\n</details>")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
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


def one_line(text: str) -> str:
    """The lines of `text` joined by single spaces, blank ones dropped (linear: a regex such
    as `\\s*[\\r\\n]+\\s*` backtracks quadratically over long whitespace runs)."""
    return " ".join(line for line in (part.strip() for part in text.split("\n")) if line)


def breakable(code: str) -> str:
    """Escaped code with a line-break opportunity after each dot and slash of a long run without
    a space (<wbr>: GitHub keeps it, a copy leaves it out). A name such as
    `torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction` or an arm such as
    `cuda/compile/deterministic=on` cannot wrap otherwise, and widens its table past the
    comment column."""
    return re.sub(rf"\S{{{LONG_CODE_RUN},}}", lambda m: re.sub(r"(?<=[./])(?=\S)", "<wbr>", m.group()), code)


def md(text: Any) -> Markup:
    """Prose from the report: one line, its `code spans` kept as <code> and everything escaped."""
    text = one_line(visible(str(text)))
    out, pos = [], 0
    for m in CODE_SPAN.finditer(text):
        out.append(_prose(text[pos:m.start()]))
        out.append(f"<code>{breakable(_escape(m.group(2).strip() or m.group(2)))}</code>")
        pos = m.end()
    out.append(_prose(text[pos:]))
    return Markup("".join(out))


def code(text: Any) -> Markup:
    flat = visible(str(text)).replace("\n", " ")
    return Markup(f"<code>{breakable(_escape(flat))}</code>")


def html_text(text: Any) -> Markup:
    """Text inside a raw HTML block (a <summary> line), where GitHub reads no markdown, so a
    backslash escape would show: HTML entities only, one line (a blank line would end the
    block), `_defuse`d, commit-like hashes in <code>."""
    escaped = html.escape(_defuse(one_line(visible(str(text)))), quote=False)
    return Markup(_COMMIT_LIKE.sub(lambda m: f"<code>{m.group()}</code>", escaped))


def html_code(text: Any) -> Markup:
    """Inline code inside a raw HTML block (see `html_text`)."""
    return Markup(f"<code>{breakable(html.escape(_defuse(one_line(visible(str(text)))), quote=False))}</code>")


def cell(text: Any, width: int = 300) -> Markup:
    """A table cell: one line, at most `width` characters of the original text."""
    text = str(text)
    return md(text if len(text) <= width else text[: width - 1] + "…")


def finalize(value: Any) -> Any:
    return value if isinstance(value, Markup) else md("" if value is None else value)
