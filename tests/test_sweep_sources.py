"""The sweep's sources: folders of repro scripts from the corpus, issue references and issue
searches against the local GitHub server (PyGithub over real HTTP)."""
import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ISSUES, SEEDS, run_as_nobody
from tests.github_server import Failure, FakeGitHub
from triage.github import GitHubOptions
from triage.sweep import sources
from triage.sweep.sources import MAX_SCRIPT_BYTES, items_from

REPO = "octo/demo"
NUMERICS = "module: numerical-stability"


@pytest.fixture
def corpus(tmp_path):
    """A folder like fixtures/issues: two report folders, loose scripts, and what is not read."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in ("gh-183768", "gh-100466"):
        shutil.copytree(ISSUES / name, folder / name)
    shutil.copy(SEEDS / "seeded_runs.py", folder)
    (folder / "docstring_first.py").write_text('#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n"""\n'
                                               '  Sum in float16 and float32.\n\nMore.\n"""\nimport torch\n')
    (folder / "code_first.py").write_text("import torch\nprint(torch.ones(2).sum())  # the sum\n")
    (folder / "notes.md").write_text("not a script")
    (folder / "no-repro").mkdir()
    (folder / "no-repro" / "other.py").write_text("print(1)\n")
    (folder / ".hidden").mkdir()
    (folder / ".hidden" / "repro.py").write_text("print(1)\n")
    (folder / "gh-100466" / "deeper").mkdir()
    (folder / "gh-100466" / "deeper" / "repro.py").write_text("print(1)\n")
    return folder


def test_folder_gives_report_folders_and_loose_scripts_by_relative_key(corpus):
    found = items_from([str(corpus)])
    assert found.problems == []
    assert [item.key for item in found.items] == [
        "code_first.py", "docstring_first.py", "gh-100466/repro.py", "gh-183768/repro.py", "seeded_runs.py"]
    by_key = {item.key: item for item in found.items}
    report = by_key["gh-183768/repro.py"]
    meta = json.loads((ISSUES / "gh-183768" / "meta.json").read_text())
    assert report.kind == "script" and report.title == meta["title"] and report.url == meta["source"]
    assert report.text == (ISSUES / "gh-183768" / "repro.py").read_text()
    assert report.path == os.path.realpath(corpus / "gh-183768" / "repro.py") and os.path.isabs(report.path)
    assert report.arms == () and report.issue is None
    assert by_key["seeded_runs.py"].title.startswith("From the article") and by_key["seeded_runs.py"].url is None
    assert by_key["docstring_first.py"].title == "Sum in float16 and float32."
    assert by_key["code_first.py"].title == "code_first.py"  # code comes first: no title in the file


