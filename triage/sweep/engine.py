"""The sweep's engine: every item is one Ray task; Ray places, queues and retries them.

Ray is the scheduler, never a home-made one.  All items are submitted at once, each with the
resources its arms need (`resources_for`: a CPU per arm, a GPU where an arm is CUDA, and the
item's ``accelerator_type`` where it names a GPU model), and Ray runs each where and when a node
has room.  An item that no node alive at submission can hold (eight GPUs, a GPU model the
cluster lacks) fails at once instead of waiting for ever.  Embedded by default (`ray.init`
starts a local Ray on this machine, its cores detected by Ray); with an address the sweep joins
that cluster.

Untrusted code: a task starts the item's arms, sandboxed subprocesses running a reporter's
script.  The task function is declared with ``max_calls=1``, so the Ray worker process that ran
an item exits after it and is never handed another item.  When a worker exits or is killed,
Ray kills its child processes, the arms' sandboxes (bubblewrap's --die-with-parent takes the
processes inside a namespace sandbox along).

Retries are for the infrastructure only.  ``max_retries`` with ``retry_exceptions=False`` makes
Ray re-run a task whose worker process or node died, never one that returned or raised: a
verdict, or triage's own error, is never re-rolled.  A task that raised becomes a ``failed``
result naming the exception; one whose retries ran out becomes a ``failed`` result naming the
infrastructure failure.  (Ray counts a worker its memory monitor killed apart, under its
``task_oom_retries`` setting, not ``max_retries``.)

The per-item budget (`EngineOptions.item_timeout_s`) runs from the start of the item's current
attempt, not from its submission: a backlog queues for minutes, and a retry after a lost node
goes to the back of Ray's queue.  The driver learns of each attempt's start from a tiny actor on
its own node (`_StartLog`) that every attempt reports to before triaging; an attempt past its
budget is cancelled with ``ray.cancel(force=True)``, which kills its worker process and so its
arms.  Such an item is reported with outcome ``failed`` (error "exceeded the sweep's per-item
budget of N s"), not as a could-not-run verdict: triage produced no report, and the script may
well be fine with only this sweep's budget too short; ``failed`` marks it as one to run again.

Results reach the caller as each item finishes (`ray.wait`), through ``on_result``, exactly once
per item, so the caller can commit each at once; an interrupted sweep keeps everything
reported so far.  Order of completion is free.
"""
from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from triage.arms.spec import parse_arm
from triage.sweep.model import ItemResult, SweepItem

# How often the driver looks for newly started attempts (their budgets start then): the
# budget's precision, and the delay of a "started" progress event.
START_POLL_S = 0.5
# How long the driver waits for cancelled items' workers to be gone before it returns.
CANCEL_SETTLE_S = 30.0
ERROR_CHARS = 300

TriageOne = Callable[[SweepItem, tuple[str, ...], str, Any], ItemResult]
Progress = Callable[[str, "ItemWork", ItemResult | None], None]  # (event, work, result)


@dataclass
class EngineOptions:
    # None: a Ray of our own on this machine (`ray.init(address="local")`, never one found
    # running); "HOST:PORT" (or "auto"): join that cluster.  Ignored where the caller has
    # already initialized Ray, as are num_cpus, runtime_env and ray_temp_dir.
    ray_address: str | None = None
    # Local Ray only: the CPUs Ray may hand out; None: this machine's cores as Ray counts them
    # (container CPU limits included).
    num_cpus: int | None = None
    # CPUs an item asks for per arm.  An item's arms run at once, but most of its time is one
    # process at a time (the ablations and the minimizer's queries) or waiting (a fresh arm's
    # start, the slower arm): below 1, Ray runs more items on a node than it has cores.
    cpus_per_arm: float = 1.0
    # Wall seconds an attempt may run from its start; past it the item is cancelled and failed.
    item_timeout_s: float = 3600.0
    # Re-runs after the item's worker process or node died (Ray's max_retries).
    infrastructure_retries: int = 2
    # Passed to ray.init, e.g. {"env_vars": {...}}; it applies to every worker on every node.
    runtime_env: dict[str, Any] | None = None
    # Local Ray only: the root of Ray's session folders (logs of every worker, so of what
    # triage_one printed); None: <tmp>/triage-ray-<uid>, apart from other users' /tmp/ray.
    ray_temp_dir: str | None = None


@dataclass(frozen=True)
class ItemWork:
    """One item on one torch build with one set of arms: one Ray task.

    ``settings`` is passed to ``triage_one`` as it is (run options, output folder…): the
    engine never reads it.  ``accelerator_type`` (Ray's name of a GPU model, e.g. "H100",
    "A100-80G") pins the item to nodes with that GPU, so one item can be fanned out over
    several GPU generations as several ItemWorks."""

    item: SweepItem
    arms: tuple[str, ...]
    torch_build: str
    accelerator_type: str | None = None
    settings: Any = field(default_factory=dict)  # plain data: Ray pickles it to the task


