"""A sweep from its sources to its report: the driver's side of `triage sweep`.

Items come from the sources (`sources.py`); each gets its arms (those asked for, else what its
script compares, as `triage run` picks them) and becomes one Ray task (`engine.py`) unless the
results store (`store.py`) already holds its triaged result for this torch build, script text
and arms — so a sweep resumes where it stopped and a finished one re-runs nothing.  Each result
is committed the moment it arrives.  The report (`report.py`, with `buckets.py`) covers every
item of the sweep, with what the store knows of the same items on other torch builds.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from triage.settings import Settings
from triage.sweep.item import ItemTask, triage_item
from triage.sweep.model import ItemResult, SweepItem


@dataclass
class SweepOptions:
    sources: list[str]
    out_dir: str  # sweep.html, sweep.md, sweep.json
    db_path: str  # the results store
    arms: tuple[str, ...] | None = None  # None: each item's own, as `triage run` picks them
    settings: Settings = field(default_factory=Settings)  # every item's, shipped to its task unchanged
    limit: int | None = None  # issues taken from each search query
    title: str = "triage sweep"
    # Torch releases to run every item on, each in its own cached environment
    # (sandbox/torch_envs.py); empty: the torch triage runs with.
    torch: tuple[str, ...] = ()


@dataclass
class SweepOutcome:
    results: list[ItemResult]  # one per item of this sweep and torch build
    ran: int  # items run by this sweep (the rest were stored already)
    problems: list[str]  # sources or items that gave nothing to run, one line each
    github_unreachable: bool  # a GitHub source among them failed because GitHub could not be reached
    torch_builds: list[str]  # the builds this sweep ran on, in --torch order
    stats: Any  # engine.EngineStats, None where nothing ran
    files: dict[str, str]  # "html" | "markdown" | "json" -> path


# The engine's events ("started", "retried", "finished") with the item's work, and first
# ("planned", number of items to run, None).
Progress = Callable[[str, Any, ItemResult | None], None]


def run_sweep(options: SweepOptions, engine: Any, github: Any = None,  # noqa: ANN401 - EngineOptions, GitHubOptions
              progress: Progress | None = None, log: Callable[[str], None] | None = None) -> SweepOutcome:
    """Resolve the sources, prepare each torch release's environment (`log` says when one is
    installed), run what the store does not hold yet, write the report."""
    from triage.report.comment import SUMMARY_LIMIT_BYTES
    from triage.sandbox.torch_envs import running_env, torch_env
    from triage.sweep.engine import ItemWork, run_items
    from triage.sweep.report import build_report, render_html, render_markdown
    from triage.sweep.sources import items_from
    from triage.sweep.store import ResultStore

    started = datetime.now(UTC).isoformat(timespec="seconds")
    began = time.monotonic()
    found = items_from(list(options.sources), github, limit=options.limit)
    # Built here, once, before any task: a task on this node finds its release ready (a task
    # on another node of a cluster builds it there, under the same lock).
    cache_dir = options.settings.run.cache_dir
    envs = list({e.build: e for e in (torch_env(v, cache_dir, log) for v in options.torch)}.values()) or [running_env()]
    builds = [e.build for e in envs]
    work = [ItemWork(item=item, arms=options.arms or arms_for(item), torch_build=env.build,
                     settings=ItemTask(options.settings, torch=None if env.running else env.version,
                                       cpus_per_arm=engine.cpus_per_arm))
            for env in envs for item in found.items]
    keys = {id(w): (w.item.key, w.item.content_sha256, w.torch_build, ",".join(w.arms)) for w in work}
    os.makedirs(options.out_dir, exist_ok=True)
    with ResultStore(options.db_path) as store:
        sweep_id = store.start_sweep(list(options.sources), builds, ",".join(options.arms or ()))
        known = store.done(keys.values())
        todo = [w for w in work if keys[id(w)] not in known]
        stats = None
        if todo:
            if progress:
                progress("planned", len(todo), None)
            stats = run_items(todo, triage_item, lambda result: store.put(result, sweep_id=sweep_id), engine, progress)
        results = [r for w in work if (r := store.get(*keys[id(w)])) is not None]
        on_other_builds = [r for item in found.items for r in store.latest(item.key)
                           if r.torch_build not in builds and r.content_sha256 == item.content_sha256]
        counts = {"items": len(found.items), "results": len(work), "ran": len(todo), "stored": len(work) - len(todo),
                  "triaged": sum(r.outcome == "triaged" for r in results),
                  "failed": sum(r.outcome == "failed" for r in results)}
        store.finish_sweep(sweep_id, counts)
    report = build_report(results + on_other_builds, title=options.title,
                          torch_builds=builds + sorted({r.torch_build for r in on_other_builds}),
                          sources=list(options.sources), started=started, seconds=time.monotonic() - began)
    files = {"html": os.path.join(options.out_dir, "sweep.html"),
             "markdown": os.path.join(options.out_dir, "sweep.md"),
             "json": os.path.join(options.out_dir, "sweep.json")}
    _write(files["html"], render_html(report))
    # Sized for a job summary (1 MiB); a GitHub issue takes the first 65,536 characters.
    _write(files["markdown"], render_markdown(report, limit=SUMMARY_LIMIT_BYTES, size=lambda t: len(t.encode())))
    _write(files["json"], json.dumps(summary(results, found.problems, builds, counts, stats), indent=2) + "\n")
    return SweepOutcome(results=results, ran=len(todo), problems=found.problems,
                        github_unreachable=found.github_unreachable, torch_builds=builds, stats=stats, files=files)


def arms_for(item: SweepItem) -> tuple[str, ...]:
    """The arms `triage run` would pick for the item's script (for an issue, the script its
    body gives; none found: `cpu`, and the report says why it could not run)."""
    from triage.arms.spec import default_arms

    source = item.text
    if item.kind == "issue":
        from triage.extract import extract_issue_body

        source = extract_issue_body(item.text).script or ""
    arms, _ = default_arms(source)
    return tuple(a.spec for a in arms)


def summary(results: list[ItemResult], problems: list[str], builds: list[str], counts: dict[str, int],
            stats: Any = None) -> dict[str, Any]:  # noqa: ANN401 - engine.EngineStats
    """sweep.json (and `--json`'s copy): one entry per item and torch build, without the
    reports (those are in the store), and what the engine measured of this sweep (None where
    every item was stored already)."""
    return {"torch_builds": builds, "counts": counts, "problems": problems,
            "engine": dataclasses.asdict(stats) if stats is not None else None,
            "items": [{"key": r.key, "title": r.title, "url": r.url, "torch_build": r.torch_build,
                       "outcome": r.outcome, "verdict": r.verdict_kind,
                       "expected": r.expected, "arms": r.arms, "seconds": round(r.seconds, 2), "node": r.node,
                       "error": r.error} for r in results]}


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