def test_a_symlink_out_of_the_folder_is_refused_and_one_inside_it_is_followed(corpus, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("print('outside')\n")
    (outside / "repro.py").write_text("print('outside')\n")
    (corpus / "escape.py").symlink_to(outside / "secret.py")
    (corpus / "gh-escape").symlink_to(outside, target_is_directory=True)
    (corpus / "alias.py").symlink_to(corpus / "seeded_runs.py")
    found = items_from([str(corpus)])
    assert sorted(found.problems) == [
        f"{corpus}/escape.py: a symlink to {outside}/secret.py, outside the swept folder; not followed",
        f"{corpus}/gh-escape/repro.py: a symlink to {outside}/repro.py, outside the swept folder; not followed"]
    keys = [item.key for item in found.items]
    assert "escape.py" not in keys and "gh-escape/repro.py" not in keys
    alias = next(item for item in found.items if item.key == "alias.py")
    assert alias.path == os.path.realpath(corpus / "seeded_runs.py")
    assert all("outside" not in item.text for item in found.items)


def test_unusable_files_each_give_one_problem_and_the_rest_come_back(corpus):
    (corpus / "big.py").write_text("#" * (MAX_SCRIPT_BYTES + 1))
    (corpus / "latin1.py").write_bytes(b"# caf\xe9\nprint(1)\n")
    os.mkfifo(corpus / "pipe.py")  # opening it would block the sweep
    (corpus / "gh-100466" / "meta.json").write_text("{not json")
    found = items_from([str(corpus)])
    assert sorted(found.problems) == [
        f"{corpus}/big.py: {MAX_SCRIPT_BYTES + 1} bytes; at most {MAX_SCRIPT_BYTES} are read",
        f"{corpus}/gh-100466/meta.json: not JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)); the title is taken from the script",
        f"{corpus}/latin1.py: not UTF-8 (byte 0xe9 at offset 5)",
        f"{corpus}/pipe.py: not a regular file"]
    keys = [item.key for item in found.items]
    assert len(keys) == 5 and "gh-100466/repro.py" in keys
    assert next(item for item in found.items if item.key == "gh-100466/repro.py").url is None


def test_an_unreadable_script_is_a_problem(request):
    # Root reads a file whatever its mode: as root, the sweep's sources are read as uid 65534,
    # with an interpreter that uid can reach (conftest's `nobody_python`).
    import subprocess
    import sys
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="triage-sources-"))
    try:
        folder.chmod(0o755)
        (folder / "readable.py").write_text("print(1)\n")
        locked = folder / "locked.py"
        locked.write_text("print(2)\n")
        locked.chmod(0)
        code = ("import json, sys\nfrom triage.sweep.sources import items_from\n"
                "found = items_from([sys.argv[1]])\n"
                "print(json.dumps([[i.key for i in found.items], found.problems]))\n")
        if os.geteuid() == 0:
            nobody = request.getfixturevalue("nobody_python")
            done = run_as_nobody([nobody.python, "-c", code, str(folder)], nobody.environment(dict(os.environ)),
                                 capture_output=True, text=True, timeout=120, cwd="/")
        else:
            done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True,
                                  timeout=120, cwd="/",
                                  env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)))
        assert done.returncode == 0, done.stderr[-2000:]
        keys, problems = json.loads(done.stdout)
        assert keys == ["readable.py"]
        assert problems == [f"{locked}: cannot read it: Permission denied"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_sources_that_are_not_folders_are_refused_without_searching(tmp_path):
    (tmp_path / "empty").mkdir()
    found = items_from([str(tmp_path / "empty"), str(tmp_path / "missing"), "./typo/", str(SEEDS / "seeded_runs.py"),
                        " "],
                       GitHubOptions(api_url="http://127.0.0.1:9/api/v3", attempts=1))
    assert found.items == []
    assert found.problems == [
        f"{tmp_path}/empty: no repro scripts (looked for {tmp_path}/empty/*.py and {tmp_path}/empty/*/repro.py)",
        f"{tmp_path}/missing: no such file or folder",
        "./typo/: no such file or folder",
        f"{SEEDS}/seeded_runs.py: not a folder; give the folder that holds it, OWNER/REPO#N or a search query",
        "' ': an empty source"]


def test_the_same_key_twice_is_kept_once_and_a_different_script_under_it_is_reported(corpus, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "seeded_runs.py").write_text("print('a different script')\n")
    found = items_from([str(corpus), str(corpus) + "/", str(other)])
    assert len(found.items) == len({item.key for item in found.items}) == 5
    assert next(item for item in found.items if item.key == "seeded_runs.py").text == (SEEDS / "seeded_runs.py").read_text()
    assert found.problems == [f"{other}/seeded_runs.py: the key seeded_runs.py is already taken by a different item "
                              "from an earlier source; skipped (sweep the two folders separately)"]


# -- GitHub ----------------------------------------------------------------------------------

@pytest.fixture
def github():
    server = FakeGitHub().start()
    yield server
    server.stop()


def _options(github):
    return GitHubOptions(api_url=github.api_url, throttle=False)


def _issue_reads(github):
    return [r for r in github.requests if r[1].startswith("/repos/")]


def _searches(github):
    return [r for r in github.requests if r[1] == "/search/issues"]


def test_issue_references_are_read_through_the_api(github):
    github.add_issue(REPO, 1, "```python\nimport torch\n```", labels=[NUMERICS], title="sum differs")
    github.add_issue(REPO, 2, "second", state="closed")
    github.add_issue("octo/other", 3, None)
    found = items_from(["octo/demo#1, octo/demo#2", "octo/other#3"], _options(github))
    assert found.problems == []
    first, second, third = found.items
    assert first.key == "octo/demo#1" and first.kind == "issue" and first.title == "sum differs"
    assert first.text == "```python\nimport torch\n```" and first.url == "https://github.example/octo/demo/issues/1"
    assert first.issue == {"repo": REPO, "number": 1, "title": "sum differs", "url": first.url, "author": "reporter",
                           "labels": [NUMERICS], "state": "open"}
    assert second.issue["state"] == "closed" and third.key == "octo/other#3" and third.text == ""
    assert len(_issue_reads(github)) == 3  # one read per issue


def test_a_missing_issue_a_pull_request_and_a_malformed_reference_are_problems(github):
    github.add_issue(REPO, 1, "body")
    github.add_issue(REPO, 5, "a fix", pull_request=True)
    found = items_from(["octo/demo#99 octo/demo#5 octo/demo#x octo/demo#1"], _options(github))
    assert [item.key for item in found.items] == ["octo/demo#1"]
    assert found.problems == [
        "octo/demo#99: not found (404: Not Found)",
        "octo/demo#5: a pull request, not an issue; the sweep triages issues",
        "'octo/demo#x' is not an issue reference; use OWNER/REPO#NUMBER"]


def test_an_issue_whose_text_is_not_unicode_is_a_problem_not_an_item(github):
    """JSON's "\\ud800" escape decodes to a lone surrogate: no UTF-8 text to hash, store or run."""
    github.add_issue(REPO, 1, "```python\nx = 1  # \ud800\n```", labels=[NUMERICS])
    github.add_issue(REPO, 2, "fine", labels=[NUMERICS], title="odd \udfff title")
    github.add_issue(REPO, 3, "fine too", labels=[NUMERICS])
    expected = ["octo/demo#1: the issue body is not valid Unicode (a lone surrogate, U+D800, at character 19); skipped",
                "octo/demo#2: the issue title is not valid Unicode (a lone surrogate, U+DFFF, at character 4); skipped"]
    by_reference = items_from(["octo/demo#1,octo/demo#2,octo/demo#3"], _options(github))
    assert [i.key for i in by_reference.items] == ["octo/demo#3"] and by_reference.problems == expected
    searched = items_from([f'repo:{REPO} label:"{NUMERICS}"'], _options(github))
    assert [i.key for i in searched.items] == ["octo/demo#3"] and searched.problems == expected


def test_search_ands_labels_with_spaces_takes_open_issues_and_never_pull_requests(github):
    github.add_issue(REPO, 1, "matmul differs", labels=[NUMERICS, "module: cuda"], title="one")
    github.add_issue(REPO, 2, "closed one", labels=[NUMERICS, "module: cuda"], state="closed")
    github.add_issue(REPO, 3, "only one label", labels=[NUMERICS])
    github.add_issue(REPO, 4, "a pull request", labels=[NUMERICS, "module: cuda"], pull_request=True)
    github.add_issue(REPO, 5, "MATMUL again", labels=[NUMERICS, "module: cuda"], title="five")
    github.add_issue("octo/other", 6, "matmul elsewhere", labels=[NUMERICS, "module: cuda"])
    query = f'repo:{REPO} is:open label:"{NUMERICS}" label:"module: cuda" matmul'
    found = items_from([query], _options(github))
    assert found.problems == []
    assert [item.key for item in found.items] == ["octo/demo#1", "octo/demo#5"]
    assert found.items[1].issue == {"repo": REPO, "number": 5, "title": "five", "url": found.items[1].url,
                                    "author": "reporter", "labels": [NUMERICS, "module: cuda"], "state": "open"}
    assert found.items[1].text == "MATMUL again"
    assert _issue_reads(github) == []  # the search result carries the body: no issue read again


def test_a_query_for_pull_requests_only_gives_a_problem(github):
    github.add_issue(REPO, 4, "a pull request", pull_request=True)
    found = items_from([f"repo:{REPO} is:pr"], _options(github))
    assert found.items == []
    assert found.problems == [f"search 'repo:{REPO} is:pr': no issues found (1 pull requests skipped: "
                              "the sweep triages issues)"]


def test_search_pages_through_every_result_in_order(github, monkeypatch):
    monkeypatch.setattr(sources, "SEARCH_PAGE_SIZE", 30)  # GitHub's default page: 3 pages for 75
    for number in range(1, 76):
        github.add_issue(REPO, number, f"body {number}", labels=[NUMERICS])
    found = items_from([f'repo:{REPO} label:"{NUMERICS}"'], _options(github))
    assert found.problems == []
    assert [item.issue["number"] for item in found.items] == list(range(1, 76))
    assert len(_searches(github)) == 3 and _issue_reads(github) == []


def test_a_failed_page_is_retried_alone(github, monkeypatch):
    monkeypatch.setattr(sources, "SEARCH_PAGE_SIZE", 30)
    for number in range(1, 76):
        github.add_issue(REPO, number, f"body {number}")
    answered = github.search

    def fail_the_next_page(q):
        if len(_searches(github)) == 1:  # serving page 2: page 3 fails once
            github.failures.append(Failure("GET", "/search/issues", 502))
        return answered(q)

    github.search = fail_the_next_page
    found = items_from([f"repo:{REPO}"], _options(github))
    assert [item.issue["number"] for item in found.items] == list(range(1, 76))
    assert [status for _, _, status in _searches(github)] == [200, 200, 502, 200]


def test_limit_caps_each_search(github, monkeypatch):
    monkeypatch.setattr(sources, "SEARCH_PAGE_SIZE", 30)
    for number in range(1, 76):
        github.add_issue(REPO, number, f"body {number}")
    github.add_issue("octo/other", 1, "other")
    found = items_from([f"repo:{REPO}", "repo:octo/other"], _options(github), limit=40)
    assert [item.key for item in found.items] == [f"{REPO}#{n}" for n in range(1, 41)] + ["octo/other#1"]
    assert len(_searches(github)) == 3  # two pages for the first search, one for the second
    assert [item.key for item in items_from([f"repo:{REPO}"], _options(github), limit=3).items] == [
        f"{REPO}#1", f"{REPO}#2", f"{REPO}#3"]


def test_search_past_githubs_1000_results_says_so(github):
    for number in range(1, 1006):
        github.add_issue(REPO, number, "body")
    found = items_from([f"repo:{REPO}"], _options(github))
    assert len(found.items) == 1000 and len(_searches(github)) == 10
    assert found.problems == [f"search 'repo:{REPO}': 1005 results, and GitHub's search serves only the first 1000; "
                              "narrow the query (e.g. with created:<DATE and created:>=DATE)"]


def test_a_refused_query_and_a_missing_issue_leave_the_rest(github, corpus):
    github.add_issue(REPO, 1, "body one")
    github.add_issue(REPO, 2, "body two")
    found = items_from([f"{REPO}#1", "repo:nobody/nothing is:open", f"{REPO}#404", f"repo:{REPO} body", str(corpus)],
                       _options(github))
    assert [item.key for item in found.items][:2] == [f"{REPO}#1", f"{REPO}#2"]  # #1 once, then #2 from the search
    assert len(found.items) == 2 + 5
    assert found.problems == [
        "search 'repo:nobody/nothing is:open': GitHub refused the query (422: Validation Failed; The listed users "
        "and repositories cannot be searched either because the resources do not exist or you do not have "
        "permission to view them.)",
        f"{REPO}#404: not found (404: Not Found)"]
    assert not found.github_unreachable  # GitHub answered, if not as hoped


def test_an_unreachable_github_is_a_problem_per_source_and_said_so(corpus):
    stopped = FakeGitHub().start()
    stopped.stop()  # its port now refuses connections
    found = items_from([f"{REPO}#1", f"repo:{REPO}", str(corpus)],
                       GitHubOptions(api_url=stopped.api_url, throttle=False, attempts=2))
    assert len(found.items) == 5  # the folder's items still come back
    reason = f"cannot reach GitHub at {stopped.api_url}: connection refused (2 attempts)"
    assert found.problems == [f"{REPO}#1: {reason}", f"search 'repo:{REPO}': {reason}"]
    assert found.github_unreachable


def test_a_search_with_no_result_is_a_problem(github):
    github.add_issue(REPO, 1, "body")
    found = items_from([f"repo:{REPO} is:closed"], _options(github))
    assert found.items == [] and found.problems == [f"search 'repo:{REPO} is:closed': no issues found"]


# -- the test server's search, as PyGithub and GitHub's clients see it ----------------------

def test_server_search_links_pages_as_github_does(github):
    for number in range(1, 76):
        github.add_issue(REPO, number, "body")
    with urllib.request.urlopen(f"{github.api_url}/search/issues?q=repo%3Aocto%2Fdemo+is%3Aissue&page=2") as answer:
        link, data = answer.headers["Link"], json.load(answer)
    page = f"{github.api_url}/search/issues?q=repo%3Aocto%2Fdemo+is%3Aissue&page="
    assert link == (f'<{page}1>; rel="prev", <{page}3>; rel="next", <{page}3>; rel="last", <{page}1>; rel="first"')
    assert data["total_count"] == 75 and data["incomplete_results"] is False
    assert [item["number"] for item in data["items"]] == list(range(31, 61))


def test_server_search_serves_pygithubs_own_pagination(github):
    from triage.github import connect

    for number in range(1, 76):
        github.add_issue(REPO, number, "body", state="closed" if number % 2 else "open")
    results = connect(_options(github)).search_issues(f"repo:{REPO} state:closed")
    assert [issue.number for issue in results] == list(range(1, 76, 2)) and results.totalCount == 38


@pytest.mark.parametrize("query", ['label:"unclosed', "", "author:someone"])
def test_server_refuses_a_malformed_query_with_422(github, query):
    github.add_issue(REPO, 1, "body")
    url = f"{github.api_url}/search/issues?" + urllib.parse.urlencode({"q": query})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url)
    assert refused.value.code == 422
