"""The sweep's sources: what `triage sweep SOURCE…` is given, turned into `SweepItem`s.

Each SOURCE is read as the first of these that fits:

* an existing **folder** of repro scripts. Its items are the ``*.py`` files directly in it
  (key ``name.py``) and, one level down, every report folder's ``repro.py`` (key
  ``name/repro.py``); a report folder's optional ``meta.json`` gives the title (``"title"``)
  and the report's address (``"source"``, an http(s) URL). Nothing deeper is read; names
  starting with ``.`` and ``__pycache__`` are skipped. Keys are posix paths relative to the
  swept folder, in sorted order. A symlink that leads outside the swept folder is refused, not
  followed; a file that is not a regular file, not UTF-8, or over ``MAX_SCRIPT_BYTES`` is
  refused. Without a meta.json title, the title is the script's first comment or docstring line,
  else its key.
* **issue references** ``OWNER/REPO#N``, one or several separated by commas or whitespace
  (an argument any word of which is written ``OWNER/REPO#…``): each issue read through the
  API. Pull requests are refused.
* a path that does not exist (``/…``, ``./…``, ``…/``, ``….py``): refused, not searched for.
* anything else: a **GitHub issue search** (``repo:pytorch/pytorch is:open
  label:"module: numerical-stability"``). Only issues are taken (``is:issue`` is added unless
  the query says is:/type:), at most ``limit`` of them per query, each from its search result
  without reading the issue again. GitHub's search serves only the first 1000 results of a query.

Every GitHub call goes through `github.with_retries`, so 5xx answers and rate limits are
waited out as publishing waits them out. A source that fails, or an item in it that is refused,
gives one line in `SourceItems.problems` (a reason, never a traceback) and the sweep goes on
with the rest. Items are deduplicated by key, the first one kept.
"""
from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from triage.github import GitHubOptions, GitHubUnreachable, PublishError, connect, parse_issue_ref, with_retries
from triage.report.markdown import visible
from triage.sweep.model import SweepItem

MAX_SCRIPT_BYTES = 1 << 20
MAX_META_BYTES = 64 << 10
MAX_TITLE_CHARS = 200
REPORT_SCRIPT = "repro.py"
REPORT_META = "meta.json"
SEARCH_PAGE_SIZE = 100  # GitHub's largest: the search API allows 30 requests a minute with a token, 10 without
SEARCH_RESULT_CAP = 1000  # GitHub's search serves no result past the 1000th
# A source that is meant as a path, not as search words: a search for it would only mislead.
PATH_LIKE = re.compile(r"^(?:\.{1,2}|~)?/|/$|\.py$")
# Something written as an issue reference (OWNER/REPO#…), well-formed or not; not a qualifier.
REF_LIKE = re.compile(r'^[^\s/#:"]+/[^\s/#:"]+#')
SOURCE_SEPARATORS = re.compile(r"[\s,]+")
# A query already choosing between issues and pull requests.
TYPE_QUALIFIER = re.compile(r"(?:^|\s)-?(?:is|type):(?:issues?|prs?|pull-requests?)(?=\s|$)", re.IGNORECASE)
CODING_COOKIE = re.compile(r"^#.*coding[:=]")
DOCSTRING = re.compile(r'^[rRuUbB]{0,2}("""|\'\'\'|"|\')(.*?)\1', re.DOTALL)


@dataclass
class SourceItems:
    items: list[SweepItem] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line each: the source (or item) and why
    github_unreachable: bool = False  # a GitHub source gave nothing because GitHub could not be reached


def items_from(sources: list[str], github: GitHubOptions | None = None, *, limit: int | None = None) -> SourceItems:
    """Every item the sources name, in order, deduplicated by key (the first one kept), and a
    line for each source or item that gave nothing. `github` (defaults: the public API, no
    token) is used only for issue references and searches; `limit` caps each search's items."""
    result = SourceItems()
    reader = _GitHubReader(github or GitHubOptions())
    kept: dict[str, SweepItem] = {}

    def problem(line: str) -> None:
        result.problems.append(_one_line(line))

    for source in sources:
        found = list(_items_of(source, reader, limit, problem))
        for item in found:
            first = kept.get(item.key)
            if first is None:
                kept[item.key] = item
                result.items.append(item)
            elif first.text != item.text:
                # Two different scripts under one key (the same relative path in two swept folders):
                # the store keys results on it, so only one of them can be swept in one run.
                problem(f"{_shown(source, item)}: the key {item.key} is already taken by a different item from "
                        "an earlier source; skipped (sweep the two folders separately)")
    result.github_unreachable = reader.unreachable
    return result


