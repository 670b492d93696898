"""The hostile-input cases of the posting and rendering side, each named after its number in
the hostile-input test's table (S1, S9, S10, R5, R9): where a report may be posted, what the
schema admits, what the renderer does with hostile strings and numbers, and what reaches a
terminal."""
import json
import os
import re
import subprocess
import sys
import time
import unicodedata

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import FIXTURES, ROOT
from tests.github_server import FakeGitHub
from triage import __version__, cli
from triage.classify.ladder import classify
from triage.extract import extract_issue_body
from triage.github import body_sha256, issue_from_event, issue_from_run_title
from triage.model import ArmRun, Comparison, Divergence, Issue, LocalizedOp, Report, Repro, Side, Verdict
from triage.report.comment import render_comment
from triage.report.data import report_json, validate_report
from triage.report.markdown import md, visible
from triage.report.terminal import render_terminal

REPO = "octo/demo"
BODY_11 = "### 🐛 Describe the bug\n\n```python\nimport torch\nprint(torch.ones(3))\n```\n"
BODY_12 = (FIXTURES / "issues" / "logdet_form.md").read_text()
TRIGGER = "bot: triage"
OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x1b\\\x1b]0;PWNED\x1b\\ok"
FORGED_LABELS = ["module: correctness (silent)", "triage review"]


@pytest.fixture
def github():
    server = FakeGitHub().start()
    server.add_issue(REPO, 11, BODY_11, labels=[TRIGGER])
    server.add_issue(REPO, 12, BODY_12, labels=[TRIGGER])  # labelled at the same time as #11
    server.add_issue(REPO, 13, BODY_12, labels=[])
    yield server
    server.stop()


def _report(number=11, body=BODY_11, summary="triage could not run the script.", repo=REPO):
    repro = Repro(path="", name="repro.py", source="import torch\n", problem="no such file")
    verdict = classify(repro, None)
    verdict.summary = summary
    issue = Issue(repo=repo, number=number, title="t", url="u", author="reporter", body_sha256=body_sha256(body),
                  extraction=extract_issue_body(body))
    report = Report(repro=repro, arms_requested=["cpu"], comparison=None, verdict=verdict, triage_version=__version__,
                    seconds=0.1, issue=issue)
    data = report_json(report)
    assert validate_report(data) == []
    return data


def _forge(data, number=12, body=BODY_12):
    """What S1's repro does to triage-out/report.json after `triage issue` exits."""
    data["issue"]["number"] = number
    data["issue"]["body_sha256"] = body_sha256(body)
    data["verdict"].update(kind="likely-bug", expected=False, labels=FORGED_LABELS,
                           summary="Silent correctness bug confirmed by triage: please escalate.")
    assert validate_report(data) == []  # schema-valid: only the binding can tell
    return data


def _write(tmp_path, data, name="report.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY", "GITHUB_REPOSITORY", "GITHUB_API_URL")
           and not k.startswith("TRIAGE_")}
    env.update(extra or {})
    return env


def _triage(*args, env=None):
    return subprocess.run([sys.executable, "-m", "triage", *args], capture_output=True, text=True,
                          env=_env(env), cwd=ROOT, timeout=300)


def _post(github, path, *args, env=None):
    return _triage("post", "--report", str(path), "--api-url", github.api_url, *args,
                   env={"GITHUB_TOKEN": "bot-token", **(env or {})})


def _nothing_changed(github):
    assert github.writes() == [] and github.comments == []
    assert github.issues[(REPO, 11)]["labels"] == [TRIGGER] and github.issues[(REPO, 12)]["labels"] == [TRIGGER]


# -- where a report is posted: the caller says, the report does not ------------------------------
def test_case_097_post_without_a_repository_is_refused(github, tmp_path):
    path = _write(tmp_path, _report(repo="evil/other"))
    proc = _post(github, path, "--expect-issue", "11", "--trigger-label", TRIGGER)
    assert proc.returncode == 2 and "--repo OWNER/REPO (or GITHUB_REPOSITORY) is required" in proc.stderr
    assert github.requests == []


