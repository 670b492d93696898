"""Printed output read back into numbers: each printed value is an interval, not a point.

A reporter's output is text that a script printed: Python floats (`-108.34196472167969`),
f-strings (`5.5936e+00`, `500,000`), `tensor(...)` reprs (nested, `inf`/`nan`, elided with
`...`, `device=`/`dtype=` keywords), numpy arrays and lists. `parse_output` cuts it into
*records* — a printed line, or several when a bracketed value spans lines — and each record
into its *skeleton* (the text with every value replaced by a placeholder, the key that lines up
a reporter's line with the same line printed here) and its value *groups* (a scalar, or one
tensor's/array's elements, each with its position).

A printed number stands for every value that prints as it: `-13.0520` is anything in
[-13.05205, -13.05195]. torch and numpy print integral values as `1.`: that one is exact.

Nothing here raises on any text (the output is whatever a reporter pasted).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAX_RECORDS = 2000
MAX_RECORD_CHARS = 200_000
MAX_NUMBERS = 100_000  # per record: a pasted tensor past this is truncated, and says so

# A number standing alone: not part of a name (`float16`, `fc1`, `sm_89`) or of a longer number.
_NUMBER = re.compile(r"(?<![\w.])(?:[-+]?(?:inf|nan)\b|[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(?![\w.])",
                     re.IGNORECASE)
_GROUPED = re.compile(r"(?<![\w.,])[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w,])")  # 500,000 (f"{n:,}")
_TENSOR_START = re.compile(r"\b(tensor|array|Parameter containing:\s*tensor)\(")
# Keywords a tensor or array repr ends with: what the value is, not the value.
_KEYWORDS = re.compile(r",\s*(device|dtype|requires_grad|grad_fn|size|layout)\s*=\s*"
                       r"('[^']*'|\"[^\"]*\"|<[^>]*>|[\w.:]+(?:\([^)]*\))?)")


# What stands for a value in a skeleton (a scalar is `#`).
PLACEHOLDERS = {"tensor": "T", "array": "A", "list": "L", "scalar": "#"}


@dataclass
class PrintedNumber:
    text: str
    value: float
    low: float
    high: float
    index: tuple[int, ...] | None = None  # position in its tensor; negative: counted from the end (after `...`)

    @property
    def digits(self) -> int:
        """Significant digits printed (how precisely the printer showed it)."""
        mantissa = re.split(r"[eE]", self.text.lstrip("+-"))[0].replace(".", "").lstrip("0")
        return len(mantissa)


@dataclass
class PrintedGroup:
    """One printed value: a scalar, or a tensor's/array's/list's elements."""

    kind: str  # scalar | tensor | array | list
    numbers: list[PrintedNumber]
    text: str
    device: str | None = None  # `device='cuda:0'` of a tensor repr
    dtype: str | None = None  # `dtype=torch.float16`
    elided: bool = False  # `...` stands for elements not printed
    truncated: bool = False  # more numbers than triage reads


@dataclass
class PrintedRecord:
    text: str
    skeleton: str
    groups: list[PrintedGroup] = field(default_factory=list)
    line: int = 0  # first line of the record in its text (1-based)
    _segments: list | None = field(default=None, repr=False, compare=False)

    def segments(self) -> list[tuple[PrintedRecord, list[PrintedGroup]]]:
        """The record cut where a reporter joined several printed lines into one (`CPU: -inf;
        GPU: -108.3`): at each `;` or ` | ` outside brackets; each piece with the record's own
        groups it holds."""
        if self._segments is None:
            depth = _depths(self.text)
            cuts = [m.start() for m in re.finditer(r";|\s\|\s", self.text) if depth[m.start()] == 0]
            self._segments = [(self, self.groups)] if not cuts else self._cut(cuts)
        return self._segments

    def _cut(self, cuts: list[int]) -> list[tuple[PrintedRecord, list[PrintedGroup]]]:
        out, start, taken = [], 0, 0
        for c in cuts + [len(self.text)]:
            text = self.text[start:c].strip(" ;|")
            start = c + 1
            if not text:
                continue
            piece = parse_record(text, self.line)
            # The piece's groups are the record's next ones, in order (a piece is re-parsed alone).
            own = self.groups[taken:taken + len(piece.groups)]
            if [g.text for g in own] != [g.text for g in piece.groups]:
                own = []
            taken += len(own)
            out.append((piece, own))
        return out