def _items_of(source: str, reader: _GitHubReader, limit: int | None,
              problem: Callable[[str], None]) -> Iterator[SweepItem]:
    if not source.strip():
        problem(f"{source!r}: an empty source")
    elif os.path.isdir(source):
        yield from _folder_items(source, problem)
    elif os.path.lexists(source):
        problem(f"{source}: not a folder; give the folder that holds it, OWNER/REPO#N or a search query")
    elif PATH_LIKE.search(source.strip()):
        problem(f"{source}: no such file or folder")
    elif any(REF_LIKE.match(token) for token in SOURCE_SEPARATORS.split(source.strip())):
        for token in SOURCE_SEPARATORS.split(source.strip()):
            if token:
                yield from reader.issue(token, problem)
    else:
        yield from reader.search(source.strip(), limit, problem)


# -- folders of scripts ---------------------------------------------------------------------

def _folder_items(folder: str, problem: Callable[[str], None]) -> Iterator[SweepItem]:
    root = os.path.realpath(folder)
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError as e:
        problem(f"{folder}: cannot list it: {e.strerror or e}")
        return
    candidates = []  # (key, script path, meta.json path or None)
    for entry in entries:
        if entry.name.startswith(".") or entry.name == "__pycache__":
            continue
        if _is_dir(entry):
            script = os.path.join(entry.path, REPORT_SCRIPT)
            if os.path.lexists(script):
                candidates.append((f"{entry.name}/{REPORT_SCRIPT}", script, os.path.join(entry.path, REPORT_META)))
        elif entry.name.endswith(".py"):
            candidates.append((entry.name, entry.path, None))
    if not candidates:
        problem(f"{folder}: no repro scripts (looked for {folder}/*.py and {folder}/*/{REPORT_SCRIPT})")
    for key, script, meta_path in candidates:
        shown = os.path.join(folder, key)
        real = _inside(root, script)
        if real is None:
            problem(f"{shown}: a symlink to {os.path.realpath(script)}, outside the swept folder; not followed")
            continue
        text, why = _read_text(real, MAX_SCRIPT_BYTES)
        if text is None:
            problem(f"{shown}: {why}")
            continue
        meta = _read_meta(root, meta_path, problem) if meta_path else {}
        yield SweepItem(key=key, kind="script", title=meta.get("title") or _script_title(text) or key, text=text,
                        url=meta.get("url"), path=real)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows a symlink: where it leads is checked before anything is read
    except OSError:
        return False


def _inside(root: str, path: str) -> str | None:
    """The real path of `path` where it lies inside `root` (itself a real path), else None."""
    real = os.path.realpath(path)
    return real if os.path.commonpath([root, real]) == root else None


def _read_text(path: str, cap: int) -> tuple[str | None, str]:
    """The file's text, or None and why not. Only a regular file is opened (a FIFO named
    x.py would block the sweep), and never more than `cap` bytes of it are read."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > cap:
            return None, f"{info.st_size} bytes; at most {cap} are read"
        with open(path, "rb") as f:
            data = f.read(cap + 1)
    except OSError as e:
        return None, f"cannot read it: {e.strerror or e}"
    if len(data) > cap:
        return None, f"over {cap} bytes; at most {cap} are read"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})"


def _read_meta(root: str, path: str, problem: Callable[[str], None]) -> dict[str, str]:
    """title and url from a report folder's meta.json; what is missing or unusable is left out."""
    if not os.path.lexists(path):
        return {}
    real = _inside(root, path)
    if real is None:
        problem(f"{path}: a symlink to {os.path.realpath(path)}, outside the swept folder; not followed")
        return {}
    text, why = _read_text(real, MAX_META_BYTES)
    meta = None
    if text is not None:
        try:
            meta = json.loads(text)
            why = "not a JSON object"
        except (ValueError, RecursionError) as e:
            why = f"not JSON ({e})"
    if not isinstance(meta, dict):
        problem(f"{path}: {why}; the title is taken from the script")
        return {}
    found = {}
    if isinstance(meta.get("title"), str) and meta["title"].strip():
        found["title"] = _clip(meta["title"].strip())
    source = meta.get("source")
    if isinstance(source, str) and re.match(r"^https?://\S+$", source):
        found["url"] = source
    elif source is not None:
        problem(f"{path}: \"source\" is not an http(s) URL; ignored")
    return found