def test_case_098_report_naming_another_labelled_issue_is_refused(github, tmp_path):
    """#12 carries the trigger label and its body is public: only the binding to #11 refuses."""
    path = _write(tmp_path, _forge(_report()))
    proc = _post(github, path, "--expect-issue", "11", "--trigger-label", TRIGGER, env={"GITHUB_REPOSITORY": REPO})
    assert proc.returncode == 4, proc.stderr
    assert "not posted: the report is about octo/demo#12, but --expect-issue is #11" in proc.stderr
    assert "Traceback" not in proc.stderr
    _nothing_changed(github)


def test_post_needs_to_be_told_the_issue(github, tmp_path):
    path = _write(tmp_path, _report())
    proc = _post(github, path, "--repo", REPO, "--trigger-label", TRIGGER)
    assert proc.returncode == 2 and "exactly one of --expect-issue N and --run-title" in proc.stderr
    assert github.requests == []


def test_case_100_post_without_a_trigger_label_is_refused_unless_opted_out(github, tmp_path):
    path = _write(tmp_path, _report(number=13, body=BODY_12))
    proc = _post(github, path, "--repo", REPO, "--expect-issue", "13")
    assert proc.returncode == 2 and "--trigger-label LABEL" in proc.stderr and "--no-trigger-label" in proc.stderr
    assert github.requests == []
    proc = _post(github, path, "--repo", REPO, "--expect-issue", "13", "--trigger-label", TRIGGER, "--no-trigger-label")
    assert proc.returncode == 2 and "contradict" in proc.stderr
    assert github.requests == []


@pytest.mark.slow
def test_case_100_the_explicit_opt_out_posts_on_an_unlabelled_issue(github, tmp_path):
    path = _write(tmp_path, _report(number=13, body=BODY_12))
    proc = _post(github, path, "--repo", REPO, "--expect-issue", "13", "--no-trigger-label")
    assert proc.returncode == 0, proc.stderr
    assert [c["number"] for c in github.comments] == [13]


@pytest.mark.parametrize("title", ["triage #", "triage #0", "triage #12 ", "numbers differ", "triage #1e3",
                                   "triage #99999999999", "Triage #12"])
def test_a_run_title_that_is_not_triage_n_is_refused(github, tmp_path, title):
    path = _write(tmp_path, _report())
    proc = _post(github, path, "--repo", REPO, "--trigger-label", TRIGGER, env={"TRIAGE_RUN_TITLE": title})
    assert proc.returncode == 4 and "is not 'triage #N'" in proc.stderr and "run-name" in proc.stderr
    assert github.requests == []


def test_run_title_names_the_issue():
    assert issue_from_run_title("triage #11") == 11
    with pytest.raises(ValueError, match="is not 'triage #N'"):
        issue_from_run_title("triage #11\n")


# -- case 116, end to end: the Action's post job, as action.yml and the workflows define it ------
WORKFLOWS = ROOT / ".github" / "workflows"
EXPRESSION = re.compile(r"\$\{\{\s*(.+?)\s*\}\}")


def _evaluate(text, context):
    """`${{ … }}` in a workflow value, from `context` (every expression used must be known)."""
    return EXPRESSION.sub(lambda m: str(context[m.group(1)]), str(text))


