"""Stage 7: GitHub — read an issue, and publish a report on it as one comment (PyGithub).

Publishing is an upsert that is safe to repeat: find the bot's own comment (hidden marker
**and** author, since anyone can paste a marker), edit it, or leave it alone when its digest
says the outcome is the same; create one only when there is none. Because the whole step is
idempotent, retrying it after a 5xx or a rate limit is retrying all of it — a POST that
succeeded but answered 502 is found by the next attempt instead of posted twice. PyGithub's
own retry is switched off for that reason.

This module holds the token. It never runs code from an issue and reads reports only after
`report.validate_report` has accepted them.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from triage import policy
from triage.model import Issue, IssueRepro
from triage.report.comment import COMMENT_LIMIT, MARKER, render_comment

ACTIONS_BOT = "github-actions[bot]"  # the author of comments made with an Action's GITHUB_TOKEN
DEFAULT_API_URL = "https://api.github.com"
# OWNER/NAME as GitHub spells a repository: an owner of letters, digits, '-' (and '_' for
# managed users), a name that is not '.' or '..'. report.schema.json's issue.repo is the same.
REPO_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,99})/(?!\.\.?(?:#|$))[A-Za-z0-9_.-]{1,100}"
ISSUE_REF = re.compile(rf"^(?P<repo>{REPO_NAME})#(?P<number>[1-9][0-9]{{0,9}})$")
MAX_ISSUE_NUMBER = 2**31 - 1
# The run-name of triage-run.yml: what `triage post --run-title` reads the triggering issue from.
RUN_TITLE = re.compile(r"triage #(?P<number>[1-9][0-9]{0,9})")
T = TypeVar("T")


class PublishError(Exception):
    """Publishing did not happen, and why (refused, or GitHub kept failing)."""


class GitHubUnreachable(PublishError):
    """GitHub could not be reached, on every attempt: a network error (connection refused, a
    name that does not resolve, a timeout) or an answer from no working server (5xx).  Nothing
    about the issue or the report is wrong; the same command may work later."""


@dataclass
class GitHubOptions:
    api_url: str = DEFAULT_API_URL
    token: str | None = None
    bot_login: str | None = None  # None: the token's own user, else github-actions[bot]
    allowed_labels: frozenset[str] = frozenset(policy.LABELS.values())  # what triage itself suggests
    trigger_label: str | None = None  # must be on the issue to post; removed afterwards
    attempts: int = 5
    max_wait_s: float = 900.0  # longest rate-limit reset worth waiting for
    throttle: bool = True  # PyGithub's pause between requests (0.25 s) and writes (1 s)
    log: Callable[[str], None] = field(default=lambda message: None)


@dataclass
class PublishResult:
    action: str  # created | edited | unchanged
    comment_id: int
    comment_url: str
    labels_added: list[str]
    labels_refused: list[str]  # suggested by the report, not on the allowlist
    trigger_removed: bool
    attempts: int


def parse_issue_ref(text: str) -> tuple[str, int]:
    m = ISSUE_REF.match(text.strip())
    if not m or int(m.group("number")) > MAX_ISSUE_NUMBER:
        raise ValueError(f"'{text}' is not an issue reference; use OWNER/REPO#NUMBER")
    return m.group("repo"), int(m.group("number"))


def is_repo_name(text: Any) -> bool:
    return isinstance(text, str) and re.fullmatch(REPO_NAME, text) is not None


def issue_from_run_title(title: str) -> int:
    """The issue number in the title of the triage-run run that triggered a post
    (`github.event.workflow_run.display_title`: triage-run.yml's run-name, `triage #N`)."""
    m = RUN_TITLE.fullmatch(title)
    if not m or int(m.group("number")) > MAX_ISSUE_NUMBER:
        raise ValueError(f"the triggering run's title {title[:200]!r} is not 'triage #N': triage-run.yml must set "
                         "run-name: triage #${{ github.event.issue.number }}")
    return int(m.group("number"))


def connect(options: GitHubOptions) -> Any:
    from github import Auth, Github

    pauses = {} if options.throttle else {"seconds_between_requests": None, "seconds_between_writes": None}
    auth = Auth.Token(options.token) if options.token else None
    return Github(auth=auth, base_url=options.api_url.rstrip("/"), retry=None, timeout=30, lazy=True, **pauses)


def body_sha256(body: str | None) -> str:
    return hashlib.sha256((body or "").encode("utf-8")).hexdigest()


def issue_from_api(gh: Any, repo: str, number: int, options: GitHubOptions, extract: Callable[[str], IssueRepro]) -> Issue:
    """The issue as data, read with retries."""
    def read() -> Issue:
        issue = gh.get_repo(repo).get_issue(number)
        return Issue(repo=repo, number=number, title=issue.title or "", url=issue.html_url or "",
                     author=issue.user.login if issue.user else "", body_sha256=body_sha256(issue.body),
                     extraction=extract(issue.body or ""))
    return with_retries(read, options)


def issue_from_event(event: dict[str, Any], extract: Callable[[str], IssueRepro]) -> Issue:
    """The issue in an `issues` webhook payload ($GITHUB_EVENT_PATH): no API call, no token.
    ValueError, saying what is wrong, for anything else."""
    expected = "expected an `issues` event with issue.number and repository.full_name"
    if not isinstance(event, dict):
        raise ValueError(f"the event is a JSON {type(event).__name__}, not an object ({expected})")
    issue = event.get("issue")
    repository = event.get("repository")
    repo = repository.get("full_name") if isinstance(repository, dict) else None
    if not isinstance(issue, dict) or repo is None or "number" not in issue:
        raise ValueError(f"the event has no issue ({expected})")
    number = issue["number"]
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_ISSUE_NUMBER:
        raise ValueError(f"the event's issue.number {str(number)[:50]!r} is not an issue number")
    if not is_repo_name(repo):
        raise ValueError(f"the event's repository.full_name {str(repo)[:200]!r} is not OWNER/NAME")
    body = issue.get("body") if isinstance(issue.get("body"), str) else ""
    user = issue.get("user") if isinstance(issue.get("user"), dict) else {}
    return Issue(repo=repo, number=number, title=str(issue.get("title") or ""),
                 url=str(issue.get("html_url") or ""), author=str(user.get("login") or ""),
                 body_sha256=body_sha256(body), extraction=extract(body))


MAX_REPORT_BYTES = 64 << 20


def load_report(path: str) -> tuple[dict[str, Any], list[str]]:
    """report.json as data, and every reason it may not be posted (empty when it may). The
    file comes from a job that ran untrusted code, so nothing in it is believed before this."""
    import json

    from triage.report.data import validate_report

    try:
        size = os.path.getsize(path)
        if size > MAX_REPORT_BYTES:
            return {}, [f"{size} bytes; a report is at most {MAX_REPORT_BYTES >> 20} MiB"]
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"), parse_constant=_refuse_constant)
    except OSError as e:
        return {}, [f"cannot read it: {e.strerror or e}"]
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return {}, [f"not JSON: {e}"]
    problems = validate_report(data)
    if not problems and not data.get("issue"):
        problems = ["it names no issue (it was written by `triage run`, not `triage issue`)"]
    return data, problems


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def post_report(gh: Any, data: dict[str, Any], options: GitHubOptions,
                full_report: str = "`report.json` in the triage run's `triage-report` artifact") -> PublishResult:
    """Post (or update, or leave alone) the comment for a validated report on its issue;
    `full_report` says where the whole report is, for a comment cut to GitHub's size."""
    target = data["issue"]
    text = render_comment(data, COMMENT_LIMIT, full_report=full_report)
    bot = options.bot_login or _bot_login(gh, options)
    suggested = list(data["verdict"]["labels"])
    wanted = [label for label in suggested if label in options.allowed_labels]
    refused = [label for label in suggested if label not in options.allowed_labels]
    attempts = 0

    def publish() -> PublishResult:
        nonlocal attempts
        attempts += 1
        issue = gh.get_repo(target["repo"]).get_issue(target["number"])
        present = {label.name for label in issue.labels}
        if options.trigger_label and options.trigger_label not in present:
            raise PublishError(f"{target['repo']}#{target['number']} no longer carries the trigger label "
                               f"'{options.trigger_label}'; nothing posted")
        if body_sha256(issue.body) != target["body_sha256"]:
            raise PublishError(f"the body of {target['repo']}#{target['number']} changed after the repro was run; "
                               "nothing posted (apply the trigger label again to re-run)")
        action, comment = _upsert(issue, text, bot)
        missing = [label for label in wanted if label not in present]
        if missing:
            issue.add_to_labels(*missing)
        removed = False
        if options.trigger_label:
            removed = _remove_label(issue, options.trigger_label)
        return PublishResult(action=action, comment_id=comment.id, comment_url=comment.html_url or "",
                             labels_added=missing, labels_refused=refused, trigger_removed=removed, attempts=attempts)

    return with_retries(publish, options)


def _upsert(issue: Any, text: str, bot: str) -> tuple[str, Any]:
    mine = [c for c in issue.get_comments()
            if c.user is not None and c.user.login == bot and (c.body or "").startswith(MARKER)]
    if not mine:
        return "created", issue.create_comment(text)
    comment = mine[0]
    if (comment.body or "").split("\n", 1)[0] == text.split("\n", 1)[0]:
        return "unchanged", comment  # same digest: the same outcome, whatever the timings
    comment.edit(text)
    return "edited", comment


def _remove_label(issue: Any, name: str) -> bool:
    from github import GithubException

    try:
        issue.remove_from_labels(name)
        return True
    except GithubException as e:
        if e.status == 404:  # someone removed it already
            return False
        raise


def _bot_login(gh: Any, options: GitHubOptions) -> str:
    """The login the bot's comments carry: the token's user, or github-actions[bot] for an
    Action's installation token (which may not read /user)."""
    from github import GithubException

    if not options.token:
        raise PublishError("posting needs a token: set GITHUB_TOKEN")
    try:
        return with_retries(lambda: gh.get_user().login, options)
    except GithubException as e:
        if e.status == 401:
            raise PublishError("GitHub refused the token (401 Bad credentials)") from None
        if e.status == 403:
            return ACTIONS_BOT
        raise


def with_retries(step: Callable[[], T], options: GitHubOptions) -> T:
    """Run `step`, again after a 5xx, a network error or a rate limit: exponential backoff,
    or exactly as long as the rate limit's reset says (up to `max_wait_s`)."""
    from github import GithubException
    from requests.exceptions import ConnectionError as NetworkError
    from requests.exceptions import Timeout

    for attempt in range(1, options.attempts + 1):
        try:
            return step()
        except GithubException as e:
            wait = _retry_wait(e, attempt)
            if attempt == options.attempts and _server_failure(e):
                raise GitHubUnreachable(f"GitHub at {options.api_url} answered {e.status} to each of "
                                        f"{options.attempts} attempts") from e
            if wait is None or attempt == options.attempts:
                raise
            if wait > options.max_wait_s:
                raise PublishError(f"GitHub's rate limit resets in {wait:.0f} s, longer than the "
                                   f"{options.max_wait_s:.0f} s triage waits") from e
            options.log(f"GitHub answered {e.status}; retrying in {wait:.1f} s (attempt {attempt + 1} of {options.attempts})")
        except (NetworkError, Timeout) as e:
            if attempt == options.attempts:
                raise GitHubUnreachable(f"cannot reach GitHub at {options.api_url}: {_network_failure(e)} "
                                        f"({options.attempts} attempts)") from e
            wait = _backoff(attempt)
            options.log(f"network error ({type(e).__name__}); retrying in {wait:.1f} s")
        time.sleep(wait)
    raise AssertionError("unreachable")


def _retry_wait(e: Any, attempt: int) -> float | None:
    headers = {str(k).lower(): str(v) for k, v in (e.headers or {}).items()}
    message = str(e.data if e.data is not None else "").lower()
    limited = e.status == 429 or (e.status == 403 and (
        "retry-after" in headers or headers.get("x-ratelimit-remaining") == "0" or "rate limit" in message))
    if limited:
        if headers.get("retry-after", "").isdigit():
            return float(headers["retry-after"])
        if headers.get("x-ratelimit-reset", "").isdigit():
            return max(0.0, int(headers["x-ratelimit-reset"]) - time.time()) + 1.0
        return 60.0  # a secondary rate limit without a hint: GitHub asks for at least a minute
    if _server_failure(e):
        return _backoff(attempt)
    return None


def _network_failure(e: Exception) -> str:
    """What went wrong on the way to GitHub, in a few words: requests' own message is a
    repr-laden chain (`HTTPConnectionPool(…): Max retries exceeded … NewConnectionError(…)`)."""
    from requests.exceptions import Timeout

    text = str(e)
    if isinstance(e, Timeout) or "timed out" in text.lower():
        return "no answer in time (timeout)"
    if "NameResolutionError" in text or "Name or service not known" in text or "name resolution" in text:
        return "its host name does not resolve (DNS)"
    if "Connection refused" in text:
        return "connection refused"
    errno = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    return errno.group(1).strip() if errno else text[:300]


def _server_failure(e: Any) -> bool:
    return e.status is not None and 500 <= e.status < 600


def _backoff(attempt: int) -> float:
    return min(30.0, 0.5 * 2 ** (attempt - 1))
