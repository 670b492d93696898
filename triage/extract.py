"""Stage 1: read a reporter's script (a file, or the code in a GitHub issue body) and check
that Python can compile it.

Compiling runs none of the script, but Python's parser is not bounded: 150,000 chained
subscripts or 100,000 unary minus signs take it gigabytes and minutes to give up on, and
triage's own process has no memory limit. Small sources are parsed here; larger ones are
parsed first in a subprocess with a memory limit and a timeout (`compile_problem`,
`parse_python`). Either way a syntax, encoding or nesting problem becomes a could-not-run
report without starting any arm.
"""
from __future__ import annotations

import ast
import errno
import functools
import json
import os
import re
import resource
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from triage.model import IssueRepro, Repro

MAX_SOURCE_BYTES = 2 << 20
# Up to this size every shape of source parses in-process in well under a second and 64 MB.
IN_PROCESS_PARSE_BYTES = 32 << 10
# A legitimate 2 MiB script (a pasted tensor literal) parses in under 2 s and 450 MB.
PARSE_MEMORY_BYTES = 1 << 30
PARSE_TIMEOUT_S = 20.0
TOO_COMPLEX = "is too deeply nested for triage to parse (Python's parser gives up on it)"

# Run by `python -I -c` with the source on stdin; prints one JSON object.
_PARSER_PROGRAM = """
import ast, json, resource, sys
limit, mode, filename = int(sys.argv[1]), sys.argv[2], sys.argv[3]
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
data = sys.stdin.buffer.read()
try:
    if mode == "compile":
        compile(data, filename, "exec", dont_inherit=True)
    else:
        ast.parse(data, filename)
except SyntaxError as e:
    print(json.dumps({"kind": "syntax", "message": str(e.msg), "line": e.lineno}))
except ValueError as e:
    print(json.dumps({"kind": "value", "message": str(e)}))
except (RecursionError, MemoryError, OverflowError):
    print(json.dumps({"kind": "complex"}))
else:
    print(json.dumps({"kind": "ok"}))
"""


@dataclass(frozen=True)
class ParseProblem:
    kind: str  # syntax | value | complex
    message: str = ""
    line: int | None = None


def compile_problem(data: bytes, filename: str) -> ParseProblem | None:
    """Why `data` does not compile as a Python module, or None when it does."""
    if len(data) > IN_PROCESS_PARSE_BYTES:
        return _parse_in_subprocess(data, "compile", filename)
    return _parse_here(data, filename, compile_only=True)[1]


def parse_python(code: str) -> ast.Module | None:
    """`code`'s syntax tree, or None when it does not parse (or is too deep to)."""
    if len(code) > IN_PROCESS_PARSE_BYTES and _parse_in_subprocess(code.encode("utf-8", "surrogatepass"),
                                                                    "parse", "<source>") is not None:
        return None
    # Within the limits: either small, or the subprocess just parsed it within them.
    return _parse_here(code, "<source>", compile_only=False)[0]


def _parse_here(source: str | bytes, filename: str,
                compile_only: bool) -> tuple[ast.Module | None, ParseProblem | None]:
    """Parsed in this process: the tree (None when only compiled), or why there is none."""
    try:
        if compile_only:
            compile(source, filename, "exec", dont_inherit=True)
            return None, None
        return ast.parse(source, filename), None
    except SyntaxError as e:
        return None, ParseProblem("syntax", str(e.msg), e.lineno)
    except ValueError as e:
        return None, ParseProblem("value", str(e))
    except (RecursionError, MemoryError, OverflowError):
        return None, ParseProblem("complex")


@functools.lru_cache(maxsize=16)
def _parse_in_subprocess(data: bytes, mode: str, filename: str) -> ParseProblem | None:
    """Parse in a fresh interpreter that may use `PARSE_MEMORY_BYTES` and `PARSE_TIMEOUT_S`;
    running out of either, or any other way of dying, means the source is too complex."""
    limit = PARSE_MEMORY_BYTES
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    try:
        proc = subprocess.run([sys.executable, "-I", "-c", _PARSER_PROGRAM, str(limit), mode, filename],
                              input=data, capture_output=True, timeout=PARSE_TIMEOUT_S,
                              env={k: v for k, v in os.environ.items() if k in ("PATH", "LD_LIBRARY_PATH")})
        answer = json.loads(proc.stdout)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        return ParseProblem("complex")
    if not isinstance(answer, dict) or answer.get("kind") == "complex" or proc.returncode != 0:
        return ParseProblem("complex")
    if answer.get("kind") == "ok":
        return None
    line = answer.get("line")
    return ParseProblem(str(answer.get("kind")), str(answer.get("message", "")),
                        line if isinstance(line, int) else None)


