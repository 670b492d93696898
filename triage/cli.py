"""The command line: a thin shell around `triage.pipeline`."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import click

from triage.arms.spec import ArmSpecError, default_arms, parse_arms, torch_release
from triage.reporter import QUIET, Reporter
from triage.settings import AblationSettings, MinimizeSettings, RunSettings, Settings

EXIT_VERDICT, EXIT_USAGE, EXIT_COULD_NOT_RUN, EXIT_NOT_POSTED, EXIT_NOT_TESTED = 0, 2, 3, 4, 5
EXIT_NOT_WRITTEN = 1  # the run finished, but an output file could not be written (the rest were)
EXIT_GITHUB_UNREACHABLE = 6  # GitHub could not be reached (network, or 5xx on every attempt): try again later
MAX_INPUTS_BYTES = 8 << 30  # the minimal script's inputs file (the diverging op's recorded inputs)
MIN_ARM_MEMORY = 512 << 20
# `triage run SCRIPT -- ARGS`: a repro's arguments, not a data channel (the job file carries them).
MAX_SCRIPT_ARGS, MAX_SCRIPT_ARGS_BYTES = 256, 64 << 10
SHOWN_ARGS_CHARS = 1000  # of the arguments, in the report's note (a note holds 5000)
# Piped output's width without COLUMNS: what a CI log or `| less` shows whole (rich's own guess is 80).
PIPED_WIDTH = 100


def _memory(text: str | None) -> int | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not m:
        raise click.BadParameter(f"'{text}' is not a size; use e.g. 4G or 512M", param_hint="--memory")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    size = int(float(m.group(1)) * scale)
    if size < MIN_ARM_MEMORY:
        # Importing torch alone takes about a quarter of a GiB: under this no arm gets to the script.
        raise click.BadParameter(f"'{text}' is less than the {MIN_ARM_MEMORY >> 20}M an arm needs to start "
                                 "(Python and torch alone take about 250M)", param_hint="--memory")
    return size


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="triage")
def main() -> None:
    """triage: bug-report minimizer and triage bot for PyTorch numerical discrepancies."""
    from triage.sandbox import scrub_own_secrets

    # Before anything runs issue code: every secret-looking variable leaves this process's
    # environment (and the block /proc/<pid>/environ shows); GITHUB_TOKEN is kept in memory
    # for the posting step only, Ray's authentication for `triage sweep --ray-address`.
    _SECRETS.clear()
    _SECRETS.update(scrub_own_secrets(keep=("GITHUB_TOKEN", *RAY_AUTHENTICATION)))


# What a driver needs to join a Ray cluster that has token authentication on.
RAY_AUTHENTICATION = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


_SECRETS: dict[str, str] = {}


def _rounding_samples(ctx: Any, param: Any, value: int) -> int:
    # The significant-digits estimate needs a spread: at least 3 samples (or none at all).
    if value in (1, 2):
        raise click.BadParameter("use 0 (judge by float64 alone) or at least 3", ctx, param)
    return value


DEFAULTS = Settings()  # the flags' defaults: written once, in triage/settings.py


def _run_options(f: Any) -> Any:
    """The options of every command that runs a repro (`run`, `issue`, `sweep`); `_settings`
    turns them into the run's `Settings`."""
    options = [
        click.option("--arms", "arms_text", default=None, metavar="SPECS",
                     help="Comma-separated arms, e.g. cpu,cuda or cpu,cpu/compile or cuda/tf32=off. "
                          "Default: what the script compares (an eager and a compile arm when it calls "
                          "torch.compile; cpu,cuda where CUDA is present; else cpu against float64)."),
        click.option("--timeout", type=click.FloatRange(min=1), default=DEFAULTS.run.timeout_s, show_default=True,
                     help="Seconds the script may run in each arm."),
        click.option("--memory", default=None, metavar="SIZE",
                     help="Memory limit per arm (e.g. 8G). Default: a share of RAM."),
        click.option("--no-reference", is_flag=True, default=not DEFAULTS.run.reference,
                     help="Skip the float64 reference replay (and with it the rounding judgement)."),
        click.option("--rounding-samples", type=click.IntRange(min=0), default=DEFAULTS.run.rounding_samples,
                     show_default=True, callback=_rounding_samples,
                     help="Simulated roundings of each observed value (Monte Carlo arithmetic on the recorded "
                          "graph); the smallest p-value is 1/(K+1). 0 judges by float64 alone."),
        click.option("--rounding-budget", type=click.FloatRange(min=1), default=DEFAULTS.run.rounding_budget_s,
                     show_default=True,
                     help="Seconds each arm's rounding simulation may take."),
        click.option("--minimize/--no-minimize", default=DEFAULTS.minimize.enabled, show_default=True,
                     help="Reduce a divergence between two arms to its minimal op set and a verified script."),
        click.option("--minimize-budget", type=click.FloatRange(min=1), default=DEFAULTS.minimize.budget_s,
                     show_default=True,
                     help="Seconds the reduction passes may take; the smallest op set found by then is kept."),
        click.option("--reduce-data/--keep-data", default=DEFAULTS.minimize.reduce_data, show_default=True,
                     help="Shrink the minimal repro's inputs to the fewest, plainest values that still diverge "
                          "the same way (--keep-data: the recorded values, exactly)."),
        click.option("--ablate/--no-ablate", default=DEFAULTS.ablation.enabled, show_default=True,
                     help="For a divergence, re-run with one switch changed at a time (threads=1, tf32=off, …) "
                          "and report which make the sides agree."),
        click.option("--ablate-budget", type=click.FloatRange(min=1), default=DEFAULTS.ablation.budget_s,
                     show_default=True,
                     help="Seconds the ablations may take."),
        click.option("--all-ablations", is_flag=True, default=DEFAULTS.ablation.exhaustive,
                     help="Try every switch that applies, not only until one explains the divergence."),
        click.option("--seed", type=int, default=DEFAULTS.run.seed, show_default=True,
                     help="Seed for every generator, in every arm."),
        click.option("--jobs", type=click.IntRange(min=1), default=DEFAULTS.run.jobs,
                     help="Processes run at once: arms, and the ablations beside the minimizer (default: cores)."),
        click.option("--isolation", type=click.Choice(["auto", "namespace", "process"]), default=DEFAULTS.run.isolation,
                     show_default=True,
                     help="How arms are isolated: 'namespace' (bubblewrap: no network, no HOME, no other "
                          "process, read-only installation), 'process' (a scrubbed environment and limits "
                          "only; the report says so), 'auto' the first this machine allows."),
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
    from triage.github import GitHubOptions
    from triage.sandbox import take_secret

    options = GitHubOptions(api_url=api_url, token=take_secret("GITHUB_TOKEN") or _SECRETS.get("GITHUB_TOKEN"),
                            bot_login=bot_login or None,
                            trigger_label=trigger_label or None, log=lambda m: err.print(m, highlight=False))
    if allowed_labels is not None:
        options.allowed_labels = frozenset(x.strip() for x in allowed_labels.split(",") if x.strip())
    return options


@main.command("run")
@click.argument("script", type=click.Path(dir_okay=True, path_type=str))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]...")
@_run_options
@click.option("--json", "json_path", default=None, metavar="PATH", help="Write report.json here.")
@click.option("--comment", "comment_path", default="comment.md", show_default=True, metavar="PATH",
              help="Write the GitHub comment (markdown) here; '-' to skip.")