@dataclass(frozen=True)
class Latency:
    """Seconds, over the items that ran in one attempt."""

    mean_s: float | None
    median_s: float | None
    samples: int

    @classmethod
    def of(cls, values: list[float]) -> Latency:
        if not values:
            return cls(None, None, 0)
        return cls(statistics.fmean(values), statistics.median(values), len(values))

    def describe(self) -> str:
        if not self.samples:
            return "n/a"
        return f"mean {self.mean_s * 1000:.0f} ms, median {self.median_s * 1000:.0f} ms"


@dataclass(frozen=True)
class EngineStats:
    """What a sweep cost.  Ray's own overhead per item: ``start_latency`` from the driver's
    submitting a task to the task's first line, ``collect_latency`` from the task's return to
    the driver's holding the result.  The task's clock is its node's: across machines the
    figures include their clock offset.  Where items outnumber the cluster's slots, start
    latency includes the wait for a free slot (and the start of a fresh worker process for
    each item, which max_calls=1 makes part of Ray's cost)."""

    items: int
    triaged: int
    failed: int
    over_budget: int  # of the failed: cancelled past item_timeout_s
    retried: int  # items that started more than once (an infrastructure retry)
    wall_s: float
    start_latency: Latency
    collect_latency: Latency

    def describe(self) -> str:
        return (f"{self.items} Ray tasks (one per item and torch build: {self.triaged} triaged, {self.failed} failed, "
                f"{self.over_budget} over budget, {self.retried} retried) in {self.wall_s:.1f} s; Ray overhead per task: "
                "submitted→started "
                f"{self.start_latency.describe()}, finished→collected {self.collect_latency.describe()}")


def resources_for(arms: list[str] | tuple[str, ...]) -> dict[str, int]:
    """Ray resources of an item with these arm specs.

    A CPU per arm, since triage runs the arms at once (at least one: with no arms given,
    triage picks them from the script).  A GPU where any arm is CUDA, all CUDA arms sharing
    it; ``cuda:N`` needs N+1 GPUs, since Ray shows a task only the GPUs it was granted,
    renumbered from 0 (CUDA_VISIBLE_DEVICES).  A bad spec raises ArmSpecError."""
    devices = [parse_arm(spec).device for spec in arms]
    cuda_indices = [int(d.partition(":")[2] or 0) for d in devices if d.startswith("cuda")]
    return {"num_cpus": max(1, len(devices)), "num_gpus": max(cuda_indices) + 1 if cuda_indices else 0}


def run_items(work: list[ItemWork], triage_one: TriageOne, on_result: Callable[[ItemResult], None],
              options: EngineOptions, progress: Progress | None = None) -> EngineStats:
    """Triage every item as a Ray task; ``on_result`` gets each item's result once, as it comes.

    ``triage_one(item, arms, torch_build, settings)`` runs inside the task, on whichever node
    Ray picks: it must be a module-level function of a module every node's workers can import
    (the installed triage, or a folder on PYTHONPATH through ``runtime_env``).  The engine sets
    the result's ``node``, ``seconds`` and ``finished_at``.  Progress events: "started",
    "retried" (a new attempt after a lost worker or node) with no result, "finished" with it.

    If Ray is not initialized, the sweep starts (or joins) it and shuts it down at the end, on
    an exception or KeyboardInterrupt too; if the caller initialized it, it stays up.  On an
    exception (``on_result``'s own included) every item still running is cancelled first."""
    began = time.monotonic()
    if not work:
        return EngineStats(0, 0, 0, 0, 0, 0.0, Latency.of([]), Latency.of([]))
    owns_ray = not ray.is_initialized()
    if owns_ray:
        _start_ray(options)
    try:
        return _Sweep(work, triage_one, on_result, options, progress or _no_progress, began).run()
    finally:
        if owns_ray:
            ray.shutdown()


def _start_ray(options: EngineOptions) -> None:
    # Workers' output stays in their log files (log_to_driver=False) and the driver logs only
    # warnings: the sweep's own progress owns the terminal.  Local Ray disables usage stats.
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING, "runtime_env": options.runtime_env}
    if options.ray_address:
        ray.init(address=options.ray_address, **quiet)
        return
    temp_dir = options.ray_temp_dir or os.path.join(tempfile.gettempdir(), f"triage-ray-{os.getuid()}")
    # A local Ray listens on every interface of this machine: token authentication (with a
    # token generated in ~/.ray/auth_token) is Ray's default for it and stays on; only Ray's
    # notice saying so, logged before `logging_level` applies, is kept off the terminal.
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = notice.level
    notice.setLevel(logging.ERROR)
    try:
        ray.init(address="local", num_cpus=options.num_cpus, include_dashboard=False, _temp_dir=temp_dir, **quiet)
    finally:
        notice.setLevel(level)