class ScriptUnreadable(Exception):
    """The script path names nothing triage can read as a script; the message says why."""


_SPECIAL_FILES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(path: str | Path, mode: int) -> str:
    if stat.S_ISDIR(mode):
        return f"{path} is a directory, not a Python script"
    kind = next((what for test, what in _SPECIAL_FILES if test(mode)), "not a regular file")
    return f"{path} is {kind}, not a regular file; triage reads the script from a regular file"


def read_script(path: str | Path, max_bytes: int = MAX_SOURCE_BYTES) -> tuple[str, bytes]:
    """The script's real path and its bytes, read without trusting what the path names: only a
    regular file (through symlinks) is opened, a FIFO cannot block the open (O_NONBLOCK), a
    terminal is not made the controlling one (O_NOCTTY), and at most `max_bytes` + 1 bytes
    are read (/dev/zero is refused, not read until memory runs out). Raises ScriptUnreadable
    with the message for the user."""
    p = Path(path).expanduser()
    try:
        info = os.stat(p)  # follows symlinks; stat never opens (a FIFO does not block it)
    except FileNotFoundError:
        if os.path.islink(p):
            raise ScriptUnreadable(f"no such file: {path} (a symlink to {os.readlink(p)!r}, which does not "
                                   "exist)") from None
        raise ScriptUnreadable(f"no such file: {path}") from None
    except OSError as e:
        raise ScriptUnreadable(_os_problem(path, e)) from None
    except ValueError as e:  # a NUL in the path
        raise ScriptUnreadable(f"cannot read {path}: {e}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ScriptUnreadable(_not_regular(path, info.st_mode))
    if info.st_size > max_bytes:
        raise ScriptUnreadable(_too_big(path, f"{info.st_size} bytes", max_bytes))
    try:
        real = str(p.resolve())
    except (OSError, RuntimeError):  # a loop made between the stat and here
        raise ScriptUnreadable(f"{path} is a symlink loop (it never reaches a file)") from None
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ScriptUnreadable(_os_problem(path, e)) from None
    try:
        # The name may have been replaced since the stat: what was opened is what counts.
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ScriptUnreadable(_not_regular(path, info.st_mode))
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ScriptUnreadable(_os_problem(path, e)) from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ScriptUnreadable(_too_big(path, f"more than {max_bytes} bytes", max_bytes))
    return real, b"".join(chunks)


def _too_big(path: str | Path, size: str, max_bytes: int) -> str:
    return f"{path} is {size}; a repro script is expected to be under {max_bytes >> 20} MiB"


def _os_problem(path: str | Path, e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return f"{path} is a symlink loop (it never reaches a file)"
    if e.errno == errno.ENOENT:
        return f"no such file: {path}"
    return f"cannot read {path}: {e.strerror or e}"


def extract_repro(path: str | Path) -> Repro:
    p = Path(path).expanduser()
    name = p.name
    try:
        real, data = read_script(path)
    except ScriptUnreadable as e:
        return Repro(os.path.abspath(p), name, "", problem=str(e))
    p = Path(real)
    source = data.decode("utf-8", errors="replace")
    problem = compile_problem(data, str(p))
    if problem is None:
        return Repro(str(p), name, source)
    line = problem.line
    if "null byte" in problem.message and b"\0" in data:
        line = data[:data.index(b"\0")].count(b"\n") + 1
        what = "contains a NUL (zero) byte, which Python source cannot contain"
    elif problem.kind == "complex":
        what = TOO_COMPLEX
    elif problem.kind == "value":
        what = f"cannot be compiled: {problem.message}"
    elif "unicode" in problem.message.lower() or "utf-8" in problem.message.lower():
        what = "is not valid UTF-8 (and declares no other encoding)"
    else:
        what = f"has a syntax error: {problem.message}"
    where = f" (line {line})" if line is not None else ""
    if problem.kind not in ("complex", "value") and any(_PROMPT_LINE.match(ln) for ln in source.splitlines()[:200]):
        # A pasted session, not a script: extraction strips its prompts and keeps what it displayed.
        where += (f"; it is a `>>>` transcript, not a script: `triage extract {name}` writes the script (prompts "
                  "stripped) and the displayed values (reported.txt), which `triage run repro.py --reported "
                  "reported.txt` then judges")
    return Repro(str(p), name, source, problem=f"{name} {what}{where}", problem_line=line)


# --- Issue bodies -----------------------------------------------------------------------
# PyTorch's bug-report form renders each field as a `### <label>` section (blank optional
# fields as `_No response_`): code in ```python fences under "Describe the bug", the
# traceback and printed output in untagged fences, collect_env output under "Versions".
# Real bodies deviate (no template, unfenced code, `>>>` transcripts, output pasted under
# Versions, a repro quoted in a `>` blockquote or fenced inside a list item), so the block
# structure is CommonMark's (markdown-it-py) and every block is classified by what it is,
# not by where it sits.

MAX_BODY_CHARS = 1 << 20
# Containers (blockquotes, lists, list items) nested deeper than this are not parsed: their
# lines are read as prose. A fence in an issue sits a few levels deep at most (in a list
# item of a list item of a blockquote it is at level 5), and markdown-it's time is lines
# times open containers: the cap is what keeps a hostile 1 MiB body to seconds.
MAX_MARKDOWN_NESTING = 8
# A line of an unfenced `>>>` session: to markdown its prompt opens three blockquotes (and
# `>>> # comment` is a heading in them); no heading, fence or code block starts on one.
_PROMPT_LINE = re.compile(r" {0,3}(?:> ?)*>>>(?: |$)")
_PROMPT = re.compile(r"^(?:>>>|\.\.\.|In \[\d+\]:|\s+\.\.\.:)(?: |$)")
_OUT_PROMPT = re.compile(r"^Out\[\d+\]: ?")
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Warning)\b.*?:", re.M)
_EXTERNAL_CODE = re.compile(r"https?://(?:gist\.github\.com|colab\.research\.google\.com|pastebin\.com)/\S+")
_ENV_KEYS = ("PyTorch version", "Is debug build", "CUDA used to build PyTorch", "ROCM used to build PyTorch", "OS",
             "Python version", "Is CUDA available", "CUDA runtime version", "GPU models and configuration",
             "Nvidia driver version", "cuDNN version")
_DATA_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".npy", ".npz", ".bin", ".safetensors", ".ckpt", ".h5", ".csv")
_COMMON_IMPORTS = {"torch": "import torch", "np": "import numpy as np", "nn": "import torch.nn as nn",
                   "F": "import torch.nn.functional as F", "numpy": "import numpy"}