@click.option("--minimal", "minimal_path", default="minimal.py", show_default=True, metavar="PATH",
              help="Write the minimal repro script here (its inputs file, if any, beside it); '-' to skip.")
@click.option("--reported", "reported_path", default=None, metavar="PATH",
              help="What the script printed on the reporter's machine (and their collect_env, if any): each "
                   "value is judged against this computation's rounding on their device.")
def run_command(script: str, script_args: tuple[str, ...], json_path: str | None, comment_path: str,
                minimal_path: str, reported_path: str | None, **run: Any) -> None:
    """Run SCRIPT on isolated arms, judge it against the accuracy policy, write the comment.

    ARGS after `--` are the script's sys.argv[1:] in every arm, exactly as given.

    Exit status: 0 a verdict, 1 an output file could not be written, 2 usage error, 3 the script
    could not run at all, 5 a requested arm cannot run on this machine (the comparison asked for
    was not made, and no --reported output of that arm's stood in for it)."""
    from triage.pipeline import triage_script

    _check_script_args(script_args)
    for option, path in (("--json", json_path), ("--comment", comment_path), ("--minimal", minimal_path)):
        _check_output_path(option, path)
    posted = _reported_file(reported_path) if reported_path is not None else None
    arms, settings, notes = _prepare(run, _source(script), script_args)
    with _progress_display(arms, run["quiet"]) as progress:
        report = triage_script(script, arms, settings, progress, notes, posted)
    _, unwritten = _finish(report, json_path, comment_path, minimal_path, run["quiet"])
    sys.exit(EXIT_NOT_WRITTEN if unwritten else _exit_code(report))


MAX_REPORTED_BYTES = 1 << 20


def _reported_file(path: str) -> Any:
    """--reported: the reporter's printed output as text (a usage error when it is unreadable)."""
    from triage.extract import parse_environment
    from triage.model import ReporterOutput

    try:
        # Not blocking in open(): a FIFO with no writer would hang triage before any arm ran.
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise click.UsageError(f"--reported {path}: not a regular file")
            os.set_blocking(f.fileno(), True)
            data = f.read(MAX_REPORTED_BYTES + 1)
    except OSError as e:
        raise click.UsageError(f"--reported {path}: cannot read it ({e.strerror})") from None
    if len(data) > MAX_REPORTED_BYTES:
        raise click.UsageError(f"--reported {path}: over {MAX_REPORTED_BYTES >> 20} MiB; paste the printed lines only")
    text = data.decode("utf-8", errors="replace")
    return ReporterOutput(text=text, source=f"`{os.path.basename(path)}`", environment=parse_environment(text))


def _check_script_args(args: tuple[str, ...]) -> None:
    """Refuse more arguments than a repro plausibly takes (each arm's job file carries them)."""
    if len(args) > MAX_SCRIPT_ARGS:
        raise click.UsageError(f"{len(args)} arguments after `--`; a script may be given at most {MAX_SCRIPT_ARGS}")
    size = _args_bytes(args)
    if size > MAX_SCRIPT_ARGS_BYTES:
        raise click.UsageError(f"the arguments after `--` take {size} bytes; a script may be given at most "
                               f"{MAX_SCRIPT_ARGS_BYTES >> 10} KiB")


def _args_bytes(args: tuple[str, ...]) -> int:
    # surrogatepass: an argument that was not UTF-8 arrives with lone surrogates (surrogateescape).
    return sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in args)


def _args_note(args: tuple[str, ...]) -> str:
    """The report's record of the arguments (as a shell would need them), cut to a note's size."""
    import shlex

    shown = shlex.join(args)
    if len(shown) > SHOWN_ARGS_CHARS:
        shown = f"{shown[:SHOWN_ARGS_CHARS]}… ({len(args)} arguments, {_args_bytes(args)} bytes in all)"
    return f"The script ran with the arguments (`sys.argv[1:]`): {shown}"


def _check_output_path(option: str, path: str | None) -> None:
    """Refuse, before any arm runs, an output path that cannot be written: its folder missing
    or not writable, or the path itself a folder."""
    if not path or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise click.UsageError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.UsageError(f"{option} {path}: the folder {folder} is not writable")
    if os.path.isdir(path):
        raise click.UsageError(f"{option} {path} is a folder, not a file")


@main.command("extract")
@click.argument("source", required=False)
@click.option("--event", "event_path", default=None, metavar="PATH",
              help="An `issues` event payload (in an Action: $GITHUB_EVENT_PATH) instead of SOURCE.")
@click.option("--out", "out_dir", default="triage-extract", show_default=True, metavar="DIR",
              help="Where repro.py and extraction.json go.")
@click.option("--api-url", envvar="GITHUB_API_URL", default="https://api.github.com", show_default=True,
              help="GitHub's REST API, for an OWNER/REPO#N source. Env: GITHUB_API_URL.")