def _run_post_job(tmp_path, api_url, report, issue_number):
    """The post job of triage-post.yml for a triage-run run triggered by `issue_number`: the
    run's title rendered from triage-run.yml's run-name, the `uses: ./` step's inputs, and
    action.yml's post step (its env and its `run:` line, in bash) with the artifact's report."""
    run_name = yaml.safe_load((WORKFLOWS / "triage-run.yml").read_text())["run-name"]
    display_title = _evaluate(run_name, {"github.event.issue.number": issue_number})
    runner_temp = tmp_path / "runner"
    (runner_temp / "triage-in").mkdir(parents=True, exist_ok=True)
    (runner_temp / "triage-in" / "report.json").write_text(json.dumps(report))
    venv_bin = runner_temp / "triage-venv" / "bin"
    venv_bin.mkdir(parents=True, exist_ok=True)
    (venv_bin / "triage").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m triage "$@"\n')
    (venv_bin / "triage").chmod(0o755)
    github_context = {"github.event.workflow_run.display_title": display_title, "runner.temp": runner_temp,
                      "github.token": "bot-token"}
    [job] = yaml.safe_load((WORKFLOWS / "triage-post.yml").read_text())["jobs"].values()
    [step] = [s for s in job["steps"] if s.get("uses") == "./"]
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    inputs = {f"inputs.{k}": v.get("default", "") for k, v in action["inputs"].items()}
    inputs.update({f"inputs.{k}": _evaluate(v, github_context) for k, v in step["with"].items()})
    [post] = [s for s in action["runs"]["steps"] if s.get("if") == "inputs.command == 'post'"]
    env = {k: _evaluate(v, inputs) for k, v in post["env"].items()}
    env.update(RUNNER_TEMP=str(runner_temp), GITHUB_REPOSITORY=REPO, GITHUB_API_URL=api_url)
    return subprocess.run(["bash", "-c", post["run"]], capture_output=True, text=True, env=_env(env), cwd=ROOT,
                          timeout=300)


def test_case_116_report_rewritten_to_another_labelled_issue_is_refused_by_the_run_title(github, tmp_path):
    forged = _forge(_report(number=11, body=BODY_11))
    proc = _run_post_job(tmp_path, github.api_url, forged, issue_number=11)
    assert proc.returncode == 4, proc.stderr
    assert "the report is about octo/demo#12, but the issue whose run triggered this post is #11" in proc.stderr
    _nothing_changed(github)  # no comment, no label added, #12 keeps its trigger label


@pytest.mark.slow
def test_case_116_each_issues_genuine_report_still_posts_on_its_own_issue(github, tmp_path):
    proc = _run_post_job(tmp_path, github.api_url, _forge(_report(number=11, body=BODY_11)), issue_number=11)
    assert proc.returncode == 4, proc.stderr
    for number, body in ((12, BODY_12), (11, BODY_11)):
        proc = _run_post_job(tmp_path, github.api_url, _report(number=number, body=body), issue_number=number)
        assert proc.returncode == 0, proc.stderr
    assert sorted(c["number"] for c in github.comments) == [11, 12]
    assert all("likely-bug" not in c["body"] for c in github.comments)
    for number in (11, 12):
        labels = github.issues[(REPO, number)]["labels"]
        assert TRIGGER not in labels and not set(FORGED_LABELS) & set(labels)


