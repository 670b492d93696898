"""`triage sweep` end to end: the real command in a subprocess, its embedded Ray, real arms.

Every sweep here runs with its own TMPDIR inside a short folder of its own: Ray's session
(``$TMPDIR/triage-ray-<uid>``), the arms' sandboxes and every process of the sweep (Ray's
inherit the variable) are then found by that folder's name, apart from anything else on the
machine.  The folder is short because Ray's Unix sockets live in it (108 bytes at most).

The verdicts asserted hold on any host by construction: a syntax error and a hang cannot
run, an issue without code cannot run, and fp16_overflow.py compares an overflowing float16
with float32 in its own code (nonfinite-flip).  ``--arms cpu`` keeps the
arms the same on a machine with CUDA (whose default would add a cuda arm)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, sweep_environment
from tests.github_server import FakeGitHub
from triage.sweep.store import ResultStore, StoreError

# Under pytest-xdist (--dist loadgroup): the first sweep (a module fixture) runs once, on the one
# worker that runs every test reading it.
pytestmark = pytest.mark.xdist_group("sweep-cli")

ARM_TIMEOUT = "20"  # seconds per arm: the hang ends after it
SWEEP_TIMEOUT_S = 300  # of one `triage sweep` subprocess, a backstop only
FP16 = (FIXTURES / "fp16_overflow.py").read_text()


@dataclass
class Run:
    rc: int
    output: str
    seconds: float


def _env(base: Path) -> dict[str, str]:
    env = sweep_environment(os.environ)
    (base / "tmp").mkdir(exist_ok=True)
    env.update(TRIAGE_TEST_ARMS="1", TMPDIR=str(base / "tmp"))
    return env


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "triage", "sweep", *args]


def sweep(base: Path, *args: str, timeout: float = SWEEP_TIMEOUT_S) -> Run:
    """`triage sweep ARGS` run in `base` (relative paths are inside it); on a machine without
    the namespace sandbox, taking the process sandbox knowingly, as a sweep must there."""
    from triage.sandbox import isolation

    weak = () if isolation("auto").strong or "--isolation" in args else ("--allow-weak-sandbox",)
    began = time.monotonic()
    proc = subprocess.run(_argv(*args, *weak), cwd=base, env=_env(base), capture_output=True, text=True,
                          timeout=timeout)
    return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - began)


def _short_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="sw-"))


@pytest.fixture
def base():
    path = _short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _rows(db: Path) -> list[dict]:
    """Every stored result row, read-only: id, key, content hash, outcome, verdict, times, sweep."""
    with ResultStore(db, readonly=True) as store:
        rows = store.conn.execute(
            "SELECT id, key, content_sha256, outcome, verdict_kind, summary, finished_at, stored_at, sweep_id "
            "FROM results ORDER BY id").fetchall()
    names = ("id", "key", "content_sha256", "outcome", "verdict", "summary", "finished_at", "stored_at", "sweep_id")
    return [dict(zip(names, row, strict=False)) for row in rows]


def _count(db: Path) -> int:
    """Rows committed so far, 0 while the store does not exist yet (or has no schema yet)."""
    try:
        with ResultStore(db, readonly=True) as store:
            return store.count()
    except StoreError:
        return 0


def _html_text(path: Path) -> str:
    # Keys are written with <wbr> break points (fp16_overflow.<wbr>py).
    return path.read_text().replace("<wbr>", "")


def _sweep_line(output: str) -> str:
    """The summary line: 'N items on torch … (R run now, S already stored): …'."""
    lines = [line for line in output.splitlines() if " run now, " in line]
    assert len(lines) == 1, output
    return lines[0]


# -- a folder of scripts: the first sweep, its resume, an edited script ---------------------

FOLDER_ITEMS = {  # file name in the swept folder -> (fixture, verdict)
    "fp16_overflow.py": (FIXTURES / "fp16_overflow.py", "nonfinite-flip"),
    "infinite_loop.py": (FIXTURES / "bad" / "infinite_loop.py", "could-not-run"),
    "syntax_error.py": (FIXTURES / "bad" / "syntax_error.py", "could-not-run"),
}
# Beside them, a file the folder source refuses (not UTF-8): a problem line, not an item.
REFUSED = "not_utf8.py"
FOLDER_ARGS = ("src", "--out", "out", "--arms", "cpu", "--no-minimize", "--timeout", ARM_TIMEOUT)


@dataclass
class FirstSweep:
    base: Path
    run: Run
    summary: dict  # out/sweep.json as the first sweep wrote it
    copied_summary: dict  # its --json copy
    html: str
    markdown: str
    rows: list[dict]


@pytest.fixture(scope="module")
def first_sweep():
    """The first sweep of a folder of three scripts (and one it refuses); what it wrote, read before any other test
    sweeps the same folder again."""
    base = _short_dir()
    (base / "src").mkdir()
    for name, (fixture, _) in FOLDER_ITEMS.items():
        shutil.copy(fixture, base / "src" / name)
    shutil.copy(FIXTURES / "bad" / REFUSED, base / "src" / REFUSED)
    run = sweep(base, *FOLDER_ARGS, "--json", "summary.json")
    out = base / "out"
    first = FirstSweep(
        base, run,
        json.loads((out / "sweep.json").read_text()) if (out / "sweep.json").exists() else {},
        json.loads((base / "summary.json").read_text()) if (base / "summary.json").exists() else {},
        _html_text(out / "sweep.html") if (out / "sweep.html").exists() else "",
        (out / "sweep.md").read_text() if (out / "sweep.md").exists() else "",
        _rows(out / "results.sqlite") if (out / "results.sqlite").exists() else [])
    yield first
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_folder_sweep_triages_every_item_once_and_writes_the_report(first_sweep):
    run, out = first_sweep.run, first_sweep.base / "out"
    assert run.rc == 0, run.output
    for name in ("sweep.html", "sweep.md", "sweep.json", "results.sqlite"):
        assert (out / name).is_file(), name
    # Every item, each once, with its verdict: the syntax error and the hang could not run,
    # and the sweep went on past them.
    summary = first_sweep.summary
    items = {item["key"]: item for item in summary["items"]}
    assert sorted(item["key"] for item in summary["items"]) == sorted(FOLDER_ITEMS)
    assert {key: item["verdict"] for key, item in items.items()} == {k: v for k, (_, v) in FOLDER_ITEMS.items()}
    assert all(item["outcome"] == "triaged" and item["arms"] == "cpu" and item["error"] is None
               for item in items.values()), items
    assert summary["counts"] == {"items": 3, "results": 3, "ran": 3, "stored": 0, "triaged": 3, "failed": 0}
    assert summary["problems"] == [f"src/{REFUSED}: not UTF-8 (byte 0xe9 at offset 23)"]
    assert f"skipped: src/{REFUSED}: not UTF-8" in run.output
    assert first_sweep.copied_summary == summary  # --json
    # The hang was stopped by the arm's timeout, not by the sweep's item budget.
    assert 15 <= items["infinite_loop.py"]["seconds"] < 120, items["infinite_loop.py"]
    # One row per item in the store, with the report's reasons.
    rows = first_sweep.rows
    assert sorted(r["key"] for r in rows) == sorted(FOLDER_ITEMS)
    by_key = {r["key"]: r for r in rows}
    assert "syntax error" in by_key["syntax_error.py"]["summary"]
    assert f"{ARM_TIMEOUT} s limit" in by_key["infinite_loop.py"]["summary"]
    assert len({r["sweep_id"] for r in rows}) == 1
    # The progress went item by item (stderr is no terminal here: a line per item).
    for key, (_, verdict) in FOLDER_ITEMS.items():
        assert f"{key}: {verdict} (" in run.output
    assert "(3 run now, 0 already stored)" in _sweep_line(run.output)
    # The report: every key in the HTML, the verdict groups in the markdown.
    for key in FOLDER_ITEMS:
        assert key in first_sweep.html, key
    assert REFUSED not in first_sweep.html
    assert "#### <code>nonfinite-flip</code> (1)" in first_sweep.markdown
    assert "#### <code>could-not-run</code> (2)" in first_sweep.markdown
    with ResultStore(out / "results.sqlite", readonly=True) as store:
        sweeps = store.sweeps()
    assert sweeps[0]["finished_at"] is not None and sweeps[0]["results"] == 3
    assert sweeps[0]["counts"] == summary["counts"]


@pytest.mark.slow
def test_the_same_sweep_again_runs_nothing(first_sweep):
    base, out = first_sweep.base, first_sweep.base / "out"
    assert first_sweep.run.rc == 0, first_sweep.run.output
    with ResultStore(out / "results.sqlite", readonly=True) as store:
        sweeps_before = len(store.sweeps())
    again = sweep(base, *FOLDER_ARGS)
    assert again.rc == 0, again.output
    assert "(0 run now, 3 already stored)" in _sweep_line(again.output)
    assert "Ray overhead" not in again.output  # no engine started at all
    # Much faster than the first run, measured on this machine in this session.
    assert again.seconds < 0.3 * first_sweep.run.seconds, (again.seconds, first_sweep.run.seconds)
    assert _rows(out / "results.sqlite") == first_sweep.rows  # not a row added or rewritten
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["counts"] == {"items": 3, "results": 3, "ran": 0, "stored": 3, "triaged": 3, "failed": 0}
    assert {i["key"]: i["verdict"] for i in summary["items"]} == {k: v for k, (_, v) in FOLDER_ITEMS.items()}
    with ResultStore(out / "results.sqlite", readonly=True) as store:
        sweeps = store.sweeps()
    assert len(sweeps) == sweeps_before + 1
    last = sweeps[-1]
    assert last["finished_at"] is not None and last["results"] == 0
    assert last["counts"] == {"items": 3, "results": 3, "ran": 0, "stored": 3, "triaged": 3, "failed": 0}
    assert last["sources"] == ["src"] and last["arms"] == "cpu"
    for key in FOLDER_ITEMS:  # the report is still whole
        assert key in _html_text(out / "sweep.html")


@pytest.mark.slow
def test_an_edited_script_is_run_again_and_the_others_are_not(first_sweep):
    assert first_sweep.run.rc == 0, first_sweep.run.output
    base = _short_dir()
    try:
        shutil.copytree(first_sweep.base / "src", base / "src")
        shutil.copytree(first_sweep.base / "out", base / "out")
        db = base / "out" / "results.sqlite"
        before = _rows(db)
        edited = base / "src" / "fp16_overflow.py"
        edited.write_text(edited.read_text() + "# edited: the same repro, another text\n")
        run = sweep(base, *FOLDER_ARGS)
        assert run.rc == 0, run.output
        assert "(1 run now, 2 already stored)" in _sweep_line(run.output)
        assert "fp16_overflow.py: nonfinite-flip (" in run.output
        for key in ("infinite_loop.py", "syntax_error.py"):
            assert f"{key}: " not in run.output, run.output  # no progress line: not run
        after = _rows(db)
        assert after[:len(before)] == before  # the old rows, the old fp16 text's included, untouched
        assert len(after) == len(before) + 1
        new = after[-1]
        assert new["key"] == "fp16_overflow.py" and new["verdict"] == "nonfinite-flip"
        old = next(r for r in before if r["key"] == "fp16_overflow.py")
        assert new["content_sha256"] != old["content_sha256"] and new["sweep_id"] > old["sweep_id"]
        with ResultStore(db, readonly=True) as store:
            assert [r.content_sha256 for r in store.latest("fp16_overflow.py")] == [new["content_sha256"]]
            assert store.sweeps()[-1]["results"] == 1
        summary = json.loads((base / "out" / "sweep.json").read_text())
        assert sorted(i["key"] for i in summary["items"]) == sorted(FOLDER_ITEMS)  # each once
        assert summary["counts"]["ran"] == 1 and summary["counts"]["stored"] == 2
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- kill -9 in the middle of a sweep --------------------------------------------------------

def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in clock ticks) of a process, None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1]), int(fields[19])


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _sweep_processes(marker: str) -> dict[tuple[int, int], str]:
    """(pid, start time) -> command line of every live process whose command line, environment
    or working folder mentions `marker`, and of their descendants (an arm inside its sandbox
    sees an allow-listed environment of its own)."""
    me, found, parents = os.getpid(), {}, {}
    needle = marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):  # a zombie is dead: nothing of it runs
            continue
        cmdline = _read(f"/proc/{pid}/cmdline")
        parents[pid] = (stat[1], stat[2], cmdline)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd").encode()
        except OSError:
            cwd = b""
        if needle in cmdline or needle in _read(f"/proc/{pid}/environ") or cwd.startswith(needle):
            found[(pid, stat[2])] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    grew = True
    while grew:
        grew = False
        pids = {pid for pid, _ in found}
        for pid, (ppid, start, cmdline) in parents.items():
            if ppid in pids and pid not in pids:
                found[(pid, start)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
                grew = True
    return found


def _still_alive(processes: dict[tuple[int, int], str]) -> dict[tuple[int, int], str]:
    """Those of `processes` that still run (the same pid with the same start time, not a zombie)."""
    alive = {}
    for (pid, start), cmd in processes.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == start and stat[0] not in ("Z", "X"):
            alive[(pid, start)] = cmd
    return alive


def _end(processes: dict[tuple[int, int], str]) -> None:
    """SIGKILL what is left of processes this test started, by pid (after checking the start time)."""
    for (pid, _start) in _still_alive(processes):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


KILL_ITEMS = {  # run in this order, one at a time (--num-cpus 1): the kill lands during a3_hang.py
    "a1_fp16.py": FP16,
    "a2_syntax.py": (FIXTURES / "bad" / "syntax_error.py").read_text(),
    "a3_hang.py": (FIXTURES / "bad" / "infinite_loop.py").read_text(),
    "a4_syntax.py": "# item 4\n" + (FIXTURES / "bad" / "syntax_error.py").read_text(),
    "a5_raises.py": (FIXTURES / "bad" / "raises.py").read_text(),
    "a6_syntax.py": "# item 6\n" + (FIXTURES / "bad" / "syntax_error.py").read_text(),
}
# No --arms: each item's own, as `triage run` picks them (the verdicts are not asserted here).
KILL_ARGS = ("src", "--out", "out", "--no-minimize", "--no-ablate", "--timeout", ARM_TIMEOUT, "--num-cpus", "1")


def _wait_for(condition, timeout_s: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the sweep ended (status {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.2)


@pytest.mark.slow
def test_kill_9_mid_sweep_leaves_no_process_and_the_sweep_resumes(base):
    (base / "src").mkdir()
    for name, text in KILL_ITEMS.items():
        (base / "src" / name).write_text(text)
    db = base / "out" / "results.sqlite"
    marker = str(base)
    log = open(base / "killed.log", "w")
    proc = subprocess.Popen(_argv(*KILL_ARGS), cwd=base, env=_env(base), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    seen: dict[tuple[int, int], str] = {}
    try:
        _wait_for(lambda: _count(db) >= 2, 120, "two items were stored", proc)

        def hang_has_an_arm():
            # The hang's Ray worker (its task is named after the item) with a process of its own
            # below it: the arm, running the script.
            found = _sweep_processes(marker)
            seen.update(found)
            workers = {pid for (pid, _), cmd in found.items() if cmd.startswith("ray::triage a3_hang.py")}
            return workers and any(_stat(pid) and _stat(pid)[1] in workers for pid, _ in found)

        _wait_for(hang_has_an_arm, 60, "the hanging item's arm was running", proc)
        time.sleep(1)
        before_kill = _sweep_processes(marker)
        seen.update(before_kill)
        commands = list(before_kill.values())
        # What the kill must take down: Ray's own processes, the item's worker and its arm.
        for name in ("raylet", "gcs_server"):
            assert any(name in cmd for cmd in commands), (name, commands)
        assert any(cmd.startswith("ray::triage a3_hang.py") for cmd in commands), commands
        ray_dir = base / "tmp" / f"triage-ray-{os.getuid()}"
        assert any(p.name.startswith("session_") for p in ray_dir.iterdir()), list(ray_dir.iterdir())

        # The whole process group, as a terminal's or CI's kill does: Ray's own processes share
        # the driver's group and die at once; the item's worker and _StartLog (groups of their
        # own) and the arm's sandbox follow within seconds.  (A kill -9 of the driver's pid
        # alone leaves Ray's DashboardAgent and RuntimeEnvAgent for about 60 s: Ray's own.)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed_at = time.monotonic()
        stored_at_kill = _rows(db)
        assert 2 <= len(stored_at_kill) < len(KILL_ITEMS), stored_at_kill  # killed mid-sweep
        assert "a3_hang.py" not in {r["key"] for r in stored_at_kill}

        def leftovers():
            left = _still_alive(seen)
            left.update(_sweep_processes(marker))
            return left

        left = leftovers()
        while left and time.monotonic() - killed_at < 30:
            time.sleep(0.5)
            left = leftovers()
        # Ray's pre-started idle workers never ran an item (a worker that ran one exits after it,
        # max_calls=1); they leave once they notice the raylet gone, which took over 30 s with
        # both cores busy (the whole suite at ATEN_CPU_CAPABILITY=default).
        assert all(cmd == "ray::IDLE" for cmd in left.values()), \
            f"still running 30 s after kill -9 of the sweep's process group: {sorted(left.values())}"
        while left and time.monotonic() - killed_at < 90:
            time.sleep(0.5)
            left = leftovers()
        assert not left, f"Ray's idle workers still running 90 s after kill -9: {sorted(left.values())}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _end(seen)
        _end(_sweep_processes(marker))
        log.close()
    with ResultStore(db, readonly=True) as store:
        killed_sweep = store.sweeps()[-1]
    assert killed_sweep["finished_at"] is None and killed_sweep["counts"] is None

    # The same sweep again: only what was not stored runs, and everything ends up stored once.
    resumed = sweep(base, *KILL_ARGS)
    assert resumed.rc == 0, resumed.output
    stored = len(stored_at_kill)
    assert f"({len(KILL_ITEMS) - stored} run now, {stored} already stored)" in _sweep_line(resumed.output)
    rows = _rows(db)
    assert len(rows) == len({r["key"] for r in rows}) == len(KILL_ITEMS)
    assert sorted(r["key"] for r in rows) == sorted(KILL_ITEMS)
    assert rows[:stored] == stored_at_kill  # same ids, finished_at, stored_at, sweep: not run again
    for key in {r["key"] for r in stored_at_kill}:
        assert f"{key}: " not in resumed.output
    assert all(r["outcome"] == "triaged" for r in rows)
    assert {r["key"]: r["verdict"] for r in rows}["a3_hang.py"] == "could-not-run"
    summary = json.loads((base / "out" / "sweep.json").read_text())
    assert sorted(i["key"] for i in summary["items"]) == sorted(KILL_ITEMS)
    assert summary["counts"]["ran"] == len(KILL_ITEMS) - stored
    # A sweep that ends normally leaves nothing running either.
    left = _gone_within(marker, 30)
    assert not left, f"still running 30 s after the sweep ended: {sorted(left.values())}"


def _gone_within(marker: str, seconds: float) -> dict[tuple[int, int], str]:
    """What still runs of the sweep `seconds` after now (ended by pid where anything does)."""
    left = _sweep_processes(marker)
    deadline = time.monotonic() + seconds
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _sweep_processes(marker)
    _end(left)
    return left


@pytest.mark.slow
def test_an_item_past_its_budget_is_failed_and_the_next_sweep_runs_it_again(base):
    (base / "src").mkdir()
    shutil.copy(FIXTURES / "bad" / "infinite_loop.py", base / "src")
    shutil.copy(FIXTURES / "bad" / "syntax_error.py", base / "src")
    args = ("src", "--out", "out", "--arms", "cpu", "--no-minimize", "--timeout", ARM_TIMEOUT, "--item-timeout", "4")
    db = base / "out" / "results.sqlite"
    first = sweep(base, *args)
    assert first.rc == 0, first.output  # a failed item is a result: the report was written
    assert "infinite_loop.py: failed (" in first.output
    rows = {r["key"]: r for r in _rows(db)}
    assert rows["infinite_loop.py"]["outcome"] == "failed" and rows["infinite_loop.py"]["verdict"] is None
    assert rows["syntax_error.py"]["verdict"] == "could-not-run"
    items = {i["key"]: i for i in json.loads((base / "out" / "sweep.json").read_text())["items"]}
    assert items["infinite_loop.py"]["outcome"] == "failed"
    assert items["infinite_loop.py"]["error"] == "exceeded the sweep's per-item budget of 4 s"
    # The cancelled item's worker and arm went with it.
    left = _gone_within(str(base), 30)
    assert not left, f"still running after the sweep ended: {sorted(left.values())}"

    again = sweep(base, *args)
    assert again.rc == 0, again.output
    assert "(1 run now, 1 already stored)" in _sweep_line(again.output)
    assert "infinite_loop.py: failed (" in again.output and "syntax_error.py: " not in again.output
    after = {r["key"]: r for r in _rows(db)}
    assert len(_rows(db)) == 2  # the failed result replaced, not added to
    assert after["syntax_error.py"] == rows["syntax_error.py"]
    assert after["infinite_loop.py"]["id"] > rows["infinite_loop.py"]["id"]
    assert after["infinite_loop.py"]["sweep_id"] > rows["infinite_loop.py"]["sweep_id"]
    left = _gone_within(str(base), 30)
    assert not left, f"still running after the sweep ended: {sorted(left.values())}"


# -- GitHub: a search query and issue references ---------------------------------------------

REPO = "acme/nets"


@pytest.fixture
def github():
    server = FakeGitHub().start()
    fenced = f"```python\n{FP16}```\n"
    server.add_issue(REPO, 1, f"softplus gives inf in half precision:\n\n{fenced}", labels=["numerics"],
                     title="softplus overflows in fp16")
    server.add_issue(REPO, 2, "The loss differs on my machine. I cannot share the code, sorry.",
                     labels=["numerics", "triage review"], title="loss differs, no code")
    server.add_issue(REPO, 3, fenced, labels=["numerics"], title="closed already", state="closed")
    server.add_issue(REPO, 4, fenced, labels=["question"], title="not labelled numerics")
    server.add_issue(REPO, 5, fenced, labels=["numerics"], title="a pull request", pull_request=True)
    yield server
    server.stop()


@pytest.mark.slow
def test_a_github_search_sweeps_the_matching_open_issues_and_refs_reuse_their_results(github, base):
    common = ("--out", "out", "--arms", "cpu", "--no-minimize", "--timeout", ARM_TIMEOUT, "--api-url", github.api_url)
    run = sweep(base, f"repo:{REPO} is:open label:numerics", *common)
    assert run.rc == 0, run.output
    # Every issue from its search result: no issue read again.
    assert github.requests == [("GET", "/search/issues", 200)]
    summary = json.loads((base / "out" / "sweep.json").read_text())
    items = {i["key"]: i for i in summary["items"]}
    assert sorted(items) == [f"{REPO}#1", f"{REPO}#2"]  # not the closed one, the unlabelled one, the PR
    assert items[f"{REPO}#1"]["verdict"] == "nonfinite-flip" and items[f"{REPO}#1"]["expected"] is True
    assert items[f"{REPO}#1"]["title"] == "softplus overflows in fp16"
    assert items[f"{REPO}#2"]["verdict"] == "could-not-run"
    for number in (1, 2):
        assert items[f"{REPO}#{number}"]["url"] == f"https://github.example/{REPO}/issues/{number}"
    html = _html_text(base / "out" / "sweep.html")
    for number in (1, 2):
        assert f'href="https://github.example/{REPO}/issues/{number}"' in html
    for number in (3, 4, 5):
        assert f"{REPO}/issues/{number}" not in html and f"{REPO}/pull/{number}" not in html
    no_code = {r["key"]: r for r in _rows(base / "out" / "results.sqlite")}[f"{REPO}#2"]
    assert "no Python code in the issue body" in no_code["summary"], no_code["summary"]
    assert "no Python code in the issue body" in (base / "out" / "sweep.md").read_text()

    # References: #1 is the search's item (one key, the same text), so it is stored already;
    # #4 (no label) runs; a missing issue and a pull request are skipped with their reasons.
    github.requests.clear()
    refs = sweep(base, f"{REPO}#1,{REPO}#4", f"{REPO}#99 {REPO}#5", *common)
    assert refs.rc == 0, refs.output
    assert "(1 run now, 1 already stored)" in _sweep_line(refs.output)
    assert f"{REPO}#4: nonfinite-flip (" in refs.output and f"{REPO}#1: " not in refs.output
    assert re.search(rf"skipped: {REPO}#99: not found \(404", refs.output), refs.output
    assert f"skipped: {REPO}#5: a pull request" in refs.output
    summary = json.loads((base / "out" / "sweep.json").read_text())
    assert [i["key"] for i in summary["items"]] == [f"{REPO}#1", f"{REPO}#4"]
    assert [i["verdict"] for i in summary["items"]] == ["nonfinite-flip", "nonfinite-flip"]
    assert len(summary["problems"]) == 2
    assert {path for method, path, _ in github.requests} == {f"/repos/{REPO}/issues/{n}" for n in (1, 4, 5, 99)}
    assert len(_rows(base / "out" / "results.sqlite")) == 3


def test_a_sweep_whose_github_source_cannot_be_reached_exits_6(base):
    stopped = FakeGitHub().start()
    stopped.stop()  # its port now refuses connections
    run = sweep(base, "octo/demo#1", "--out", "out", "--api-url", stopped.api_url)
    assert run.rc == 6, run.output
    assert f"skipped: octo/demo#1: cannot reach GitHub at {stopped.api_url}: connection refused (5 attempts)" \
        in run.output.splitlines()
    assert "Traceback" not in run.output


@pytest.mark.slow
def test_post_comments_each_swept_issue_once_and_updates_it_in_place(github, base):
    def post_sweep(*extra: str) -> Run:
        env = dict(_env(base), GITHUB_TOKEN="bot-token")
        began = time.monotonic()
        proc = subprocess.run(_argv(f"repo:{REPO} is:open label:numerics", "--out", "out", "--arms", "cpu",
                                    "--no-minimize", "--timeout", ARM_TIMEOUT, "--api-url", github.api_url, "--post",
                                    "--allow-weak-sandbox", *extra),
                              cwd=base, env=env, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
        return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - began)

    first = post_sweep()
    assert first.rc == 0, first.output
    for number in (1, 2):
        comments = [c for c in github.comments_on(REPO, number) if c["login"] == "triage-bot"]
        assert len(comments) == 1, (number, first.output)
        assert f"{REPO}#{number}: created comment" in first.output
    assert "nonfinite-flip" in github.comments_on(REPO, 1)[0]["body"]
    for number in (3, 4, 5):
        assert github.comments_on(REPO, number) == []  # not swept, not touched

    again = post_sweep()
    assert again.rc == 0, again.output
    assert "(0 run now, 2 already stored)" in _sweep_line(again.output)
    for number in (1, 2):
        assert len(github.comments_on(REPO, number)) == 1
        assert f"{REPO}#{number}: unchanged comment" in again.output, again.output

    # An edited body is another item text: run again, and its comment updated in place.
    github.issues[(REPO, 2)]["body"] += "\n\n```python\nprint(1)\n```\n"
    edited = post_sweep()
    assert edited.rc == 0, edited.output
    assert "(1 run now, 1 already stored)" in _sweep_line(edited.output)
    assert f"{REPO}#2: edited comment" in edited.output and f"{REPO}#1: unchanged comment" in edited.output
    assert [len(github.comments_on(REPO, n)) for n in (1, 2)] == [1, 1]


def test_post_needs_a_token_and_a_sweep_the_namespace_sandbox(base):
    (base / "src").mkdir()
    shutil.copy(FIXTURES / "bad" / "syntax_error.py", base / "src")
    no_token = sweep(base, "src", "--out", "out", "--post")
    assert no_token.rc == 2 and "--post needs a token" in no_token.output, no_token.output
    proc = subprocess.run(_argv("src", "--out", "out", "--post", "--isolation", "process"), cwd=base,
                          env=dict(_env(base), GITHUB_TOKEN="bot-token"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "refusing to --post" in proc.stdout + proc.stderr
    assert not (base / "out").exists()
    # Without --post too (hostile-4 061): an arm in the process sandbox reaches the local Ray's sockets.
    proc = subprocess.run(_argv("src", "--out", "out", "--isolation", "process"), cwd=base, env=_env(base),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "refusing to sweep" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert not (base / "out").exists()


def test_a_sweep_with_ray_token_authentication_set_in_its_environment(base):
    """What the README tells a cluster operator to set (RAY_AUTH_MODE=token and a token file)
    reaches Ray before Ray is imported, though triage takes it out of its environment at start:
    the local Ray starts authenticated, the item runs, and the token reaches no arm."""
    import secrets

    (base / "src").mkdir()
    (base / "src" / "env_probe.py").write_text(
        "import os, torch\n"
        "print('RAY_VARS', sorted(k for k in os.environ if k.startswith('RAY_')))\n"
        "print(torch.ones(2).sum().item())\n")
    token = base / "ray-token"
    token.write_text(secrets.token_hex(32))
    proc = subprocess.run(_argv("src", "--out", "out", "--arms", "cpu", "--no-minimize", "--json", "out.json"),
                          cwd=base, env=dict(_env(base), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token)),
                          capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    [item] = json.loads((base / "out.json").read_text())["items"]
    assert item["outcome"] == "triaged", item
    with ResultStore(base / "out" / "results.sqlite", readonly=True) as store:
        [stored] = store.results()
    assert "RAY_VARS []" in stored.report["arms"][0]["stdout"]


# -- refusals ----------------------------------------------------------------------------------

def test_no_usable_source_exits_3_and_a_bad_arm_exits_2(base):
    (base / "empty").mkdir()
    empty = sweep(base, "empty", "--out", "out")
    assert empty.rc == 3, empty.output
    assert "skipped: empty: no repro scripts" in empty.output
    assert "Nothing to triage: no source gave an item." in empty.output
    assert "(0 run now, 0 already stored). Report: out/sweep.html" in _sweep_line(empty.output)
    assert "Traceback" not in empty.output and "Ray overhead" not in empty.output
    assert json.loads((base / "out" / "sweep.json").read_text())["items"] == []
    missing = sweep(base, "./no-such-folder/", "--out", "out")
    assert missing.rc == 3 and "no such file or folder" in missing.output, missing.output

    (base / "src").mkdir()
    shutil.copy(FIXTURES / "bad" / "syntax_error.py", base / "src")
    for arms, said in (("cpu,warp9", "unknown device 'warp9'"), ("cpu,cpu", "given twice"), (",", "empty")):
        bad = sweep(base, "src", "--out", "bad-arms", "--arms", arms)
        assert bad.rc == 2, (arms, bad.output)
        assert said in bad.output and "Traceback" not in bad.output, (arms, bad.output)
    assert not (base / "bad-arms").exists()  # refused before anything was written


def test_a_db_that_is_not_a_results_store_is_refused_in_one_line(base):
    (base / "src").mkdir()
    shutil.copy(FIXTURES / "bad" / "syntax_error.py", base / "src")
    (base / "notes.sqlite").write_text("not a database\n")
    run = sweep(base, "src", "--out", "out", "--db", "notes.sqlite")
    assert run.rc == 1, run.output
    assert "notes.sqlite: not a triage sweep results store" in run.output
    assert "Traceback" not in run.output
    assert (base / "notes.sqlite").read_text() == "not a database\n"


def test_the_progress_bar_counts_against_the_items_to_run():
    import io

    from rich.console import Console

    from triage.cli import _SweepProgress
    from triage.sweep.model import ItemResult

    out = io.StringIO()
    progress = _SweepProgress(Console(file=out, force_terminal=True, width=120))
    progress.update("planned", 3, None)
    done = ItemResult(key="a.py", kind="script", title="", content_sha256="0", torch_build="b", arms="cpu",
                      outcome="triaged", verdict_kind="nonfinite-flip", seconds=1.0)
    progress.update("started", object(), None)
    progress.update("finished", object(), done)
    task = progress.bar.tasks[0]
    assert (task.completed, task.total) == (1, 3)
    assert "1 nonfinite-flip" in task.description
    progress.stop()


def test_progress_lines_name_the_build_when_a_sweep_has_several():
    import io

    from rich.console import Console

    from triage.cli import _SweepProgress
    from triage.sweep.model import ItemResult

    done = ItemResult(key="a.py", kind="script", title="", content_sha256="0", torch_build="2.15.0+cu132", arms="cpu",
                      outcome="triaged", verdict_kind="not-reproduced", seconds=1.0)
    for several, line in ((True, "a.py on 2.15.0+cu132: not-reproduced (1.0s)"), (False, "a.py: not-reproduced (1.0s)")):
        out = io.StringIO()
        progress = _SweepProgress(Console(file=out, force_terminal=False, width=120), name_builds=several)
        progress.update("finished", object(), done)
        assert out.getvalue().strip() == line


def test_the_run_options_reach_every_item_and_json_may_name_the_sweeps_own_summary(base, monkeypatch):
    from click.testing import CliRunner

    from triage import cli
    from triage.sweep import driver
    from triage.sweep.item import _arm_share

    seen = {}

    def fake_sweep(options, engine, github, progress, log):
        seen.update(options=options, engine=engine)
        os.makedirs(options.out_dir, exist_ok=True)
        files = {name: os.path.join(options.out_dir, f"sweep.{ext}")
                 for name, ext in (("html", "html"), ("markdown", "md"), ("json", "json"))}
        for path in files.values():
            Path(path).write_text("{}\n")
        return driver.SweepOutcome(results=[], ran=0, problems=[], github_unreachable=False, torch_builds=["b"], stats=None, files=files)

    monkeypatch.setattr(driver, "run_sweep", fake_sweep)
    monkeypatch.chdir(base)
    (base / "out").mkdir()  # a second sweep into the same folder
    result = CliRunner().invoke(cli.main, ["sweep", "src", "--out", "out", "--json", "out/sweep.json", "--seed", "7",
                                           "--all-ablations", "--keep-data", "--rounding-samples", "9",
                                           "--minimize-budget", "30", "--cpus-per-arm", "0.25", "--quiet",
                                           "--torch", "2.15.0, 2.13.0,2.15.0"])
    assert result.exit_code == 3, result.output  # no item: exit 3, and no SameFileError from --json
    assert seen["options"].torch == ("2.15.0", "2.13.0")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    settings = seen["options"].settings
    assert (settings.run.seed, settings.ablation.exhaustive, settings.minimize.reduce_data,
            settings.run.rounding_samples, settings.minimize.budget_s) == (7, True, False, 9, 30.0)
    assert seen["engine"].cpus_per_arm == 0.25
    # Half a CPU per arm: twice the arms at once on a node, each with half the memory ceiling.
    assert _arm_share(0.5) in (512 << 20, _arm_share(1.0) // 2)


def test_the_readmes_sweep_json_has_the_fields_the_sweep_writes(tmp_path):
    """The README's example of sweep.json (its elided parts aside) holds exactly the fields a
    sweep writes, at every level: the file of a sweep with nothing to run, and one item's
    entry and the engine's figures as `driver.summary` writes them."""
    from triage.sweep.driver import SweepOptions, run_sweep, summary
    from triage.sweep.engine import EngineOptions, EngineStats, Latency
    from triage.sweep.model import ItemResult

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    shown = readme.split("`OUT/sweep.json` is one JSON object", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    example = json.loads(re.sub(r",\n\s*…", "", shown).replace("…", ""))
    outcome = run_sweep(SweepOptions(sources=[], out_dir=str(tmp_path), db_path=str(tmp_path / "db.sqlite")),
                        EngineOptions())
    written = json.loads(Path(outcome.files["json"]).read_text())
    latency = Latency.of([1.0])
    item_and_engine = summary([ItemResult(key="k.py", kind="script", title="t", content_sha256="0" * 64,
                                          torch_build="b", arms="cpu", outcome="triaged")], [], ["b"], {},
                              EngineStats(items=1, triaged=1, failed=0, over_budget=0, retried=0, wall_s=1.0,
                                          start_latency=latency, collect_latency=latency))
    written.update(engine=item_and_engine["engine"], items=item_and_engine["items"])

    def shape(value):
        if isinstance(value, dict):
            return {k: shape(v) for k, v in value.items()}
        return [shape(value[0])] if isinstance(value, list) and value and isinstance(value[0], dict) else None

    assert shape(example) == shape(written)
