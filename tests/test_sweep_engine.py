"""The sweep's Ray engine (triage/sweep/engine.py): one Ray task per item, results as they
come, no reused worker, budgets, retries only for lost workers and nodes.

The triage functions below run inside Ray workers, which import this module by name: every
sweep here gives them this folder on PYTHONPATH through its runtime_env (`WORKERS_SEE_TESTS`).
Each execution appends a line to a file per item (``<pid> <node id>``), so a test counts runs."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from triage.arms.spec import ArmSpecError
from triage.sweep.engine import EngineOptions, ItemWork, resources_for, run_items
from triage.sweep.model import ItemResult, SweepItem

# Under pytest-xdist (--dist loadgroup): the module's two-node Ray cluster (a module fixture) is
# built once, on one worker, which runs the in-process `ray.init` of its other tests one at a time.
pytestmark = pytest.mark.xdist_group("ray-engine")

WORKERS_SEE_TESTS = {"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent)}}


def triage_logged(item: SweepItem, arms: tuple[str, ...], torch_build: str, settings: dict[str, Any]) -> ItemResult:
    """A stand-in for the pipeline: logs its run, then raises, hangs or sleeps as settings say."""
    log_dir = Path(settings["log_dir"])
    with open(log_dir / f"{item.key}.runs", "a") as f:
        f.write(f"{os.getpid()} {ray.get_runtime_context().get_node_id()}\n")
    if item.key in settings.get("raise_for", ()):
        raise ValueError(f"cannot triage {item.key}:\n  second line")
    if item.key in settings.get("hang_for", ()):
        # As an arm would be: a child process of the worker.
        child = subprocess.Popen(["sleep", "600"])
        (log_dir / f"{item.key}.pids").write_text(f"{os.getpid()} {child.pid}")
        time.sleep(600)
    if "hold_until" in settings:  # the test's signal that every slot of the cluster is taken
        deadline = time.monotonic() + 60
        while not os.path.exists(settings["hold_until"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(settings.get("sleep_s", 0.2))
    return ItemResult(key=item.key, kind=item.kind, title=item.title, content_sha256=item.content_sha256,
                      torch_build=torch_build, arms=",".join(arms), outcome="triaged", verdict_kind="no-divergence",
                      extra={"pid": os.getpid()})


def _work(key: str, log_dir: Path, arms: tuple[str, ...] = ("cpu",), accelerator_type: str | None = None,
          **settings: Any) -> ItemWork:
    item = SweepItem(key=key, kind="script", title=key, text=f"print({key!r})\n")
    return ItemWork(item, arms, "2.13.0+cpu", accelerator_type, {"log_dir": str(log_dir), **settings})


def _runs(log_dir: Path, key: str) -> list[tuple[int, str]]:
    """Each execution of the item: (worker pid, node id)."""
    path = log_dir / f"{key}.runs"
    lines = path.read_text().split("\n") if path.exists() else []
    # A line being written may be read half: only whole ones count.
    return [(int(fields[0]), fields[1]) for fields in (line.split() for line in lines) if len(fields) == 2]


def _release_when(log_dir: Path, keys: list[str], started: int,
                  first: Callable[[], Any] | None = None) -> threading.Thread:
    """A thread that, once `started` runs of these items are logged, calls `first` and then
    releases every held item (`hold_until`)."""
    def watch() -> None:
        deadline = time.monotonic() + 60
        while sum(len(_runs(log_dir, k)) for k in keys) < started and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            if first is not None:
                first()
        finally:
            (log_dir / "release").touch()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except FileNotFoundError:
        return True


def _wait_gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    """The pids still running after `within_s`."""
    deadline = time.monotonic() + within_s
    while [p for p in pids if not _gone(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]


class Recorder:
    def __init__(self) -> None:
        self.results: list[ItemResult] = []
        self.events: list[tuple[str, str]] = []

    def on_result(self, result: ItemResult) -> None:
        self.results.append(result)

    def progress(self, event: str, work: ItemWork, result: ItemResult | None) -> None:
        assert (result is not None) == (event == "finished")
        self.events.append((event, work.item.key))

    def by_key(self) -> dict[str, ItemResult]:
        keys = [r.key for r in self.results]
        assert len(keys) == len(set(keys)), f"an item was reported twice: {keys}"
        return {r.key: r for r in self.results}


def test_resources_for_arms():
    assert resources_for(["cpu"]) == {"num_cpus": 1, "num_gpus": 0}
    assert resources_for([]) == {"num_cpus": 1, "num_gpus": 0}
    assert resources_for(["cpu", "cpu/compile", "cpu/threads=1"]) == {"num_cpus": 3, "num_gpus": 0}
    # CUDA arms share one GPU; cuda:1 is the second GPU the task was granted.
    assert resources_for(["cpu", "cuda"]) == {"num_cpus": 2, "num_gpus": 1}
    assert resources_for(["cuda", "cuda/compile", "cuda/tf32=off"]) == {"num_cpus": 3, "num_gpus": 1}
    assert resources_for(["cuda:0", "cuda:1"]) == {"num_cpus": 2, "num_gpus": 2}
    assert resources_for(["cuda:3"]) == {"num_cpus": 1, "num_gpus": 4}
    with pytest.raises(ArmSpecError):
        resources_for(["tpu"])


def test_local_sweep_reports_every_item_once_each_in_a_fresh_worker(tmp_path):
    assert not ray.is_initialized()
    keys = [f"item-{i}" for i in range(6)]
    recorder = Recorder()
    stats = run_items([_work(k, tmp_path, sleep_s=0.3) for k in keys], triage_logged, recorder.on_result,
                      EngineOptions(num_cpus=2, runtime_env=WORKERS_SEE_TESTS), recorder.progress)
    results = recorder.by_key()
    assert sorted(results) == keys
    assert {r.outcome for r in results.values()} == {"triaged"}
    # max_calls=1: no worker process ran two items.
    assert len({r.extra["pid"] for r in results.values()}) == 6
    assert all(len(_runs(tmp_path, k)) == 1 for k in keys)
    # The engine stamps where and when: one local node, as "ip/node id".
    nodes = {r.node for r in results.values()}
    assert len(nodes) == 1 and nodes.pop().split("/")[1] == _runs(tmp_path, "item-0")[0][1]
    assert all(r.finished_at and 0.3 <= r.seconds < 30 for r in results.values())
    for key in keys:
        assert [e for e, k in recorder.events if k == key] == ["started", "finished"]
    assert (stats.items, stats.triaged, stats.failed, stats.retried, stats.over_budget) == (6, 6, 0, 0, 0)
    assert stats.start_latency.samples == stats.collect_latency.samples == 6
    assert 0 <= stats.start_latency.median_s < stats.wall_s and 0 <= stats.collect_latency.median_s < 5
    assert "6 Ray tasks" in stats.describe()
    # Ray was started for the sweep, so it was shut down after it.
    assert not ray.is_initialized()


def test_an_item_that_raises_fails_once_and_unplaceable_items_fail_at_once(tmp_path):
    work = [_work(k, tmp_path, raise_for=["broken"]) for k in ("fine-1", "broken", "fine-2")]
    # No local node has eight GPUs or a GPU model of this name: Ray would keep these pending for ever.
    work += [_work("eight-gpus", tmp_path, arms=("cuda:7",)),
             _work("no-such-gpu", tmp_path, accelerator_type="NO-SUCH-GPU")]
    recorder = Recorder()
    stats = run_items(work, triage_logged, recorder.on_result,
                      EngineOptions(num_cpus=2, runtime_env=WORKERS_SEE_TESTS, infrastructure_retries=3))
    results = recorder.by_key()
    assert results["broken"].outcome == "failed"
    assert results["broken"].error == "triage raised ValueError: cannot triage broken: second line"
    assert results["broken"].arms == "cpu" and results["broken"].node
    # retry_exceptions=False: an exception is triage's verdict on the item, never retried.
    assert len(_runs(tmp_path, "broken")) == 1
    assert results["fine-1"].outcome == results["fine-2"].outcome == "triaged"
    assert results["eight-gpus"].outcome == results["no-such-gpu"].outcome == "failed"
    assert "8 GPU(s)" in results["eight-gpus"].error and "NO-SUCH-GPU" in results["no-such-gpu"].error
    assert not _runs(tmp_path, "eight-gpus") and not _runs(tmp_path, "no-such-gpu")
    assert (stats.items, stats.triaged, stats.failed, stats.retried) == (5, 2, 3, 0)


def test_an_item_past_its_budget_is_cancelled_and_its_processes_killed(tmp_path):
    # Ray initialized by the caller: the sweep uses it and leaves it up.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env=WORKERS_SEE_TESTS)
    try:
        recorder = Recorder()
        began = time.monotonic()
        stats = run_items([_work("hangs", tmp_path, hang_for=["hangs"]), _work("quick", tmp_path)],
                          triage_logged, recorder.on_result, EngineOptions(item_timeout_s=3))
        took = time.monotonic() - began
        assert ray.is_initialized()
    finally:
        ray.shutdown()
    results = recorder.by_key()
    assert results["hangs"].outcome == "failed"
    assert results["hangs"].error == "exceeded the sweep's per-item budget of 3 s"
    assert 3 <= results["hangs"].seconds < 10
    assert results["quick"].outcome == "triaged"
    assert (stats.triaged, stats.failed, stats.over_budget) == (1, 1, 1)
    assert took < 30
    worker, child = map(int, (tmp_path / "hangs.pids").read_text().split())
    assert _wait_gone([worker, child]) == []
    assert len(_runs(tmp_path, "hangs")) == 1


def test_an_error_in_the_caller_cancels_running_items_and_shuts_ray_down(tmp_path):
    def on_result(result: ItemResult) -> None:
        raise RuntimeError("the store is gone")

    with pytest.raises(RuntimeError, match="the store is gone"):
        run_items([_work("hangs", tmp_path, hang_for=["hangs"]), _work("quick", tmp_path, sleep_s=1)],
                  triage_logged, on_result, EngineOptions(num_cpus=2, runtime_env=WORKERS_SEE_TESTS))
    assert not ray.is_initialized()
    worker, child = map(int, (tmp_path / "hangs.pids").read_text().split())
    assert _wait_gone([worker, child]) == []


@pytest.fixture(scope="module")
def cluster():
    """A head with one CPU and a worker node with two: three items at once need both."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def test_items_spread_over_the_cluster_nodes(cluster, tmp_path):
    keys = [f"item-{i}" for i in range(4)]
    # Items run until three are running at once, which takes both nodes.
    releaser = _release_when(tmp_path, keys, started=3)
    recorder = Recorder()
    try:
        run_items([_work(k, tmp_path, hold_until=str(tmp_path / "release")) for k in keys], triage_logged,
                  recorder.on_result, EngineOptions(ray_address=cluster.address, runtime_env=WORKERS_SEE_TESTS))
    finally:
        releaser.join()
    results = recorder.by_key()
    assert sorted(results) == keys and {r.outcome for r in results.values()} == {"triaged"}
    alive = {n.node_id for n in cluster.list_all_nodes()}
    assert {r.node.split("/")[1] for r in results.values()} == alive and len(alive) == 2
    assert not ray.is_initialized()