def _no_progress(event: str, work: ItemWork, result: ItemResult | None) -> None:
    pass


@dataclass(frozen=True)
class _Attempt:
    """What a task returns: the result and the task's own wall clock at its start and end."""

    result: ItemResult
    started_at: float
    finished_at: float


@ray.remote(num_cpus=0)
class _StartLog:
    """Where each attempt says it started, for the driver to take: Ray tells the driver when a
    task ends, not when it starts (or starts again after a lost node)."""

    def __init__(self) -> None:
        self._starts: list[tuple[int, str]] = []

    def started(self, index: int, node: str) -> None:
        self._starts.append((index, node))

    def take(self) -> list[tuple[int, str]]:
        starts, self._starts = self._starts, []
        return starts


@ray.remote(max_calls=1)
def _run_item(triage_one: TriageOne, work: ItemWork, index: int, start_log: ActorHandle) -> _Attempt:
    started_at = time.time()
    context = ray.get_runtime_context()
    node = f"{ray.util.get_node_ip_address()}/{context.get_node_id()}"
    try:
        # Before triaging, and waited for: the driver must know of this attempt before its
        # result can reach it.
        ray.get(start_log.started.remote(index, node), timeout=60)
    except RayError:
        pass  # the log lives on the driver's node; unreachable, the driver goes untold of this start
    result = triage_one(work.item, work.arms, work.torch_build, work.settings)
    finished_at = time.time()
    result.node = node
    result.seconds = finished_at - started_at
    result.finished_at = _iso(finished_at)
    return _Attempt(result, started_at, finished_at)


@dataclass
class _Pending:
    index: int
    work: ItemWork
    submitted_at: float  # wall clock, for the start latency
    attempts: int = 0
    node: str | None = None
    attempt_began: float | None = None  # monotonic, on the driver: when it saw the start
    first_began: float | None = None