def parse_output(text: str | None) -> list[PrintedRecord]:
    """Records of printed output: a line each, lines joined while a bracket is open."""
    records: list[PrintedRecord] = []
    if not text:
        return records
    lines = str(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i = 0
    while i < len(lines) and len(records) < MAX_RECORDS:
        start, depth, size = i, _depth_after(lines[i], 0), len(lines[i])
        i += 1
        while depth > 0 and i < len(lines) and size < MAX_RECORD_CHARS:
            depth = _depth_after(lines[i], depth)
            size += 1 + len(lines[i])
            i += 1
        chunk = "\n".join(lines[start:i])
        if chunk.strip():
            records.append(parse_record(chunk[:MAX_RECORD_CHARS], start + 1))
    return records


def parse_record(text: str, line: int = 0) -> PrintedRecord:
    """One record's skeleton and value groups."""
    groups: list[PrintedGroup] = []
    skeleton: list[str] = []
    pos = 0
    for start, end, kind in _bracketed(text):
        skeleton.append(_scalars(text[pos:start], groups))
        groups.append(_group(text[start:end], kind))
        skeleton.append(f" {PLACEHOLDERS[kind]} ")
        pos = end
    skeleton.append(_scalars(text[pos:], groups))
    return PrintedRecord(text=text, skeleton=" ".join("".join(skeleton).split()), groups=groups, line=line)


def interval(token: str) -> PrintedNumber | None:
    """The values a printed number stands for: ± half a unit of its last printed digit."""
    t = token.strip().replace(",", "")
    try:
        value = float(t)
    except ValueError:
        return None
    if not math.isfinite(value):
        return PrintedNumber(token.strip(), value, value, value)
    mantissa, _, exponent = t.lower().partition("e")
    if mantissa.endswith("."):
        half = 0.0  # torch's and numpy's integral values: `1.`
    else:
        decimals = len(mantissa.partition(".")[2])
        try:
            half = 0.5 * 10.0 ** (int(exponent or 0) - decimals)
        except OverflowError:
            half = math.inf
    return PrintedNumber(token.strip(), value, value - half, value + half)


# -- internals ------------------------------------------------------------------------------
def _depth_after(text: str, depth: int) -> int:
    """The bracket depth after `text`, starting at `depth` (a stray closer does not go below 0)."""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}" and depth:
            depth -= 1
    return depth


def _depths(text: str) -> list[int]:
    """The bracket depth before each character of `text` (and after its last)."""
    out, depth = [], 0
    for ch in text:
        out.append(depth)
        if ch in "([{":
            depth += 1
        elif ch in ")]}" and depth:
            depth -= 1
    out.append(depth)
    return out


def _bracketed(text: str) -> list[tuple[int, int, str]]:
    """Spans of tensor(...)/array(...) reprs and of bare bracketed lists, in order."""
    spans: list[tuple[int, int, str]] = []
    i = 0
    # The next `tensor(` at or after i, searched for again only once i passed it: a search from
    # every bracket of a long output with none scans to its end each time (minutes on 200 KB).
    m = _TENSOR_START.search(text)
    while i < len(text):
        if m is not None and m.start() < i:
            m = _TENSOR_START.search(text, i)
        bracket = text.find("[", i)
        if m and (bracket < 0 or m.start() <= bracket):
            end = _closing(text, m.end() - 1)
            spans.append((m.start(), end, "array" if m.group(1) == "array" else "tensor"))
            i = end
        elif bracket >= 0:
            end = _closing(text, bracket)
            inner = text[bracket:end]
            if _NUMBER.search(inner):
                spans.append((bracket, end, "list"))
            i = end
        else:
            break
    return spans