@pytest.mark.parametrize("retries", [2, 0])
def test_a_node_lost_mid_sweep_retries_only_its_items(cluster, tmp_path, retries):
    doomed = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    keys = [f"item-{i}" for i in range(5)]
    # Five slots for five items, held until all five run (two of them on the doomed node),
    # then the node goes and the items still running elsewhere finish.
    releaser = _release_when(tmp_path, keys, started=5, first=lambda: cluster.remove_node(doomed))
    recorder = Recorder()
    try:
        stats = run_items([_work(k, tmp_path, hold_until=str(tmp_path / "release")) for k in keys], triage_logged,
                          recorder.on_result, EngineOptions(ray_address=cluster.address,
                                                            runtime_env=WORKERS_SEE_TESTS,
                                                            infrastructure_retries=retries))
    finally:
        releaser.join()
    results = recorder.by_key()
    assert sorted(results) == keys
    runs = {k: _runs(tmp_path, k) for k in keys}
    lost = [k for k in keys if runs[k][0][1] == doomed.node_id]
    assert len(lost) == 2
    for key in set(keys) - set(lost):
        assert len(runs[key]) == 1 and results[key].outcome == "triaged", (key, runs[key])
    for key in lost:
        result = results[key]
        if retries:  # run again on a node still alive
            assert result.outcome == "triaged" and len(runs[key]) == 2
            assert result.node.split("/")[1] == runs[key][1][1] != doomed.node_id
        else:
            assert result.outcome == "failed" and len(runs[key]) == 1
            assert result.error.startswith("infrastructure failure (0 retries allowed): "), result.error
    assert stats.retried == (len(lost) if retries else 0)
