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

EXIT_VERDICT, EXIT_USAGE, EXIT_COULD_NOT_RUN = 0, 2, 3


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


@main.command("run")
@click.argument("script", type=click.Path(dir_okay=True, path_type=str))
@click.option("--arms", "arms_text", default=None, metavar="SPECS",
              help="Comma-separated arms, e.g. cpu,cuda or cpu,cpu/compile or cuda/tf32=off. "
                   "Default: cpu,cuda where CUDA is present, else cpu against float64.")
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds the script may run in each arm.")
@click.option("--memory", default=None, metavar="SIZE", help="Memory limit per arm (e.g. 8G). Default: a share of RAM.")
@click.option("--json", "json_path", default=None, metavar="PATH", help="Write report.json here.")
@click.option("--comment", "comment_path", default="comment.md", show_default=True, metavar="PATH",
              help="Write the GitHub comment (markdown) here; '-' to skip.")
@click.option("--no-reference", is_flag=True, help="Skip the float64 reference replay.")
@click.option("--minimize/--no-minimize", default=True, show_default=True,
              help="Reduce a divergence between two arms to its minimal op set and a verified script.")
@click.option("--minimal", "minimal_path", default="minimal.py", show_default=True, metavar="PATH",
              help="Write the minimal repro script here (its inputs file, if any, beside it); '-' to skip.")
@click.option("--minimize-budget", type=click.FloatRange(min=1), default=900.0, show_default=True,
              help="Seconds the reduction passes may take; the smallest op set found by then is kept.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for every generator, in every arm.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Arms run at once (default: cores).")
@click.option("--quiet", is_flag=True, help="No progress and no terminal summary.")
def run_command(script: str, arms_text: str | None, timeout: float, memory: str | None, json_path: str | None,
                comment_path: str, no_reference: bool, minimize: bool, minimal_path: str, minimize_budget: float,
                seed: int, jobs: int | None, quiet: bool) -> None:
    """Run SCRIPT on isolated arms, judge it against the accuracy policy, write the comment."""
    from rich.console import Console

    from triage.minimize import MinimizeOptions
    from triage.pipeline import triage_script
    from triage.report import render_comment, render_terminal, write_json

    notes: list[str] = []
    try:
        arms = parse_arms(arms_text) if arms_text is not None else None
    except ArmSpecError as e:
        raise click.UsageError(str(e)) from None
    if arms is None:
        arms, note = default_arms()
        if note:
            notes.append(note)
    options = RunOptions(timeout_s=timeout, memory_bytes=_memory(memory), seed=seed,
                         reference=not no_reference, jobs=jobs)
    err = Console(stderr=True)
    progress = _Progress(err, [a.spec for a in arms]) if not quiet else None
    try:
        report = triage_script(script, arms, options, progress=progress.update if progress else None, notes=notes,
                               minimize=MinimizeOptions(enabled=minimize, budget_s=minimize_budget))
    finally:
        if progress:
            progress.stop()
    if json_path:
        write_json(report, json_path)
    minimal_written = _write_minimal(report, minimal_path)
    if report.minimal_dir:
        shutil.rmtree(report.minimal_dir, ignore_errors=True)
    if comment_path and comment_path != "-":
        with open(comment_path, "w", encoding="utf-8") as f:
            f.write(render_comment(report))
    if not quiet:
        render_terminal(report, Console())
        written = [p for p in (json_path, comment_path if comment_path != "-" else None) if p] + minimal_written
        if written:
            Console().print("wrote " + ", ".join(written), highlight=False)
    ran_nothing = report.comparison is None or all(
        not r.completed for r in report.comparison.arms)
    sys.exit(EXIT_COULD_NOT_RUN if report.verdict.kind == "could-not-run" and ran_nothing else EXIT_VERDICT)


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