def extract_command(source: str | None, event_path: str | None, out_dir: str, api_url: str) -> None:
    """Find the repro in an issue: SOURCE is a body file (markdown) or OWNER/REPO#N.

    Exit status: 0 a repro was found, 1 GitHub refused to give the issue, 2 usage error, 3 no
    runnable repro in it, 6 GitHub could not be reached."""
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
    from triage.report.markdown import visible

    console = Console(soft_wrap=True)
    if found.script is not None:
        with open(os.path.join(out_dir, "repro.py"), "w", encoding="utf-8") as f:
            f.write(found.script.rstrip("\n") + "\n")
        lines = found.script.count("\n") + 1
        console.print(visible(f"{title}: repro.py ({lines} lines) written to {out_dir}/"), markup=False,
                      highlight=False)
    if found.observed:
        # What the reporter's machine printed (and their collect_env): `triage run repro.py
        # --reported reported.txt` judges it as their arm.
        with open(os.path.join(out_dir, "reported.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(found.observed + ([found.environment] if found.environment else [])).rstrip("\n") + "\n")
        console.print(visible(f" · the output they posted: {out_dir}/reported.txt (`triage run {out_dir}/repro.py "
                              f"--reported {out_dir}/reported.txt` judges it)"), markup=False, highlight=False)
    # Issue text, shown with its control and escape characters written out (never sent).
    for note in found.notes:
        console.print(visible(f" · {note}"), markup=False, highlight=False)
    if found.environment_fields:
        shown = ("PyTorch version", "CUDA used to build PyTorch", "GPU models and configuration", "OS")
        console.print(visible(" · reporter's environment: " + "; ".join(
            f"{k}: {v}" for k, v in found.environment_fields.items() if k in shown)), markup=False, highlight=False)
    if found.problem:
        console.print(visible(f"no runnable repro: {found.problem}"), markup=False, highlight=False)
        sys.exit(EXIT_COULD_NOT_RUN)


@main.command("issue")
@click.argument("ref", required=False, metavar="OWNER/REPO#N")
@click.option("--event", "event_path", default=None, metavar="PATH",
              help="An `issues` event payload (in an Action: $GITHUB_EVENT_PATH) instead of OWNER/REPO#N.")
@click.option("--post", is_flag=True, help="Post the comment (GITHUB_TOKEN from the environment).")
@click.option("--allow-weak-sandbox", is_flag=True,
              help="Post even where arms run in the process sandbox only (no bubblewrap), where the repro "
                   "could read the token from this process.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Read the token from this file (or /dev/fd/N) when posting, after every arm has ended, "
                   "instead of GITHUB_TOKEN.")
@click.option("--out", "out_dir", default="triage-out", show_default=True, metavar="DIR",
              help="Where repro.py, report.json, comment.md and minimal.py go (written before posting).")
@_run_options
@_github_options
def issue_command(ref: str | None, event_path: str | None, post: bool, allow_weak_sandbox: bool,
                  token_file: str | None, out_dir: str, api_url: str, bot_login: str | None, allowed_labels: str | None, trigger_label: str | None,
                  **run: Any) -> None:
    """Extract the repro from an issue, run and judge it, write the report; --post comments.

    Exit status: as `triage run`'s, and 4 --post did not post (said why), 6 GitHub could not be
    reached (to read the issue, or to post)."""
    from rich.console import Console

    from triage.pipeline import triage_issue

    err = Console(stderr=True, soft_wrap=True)
    github = _github(api_url, bot_login, allowed_labels, trigger_label, err)
    if post and not github.token and not token_file:
        raise click.UsageError("--post needs a token: set GITHUB_TOKEN or give --token-file")
    if post:
        how = _isolation(run["isolation"])
        if not how.strong and not allow_weak_sandbox:
            raise click.UsageError(f"refusing to --post: arms would run in the {how.detail}. The repro could read "
                                   "the token from this process. Install bubblewrap, or split the steps "
                                   "(`triage issue` without a token, then `triage post --report R --repo "
                                   "OWNER/REPO --expect-issue N --trigger-label LABEL`), or pass "
                                   "--allow-weak-sandbox.")
        _preload_posting()
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise click.UsageError(f"--out {out_dir}: cannot make the folder ({e.strerror})") from None
    outputs = {name: os.path.join(out_dir, name) for name in ("repro.py", "report.json", "comment.md", "minimal.py")}
    for path in outputs.values():
        _check_output_path("--out", path)
    issue = _load_issue(ref, event_path, github)
    arms, settings, notes = _prepare(run, issue.extraction.script)
    with _progress_display(arms, run["quiet"]) as progress:
        report = triage_issue(issue, out_dir, arms, settings, progress, notes)
    data, unwritten = _finish(report, outputs["report.json"], outputs["comment.md"], outputs["minimal.py"],
                              run["quiet"])
    _write_step_summary(data)
    if post:
        _take_token_file(github, token_file)
        _post(data, github, err)
    sys.exit(EXIT_NOT_WRITTEN if unwritten else _exit_code(report))


@main.command("sweep")
@click.argument("sources", nargs=-1, required=True, metavar="SOURCE...")
@click.option("--out", "out_dir", default="triage-sweep", show_default=True, metavar="DIR",
              help="Where sweep.html, sweep.md and sweep.json go.")
@click.option("--db", "db_path", default=None, metavar="PATH",
              help="The results store (SQLite), kept between sweeps. Default: DIR/results.sqlite.")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
              help="At most N issues from each search query.")
@click.option("--item-timeout", type=click.FloatRange(min=1), default=1800.0, show_default=True,
              help="Seconds one item may take in all; past it the item is stopped and listed as failed.")
@click.option("--ray-address", default=None, metavar="HOST:PORT",
              help="Join this Ray cluster ('auto': the one this machine belongs to). Default: a Ray of its own "
                   "on this machine.")
@click.option("--num-cpus", type=click.IntRange(min=1), default=None,
              help="Local Ray only: the CPUs it may use (default: this machine's cores).")
@click.option("--post", is_flag=True,
              help="Comment each swept issue's report on it (GITHUB_TOKEN from the environment), as `triage issue "
                   "--post` does: one comment per issue, updated in place.")
@click.option("--allow-weak-sandbox", is_flag=True,
              help="Sweep (and --post) although arms would run in the process sandbox only, where an arm can "
                   "reach the local Ray's unix sockets.")
@click.option("--cpus-per-arm", type=click.FloatRange(min=0.01), default=0.5, show_default=True,
              help="CPUs an item asks Ray for, per arm: below 1, more items run at once than the node has "
                   "cores, which their waits leave room for (bench/sweep.py).")
@click.option("--torch", "torch_releases", default=None, metavar="VERSIONS",
              help="Run every item on each of these torch releases (comma-separated, e.g. 2.13.0,2.15.0), each "
                   "installed once into its own cached environment with venv + pip; the report shows what "
                   "reproduces on one and not on another.  Default: the torch triage runs with.")
@click.option("--json", "json_path", default=None, metavar="PATH", help="Also write the summary JSON here.")
@_run_options
@_github_options
def sweep_command(sources: tuple[str, ...], out_dir: str, db_path: str | None, limit: int | None,
                  item_timeout: float, ray_address: str | None, num_cpus: int | None, post: bool,
                  allow_weak_sandbox: bool, cpus_per_arm: float, torch_releases: str | None,
                  json_path: str | None, api_url: str,
                  bot_login: str | None, allowed_labels: str | None, trigger_label: str | None, **run: Any) -> None:
    """Triage a backlog: every item of every SOURCE as a Ray task, results kept in SQLite.

    A SOURCE is a folder of repro scripts (one folder per report with repro.py, or *.py files),
    OWNER/REPO#N (several: comma-separated), or a GitHub issue search query such as
    'repo:pytorch/pytorch is:open label:"module: numerical-stability"'.  Items already triaged on
    this torch build (same script text, same arms) are not run again: an interrupted sweep
    resumes, a finished one costs nothing.  The run options apply to every item, as
    `triage run` takes them; `--arms` replaces each item's own choice.

    Exit status: 0 the report was written (whatever the verdicts), 2 usage error, 3 no source
    gave an item, 4 --post could not post on some issue, 6 GitHub could not be reached (for a
    source or a post; the same sweep again runs only what is missing)."""
    # Ray's own processes (never an arm: arms get an allow-listed environment) need them to join
    # or start an authenticated Ray, and before Ray is imported: its core reads them at import.
    os.environ.update({name: _SECRETS[name] for name in RAY_AUTHENTICATION if name in _SECRETS})
    from rich.console import Console

    from triage.sandbox.torch_envs import TorchEnvError
    from triage.sweep.driver import SweepOptions, run_sweep
    from triage.sweep.engine import EngineOptions
    from triage.sweep.store import StoreError

    err = Console(stderr=True, soft_wrap=True)
    try:
        releases = tuple(dict.fromkeys(torch_release(v) for v in (torch_releases or "").split(",") if v.strip()))
    except TorchEnvError as e:
        raise click.UsageError(f"--torch: {e}") from None
    if torch_releases is not None and not releases:
        raise click.UsageError("--torch is empty: name at least one release, e.g. 2.15.0")
    arms = None
    if run["arms_text"] is not None:
        try:
            arms = tuple(a.spec for a in parse_arms(run["arms_text"]))
        except ArmSpecError as e:
            raise click.UsageError(str(e)) from None
    how = _isolation(run["isolation"])
    github = _github(api_url, bot_login, allowed_labels, trigger_label, err)
    if post and not github.token:
        raise click.UsageError("--post needs a token: set GITHUB_TOKEN")
    if post and not how.strong and not allow_weak_sandbox:
        raise click.UsageError(f"refusing to --post: arms would run in the {how.detail}. Install bubblewrap, or "
                               "sweep without --post and post each report.json with `triage post`, or pass "
                               "--allow-weak-sandbox.")
    if ray_address and not how.strong:
        raise click.UsageError(f"refusing to join a Ray cluster with arms in the {how.detail}: an arm could read "
                               "the cluster's token and reach its control plane. Install bubblewrap on every node.")
    if not how.strong and not allow_weak_sandbox:
        # Landlock does not check connect() to a unix socket by its path: an arm would reach
        # the local Ray's raylet and object store, whose tasks run outside every sandbox.
        raise click.UsageError(f"refusing to sweep with arms in the {how.detail}: an arm could reach the local Ray's "
                               "unix sockets and run code outside it. Install bubblewrap, or pass "
                               "--allow-weak-sandbox.")
    _check_output_path("--json", json_path)
    options = SweepOptions(sources=list(sources), out_dir=out_dir, torch=releases,
                           db_path=db_path or os.path.join(out_dir, "results.sqlite"), arms=arms, limit=limit,
                           settings=_settings(run))
    progress = _SweepProgress(err, name_builds=len(releases) > 1) if not run["quiet"] else None
    try:
        outcome = run_sweep(options, EngineOptions(ray_address=ray_address, num_cpus=num_cpus,
                                                   item_timeout_s=item_timeout, cpus_per_arm=cpus_per_arm),
                            github,
                            progress.update if progress else None,
                            log=None if run["quiet"] else lambda line: err.print(line, markup=False, highlight=False))
    except TorchEnvError as e:
        raise click.ClickException(f"--torch: {e}") from None
    except OSError as e:
        raise click.ClickException(f"{getattr(e, 'filename', None) or out_dir}: {e.strerror or e}") from None
    except StoreError as e:  # --db is not a results store (another file, a newer schema, corrupt)
        raise click.ClickException(str(e)) from None
    finally:
        if progress:
            progress.stop()
    from triage.report.markdown import visible

    for problem in outcome.problems:
        err.print(f"skipped: {visible(problem)}", markup=False, highlight=False)
    if json_path and os.path.abspath(json_path) != os.path.abspath(outcome.files["json"]):
        shutil.copyfile(outcome.files["json"], json_path)
    counts: dict[str, int] = {}
    for r in outcome.results:
        counts[r.verdict_kind or r.outcome] = counts.get(r.verdict_kind or r.outcome, 0) + 1
    items = len({r.key for r in outcome.results})
    results = f", {len(outcome.results)} results" if len(outcome.torch_builds) > 1 else ""
    err.print(f"{items} items on torch {' and '.join(outcome.torch_builds)}{results} ({outcome.ran} run now, "
              f"{len(outcome.results) - outcome.ran} already stored)"
              + "".join(f"{', ' if i else ': '}{n} {k}"
                        for i, (k, n) in enumerate(sorted(counts.items(), key=lambda kv: -kv[1])))
              + f". Report: {outcome.files['html']}", markup=False, highlight=False)
    if not outcome.results:
        err.print("Nothing to triage: no source gave an item.", markup=False, highlight=False)
    if outcome.stats is not None:
        err.print(outcome.stats.describe(), markup=False, highlight=False)
    with open(outcome.files["markdown"], encoding="utf-8") as f:
        _write_step_summary(None, f.read())
    unposted, unreachable = _post_swept(outcome.results, github, err) if post else (0, False)
    if outcome.github_unreachable or unreachable:
        sys.exit(EXIT_GITHUB_UNREACHABLE)  # the same sweep again runs only what is missing
    sys.exit(EXIT_NOT_POSTED if unposted else EXIT_VERDICT if outcome.results else EXIT_COULD_NOT_RUN)


def _post_swept(results: list[Any], github: Any, err: Any) -> tuple[int, bool]:
    """Each swept issue's comment, through the same idempotent upsert as `triage issue --post`
    (every arm has ended); how many could not be posted, each said why, and whether any of
    them failed because GitHub could not be reached."""
    from github import GithubException

    from triage.github import GitHubUnreachable, PublishError, connect, post_report
    from triage.report.data import validate_report
    from triage.report.markdown import visible

    gh, unposted, unreachable = connect(github), 0, False
    for result in results:
        if result.kind != "issue" or result.outcome != "triaged" or not result.report:
            continue
        if unreachable:  # each further post would wait out the same retries
            unposted += 1
            err.print(f"{visible(result.key)}: not posted: GitHub could not be reached (above)", markup=False,
                      highlight=False)
            continue
        problems = validate_report(result.report)
        try:
            if problems:
                raise PublishError(f"its report is not valid ({problems[0]})")
            posted = post_report(gh, result.report, github, full_report="the sweep's report (`sweep.html`)")
            line = f"{result.key}: {posted.action} comment {posted.comment_url}"
        except (PublishError, GithubException) as e:
            unposted += 1
            unreachable |= isinstance(e, GitHubUnreachable)
            line = f"{result.key}: not posted: {e if isinstance(e, PublishError) else f'GitHub answered {e.status}'}"
        err.print(visible(line), markup=False, highlight=False)
    return unposted, unreachable


@main.command("calibrate")
@click.option("--device", default="cpu", show_default=True, metavar="DEVICE",
              help="Measure the kernels of this device (cpu, cuda).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(["float32", "float16", "bfloat16"]),
              default=("float32", "float16", "bfloat16"), show_default=True, help="Dtypes to measure (repeatable).")
@click.option("--op", "ops", multiple=True, metavar="NAME",
              help="Only these OpInfo entries (e.g. softmax, nn.functional.gelu); repeatable. Default: all.")
@click.option("--table", "table_path", default=None, metavar="PATH",
              help="The table to add this machine's entry to. Default: the one shipped in the package.")
@click.option("--time-limit", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Start no OpInfo entry past this many seconds; the entry says how far it came.")
@click.option("--pass", "passes", multiple=True, type=click.Choice(["forward", "backward"]),
              default=("forward", "backward"), show_default=True,
              help="The samples' own calls, and the pointwise backward kernels their gradients call "
                   "(tanh_backward, silu_backward …); one pass alone is merged into this machine's entry.")
def calibrate_command(device: str, dtypes: tuple[str, ...], ops: tuple[str, ...], table_path: str | None,
                      time_limit: float | None, passes: tuple[str, ...]) -> None:
    """Measure every aten kernel's error on PyTorch's own op database (OpInfo) and add this
    machine's entry (torch release, device, CPU capability) to the kernel error table the
    rounding simulation reads. Runs PyTorch's sample inputs only, never a script; needs the
    `expecttest` package (OpInfo imports it)."""
    from pathlib import Path

    from rich.console import Console

    from triage.worker import kernel_errors

    err = Console(stderr=True, soft_wrap=True)
    try:
        import expecttest  # noqa: F401
    except ImportError:
        raise click.ClickException("OpInfo needs the expecttest package: pip install expecttest") from None
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise click.ClickException(f"--device {device}: no CUDA device on this machine")
    with err.status("measuring kernels") as status:
        entry = kernel_errors.measure(device, dtypes, ops or None, progress=lambda name: status.update(f"measuring {name}"),
                                      time_limit=time_limit, passes=passes)
    path = Path(table_path) if table_path else kernel_errors.TABLE
    try:
        kernel_errors.write(entry, path, partial=bool(ops) or "coverage" in entry
                            or set(passes) != set(kernel_errors.PASSES))
    except OSError as e:
        raise click.ClickException(f"cannot write the table {path}: {e.strerror}") from None
    measured = sum(len(per) for per in entry["ops"].values())
    click.echo(f"{len(entry['ops'])} aten ops, {measured} op × dtype measured on torch {entry['torch']} "
               f"{entry['device']} {entry['capability']} in {entry['seconds']:.0f} s: {path}"
               + (f" (partial: {entry['coverage']})" if "coverage" in entry else ""))


@main.command("post")
@click.option("--report", "report_path", required=True, metavar="PATH", help="report.json from `triage issue`.")
@click.option("--repo", envvar="GITHUB_REPOSITORY", default=None, metavar="OWNER/REPO",
              help="The repository the report must be about (required). Env: GITHUB_REPOSITORY.")
@click.option("--expect-issue", type=click.IntRange(min=1), default=None, metavar="N",
              help="The issue the report must be about: any other is refused (exit 4).")
@click.option("--run-title", envvar="TRIAGE_RUN_TITLE", default=None, metavar="TEXT",
              help="In the Action: the title of the triage-run run that triggered this post, 'triage #N' "
                   "(github.event.workflow_run.display_title); the report must be about issue N. "
                   "Env: TRIAGE_RUN_TITLE.")
@click.option("--no-trigger-label", is_flag=True,
              help="Post whatever labels the issue carries (otherwise --trigger-label is required).")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Read the token from this file (or /dev/fd/N) when posting, after every arm has ended, "
                   "instead of GITHUB_TOKEN.")
@_github_options
def post_command(report_path: str, repo: str | None, expect_issue: int | None, run_title: str | None,
                 no_trigger_label: bool, api_url: str, bot_login: str | None, allowed_labels: str | None,
                 trigger_label: str | None, token_file: str | None) -> None:
    """Validate report.json, render its comment and post it. Never runs code from the issue.

    The report comes from a job that ran the issue's code, which may have rewritten it: the
    repository (--repo) and the issue (--expect-issue, or --run-title in the Action) it may be
    about come from the caller, never from the report.

    Exit status: 0 posted (or left unchanged), 2 usage error or a report triage will not post,
    4 not posted (said why), 6 GitHub could not be reached."""
    from rich.console import Console

    from triage.github import is_repo_name, issue_from_run_title, load_report
    from triage.report.markdown import visible

    if not repo or not is_repo_name(repo):
        raise click.UsageError("--repo OWNER/REPO (or GITHUB_REPOSITORY) is required: the repository the report "
                               "must be about" + (f"; {repo!r} is not one" if repo else ""))
    if (expect_issue is None) == (run_title is None):
        raise click.UsageError("give exactly one of --expect-issue N and --run-title 'triage #N' (TRIAGE_RUN_TITLE): "
                               "the issue the report must be about")
    if not trigger_label and not no_trigger_label:
        raise click.UsageError("give --trigger-label LABEL (TRIAGE_TRIGGER_LABEL), the label that asked for the run "
                               "and must still be on the issue, or --no-trigger-label to post regardless of labels")
    if trigger_label and no_trigger_label:
        raise click.UsageError("--trigger-label and --no-trigger-label contradict each other")
    err = Console(stderr=True, soft_wrap=True)
    github = _github(api_url, bot_login, allowed_labels, trigger_label, err)
    if run_title is not None:
        try:
            expect_issue = issue_from_run_title(run_title)
        except ValueError as e:
            _not_posted(str(e), err)
    data, problems = load_report(report_path)
    if not problems and data["issue"]["repo"].lower() != repo.lower():
        problems = [f"the report is about {data['issue']['repo']}, not {repo}"]
    if problems:
        err.print(f"{report_path} is not a report triage will post:", markup=False, highlight=False)
        for p in problems:
            err.print(f"  {visible(p)}", markup=False, highlight=False)
        sys.exit(EXIT_USAGE)
    if data["issue"]["number"] != expect_issue:
        source = "the issue whose run triggered this post" if run_title is not None else "--expect-issue"
        _not_posted(f"the report is about {data['issue']['repo']}#{data['issue']['number']}, but {source} is "
                    f"#{expect_issue} (a report rewritten after triage ran?); nothing posted", err)
    _take_token_file(github, token_file)
    if not github.token:
        raise click.UsageError("posting needs a token: set GITHUB_TOKEN or give --token-file")
    _post(data, github, err)


def _take_token_file(github: Any, token_file: str | None) -> None:
    """The token, read from its file only now, when every arm process has ended."""
    if not token_file:
        return
    from triage.sandbox.environment import read_secret_file

    try:
        github.token = read_secret_file(token_file)
    except (OSError, ValueError) as e:
        raise click.UsageError(f"--token-file {token_file}: {getattr(e, 'strerror', None) or e}") from None


def _post(data: dict[str, Any], github: Any, err: Any) -> None:
    from github import GithubException

    from triage.github import GitHubUnreachable, PublishError, connect, post_report
    from triage.report.markdown import visible

    try:
        result = post_report(connect(github), data, github)
    except (PublishError, GithubException) as e:
        if isinstance(e, PublishError):
            why = str(e)
        else:
            message = e.data.get("message", e.data) if isinstance(e.data, dict) else e.data
            why = f"GitHub answered {e.status}: {message}"
        _not_posted(why, err, EXIT_GITHUB_UNREACHABLE if isinstance(e, GitHubUnreachable) else EXIT_NOT_POSTED)
    line = f"{result.action} comment {result.comment_url}"
    if result.labels_added:
        line += "; labels added: " + ", ".join(result.labels_added)
    if result.labels_refused:
        line += "; not on the allowlist: " + ", ".join(result.labels_refused)
    if result.trigger_removed:
        line += f"; removed '{github.trigger_label}'"
    err.print(visible(line), markup=False, highlight=False)
    _write_step_summary(None, f"triage: {visible(line)}")


def _not_posted(why: str, err: Any, status: int = EXIT_NOT_POSTED) -> NoReturn:
    """Say why nothing was posted (terminal and job summary) and exit with `status`."""
    from triage.report.markdown import visible

    err.print(f"not posted: {visible(why)}", markup=False, highlight=False)
    _write_step_summary(None, f"triage: not posted: {visible(why)}")
    sys.exit(status)


def _load_issue(ref: str | None, event_path: str | None, github: Any) -> Any:
    """The issue from OWNER/REPO#N (API) or an event file, as data; usage errors otherwise."""
    import json

    from triage.extract import extract_issue_body
    from triage.github import connect, issue_from_api, issue_from_event, parse_issue_ref

    if (ref is None) == (event_path is None):
        raise click.UsageError("give exactly one of OWNER/REPO#N and --event PATH")
    if event_path is not None:
        try:
            with open(event_path, encoding="utf-8") as f:
                return issue_from_event(json.load(f), extract_issue_body)
        except (OSError, ValueError, RecursionError) as e:
            raise click.UsageError(f"cannot read the event {event_path}: {e}") from None
    try:
        repo, number = parse_issue_ref(ref)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    from github import GithubException

    from triage.github import GitHubUnreachable, PublishError

    try:
        return issue_from_api(connect(github), repo, number, github, extract_issue_body)
    except GithubException as e:
        raise click.ClickException(f"cannot read {repo}#{number} from {github.api_url}: GitHub answered {e.status}") from None
    except GitHubUnreachable as e:
        failed = click.ClickException(f"cannot read {repo}#{number}: {e}")
        failed.exit_code = EXIT_GITHUB_UNREACHABLE
        raise failed from None
    except PublishError as e:
        raise click.ClickException(str(e)) from None


def _settings(run: dict[str, Any], script_args: tuple[str, ...] = ()) -> Settings:
    """The run options (`_run_options`' flags) as the run's `Settings`: the one place a flag
    becomes a setting, for `run`, `issue` and `sweep` alike."""
    _check_cache_root()
    return Settings(
        run=RunSettings(timeout_s=run["timeout"], memory_bytes=_memory(run["memory"]), seed=run["seed"],
                        reference=not run["no_reference"], jobs=run["jobs"],
                        rounding_samples=run["rounding_samples"], rounding_budget_s=run["rounding_budget"],
                        isolation=run["isolation"], script_args=script_args),
        ablation=AblationSettings(enabled=run["ablate"], budget_s=run["ablate_budget"],
                                  exhaustive=run["all_ablations"]),
        minimize=MinimizeSettings(enabled=run["minimize"], budget_s=run["minimize_budget"],
                                  reduce_data=run["reduce_data"]))


def _check_cache_root() -> None:
    """The caches' folder (TRIAGE_CACHE_DIR, else $XDG_CACHE_HOME/triage) must be one triage can
    make: said before any arm runs, not as a traceback once the arms are chosen."""
    from triage.sandbox.caches import cache_root

    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        raise click.UsageError(f"the cache folder {root} cannot be used ({e.strerror}); set TRIAGE_CACHE_DIR "
                               "to a folder triage may write") from None


def _prepare(run: dict[str, Any], source: str | None,
             script_args: tuple[str, ...] = ()) -> tuple[list[Any], Settings, list[str]]:
    """The arms, the settings and the report's first notes of a `run` or `issue`: without
    --arms, the arms follow what the script (`source`) compares; arms on another torch release
    get its interpreter (installed first where this machine lacks it)."""
    notes: list[str] = []
    try:
        arms = parse_arms(run["arms_text"]) if run["arms_text"] is not None else None
    except ArmSpecError as e:
        raise click.UsageError(str(e)) from None
    if arms is None:
        arms, chosen = default_arms(source)
        notes.extend(chosen)
    if script_args:
        notes.append(_args_note(script_args))
    _isolation(run["isolation"])
    settings = _settings(run, script_args)
    settings = dataclasses.replace(settings, run=dataclasses.replace(
        settings.run, interpreters=_torch_releases([a.torch for a in arms], run["quiet"])))
    _preload_rendering()
    return arms, settings, notes


@contextlib.contextmanager
def _progress_display(arms: list[Any], quiet: bool) -> Iterator[Reporter]:
    """The pipeline's reporter: the live status display (nobody with --quiet), stopped however
    the pipeline ends."""
    progress = _Progress(_console(stderr=True), [a.spec for a in arms]) if not quiet else None
    try:
        yield progress or QUIET
    finally:
        if progress:
            progress.stop()


def _torch_releases(releases: list[str | None], quiet: bool) -> dict[str, str]:
    """The interpreters of arms on other torch releases (`cpu/compile@2.15.0`), each release's
    environment installed first where this machine does not have it yet (said on stderr)."""
    from triage.sandbox.torch_envs import TorchEnvError, interpreters_for

    err = _console(stderr=True)
    try:
        return interpreters_for(releases, log=None if quiet else lambda line: err.print(line, highlight=False,
                                                                                       markup=False))
    except (TorchEnvError, OSError) as e:
        failed = click.ClickException(f"a requested arm cannot run here: its torch release could not be installed: {e}")
        failed.exit_code = EXIT_NOT_TESTED  # as for `cuda` without a GPU; no arm has run
        raise failed from None


def _isolation(requested: str) -> Any:
    """The isolation arms will get; `--isolation namespace` where it cannot be had is a usage error."""
    from triage.sandbox import isolation

    how = isolation(requested)
    if requested == "namespace" and not how.strong:
        raise click.UsageError(f"--isolation namespace: not available here ({how.detail})")
    return how


def _preload_rendering() -> None:
    """Import and read, before any arm runs, all the code and templates used after the arms:
    nothing triage executes after a repro ran is loaded from where a repro could have written."""
    import triage.report.terminal  # noqa: F401
    from triage.report.comment import template_environment
    from triage.report.data import load_schema

    load_schema()
    template_environment()


def _preload_posting() -> None:
    """PyGithub and its dependencies, and triage's GitHub stage, imported while no arm has run."""
    import github  # noqa: F401

    import triage.github  # noqa: F401


def _finish(report: Any, json_path: str | None, comment_path: str, minimal_path: str,
            quiet: bool) -> tuple[dict[str, Any], list[str]]:
    """Write what the user asked for, print the terminal view; the report's JSON data and the
    paths that could not be written (each said on stderr; every other output is still written)."""
    from rich.console import Console

    from triage.report.comment import render_comment
    from triage.report.data import report_json, write_json
    from triage.report.terminal import render_terminal
    from triage.untrusted import UntrustedOutput, remove_tree

    data = report_json(report)
    written: list[str] = []
    unwritten: list[str] = []

    def attempt(path: str, write: Any) -> None:
        try:
            write()
            written.append(path)
        except (OSError, UntrustedOutput) as e:
            unwritten.append(path)
            why = e.strerror or e if isinstance(e, OSError) else e
            Console(stderr=True, soft_wrap=True).print(f"could not write {path}: {why}", markup=False, highlight=False)

    try:
        if json_path:
            attempt(json_path, lambda: write_json(data, json_path))
        _write_minimal(report, minimal_path, attempt)
    finally:
        if report.minimal_dir:
            remove_tree(report.minimal_dir)
    if comment_path and comment_path != "-":
        # The comment names report.json only when it was written, by base name (no local path
        # in a public comment).
        full_report = f"`{os.path.basename(json_path)}`" if json_path and json_path in written else None
        attempt(comment_path, lambda: _write_text(comment_path, render_comment(data, full_report=full_report)))
    if not quiet:
        console = _console()
        render_terminal(data, console)
        if written:
            console.print("wrote " + ", ".join(written), markup=False, highlight=False)
    return data, unwritten


def _console(stderr: bool = False) -> Any:
    """The console for the summary (stdout) or the progress (stderr).  Piped or redirected, the
    text is for logs and for copying: prose, boxes and tables wrap at an exported COLUMNS, else
    at `PIPED_WIDTH`, as in a terminal that wide (code and URLs are printed whole either way), and
    no colour or cursor control is written, even where FORCE_COLOR asks for it."""
    from rich.console import Console

    if _is_tty(sys.stderr if stderr else sys.stdout):
        return Console(stderr=stderr)
    width = None if os.environ.get("COLUMNS", "").isdigit() else PIPED_WIDTH  # None: rich reads COLUMNS
    return Console(stderr=stderr, width=width, force_terminal=False)


def _is_tty(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _source(path: str) -> str | None:
    """The script's text for choosing arms (None when unreadable: extract reports why)."""
    from triage.extract import ScriptUnreadable, read_script

    try:
        # Never a plain open(): a FIFO named as the script would block it for ever.
        return read_script(path)[1].decode("utf-8", errors="replace")
    except ScriptUnreadable:
        return None


def _exit_code(report: Any) -> int:
    from triage.classify.facts import compiled_nothing

    ran_nothing = report.comparison is None or all(not r.completed for r in report.comparison.arms)
    if report.verdict.kind == "could-not-run" and ran_nothing:
        return EXIT_COULD_NOT_RUN
    stood_in = report.reported is not None and report.reported.judged and report.verdict.kind != "could-not-run"
    if report.comparison is not None and not stood_in and any(
            r.status == "unavailable" or compiled_nothing(r) for r in report.comparison.arms):
        return EXIT_NOT_TESTED  # a requested arm did not run as asked here: no verdict on the comparison asked for
    return EXIT_VERDICT


def _write_step_summary(data: dict[str, Any] | None, line: str | None = None) -> None:
    """The full report (or one line) in the Action's job summary, under its 1 MiB cap."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    from triage.report.comment import SUMMARY_LIMIT_BYTES, render_comment

    text = render_comment(data, SUMMARY_LIMIT_BYTES, size=lambda t: len(t.encode("utf-8"))) if data else f"{line}\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def _write_minimal(report: Any, path: str, attempt: Any) -> None:
    """The verified script (and its inputs file) where the user asked, each write through
    `attempt(path, write)`."""
    m = report.minimal
    if m is None or not path or path == "-":
        return
    attempt(path, lambda: _write_text(path, m.script))
    if m.inputs_file and report.minimal_dir:
        target = os.path.join(os.path.dirname(os.path.abspath(path)), m.inputs_file)
        attempt(target, lambda: _copy_inputs(os.path.join(report.minimal_dir, m.inputs_file), target))


def _copy_inputs(source: str, target: str) -> None:
    """The minimal script's inputs file, as the warm worker wrote it: a regular file, not a
    link to something else of the user's."""
    from triage.untrusted import open_regular

    with open_regular(source, MAX_INPUTS_BYTES) as f, open(target, "wb") as out:
        shutil.copyfileobj(f, out)


class _SweepProgress:
    """A progress bar over a sweep's items, with the verdicts so far (on stderr)."""

    def __init__(self, console: Any, name_builds: bool = False) -> None:
        """`name_builds`: the sweep runs on several torch builds; each line says which."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.name_builds = name_builds
        self.counts: dict[str, int] = {}
        self.total = 0
        self.lock = threading.Lock()
        self.bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.description}"), console=console, transient=True) \
            if console.is_terminal else None
        self.task = self.bar.add_task("", total=None) if self.bar else None
        if self.bar:
            self.bar.start()

    def update(self, event: str, work: Any, result: Any) -> None:
        from triage.report.markdown import visible

        with self.lock:
            if event == "planned":
                self.total = work
            if event == "finished" and result is not None:
                kind = result.verdict_kind or result.outcome
                self.counts[kind] = self.counts.get(kind, 0) + 1
                if not self.bar:
                    on = f" on {visible(result.torch_build)}" if self.name_builds else ""
                    self.console.print(f"{visible(result.key)}{on}: {kind} ({result.seconds:.1f}s)", markup=False,
                                       highlight=False)
            if self.bar:
                self.bar.update(self.task, total=self.total,
                                completed=sum(self.counts.values()),
                                description=", ".join(f"{n} {k}" for k, n in sorted(self.counts.items())))

    def stop(self) -> None:
        if self.bar:
            self.bar.stop()


class _Progress(Reporter):
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

    def _set(self, name: str, state: str, restart: bool = False, line: str | None = None) -> None:
        """`name`'s state; `line` printed instead where there is no live status (piped output)."""
        with self.lock:
            if restart or name not in self.state:
                self.started[name] = time.monotonic()
            self.state[name] = state
            if self.status:
                self.status.update(self._text())
            elif line:
                self.console.print(line.format(seconds=time.monotonic() - self.started[name]), highlight=False)

    def arm_started(self, arm: str) -> None:
        self._set(arm, "starting", restart=True)

    def arm_phase(self, arm: str, phase: str) -> None:
        if phase in self.PHASES:
            self._set(arm, self.PHASES[phase])

    def arm_ended(self, arm: str, status: str) -> None:
        self._set(arm, f"done: {status}", line=f"arm {arm}: {status} after {{seconds:.1f}}s")

    def minimize_step(self, step: str) -> None:
        self._set("minimize", step)

    def minimize_ended(self, verified: bool) -> None:
        status = "verified" if verified else "not verified"
        self._set("minimize", status, line=f"minimize: {status} after {{seconds:.1f}}s")

    def stop(self) -> None:
        if self.status:
            self.status.stop()