def _closing(text: str, opening: int) -> int:
    """The index past the bracket closing the one at `opening` (the text's end if none)."""
    depth = 0
    for j in range(opening, len(text)):
        if text[j] in "([{":
            depth += 1
        elif text[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def _scalars(text: str, groups: list[PrintedGroup]) -> str:
    """Numbers outside brackets, each a scalar group; returns the text with each as `#`."""
    out, pos = [], 0
    grouped = [(m.start(), m.end()) for m in _GROUPED.finditer(text)]
    inside = set()
    for start, end in grouped:
        inside.update(range(start, end))
    spans = sorted(grouped + [(m.start(), m.end()) for m in _NUMBER.finditer(text) if m.start() not in inside])
    for start, end in spans:
        if start < pos or _nonfinite_word_as_label(text, start, end):
            continue
        number = interval(text[start:end])
        if number is None:
            continue
        out.append(text[pos:start])
        out.append("#")
        groups.append(PrintedGroup("scalar", [number], text[start:end]))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _nonfinite_word_as_label(text: str, start: int, end: int) -> bool:
    """`inf`/`nan` as a word of a label (`CPU is inf: True`), not a printed value."""
    return text[start:end].lstrip("+-").lower() in ("inf", "nan") and re.match(r"\s*[:=]", text[end:]) is not None


def _group(text: str, kind: str) -> PrintedGroup:
    """A tensor/array repr or a list: its keywords, then its numbers with their positions."""
    device = dtype = None
    for m in _KEYWORDS.finditer(text):
        if m.group(1) == "device":
            device = m.group(2).strip("'\"")
        elif m.group(1) == "dtype":
            dtype = m.group(2).rpartition(".")[2]
    body = _KEYWORDS.sub("", text)
    if kind != "list":
        body = body[body.find("(") + 1:body.rfind(")") if body.rfind(")") > body.find("(") else len(body)]
    items, elided = _nested(body)
    numbers: list[PrintedNumber] = []
    truncated = _positions(items, (), numbers)
    if kind != "list" and not body.lstrip().startswith("[") and len(numbers) == 1:
        numbers[0].index = ()  # tensor(1.): a 0-d tensor
    return PrintedGroup(kind, numbers, text, device=device, dtype=dtype, elided=elided, truncated=truncated)


_ELLIPSIS = object()


MAX_DEPTH = 32  # tensors have at most a few dozen dimensions; deeper brackets are read as one level


def _nested(body: str) -> tuple[list, bool]:
    """The bracket structure of a repr's body: nested lists of number tokens and `...`."""
    root: list = []
    stack = [root]
    elided = False
    deeper = 0  # brackets opened past MAX_DEPTH, not nested further
    for m in re.finditer(r"\[|\]|\.\.\.|" + _NUMBER.pattern, body, re.IGNORECASE):
        tok = m.group(0)
        if tok == "[":
            if len(stack) > MAX_DEPTH:
                deeper += 1
                continue
            child: list = []
            stack[-1].append(child)
            stack.append(child)
        elif tok == "]":
            if deeper:
                deeper -= 1
            elif len(stack) > 1:
                stack.pop()
        elif tok == "...":
            stack[-1].append(_ELLIPSIS)
            elided = True
        else:
            stack[-1].append(tok)
    # `tensor([1., 2.])`: the repr's outer list is the tensor; a bare number is a 0-d tensor.
    return (root[0] if len(root) == 1 and isinstance(root[0], list) else root), elided


def _positions(items: list, prefix: tuple[int, ...], out: list[PrintedNumber]) -> bool:
    """Each number's index; after a `...` indices count from the end (-1 the last). True
    when the numbers ran past MAX_NUMBERS."""
    cut = next((k for k, it in enumerate(items) if it is _ELLIPSIS), None)
    for k, it in enumerate(items):
        if it is _ELLIPSIS:
            continue
        position = k if cut is None or k < cut else k - len(items)
        if isinstance(it, list):
            if _positions(it, prefix + (position,), out):
                return True
        else:
            number = interval(it)
            if number is not None:
                number.index = prefix + (position,)
                out.append(number)
                if len(out) >= MAX_NUMBERS:
                    return True
    return False


def flat_index(index: tuple[int, ...] | None, shape: list[int]) -> int | None:
    """The flat position of a printed element in a tensor of `shape` (None: it does not fit)."""
    if index is None:
        return 0 if math.prod(shape) == 1 else None
    if len(index) != len(shape):
        if math.prod(shape) == 1 and all(i in (0, -1) for i in index):
            return 0
        return None
    flat = 0
    for i, n in zip(index, shape, strict=False):
        i = i + n if i < 0 else i
        if not 0 <= i < n:
            return None
        flat = flat * n + i
    return flat