def test_post_job_without_a_run_title_posts_nothing(github, tmp_path):
    """A workflow that forgot to pass run-title: the Action's post step refuses, it does not
    fall back to the report's issue."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    [post] = [s for s in action["runs"]["steps"] if s.get("if") == "inputs.command == 'post'"]
    assert post["env"]["TRIAGE_RUN_TITLE"] == "${{ inputs.run-title }}"
    assert action["inputs"]["run-title"]["default"] == ""
    path = _write(tmp_path, _report())
    proc = _post(github, path, env={"GITHUB_REPOSITORY": REPO, "TRIAGE_TRIGGER_LABEL": TRIGGER, "TRIAGE_RUN_TITLE": ""})
    assert proc.returncode == 2 and "--run-title" in proc.stderr
    assert github.requests == []


# -- the schema: what a report may contain ----------------------------------------------------
def _full_report():
    """A report from every part of the pipeline's model: arms, observables, a divergence."""
    side = Side(arm="cpu", observable=0, label="y", line=3, dtype="float32", summary="[1] float32[1]",
                max_abs_error=1.0, max_rel_error=1.0, max_ulps=float("inf"), rmse=1.0, kind="call")
    divergence = Divergence(source="arms", observable_label="y", line=3, a=side, b=None, dtype="float32",
                            bitwise_equal=False, within_tolerance=False, rtol=1e-5, atol=1e-8, max_abs_diff=1.0,
                            nonfinite_mismatch=0, numel=1)
    run = ArmRun(spec="cpu", device="cpu", mode="eager", status="raised", elapsed_s=0.5,
                 exception={"type": "RuntimeError", "qualified_type": "builtins.RuntimeError", "message": "m",
                            "traceback": "t", "line": 3, "claim": False},
                 graph={"nodes": 1, "leaves": 0, "compiled_graphs": 0, "stopped": None, "dtypes": ["float32"]},
                 reference={"status": "complete", "seconds": 0.1, "note": None, "approximate_ops": []},
                 leaves=[{"index": 0, "node": "n0", "kind": "random", "op": "randn", "line": 2, "call_line": 2,
                          "fingerprint": None, "seed": {"line": 1, "value": 0, "draws": 1}}],
                 conditioning=[{"op": "linalg_solve", "cond": 1e3, "shape": [2, 2], "dtype": "float32", "node": "n1",
                               "line": 4}])
    comparison = Comparison(arms=[run], aligned=0, alignment_note=None, leaves_identical=None, leaves_note=None,
                            divergence=divergence, divergences=1, claims=[], conditioning=[])
    repro = Repro(path="x.py", name="x.py", source="import torch\n")
    verdict = Verdict(kind="likely-bug", expected=False, policy_section="s", policy_url="", labels=[], summary="s")
    data = report_json(Report(repro=repro, arms_requested=["cpu"], comparison=comparison, verdict=verdict,
                              triage_version=__version__, seconds=1.0))
    assert validate_report(data) == []
    return data


@pytest.mark.parametrize("where", ["comparison", "comparison/divergence", "comparison/divergence/a",
                                   "arms/0/exception", "arms/0/graph", "arms/0/reference", "arms/0/leaves/0",
                                   "arms/0/leaves/0/seed", "arms/0/conditioning/0"])
def test_case_105_unknown_fields_are_refused_at_every_level(where):
    data = _full_report()
    target = data
    for key in where.split("/"):
        target = target[int(key)] if key.isdigit() else target[key]
    target["planted"] = {"nested": "anything"}
    problems = validate_report(data)
    assert problems and any(p.startswith(where) for p in problems), problems


def test_case_106_arbitrary_objects_in_observables_are_refused():
    data = _full_report()
    data["observables"] = [{"anything": i} for i in range(1000)]
    assert any("Additional properties" in p or "required" in p for p in validate_report(data))


@pytest.mark.parametrize("number, message", [(7.0, "is not of type 'integer'"), (True, "is not of type 'integer'"),
                                             (0, "less than the minimum"), (2**31, "greater than the maximum")])
def test_case_102_issue_number_must_be_a_positive_integer(github, tmp_path, number, message):
    data = _report()
    data["issue"]["number"] = number
    assert any(message in p for p in validate_report(data))
    proc = _post(github, _write(tmp_path, data), "--repo", REPO, "--expect-issue", "11", "--no-trigger-label")
    assert proc.returncode == 2 and "issue/number" in proc.stderr and "Traceback" not in proc.stderr
    assert github.requests == []


@pytest.mark.parametrize("repo", ["../..", "a/..", "evil/other/extra", "-x/y", "x/y#1", "x"])
def test_case_094_report_repository_must_be_owner_slash_name(repo):
    data = _report()
    data["issue"]["repo"] = repo
    assert any(p.startswith("issue/repo") for p in validate_report(data))


def test_case_112_infinite_numbers_are_refused(github, tmp_path):
    text = json.dumps(_report()).replace('"seconds": 0.1', '"seconds": 1e400')
    path = tmp_path / "report.json"
    path.write_text(text)
    proc = _post(github, path, "--repo", REPO, "--expect-issue", "11", "--no-trigger-label")
    assert proc.returncode == 2 and "seconds" in proc.stderr
    assert github.requests == []