class _Sweep:
    def __init__(self, work: list[ItemWork], triage_one: TriageOne, on_result: Callable[[ItemResult], None],
                 options: EngineOptions, progress: Progress, began: float) -> None:
        self.work, self.triage_one, self.on_result = work, triage_one, on_result
        self.options, self.progress, self.began = options, progress, began
        self.pending: dict[ray.ObjectRef, _Pending] = {}
        self.cancelled: list[ray.ObjectRef] = []
        self.counts = {"triaged": 0, "failed": 0, "over_budget": 0, "retried": 0}
        self.start_latencies: list[float] = []
        self.collect_latencies: list[float] = []

    def run(self) -> EngineStats:
        # On the driver's node, which lives as long as the sweep does.
        self.start_log = _StartLog.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False)).remote()
        try:
            self._submit_all()
            while self.pending:
                self._step()
            self._settle_cancelled()
        except BaseException:
            for ref in self.pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            ray.kill(self.start_log)
        return EngineStats(len(self.work), self.counts["triaged"], self.counts["failed"], self.counts["over_budget"],
                           self.counts["retried"], time.monotonic() - self.began,
                           Latency.of(self.start_latencies), Latency.of(self.collect_latencies))

    def _submit_all(self) -> None:
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        for index, work in enumerate(self.work):
            request = _placeable(work, nodes, self.options.cpus_per_arm)
            if isinstance(request, str):
                self._report(work, _failed(work, request))
                continue
            submitted_at = time.time()
            ref = _run_item.options(
                **request, max_retries=self.options.infrastructure_retries, retry_exceptions=False,
                name=f"triage {work.item.key}",
            ).remote(self.triage_one, work, index, self.start_log)
            self.pending[ref] = _Pending(index, work, submitted_at)

    def _step(self) -> None:
        now = time.monotonic()
        deadlines = [p.attempt_began + self.options.item_timeout_s for p in self.pending.values()
                     if p.attempt_began is not None]
        wait_s = max(0.0, min([START_POLL_S, *(d - now for d in deadlines)]))
        ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=wait_s)
        # Starts first: a finished item's start was logged before its result existed.
        self._take_starts()
        for ref in ready:
            self._collect(ref)
        self._cancel_over_budget()

    def _take_starts(self) -> None:
        by_index = {p.index: p for p in self.pending.values()}
        for index, node in ray.get(self.start_log.take.remote()):
            pending = by_index.get(index)
            if pending is None:  # cancelled already
                continue
            pending.attempts += 1
            pending.node = node
            pending.attempt_began = time.monotonic()
            if pending.attempts == 1:
                pending.first_began = pending.attempt_began
                self.progress("started", pending.work, None)
            else:
                if pending.attempts == 2:
                    self.counts["retried"] += 1
                self.progress("retried", pending.work, None)

    def _collect(self, ref: ray.ObjectRef) -> None:
        pending = self.pending.pop(ref)
        work = pending.work
        try:
            attempt: _Attempt = ray.get(ref)
        except RayTaskError as error:
            # triage_one raised: its own error, never retried.
            cause = error.cause if error.cause is not None else error
            self._report(work, _failed(work, f"triage raised {type(cause).__name__}: {_one_line(str(cause))}",
                                       pending.node, self._seconds(pending)))
            return
        except RayError as error:
            # The worker or node died on every attempt Ray was allowed.
            self._report(work, _failed(
                work, f"infrastructure failure ({self.options.infrastructure_retries} retries allowed): "
                      f"{type(error).__name__}: {_one_line(str(error))}", pending.node, self._seconds(pending)))
            return
        collected_at = time.time()
        if pending.attempts <= 1:
            self.start_latencies.append(attempt.started_at - pending.submitted_at)
            self.collect_latencies.append(collected_at - attempt.finished_at)
        self._report(work, attempt.result)

    def _cancel_over_budget(self) -> None:
        now = time.monotonic()
        budget = self.options.item_timeout_s
        for ref, pending in list(self.pending.items()):
            if pending.attempt_began is None or now - pending.attempt_began < budget:
                continue
            ray.cancel(ref, force=True)
            del self.pending[ref]
            self.cancelled.append(ref)
            self.counts["over_budget"] += 1
            self._report(pending.work, _failed(pending.work, f"exceeded the sweep's per-item budget of {budget:g} s",
                                               pending.node, self._seconds(pending)))

    def _settle_cancelled(self) -> None:
        # A force-cancelled task's reference resolves once Ray has killed its worker: waiting
        # for it means no cancelled item's processes outlive the sweep, and reading it keeps
        # Ray from logging the error as unhandled.
        if not self.cancelled:
            return
        done, _ = ray.wait(self.cancelled, num_returns=len(self.cancelled), timeout=CANCEL_SETTLE_S)
        for ref in done:
            try:
                ray.get(ref)
            except RayError:
                pass  # TaskCancelledError, as asked; or the result of one that ended first, already reported

    def _seconds(self, pending: _Pending) -> float:
        return time.monotonic() - pending.first_began if pending.first_began is not None else 0.0

    def _report(self, work: ItemWork, result: ItemResult) -> None:
        self.counts["triaged" if result.outcome == "triaged" else "failed"] += 1
        self.on_result(result)
        self.progress("finished", work, result)


def _placeable(work: ItemWork, nodes: list[dict[str, float]], cpus_per_arm: float) -> dict[str, Any] | str:
    """Ray options for the item, or why no node of the cluster can run it.

    Ray would keep a task no node can hold pending for ever (waiting for an autoscaler), so
    the check is made against the nodes alive at submission: on an autoscaling cluster, have
    one node of each kind up before the sweep.  CPUs are capped at the largest suitable
    node's: the arms then share its cores, as `triage run` shares a machine's."""
    wanted = resources_for(work.arms)
    accelerator = f"accelerator_type:{work.accelerator_type}" if work.accelerator_type else None
    suitable = [n for n in nodes if n.get("GPU", 0) >= wanted["num_gpus"] and (accelerator is None or accelerator in n)]
    cpus = max((int(n.get("CPU", 0)) for n in suitable), default=0)
    if cpus < 1:
        needs = [f"{wanted['num_gpus']} GPU(s)"] if wanted["num_gpus"] else []
        needs += [f"accelerator_type {work.accelerator_type}"] if accelerator else []
        return f"no node of the Ray cluster has a CPU{' and ' + ', '.join(needs) if needs else ''} for this item"
    request: dict[str, Any] = {"num_cpus": min(round(wanted["num_cpus"] * cpus_per_arm, 2), cpus),
                               "num_gpus": wanted["num_gpus"]}
    if work.accelerator_type:
        request["accelerator_type"] = work.accelerator_type
    return request


def _failed(work: ItemWork, error: str, node: str | None = None, seconds: float = 0.0) -> ItemResult:
    item = work.item
    return ItemResult(key=item.key, kind=item.kind, title=item.title, content_sha256=item.content_sha256,
                      torch_build=work.torch_build, arms=",".join(work.arms), outcome="failed", url=item.url,
                      error=error, seconds=seconds, node=node, finished_at=_iso(time.time()))


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS - 1] + "…"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")