_PYTHON_TAGS = {"python", "py", "python3", "py3", "pytorch", "torch"}
_TRANSCRIPT_TAGS = {"pycon", "pycon3", "ipython", "python-repl", "repl"}


@dataclass
class _Block:
    kind: str  # code | transcript | traceback | environment | output | text
    text: str
    section: str
    tagged: bool = False  # fenced and tagged as Python


def extract_issue_body(body: str | None) -> IssueRepro:
    """The repro script in a GitHub issue body, or the reason there is none. Never raises:
    the body is whatever a reporter (or an attacker) typed."""
    text = (body or "").replace("\r\n", "\n").replace("\r", "\n")
    if len(text) > MAX_BODY_CHARS:
        return IssueRepro(None, problem=f"the issue body is {len(text)} characters; triage reads bodies up to "
                                        f"{MAX_BODY_CHARS} characters")
    if not text.strip():
        return IssueRepro(None, problem="the issue body is empty")
    blocks = _classify(_blocks(text))
    result = IssueRepro(None)
    for b in blocks:
        if b.kind == "environment" and result.environment is None:
            result.environment = b.text
            result.environment_fields = parse_environment(b.text)
        elif b.kind == "traceback" and result.traceback is None:
            result.traceback = b.text
        elif b.kind == "output":
            result.observed.append(b.text)
        elif b.kind == "transcript":
            result.observed.extend(_transcript_output(b.text))
    script, how = _choose_script(blocks)
    if script is None:
        link = _EXTERNAL_CODE.search(text)
        result.problem = (f"the repro is linked ({link.group(0)}), not in the issue; triage does not fetch external "
                          "code, so please paste it into the issue" if link else
                          "no Python code in the issue body (triage looks for ```python fences, untagged fences that "
                          "parse as Python, `>>>` transcripts and an unfenced script)")
        return result
    result.notes.extend(how)
    script, added = _add_missing_imports(script)
    if added:
        result.notes.append("added " + ", ".join(f"`{a}`" for a in added) + " (used but not imported in the issue)")
    if not re.search(r"\btorch\b", script):
        result.problem = "the code in the issue does not use torch"
    elif missing := _external_files(script):
        result.problem = ("the repro loads files that are not in the issue (" + ", ".join(missing[:5]) +
                          "); please replace them with tensors built in the script")
    result.script = script
    return result


