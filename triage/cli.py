"""The command line: a thin shell around `triage.pipeline`."""
from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from typing import Any

import click

from triage.arms import ArmSpecError, default_arms, parse_arms
from triage.run import RunOptions

EXIT_VERDICT, EXIT_USAGE, EXIT_COULD_NOT_RUN, EXIT_NOT_POSTED, EXIT_NOT_TESTED = 0, 2, 3, 4, 5


def _memory(text: str | None) -> int | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not m:
        raise click.BadParameter(f"'{text}' is not a size; use e.g. 4G or 512M", param_hint="--memory")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="triage")
def main() -> None:
    """triage: bug-report minimizer and triage bot for PyTorch numerical discrepancies."""


def _run_options(f: Any) -> Any:
    """The options of every command that runs a repro (`run`, `issue`)."""
    options = [
        click.option("--arms", "arms_text", default=None, metavar="SPECS",
                     help="Comma-separated arms, e.g. cpu,cuda or cpu,cpu/compile or cuda/tf32=off. "
                          "Default: what the script compares (an eager and a compile arm when it calls "
                          "torch.compile; cpu,cuda where CUDA is present; else cpu against float64)."),
        click.option("--timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
                     help="Seconds the script may run in each arm."),
        click.option("--memory", default=None, metavar="SIZE",
                     help="Memory limit per arm (e.g. 8G). Default: a share of RAM."),
        click.option("--no-reference", is_flag=True,
                     help="Skip the float64 reference replay (and with it the rounding judgement)."),
        click.option("--rounding-samples", type=click.IntRange(min=0), default=29, show_default=True,
                     help="Simulated roundings of each observed value (Monte Carlo arithmetic on the recorded "
                          "graph); the smallest p-value is 1/(K+1). 0 judges by float64 alone."),
        click.option("--rounding-budget", type=click.FloatRange(min=1), default=60.0, show_default=True,
                     help="Seconds each arm's rounding simulation may take."),
        click.option("--minimize/--no-minimize", default=True, show_default=True,
                     help="Reduce a divergence between two arms to its minimal op set and a verified script."),
        click.option("--minimize-budget", type=click.FloatRange(min=1), default=900.0, show_default=True,
                     help="Seconds the reduction passes may take; the smallest op set found by then is kept."),
        click.option("--ablate/--no-ablate", default=True, show_default=True,
                     help="For a divergence, re-run with one switch changed at a time (threads=1, tf32=off, …) "
                          "and report which make the sides agree."),
        click.option("--ablate-budget", type=click.FloatRange(min=1), default=120.0, show_default=True,
                     help="Seconds the ablations may take."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed for every generator, in every arm."),
        click.option("--jobs", type=click.IntRange(min=1), default=None, help="Arms run at once (default: cores)."),
        click.option("--quiet", is_flag=True, help="No progress and no terminal summary."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _github_options(f: Any) -> Any:
    """The options of every command that talks to GitHub (`extract`, `issue`, `post`)."""
    options = [
        click.option("--api-url", envvar="GITHUB_API_URL", default="https://api.github.com", show_default=True,
                     help="GitHub's REST API (GitHub Enterprise: https://HOST/api/v3). Env: GITHUB_API_URL."),
        click.option("--bot-login", default=None, metavar="LOGIN",
                     help="Author of the bot's comment. Default: the token's user, or github-actions[bot]."),
        click.option("--allowed-labels", envvar="TRIAGE_ALLOWED_LABELS", default=None, metavar="A,B",
                     help="Suggested labels that may be applied (comma-separated). Default: the labels triage "
                          "suggests; '' applies none. Env: TRIAGE_ALLOWED_LABELS."),
        click.option("--trigger-label", envvar="TRIAGE_TRIGGER_LABEL", default=None, metavar="LABEL",
                     help="The label that asked for the run: it must still be on the issue to post, and is "
                          "removed afterwards. Env: TRIAGE_TRIGGER_LABEL."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _github(api_url: str, bot_login: str | None, allowed_labels: str | None, trigger_label: str | None,
            err: Any) -> Any:
    from triage.publish import GitHubOptions
    from triage.sandbox import take_secret

    options = GitHubOptions(api_url=api_url, token=take_secret("GITHUB_TOKEN"), bot_login=bot_login or None,
                            trigger_label=trigger_label or None, log=lambda m: err.print(m, highlight=False))
    if allowed_labels is not None:
        options.allowed_labels = frozenset(x.strip() for x in allowed_labels.split(",") if x.strip())
    return options


@main.command("run")
@click.argument("script", type=click.Path(dir_okay=True, path_type=str))
@_run_options
@click.option("--json", "json_path", default=None, metavar="PATH", help="Write report.json here.")
@click.option("--comment", "comment_path", default="comment.md", show_default=True, metavar="PATH",
              help="Write the GitHub comment (markdown) here; '-' to skip.")
@click.option("--minimal", "minimal_path", default="minimal.py", show_default=True, metavar="PATH",
              help="Write the minimal repro script here (its inputs file, if any, beside it); '-' to skip.")
def run_command(script: str, json_path: str | None, comment_path: str, minimal_path: str, **run: Any) -> None:
    """Run SCRIPT on isolated arms, judge it against the accuracy policy, write the comment.

    Exit status: 0 a verdict, 2 usage error, 3 the script could not run at all, 5 a requested
    arm cannot run on this machine (the comparison asked for was not made)."""
    from triage.pipeline import triage_script

    report = _execute(lambda arms, options, progress, notes, minimize, ablation: triage_script(
        script, arms, options, progress, notes, minimize, ablation), run, _source(script))
    _finish(report, json_path, comment_path, minimal_path, run["quiet"])
    sys.exit(_exit_code(report))


@main.command("extract")
@click.argument("source", required=False)
@click.option("--event", "event_path", default=None, metavar="PATH",
              help="An `issues` event payload (in an Action: $GITHUB_EVENT_PATH) instead of SOURCE.")
@click.option("--out", "out_dir", default="triage-extract", show_default=True, metavar="DIR",
              help="Where repro.py and extraction.json go.")
@click.option("--api-url", envvar="GITHUB_API_URL", default="https://api.github.com", show_default=True,
              help="GitHub's REST API, for an OWNER/REPO#N source. Env: GITHUB_API_URL.")
def extract_command(source: str | None, event_path: str | None, out_dir: str, api_url: str) -> None:
    """Find the repro in an issue: SOURCE is a body file (markdown) or OWNER/REPO#N."""
    import json

    from rich.console import Console

    from triage.extract import extract_issue_body
    from triage.model import to_jsonable

    if source and os.path.isfile(source):
        with open(source, encoding="utf-8", errors="replace") as f:
            found, title = extract_issue_body(f.read()), source
    else:
        issue = _load_issue(source, event_path, _github(api_url, None, None, None, Console(stderr=True)))
        found, title = issue.extraction, f"{issue.repo}#{issue.number}"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "extraction.json"), "w", encoding="utf-8") as f:
        json.dump(to_jsonable(found), f, indent=1)
    console = Console(soft_wrap=True)
    if found.script is not None:
        with open(os.path.join(out_dir, "repro.py"), "w", encoding="utf-8") as f:
            f.write(found.script.rstrip("\n") + "\n")
        lines = found.script.count("\n") + 1
        console.print(f"{title}: repro.py ({lines} lines) written to {out_dir}/", highlight=False)
    for note in found.notes:
        console.print(f" · {note}", markup=False, highlight=False)
    if found.environment_fields:
        shown = ("PyTorch version", "CUDA used to build PyTorch", "GPU models and configuration", "OS")
        console.print(" · reporter's environment: " + "; ".join(
            f"{k}: {v}" for k, v in found.environment_fields.items() if k in shown), markup=False, highlight=False)
    if found.problem:
        console.print(f"no runnable repro: {found.problem}", markup=False, highlight=False)
        sys.exit(EXIT_COULD_NOT_RUN)


@main.command("issue")
@click.argument("ref", required=False, metavar="OWNER/REPO#N")
@click.option("--event", "event_path", default=None, metavar="PATH",
              help="An `issues` event payload (in an Action: $GITHUB_EVENT_PATH) instead of OWNER/REPO#N.")
@click.option("--post", is_flag=True, help="Post the comment (GITHUB_TOKEN from the environment).")
@click.option("--out", "out_dir", default="triage-out", show_default=True, metavar="DIR",
              help="Where repro.py, report.json, comment.md and minimal.py go (written before posting).")
@_run_options
@_github_options
def issue_command(ref: str | None, event_path: str | None, post: bool, out_dir: str, api_url: str,
                  bot_login: str | None, allowed_labels: str | None, trigger_label: str | None, **run: Any) -> None:
    """Extract the repro from an issue, run and judge it, write the report; --post comments."""
    from rich.console import Console

    from triage.pipeline import triage_issue

    err = Console(stderr=True, soft_wrap=True)
    github = _github(api_url, bot_login, allowed_labels, trigger_label, err)
    if post and not github.token:
        raise click.UsageError("--post needs a token: set GITHUB_TOKEN")
    if post and hasattr(os, "geteuid") and os.geteuid() == 0:
        err.print("warning: triage runs as root, so the repro does too, and root can read this process's memory "
                  "(and the token in it). Run as an ordinary user, or split the steps: `triage issue` without a "
                  "token, then `triage post --report`.", highlight=False)
    issue = _load_issue(ref, event_path, github)
    os.makedirs(out_dir, exist_ok=True)
    report = _execute(lambda arms, options, progress, notes, minimize, ablation: triage_issue(
        issue, out_dir, arms, options, progress, notes, minimize, ablation), run, issue.extraction.script)
    data = _finish(report, os.path.join(out_dir, "report.json"), os.path.join(out_dir, "comment.md"),
                   os.path.join(out_dir, "minimal.py"), run["quiet"])
    _write_step_summary(data)
    if post:
        _post(data, github, err)
    sys.exit(_exit_code(report))


@main.command("post")
@click.option("--report", "report_path", required=True, metavar="PATH", help="report.json from `triage issue`.")
@click.option("--repo", envvar="GITHUB_REPOSITORY", default=None, metavar="OWNER/REPO",
              help="Refuse a report about any other repository. Env: GITHUB_REPOSITORY.")
@_github_options
def post_command(report_path: str, repo: str | None, api_url: str, bot_login: str | None,
                 allowed_labels: str | None, trigger_label: str | None) -> None:
    """Validate report.json, render its comment and post it. Never runs code from the issue."""
    from rich.console import Console

    from triage.publish import load_report

    err = Console(stderr=True, soft_wrap=True)
    github = _github(api_url, bot_login, allowed_labels, trigger_label, err)
    data, problems = load_report(report_path)
    if not problems and repo and data["issue"]["repo"].lower() != repo.lower():
        problems = [f"the report is about {data['issue']['repo']}, not {repo}"]
    if problems:
        err.print(f"{report_path} is not a report triage will post:", highlight=False)
        for p in problems:
            err.print(f"  {p}", markup=False, highlight=False)
        sys.exit(EXIT_USAGE)
    if not github.token:
        raise click.UsageError("posting needs a token: set GITHUB_TOKEN")
    _post(data, github, err)


def _post(data: dict[str, Any], github: Any, err: Any) -> None:
    from github import GithubException

    from triage.publish import PublishError, connect, post_report

    try:
        result = post_report(connect(github), data, github)
    except (PublishError, GithubException) as e:
        if isinstance(e, PublishError):
            why = str(e)
        else:
            message = e.data.get("message", e.data) if isinstance(e.data, dict) else e.data
            why = f"GitHub answered {e.status}: {message}"
        err.print(f"not posted: {why}", markup=False, highlight=False)
        _write_step_summary(None, f"triage: not posted: {why}")
        sys.exit(EXIT_NOT_POSTED)
    line = f"{result.action} comment {result.comment_url}"
    if result.labels_added:
        line += "; labels added: " + ", ".join(result.labels_added)
    if result.labels_refused:
        line += "; not on the allowlist: " + ", ".join(result.labels_refused)
    if result.trigger_removed:
        line += f"; removed '{github.trigger_label}'"
    err.print(line, markup=False, highlight=False)
    _write_step_summary(None, f"triage: {line}")


def _load_issue(ref: str | None, event_path: str | None, github: Any) -> Any:
    """The issue from OWNER/REPO#N (API) or an event file, as data; usage errors otherwise."""
    import json

    from triage.extract import extract_issue_body
    from triage.publish import connect, issue_from_api, issue_from_event, parse_issue_ref

    if (ref is None) == (event_path is None):
        raise click.UsageError("give exactly one of OWNER/REPO#N and --event PATH")
    if event_path is not None:
        try:
            with open(event_path, encoding="utf-8") as f:
                return issue_from_event(json.load(f), extract_issue_body)
        except (OSError, ValueError) as e:
            raise click.UsageError(f"cannot read the event {event_path}: {e}") from None
    try:
        repo, number = parse_issue_ref(ref)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    from github import GithubException

    from triage.publish import PublishError

    try:
        return issue_from_api(connect(github), repo, number, github, extract_issue_body)
    except GithubException as e:
        raise click.ClickException(f"cannot read {repo}#{number} from {github.api_url}: GitHub answered {e.status}") from None
    except PublishError as e:
        raise click.ClickException(str(e)) from None


def _execute(pipeline: Any, run: dict[str, Any], source: str | None) -> Any:
    """Parse the run options, run `pipeline` with a progress display, return its Report;
    without --arms, the arms follow what the script (`source`) compares."""
    from rich.console import Console

    from triage.ablate import AblationOptions
    from triage.minimize import MinimizeOptions

    notes: list[str] = []
    try:
        arms = parse_arms(run["arms_text"]) if run["arms_text"] is not None else None
    except ArmSpecError as e:
        raise click.UsageError(str(e)) from None
    if arms is None:
        arms, chosen = default_arms(source)
        notes.extend(chosen)
    options = RunOptions(timeout_s=run["timeout"], memory_bytes=_memory(run["memory"]), seed=run["seed"],
                         reference=not run["no_reference"], jobs=run["jobs"],
                         rounding_samples=run["rounding_samples"], rounding_budget_s=run["rounding_budget"])
    progress = _Progress(Console(stderr=True), [a.spec for a in arms]) if not run["quiet"] else None
    try:
        return pipeline(arms, options, progress.update if progress else None, notes,
                        MinimizeOptions(enabled=run["minimize"], budget_s=run["minimize_budget"]),
                        AblationOptions(enabled=run["ablate"], budget_s=run["ablate_budget"]))
    finally:
        if progress:
            progress.stop()


def _finish(report: Any, json_path: str | None, comment_path: str, minimal_path: str, quiet: bool) -> dict[str, Any]:
    """Write what the user asked for, print the terminal view; the report's JSON data."""
    from rich.console import Console

    from triage.report import render_comment, render_terminal, report_json, write_json

    data = report_json(report)
    if json_path:
        write_json(data, json_path)
    minimal_written = _write_minimal(report, minimal_path)
    if report.minimal_dir:
        shutil.rmtree(report.minimal_dir, ignore_errors=True)
    if comment_path and comment_path != "-":
        with open(comment_path, "w", encoding="utf-8") as f:
            f.write(render_comment(data))
    if not quiet:
        render_terminal(report, Console())
        written = [p for p in (json_path, comment_path if comment_path != "-" else None) if p] + minimal_written
        if written:
            Console().print("wrote " + ", ".join(written), highlight=False)
    return data


def _source(path: str) -> str | None:
    """The script's text for choosing arms (None when unreadable: extract reports why)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _exit_code(report: Any) -> int:
    ran_nothing = report.comparison is None or all(not r.completed for r in report.comparison.arms)
    if report.verdict.kind == "could-not-run" and ran_nothing:
        return EXIT_COULD_NOT_RUN
    if report.comparison is not None and any(r.status == "unavailable" for r in report.comparison.arms):
        return EXIT_NOT_TESTED  # a requested arm could not run here: no verdict on the comparison asked for
    return EXIT_VERDICT


def _write_step_summary(data: dict[str, Any] | None, line: str | None = None) -> None:
    """The full report (or one line) in the Action's job summary, under its 1 MiB cap."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    from triage.report import SUMMARY_LIMIT_BYTES, render_comment

    text = render_comment(data, SUMMARY_LIMIT_BYTES, size=lambda t: len(t.encode("utf-8"))) if data else f"{line}\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def _write_minimal(report: Any, path: str) -> list[str]:
    """The verified script (and its inputs file) where the user asked; the paths written."""
    m = report.minimal
    if m is None or not path or path == "-":
        return []
    with open(path, "w", encoding="utf-8") as f:
        f.write(m.script)
    written = [path]
    if m.inputs_file and report.minimal_dir:
        target = os.path.join(os.path.dirname(os.path.abspath(path)), m.inputs_file)
        shutil.copyfile(os.path.join(report.minimal_dir, m.inputs_file), target)
        written.append(target)
    return written


class _Progress:
    """A live status line per arm while the arms run (on stderr)."""

    PHASES = {"imported": "torch imported", "script-start": "running the script",
              "script-done": "script finished", "reference-start": "float64 replay"}

    def __init__(self, console: Any, specs: list[str]) -> None:
        self.console = console
        self.state = {s: "waiting" for s in specs}
        self.started = {s: time.monotonic() for s in specs}
        self.lock = threading.Lock()
        self.status = console.status(self._text()) if console.is_terminal else None
        if self.status:
            self.status.start()

    def _text(self) -> str:
        return " | ".join(f"{s}: {st} ({time.monotonic() - self.started[s]:.0f}s)" for s, st in self.state.items())

    def update(self, spec: str, event: str, details: dict[str, Any]) -> None:
        with self.lock:
            if spec not in self.state:
                self.state[spec] = "waiting"
                self.started[spec] = time.monotonic()
            if spec == "minimize":
                self.state[spec] = event if event != "end" else details.get("status", "done")
                if event == "end" and not self.status:
                    self.console.print(f"minimize: {self.state[spec]} after {time.monotonic() - self.started[spec]:.1f}s",
                                       highlight=False)
                if self.status:
                    self.status.update(self._text())
                return
            if event == "start":
                self.started[spec] = time.monotonic()
                self.state[spec] = "starting"
            elif event == "message" and details.get("phase") in self.PHASES:
                self.state[spec] = self.PHASES[details["phase"]]
            elif event == "end":
                self.state[spec] = f"done: {details.get('status')}"
                if not self.status:
                    self.console.print(f"arm {spec}: {details.get('status')} after "
                                       f"{time.monotonic() - self.started[spec]:.1f}s", highlight=False)
            if self.status:
                self.status.update(self._text())

    def stop(self) -> None:
        if self.status:
            self.status.stop()
