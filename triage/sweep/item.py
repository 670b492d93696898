"""One sweep item through the same pipeline as `triage run` / `triage issue`, inside its Ray task.

`triage_item` is what the engine runs on whichever node takes the item: it writes the item's
text where the pipeline reads it, runs `triage_script` or `triage_issue` (every arm in its own
sandbox, as on the command line), and hands back an `ItemResult` holding the report.  It never
raises for anything the item does: a script that does not parse, hangs or crashes is a
could-not-run verdict in its report, as `triage run` gives it.  Only triage's own failures
raise, and the engine records those as failed items.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from datetime import UTC, datetime
from typing import Any

from triage.settings import Settings
from triage.sweep.model import ItemResult, SweepItem


@dataclasses.dataclass(frozen=True)
class ItemTask:
    """What an item's Ray task gets beside the item (plain data: it travels through Ray)."""

    settings: Settings  # as the command line built them, for every item of the sweep
    torch: str | None  # the torch release every arm runs on (None: the one triage runs with)
    cpus_per_arm: float  # what the item asked Ray for: its arms' share of the node


def triage_item(item: SweepItem, arms: tuple[str, ...], build: str, task: ItemTask) -> ItemResult:
    """The item's report on this node's torch, or on `task.torch`'s release from its
    environment (built on this node where it is missing), as an `ItemResult` (outcome
    ``triaged``)."""
    from triage.arms.spec import parse_arm
    from triage.pipeline import triage_issue, triage_script
    from triage.report.data import report_json
    from triage.sandbox.torch_envs import interpreters_for

    run = task.settings.run
    specs = [dataclasses.replace(parse_arm(a), torch=task.torch) if task.torch else parse_arm(a) for a in arms]
    # Without --memory, each arm gets the share of this node that Ray's CPU count gives it.
    settings = dataclasses.replace(task.settings, run=dataclasses.replace(
        run, memory_bytes=run.memory_bytes or _arm_share(task.cpus_per_arm),
        interpreters=interpreters_for([s.torch for s in specs], run.cache_dir)))
    workdir = tempfile.mkdtemp(prefix="triage-sweep-item-")
    try:
        if item.kind == "issue":
            report = triage_issue(issue_of(item), workdir, specs, settings)
        else:
            report = triage_script(_script_path(item, workdir), specs, settings)
        if report.minimal_dir:
            shutil.rmtree(report.minimal_dir, ignore_errors=True)
        data = report_json(report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return ItemResult(key=item.key, kind=item.kind, title=item.title, content_sha256=item.content_sha256,
                      torch_build=build, arms=",".join(arms), outcome="triaged", url=item.url,
                      verdict_kind=report.verdict.kind, expected=report.verdict.expected,
                      summary=report.verdict.summary, report=data,
                      finished_at=datetime.now(UTC).isoformat(timespec="seconds"))


def issue_of(item: SweepItem) -> Any:  # noqa: ANN401 - triage.model.Issue
    """The issue item as the pipeline's `Issue`, its repro extracted from the body."""
    from triage.extract import extract_issue_body
    from triage.github import body_sha256
    from triage.model import Issue

    info = item.issue or {}
    repo, _, number = item.key.rpartition("#")
    return Issue(repo=str(info.get("repo") or repo), number=int(info.get("number") or number), title=item.title,
                 url=item.url or "", author=str(info.get("author") or ""), body_sha256=body_sha256(item.text),
                 extraction=extract_issue_body(item.text))


def _script_path(item: SweepItem, workdir: str) -> str:
    """The script where the pipeline reads it: the swept file itself where this node has it
    unchanged (files beside it, such as saved weights, stay in reach), else a copy of the text
    the driver read."""
    if item.path and os.path.isfile(item.path):
        try:
            with open(item.path, encoding="utf-8", errors="surrogateescape") as f:
                if f.read() == item.text:
                    return item.path
        except OSError:
            pass
    path = os.path.join(workdir, os.path.basename(item.path or item.key) or "repro.py")
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(item.text)
    return path


def _arm_share(cpus_per_arm: float) -> int:
    """Memory per arm where none was given: its CPUs' share of this node's memory, since Ray
    runs as many arms at once as the node's cores divided by each arm's CPUs."""
    pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return max(512 << 20, int(pages * page * min(1.0, cpus_per_arm) / max(1, os.cpu_count() or 1)))