def parse_environment(text: str) -> dict[str, str]:
    """The key lines of `python -m torch.utils.collect_env` output."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in _ENV_KEYS and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


@functools.lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"maxNesting": MAX_MARKDOWN_NESTING})
    # Only the block structure is read. No inline parsing (links, emphasis: where the
    # pathological `[[[[…` inputs are), and no `normalize`, which would turn a NUL in code into
    # U+FFFD (the body's line endings are normalized already).
    md.core.ruler.enableOnly(["block"])
    # No HTML blocks: `<details><summary>…` directly above a fence (no blank line between)
    # would make the fence raw HTML, a CommonMark rule reporters do not know; the tags are
    # prose. No link reference definitions (`[x]: url`, prose either way): on a body of `[`
    # lines their look-ahead is most of the parser's time.
    md.block.ruler.disable(["html_block", "reference"])
    # HTML comments, though, are what GitHub hides: a fence inside `<!-- ... -->` is not
    # shown to anyone, so it is not the reporter's repro (and could be planted to steer the
    # verdict). Only CommonMark's HTML block of type 2 is recognized, as cmark-gfm does.
    md.block.ruler.before("html_block", "html_comment", _html_comment,
                          {"alt": ["paragraph", "reference", "blockquote"]})
    return md


_COMMENT_START = re.compile(r"<!--")
_COMMENT_END = re.compile(r"-->")


def _html_comment(state: Any, start_line: int, end_line: int, silent: bool) -> bool:
    """CommonMark's HTML block type 2 (a line that starts, after at most 3 spaces, with
    `<!--`; it ends on the first line holding `-->`, or with its container or the document
    when none does), as markdown-it's own `html_block` rule finds it, for comments only.
    Code (a fence, an indented block) is parsed before: a `<!--` in code stays code."""
    if state.is_code_block(start_line):
        return False
    pos = state.bMarks[start_line] + state.tShift[start_line]
    maximum = state.eMarks[start_line]
    if not _COMMENT_START.match(state.src, pos, maximum):
        return False
    if silent:
        return True  # it can interrupt a paragraph
    line = start_line + 1
    if not _COMMENT_END.search(state.src, pos, maximum):
        while line < end_line:
            # An outdented line ends the container and the comment with it (a blank one does not).
            if state.sCount[line] < state.blkIndent and not state.isEmpty(line):
                break
            found = _COMMENT_END.search(state.src, state.bMarks[line] + state.tShift[line], state.eMarks[line])
            line += 1
            if found:
                break
    state.line = line
    token = state.push("html_comment", "", 0)
    token.map = [start_line, line]
    return True


def _blocks(text: str) -> list[_Block]:
    """Fenced and indented code blocks and the prose around them, each tagged with the
    heading it sits under (a heading inside a blockquote or list item holds until that ends).
    Prose is the body's own source lines, `>` markers and all, so that an unfenced `>>>`
    session (to markdown, a nested blockquote) or script reads as it was typed."""
    lines = text.split("\n")
    try:
        tokens = _markdown().parse(text)
    except Exception:  # a parser bug on some hostile input: the body is read as prose
        tokens = []
    # In document order: fenced blocks, and prose runs (section, first line, end line, the
    # indented code blocks in the run as (first line, end line, code)).
    items: list[_Block | tuple[str, int, int, list[tuple[int, int, str]]]] = []
    section, start = "", 0  # the prose run not yet recorded begins at line `start`
    indented: list[tuple[int, int, str]] = []
    outer: list[tuple[str, int]] = []  # per open container: the section outside it, its end line

    def flush(upto: int) -> None:
        nonlocal start
        if upto > start or indented:
            items.append((section, start, upto, indented[:]))
        indented.clear()
        start = max(start, upto)

    for i, tok in enumerate(tokens):
        if tok.type in ("blockquote_open", "list_item_open"):
            outer.append((section, tok.map[1] if tok.map else start))
        elif tok.type == "html_comment" and tok.map:
            flush(tok.map[0])  # its lines are neither code nor prose: GitHub shows none of them
            start = max(start, tok.map[1])
            continue
        elif tok.type in ("blockquote_close", "list_item_close") and outer:
            was, end = outer.pop()
            if was != section:
                flush(end)
                section = was
        elif tok.type in ("fence", "code_block", "heading_open") and tok.map and \
                not _PROMPT_LINE.match(lines[tok.map[0]]):
            a, b = tok.map
            if tok.type == "code_block":
                indented.append((a, b, tok.content.removesuffix("\n")))
                continue
            flush(a)
            start = max(start, b)
            if tok.type == "fence":
                info = tok.info.strip()
                tag = info.split()[0].lower().strip("{}.") if info else ""
                items.append(_Block(tag or "untagged", tok.content.removesuffix("\n"), section,
                                    tagged=tag in _PYTHON_TAGS))
            elif i + 1 < len(tokens):
                section = tokens[i + 1].content.strip()
    flush(len(lines))

    def prose(chunk: list[str], sec: str) -> _Block | None:
        joined = "\n".join(chunk).strip("\n")
        if joined.strip() and joined.strip() != "_No response_":
            return _Block("text", joined, sec)
        return None

    runs = [item for item in items if isinstance(item, tuple)]
    unfenced_script = False
    if any(codes for *_, codes in runs):
        # An unfenced script is prose to markdown, and a blank line inside one of its function
        # bodies makes the rest of that body an indented code block: when all the prose, those
        # blocks included, is a script (as the unfenced-script fallback reads it), they stay in it.
        texts = [prose(lines[first:upto], sec) for sec, first, upto, _ in runs
                 if not sec.lower().startswith("version")]
        unfenced_script = _is_code("\n".join(t.text for t in texts if t is not None))
    blocks: list[_Block | None] = []
    for item in items:
        if isinstance(item, _Block):
            blocks.append(item)
            continue
        sec, first, upto, codes = item
        for a, b, code in [] if unfenced_script else codes:
            blocks += [prose(lines[first:a], sec), _Block("indented", code, sec)]
            first = b
        blocks.append(prose(lines[first:upto], sec))
    return [b for b in blocks if b is not None]


def _classify(blocks: list[_Block]) -> list[_Block]:
    out = []
    for b in blocks:
        text = b.text.strip("\n")
        if not text.strip() or text.strip() == "_No response_":
            continue
        if b.kind == "text":
            for prose, transcript in _split_transcripts(text):
                if prose.strip():
                    out.append(_Block("environment" if _is_environment(prose) else "text", prose, b.section))
                if transcript:
                    out.append(_Block("transcript", transcript, b.section))
            continue
        elif b.kind in _TRANSCRIPT_TAGS or _is_transcript(text):
            kind = "transcript"
        elif b.tagged:
            kind = "code"
        elif _is_environment(text):
            kind = "environment"
        elif text.lstrip().startswith("Traceback (most recent call last)") or _EXCEPTION_LINE.match(text.lstrip()):
            kind = "traceback"
        elif _is_code(text):
            kind = "code"
        else:
            kind = "output"
        out.append(_Block(kind, text, b.section, b.tagged))
    return out


def _split_transcripts(text: str) -> list[tuple[str, str]]:
    """Prose with unfenced `>>>` sessions in it: (prose before, session) pairs. A session runs
    from a prompt line to a blank line that is not followed by another prompt."""
    lines, pieces, prose, session = text.split("\n"), [], [], []
    following = [""] * len(lines)  # the first non-blank line after each (not a scan per line: quadratic)
    for i in range(len(lines) - 2, -1, -1):
        following[i] = lines[i + 1] if lines[i + 1].strip() else following[i + 1]
    for i, line in enumerate(lines):
        if session:
            if not line.strip() and not _PROMPT.match(following[i]):
                pieces.append(("\n".join(prose), "\n".join(session)))
                prose, session = [], []
            else:
                session.append(line)
        elif _PROMPT.match(line) and line.startswith((">>>", "In [")):
            session.append(line)
        else:
            prose.append(line)
    pieces.append(("\n".join(prose), "\n".join(session)))
    return pieces


def _is_environment(text: str) -> bool:
    return "Collecting environment information" in text or len(parse_environment(text)) >= 2


def _is_transcript(text: str) -> bool:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return bool(lines) and _PROMPT.match(lines[0]) is not None


def _is_code(text: str) -> bool:
    """Python, and more than a printed value: `tensor([1., inf])` parses too, but a script has
    a statement, an import, or a call on a name it defines."""
    tree = parse_python(text)
    if tree is None or not tree.body:
        return False
    return any(not isinstance(node, ast.Expr) for node in tree.body) or "import" in text


def _transcript_code(text: str) -> str:
    code = []
    for line in text.splitlines():
        if m := _PROMPT.match(line):
            code.append(line[m.end():])
    return "\n".join(code)


def _transcript_output(text: str) -> list[str]:
    out = [_OUT_PROMPT.sub("", ln) for ln in text.splitlines() if ln.strip() and not _PROMPT.match(ln)]
    return ["\n".join(out)] if out else []


def _choose_script(blocks: list[_Block]) -> tuple[str | None, list[str]]:
    """The script: code blocks in order when later ones build on earlier ones, else the
    largest that imports torch. Blocks under a Versions heading are never code."""
    candidates = []
    for b in blocks:
        if b.section.lower().startswith("version"):
            continue
        if b.kind == "code":
            candidates.append((b.text, b.tagged, "fence"))
        elif b.kind == "transcript" and (code := _transcript_code(b.text)).strip():
            candidates.append((code, True, "transcript"))
    parsed = [(code, src) for code, _, src in candidates if parse_python(code) is not None]
    if not parsed:
        # A Python-tagged block that does not parse still goes to the run, so the report can
        # name the syntax error and its line; prose that parses is the last resort.
        tagged = [code for code, is_tagged, _ in candidates if is_tagged]
        if tagged:
            return max(tagged, key=len), ["the ```python block does not parse as Python"]
        prose = "\n".join(b.text for b in blocks if b.kind == "text" and not b.section.lower().startswith("version"))
        if _is_code(prose):
            return prose, ["the code is unfenced in the issue body"]
        return None, []
    notes = ["from a `>>>` transcript (prompts stripped)"] if any(src == "transcript" for _, src in parsed) else []
    if len(parsed) == 1:
        return parsed[0][0], notes
    joined = "\n\n".join(code for code, _ in parsed)
    if _builds_on_earlier([code for code, _ in parsed]) and parse_python(joined) is not None:
        return joined, notes + [f"joined the issue's {len(parsed)} code blocks in order (each uses names from the ones before)"]
    with_torch = [code for code, _ in parsed if re.search(r"^\s*(import torch|from torch)", code, re.M)]
    chosen = max(with_torch or [code for code, _ in parsed], key=len)
    index = [code for code, _ in parsed].index(chosen) + 1
    return chosen, notes + [f"used code block {index} of {len(parsed)} (the largest that imports torch)"]


def _builds_on_earlier(codes: list[str]) -> bool:
    defined: set[str] = set()
    for i, code in enumerate(codes):
        tree = parse_python(code)
        if tree is None:
            return False
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        if i > 0 and not used & defined:
            return False
        defined |= _defined_names(tree)
    return True


def _defined_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _add_missing_imports(script: str) -> tuple[str, list[str]]:
    tree = parse_python(script)
    if tree is None:
        return script, []
    defined = _defined_names(tree)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    added = [stmt for name, stmt in _COMMON_IMPORTS.items() if name in used and name not in defined]
    if not added:
        return script, []
    return "\n".join(added) + "\n" + script, added


def _external_files(script: str) -> list[str]:
    """Data files the script reads but never writes (a `.pt` the reporter had on disk)."""
    tree = parse_python(script)
    if tree is None:
        return []
    read, written = [], set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        literals = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        for path in literals:
            if "save" in name or "write" in name or "dump" in name:
                written.add(path)
            elif name in ("load", "open", "loadtxt", "fromfile", "read_csv", "load_file") and \
                    path.lower().endswith(_DATA_SUFFIXES):
                read.append(path)
    return [p for p in read if p not in written]