def _script_title(text: str) -> str | None:
    """The first line of the script's leading comment or docstring (after a #! line and a
    coding cookie), or None when code comes first."""
    lines = text.splitlines()
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#!") or CODING_COOKIE.match(stripped):
            continue
        if stripped.startswith("#"):
            if stripped.lstrip("#").strip():
                return _clip(stripped.lstrip("#").strip())
            continue
        docstring = DOCSTRING.match("\n".join([stripped, *lines[number + 1:]]))
        if docstring:
            return next((_clip(part.strip()) for part in docstring.group(2).splitlines() if part.strip()), None)
        return None
    return None


def _clip(title: str) -> str:
    return title if len(title) <= MAX_TITLE_CHARS else title[:MAX_TITLE_CHARS - 1] + "…"


# -- GitHub: issue references and searches ---------------------------------------------------

class _GitHubReader:
    """Issue references and searches, through one PyGithub connection made on first use."""

    def __init__(self, options: GitHubOptions) -> None:
        self.options = options
        self._gh: Any = None
        self.unreachable = False  # some read failed on the way to GitHub, not on GitHub's answer

    @property
    def gh(self) -> Any:
        if self._gh is None:
            self._gh = connect(self.options)
        return self._gh

    def issue(self, ref: str, problem: Callable[[str], None]) -> Iterator[SweepItem]:
        try:
            repo, number = parse_issue_ref(ref)
        except ValueError as e:
            problem(str(e))
            return

        def read() -> tuple[SweepItem, bool]:
            issue = self.gh.get_repo(repo).get_issue(number)
            # The repository as GitHub spells it (the reference may differ in case, or name a
            # repository the issue has moved from), so the key matches the same issue's search result.
            return _issue_item(issue, _repo_of(issue)), issue.pull_request is not None

        try:
            item, is_pull_request = with_retries(read, self.options)
        except _github_failures() as e:
            problem(f"{ref}: {self._failure(e)}")
            return
        if is_pull_request:
            problem(f"{ref}: a pull request, not an issue; the sweep triages issues")
            return
        if (why := _not_unicode(item)) is not None:
            problem(why)
            return
        yield item

    def search(self, query: str, limit: int | None, problem: Callable[[str], None]) -> Iterator[SweepItem]:
        """The issues the query finds, page by page: each page is retried on its own, so a rate
        limit on page 5 does not start the search over."""
        sent = query if TYPE_QUALIFIER.search(query) else f"{query} is:issue"
        wanted = SEARCH_RESULT_CAP if limit is None else min(limit, SEARCH_RESULT_CAP)
        if wanted <= 0:
            return
        per_page = min(SEARCH_PAGE_SIZE, wanted)
        taken = pull_requests = 0
        total = 0
        incomplete = False
        try:
            self.gh.per_page = per_page
            results = self.gh.search_issues(sent)
            page = 0
            while taken < wanted:
                def read(page: int = page) -> tuple[list[SweepItem | None], int, bool]:
                    found = results.get_page(page)  # None for a pull request
                    return ([None if _is_pull_request(r) else _issue_item(r, _repo_of(r)) for r in found],
                            results.totalCount, bool(results.incomplete_results))

                found, total, incomplete_page = with_retries(read, self.options)
                incomplete = incomplete or incomplete_page
                for item in found:
                    if taken == wanted:
                        break
                    if item is None:
                        pull_requests += 1
                        continue
                    taken += 1
                    if (why := _not_unicode(item)) is not None:
                        problem(why)
                        continue
                    yield item
                page += 1
                if len(found) < per_page or page * per_page >= min(total, SEARCH_RESULT_CAP):
                    break
        except _github_failures() as e:
            problem(f"search {query!r}: {self._failure(e)}")
            return
        if taken == 0:
            also = f" ({pull_requests} pull requests skipped: the sweep triages issues)" if pull_requests else ""
            problem(f"search {query!r}: no issues found{also}")
        if incomplete:
            problem(f"search {query!r}: GitHub's search timed out and returned incomplete results; "
                    "some issues may be missing (run it again, or narrow the query)")
        if total > SEARCH_RESULT_CAP and wanted == SEARCH_RESULT_CAP:
            problem(f"search {query!r}: {total} results, and GitHub's search serves only the first "
                    f"{SEARCH_RESULT_CAP}; narrow the query (e.g. with created:<DATE and created:>=DATE)")


    def _failure(self, error: Exception) -> str:
        """Why a GitHub read failed (one of `_github_failures`), in one line; noted when the
        failure was GitHub being out of reach."""
        from github import GithubException

        self.unreachable |= isinstance(error, GitHubUnreachable) or not isinstance(error, (GithubException,
                                                                                          PublishError))
        return _github_failure(error, self.options)