@pytest.mark.slow
@pytest.mark.parametrize("script, arms", [
    ("matmul_chain.py", "cpu,cpu/fault=mm"),  # minimized: the float64 upcast ablations, localization
    ("hilbert_solve.py", "cpu,cpu/fault=linalg_solve_ex"),  # conditioning notes
    ("training_loop_reference.py", "cpu"),  # module calls and their settings
    ("seeds/batchnorm_train_mode.py", "cpu"),  # train-mode layers, claims
])
def test_every_report_triage_writes_is_one_it_will_post(triage, script, arms):
    """The closed schema describes what the pipeline really writes."""
    _, report, _, out = triage(FIXTURES / script, arms)
    assert report is not None, out
    assert validate_report(report) == []


# -- the event file ---------------------------------------------------------------------------
@pytest.mark.parametrize("event, message", [
    ([1, 2, 3], "is a JSON list, not an object"),
    ("issue", "is a JSON str, not an object"),
    ({"issue": {"number": -5}, "repository": {"full_name": REPO}}, "'-5' is not an issue number"),
    ({"issue": {"number": True}, "repository": {"full_name": REPO}}, "'True' is not an issue number"),
    ({"issue": {"number": 7.0}, "repository": {"full_name": REPO}}, "'7.0' is not an issue number"),
    ({"issue": {"number": 7}, "repository": {"full_name": "../.."}}, "'../..' is not OWNER/NAME"),
    ({"issue": {"number": 7}, "repository": "octo/demo"}, "has no issue"),
])
def test_case_092_094_bad_events_are_clear_errors(event, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        issue_from_event(event, extract_issue_body)


def test_case_092_event_that_is_a_json_list_is_a_usage_error(tmp_path):
    event = tmp_path / "event.json"
    event.write_text("[1, 2, 3]")
    proc = _triage("extract", "--event", str(event), "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "is a JSON list, not an object" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the renderer: numbers, hostile strings, linear time ----------------------------------------
def test_case_071_110_nonfinite_and_huge_figures_render(github, tmp_path):
    data = _report()
    data["comparison"] = {"divergence": {"observable_label": "y", "a": {
        "arm": "cpu", "summary": "[1] float64[1]", "max_rel_error": 1e308, "max_ulps": "inf"}}}
    data["arms"] = [{"spec": "cpu", "status": "ok", "elapsed_s": "inf"}]
    data["localization"] = [{"op": "aten.mul", "role": "introduced", "line": 5,
                             "local": {"kind": "mismatch", "max_ulps": "inf", "max_abs": "nan"},
                             "end_to_end": {"kind": "mismatch", "max_ulps": 1.7976931348623157e308, "max_abs": 1e-300}}]
    assert validate_report(data) == []
    text = render_comment(data)
    assert "rel 1e+308, inf ulp" in text and "mismatch: inf ulp, abs nan" in text and "1.8e+308 ulp" in text
    proc = _post(github, _write(tmp_path, data), "--repo", REPO, "--expect-issue", "11", "--no-trigger-label")
    assert proc.returncode == 0, proc.stderr
    assert "inf ulp" in github.comments[0]["body"]


def test_case_071_terminal_view_of_an_infinite_local_error(capsys):
    from rich.console import Console

    repro = Repro(path="x.py", name="x.py", source="import torch\n")
    verdict = Verdict(kind="likely-bug", expected=False, policy_section="s", policy_url="", labels=[], summary="s")
    op = LocalizedOp(node="mul", op="aten.mul", line=5, role="introduced", first=True,
                     end_to_end={"kind": "mismatch", "max_ulps": float("inf"), "max_abs": 1.0},
                     local={"kind": "mismatch", "max_ulps": float("inf"), "max_abs": float("nan")})
    report = Report(repro=repro, arms_requested=["cpu"], comparison=None, verdict=verdict, triage_version="t",
                    seconds=1.0, localization=[op])
    render_terminal(report_json(report), Console(width=200))
    assert "mismatch: inf ulp, abs nan" in capsys.readouterr().out


def test_case_109_bidi_controls_and_commit_hashes_are_inert():
    sha = "9fceb02d0ae598e95dc970b74767f19372d61af8"
    data = _report(summary=f"file\u202eexe.py rewritten \u2066by\u2069 {sha} and 1.2345678e-07 or 12345678")
    data["notes"] = [f"short {sha[:7]}; zero\u200bwidth"]
    data["repro"]["source"] = "x = 1  # \u202e evil\n"
    text = render_comment(data)
    assert not re.search("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]", text)
    assert "\\\\u202e" in text.split("<details>")[0]  # shown as an escape in prose (backslash escaped)
    assert "x = 1  # \\u202e evil" in text  # and in a code fence
    assert f"<code>{sha}</code>" in text and f"<code>{sha[:7]}</code>" in text
    assert "1.2345678e-07" in text and "<code>12345678</code>" not in text  # numbers stay numbers
    assert "zero\\\\u200bwidth" in text


def test_s9_control_characters_never_reach_the_comment():
    data = _report(summary=f"raised: {OSC52}")
    data["arms"] = [{"spec": "cpu", "status": "raised", "failure": f"RuntimeError: {OSC52}",
                     "stdout": f"tensor([2., 2., 2.])\n{OSC52}\r\nbell\x07 del\x7f c1\x9b2J\n",
                     "exception": {"type": "RuntimeError", "message": OSC52, "traceback": f"RuntimeError: {OSC52}"}}]
    data["notes"] = [f"lone surrogate \ud800 {OSC52}"]
    assert validate_report(data) == []
    text = render_comment(data)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]", text)
    assert "\\x1b]52;c;ZWNobyBwd25lZA==\\x1b\\" in text  # in a code fence, exactly as printed
    assert "bell\\x07 del\\x7f c1\\x9b2J" in text


def test_visible_escapes_every_control_and_invisible_format_character():
    acting = [chr(c) for c in range(sys.maxunicode + 1)
              if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp", "Cs") and chr(c) not in "\t\n"]
    shown = visible("".join(acting))
    assert shown.isascii() and shown.isprintable()
    assert visible("tab\tand\nnewline, CRLF\r\n, é 中 🙂") == "tab\tand\nnewline, CRLF\n, é 中 🙂"
    # Hostile-4 041: the characters that are not Cf but draw nothing (Unicode's default
    # ignorables, the Hangul fillers, the Braille blank), variation selectors among them.
    ignorable = ("\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u2800\u3164\uffa0"
                 + "".join(map(chr, range(0xFE00, 0xFE10))) + "".join(map(chr, range(0xE0100, 0xE01F0))))
    shown = visible(ignorable)
    assert shown.isascii() and shown.count("\\") == len(ignorable)


def _hostile_report():
    """Schema-valid and about 1 MB, nearly all of it whitespace runs in the prose fields."""
    data = _report(summary="\t" * 19_990 + " `x` ok")
    data["verdict"]["evidence"] = [" " * 3_990 + f"item {i}" for i in range(50)]
    data["notes"] = [" " * 4_990 + f"\n\t note {i}" for i in range(100)]
    data["arms"] = [{"spec": f"cpu/threads={i}", "status": "crashed", "failure": "\t \n" * 1_333,
                     "stdout": " \t" * 20_000} for i in range(1, 6)]
    assert validate_report(data) == []
    assert len(json.dumps(data)) > 900_000
    return data


def test_case_111_r9_a_megabyte_of_whitespace_renders_in_linear_time():
    start = time.monotonic()
    md("\t" * 20_000 + "x")
    md(" \n" * 10_000 + "x")
    assert time.monotonic() - start < 0.5
    data = _hostile_report()
    start = time.monotonic()
    text = render_comment(data)
    assert time.monotonic() - start < 5.0
    assert "<code>x</code> ok" in text and "item 49" in text


@pytest.mark.parametrize("text", [
    "".join("`" * n + "a" for n in range(1, 200)),  # unclosed runs of every length
    "`" + "``x" * 6_000,  # an opener no run closes, then pairs
    "a`" * 10_000,
    "0a" * 10_000 + " " + "1" * 19_000 + "f",  # commit-hash lookaheads on long runs
])
def test_r9_prose_regexes_stay_linear_on_hostile_text(text):
    start = time.monotonic()
    md(text)
    assert time.monotonic() - start < 1.0


def test_case_111_posting_the_megabyte_report_takes_seconds(github, tmp_path):
    path = _write(tmp_path, _hostile_report())
    start = time.monotonic()
    proc = _post(github, path, "--repo", REPO, "--expect-issue", "11", "--no-trigger-label")
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 30


# -- the terminal (S9, case 21) ------------------------------------------------------------------
def _osc_report(script: str) -> Report:
    run = ArmRun(spec="cpu", device="cpu", mode="eager", status="raised", elapsed_s=0.1,
                 failure=f"RuntimeError: {OSC52}",
                 exception={"type": "RuntimeError", "message": OSC52, "traceback": OSC52, "line": 4, "claim": False},
                 stdout=f"tensor([2., 2., 2.])\n{OSC52}\n", stderr=OSC52)
    comparison = Comparison(arms=[run], aligned=0, alignment_note=None, leaves_identical=None, leaves_note=None,
                            divergence=None, divergences=0, claims=[], conditioning=[])
    repro = Repro(path=script, name=f"repro{OSC52}.py", source=f"raise RuntimeError({OSC52!r})\n")
    verdict = Verdict(kind="could-not-run", expected=None, policy_section="none", policy_url="", labels=[],
                      summary=f"The script raised RuntimeError: {OSC52}", evidence=[f"evidence {OSC52}"])
    return Report(repro=repro, arms_requested=["cpu"], comparison=comparison, verdict=verdict, triage_version="t",
                  seconds=0.2, notes=[f"note {OSC52}"])


def test_case_021_terminal_escapes_from_the_script_are_shown_not_sent(tmp_path, monkeypatch):
    import triage.pipeline

    script = tmp_path / "osc.py"
    script.write_text("raise RuntimeError('x')\n")
    monkeypatch.setattr(triage.pipeline, "triage_script", lambda path, *a: _osc_report(path))
    comment = tmp_path / "comment.md"
    result = CliRunner().invoke(cli.main, ["run", str(script), "--arms", "cpu", "--json", str(tmp_path / "r.json"),
                                           "--comment", str(comment), "--minimal", "-"])
    assert result.exit_code == 3, result.output
    assert "\x1b" not in result.output and "\x1b" not in result.stderr
    assert "\\x1b]52;c;ZWNobyBwd25lZA==" in result.output  # what the script printed, visible
    assert "\x1b" not in comment.read_text()


@pytest.mark.slow
def test_case_021_real_run_of_a_script_raising_terminal_escapes(tmp_path):
    script = tmp_path / "osc.py"
    script.write_text(f"import torch\nx = torch.ones(3) * 2\nprint(x)\nraise RuntimeError({OSC52!r})\n")
    proc = subprocess.run([sys.executable, "-m", "triage", "run", str(script), "--arms", "cpu", "--json", "r.json",
                           "--comment", "c.md", "--minimal", "-", "--no-minimize", "--no-ablate"],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=600)
    assert (tmp_path / "r.json").exists(), proc.stderr
    assert "\x1b" not in proc.stdout and "\x1b" not in proc.stderr
    assert "\\x1b]52;c;" in proc.stdout
    assert "\x1b" not in (tmp_path / "c.md").read_text()