def _not_unicode(item: SweepItem) -> str | None:
    """Why an issue cannot be an item: its title or body holds a lone surrogate (JSON's
    "\\ud800" escape decodes to one), which is no Unicode text: it has no UTF-8 bytes to hash,
    to store or to write the repro with.  None where both are text."""
    for what, text in (("title", item.title), ("body", item.text)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return (f"{item.key}: the issue {what} is not valid Unicode (a lone surrogate, U+{ord(text[e.start]):04X}, "
                    f"at character {e.start}); skipped")
    return None


def _issue_item(issue: Any, repo: str) -> SweepItem:
    """An issue item from an issue or a search result. Every attribute read here is in both
    answers, so PyGithub never goes back to GitHub for the rest of the issue."""
    key = f"{repo}#{issue.number}"
    labels = [label.name for label in issue.labels]
    return SweepItem(key=key, kind="issue", title=issue.title or key, text=issue.body or "", url=issue.html_url,
                     issue={"repo": repo, "number": issue.number, "title": issue.title or "",
                            "url": issue.html_url or "", "author": issue.user.login if issue.user else "",
                            "labels": labels, "state": issue.state})


def _repo_of(issue: Any) -> str:
    """OWNER/REPO of an issue or search result, from its repository_url (…/repos/OWNER/REPO)."""
    return "/".join(issue.repository_url.rstrip("/").split("/")[-2:])


def _is_pull_request(result: Any) -> bool:
    # Not `result.pull_request`: an issue's search result has no such key, and asking PyGithub
    # for a missing attribute reads the whole issue again. A pull request's page is /pull/N.
    return "/pull/" in (result.html_url or "")


def _github_failures() -> tuple[type[Exception], ...]:
    """What a GitHub read raises when GitHub (or the way to it) fails: a problem line, not a crash."""
    from github import GithubException
    from requests.exceptions import RequestException

    return GithubException, PublishError, RequestException


def _github_failure(error: Exception, options: GitHubOptions) -> str:
    """Why a GitHub read failed (one of `_github_failures`), in one line."""
    from github import GithubException

    if isinstance(error, PublishError):
        return str(error)
    if not isinstance(error, GithubException):
        return f"cannot reach GitHub at {options.api_url}: {error}"
    data = error.data if isinstance(error.data, dict) else {}
    details = [e.get("message") for e in data.get("errors") or [] if isinstance(e, dict) and e.get("message")]
    said = "; ".join(str(part) for part in [data.get("message"), *details] if part)
    reason = {401: "GitHub refused the token", 404: "not found", 410: "deleted",
              422: "GitHub refused the query"}.get(error.status, "GitHub answered")
    return f"{reason} ({error.status}{': ' + said if said else ''})"


def _shown(source: str, item: SweepItem) -> str:
    return os.path.join(source, item.key) if item.kind == "script" else item.key


def _one_line(text: str) -> str:
    """`text` shown safely on one line: names, queries and GitHub's messages are not ours."""
    return visible(text).replace("\n", "\\n")
