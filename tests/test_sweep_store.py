"""The sweep results store (triage/sweep/store.py): exact round trips, idempotence on the result
key, what a resumed sweep skips, durability of each put under kill -9, a reader beside the
writer, and the files it refuses."""
import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT

from triage.sweep.model import ItemResult
from triage.sweep.store import APPLICATION_ID, SCHEMA_VERSION, ResultStore, StoreError

SHA_A, SHA_B = "a" * 64, "b" * 64
BUILD_13, BUILD_15 = "2.13.0+cpu (git 1a2b3c4)", "2.15.0+cpu (git 9f8e7d6)"


def result(key="pytorch/pytorch#183768", *, sha=SHA_A, build=BUILD_13, arms="", outcome="triaged",
           **fields):
    base = dict(kind="issue", title=f"title of {key}", url=None, verdict_kind="likely-bug",
                expected=False, summary="diverges", report={"verdict": {"kind": "likely-bug"}},
                error=None, seconds=1.5, node="node-1", finished_at="2025-01-02T03:04:05+00:00",
                extra={})
    if outcome == "failed":
        base.update(verdict_kind=None, expected=None, summary="", report=None,
                    error="node lost after 3 retries")
    base.update(fields)
    return ItemResult(key=key, content_sha256=sha, torch_build=build, arms=arms, outcome=outcome,
                      **base)


def same(a: ItemResult, b: ItemResult) -> bool:
    """Equal field by field, in types and key order too (repr tells 1 from 1.0, -0.0 from 0.0,
    and a dict's key order), which == alone does not."""
    return repr(dataclasses.astuple(a)) == repr(dataclasses.astuple(b)) and a == b


def rows(path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT count(*) FROM results").fetchone()[0]


# -- round trip --------------------------------------------------------------------------------

def test_a_realistic_result_round_trips_exactly_after_reopening(tmp_path):
    report = {
        "schema": 3,
        "verdict": {"kind": "likely-bug", "expected": False, "confidence": None,
                    "summary": "max |Δ| = 3.2e-2 on cpu/compile vs eager — 2 of 1024 elements ✗"},
        "arms": [
            {"name": "cpu", "max_abs_err": 0.0, "max_rel_err": "nan", "ulp": [0, 1, 2**53 + 1],
             "values": [1.0000000000000002, -0.0, 5e-324, 1.7976931348623157e308, "inf", "-inf",
                        None, True]},
            {"name": "cpu/compile", "stderr": "Traceback…\n  ÿ \x00 \t\r\n", "flags": {}},
        ],
        "unicode": "日本語 🐍 \u202e reversed",
        "nested": [[[]], {"a": [None, {"b": "NaN"}]}],
        "zzz_before_aaa": 1, "aaa": 2,  # key order is kept as written
    }
    original = result("gh-183768/repro.py", kind="script", title="torch.compile diverges 🙃",
                      arms="cpu,cpu/compile", url="https://github.com/pytorch/pytorch/issues/1",
                      expected=False, summary="likely a bug: Δ 3.2e-2", report=report,
                      seconds=12.345678901234567, node=None,
                      extra={"labels": ["module: inductor"], "retries": 2, "ratio": 0.1 + 0.2,
                             "empty": {}, "big": 10**30})
    others = [result("k#1", expected=True, seconds=0.0, report=None, extra={"x": [1.5, "inf"]}),
              result("k#2", expected=None, seconds=float("inf")),
              result("k#3", outcome="failed", error="RayActorError: node died\nline 2")]
    path = tmp_path / "results.sqlite"
    with ResultStore(str(path)) as store:
        for r in (original, *others):
            assert store.put(r) is True
    with ResultStore(str(path)) as store:
        back = store.get(*original.result_key)
        stored = store.results()
    assert back is not None and same(back, original)
    assert len(stored) == 4
    for r in (original, *others):
        match = [s for s in stored if s.result_key == r.result_key]
        assert len(match) == 1 and same(match[0], r), r.key
    assert back.report["arms"][0]["max_rel_err"] == "nan"  # a string stays a string
    assert type(back.expected) is bool and back.extra["big"] == 10**30


def test_float_nan_seconds_and_json_nan_round_trip(tmp_path):
    r = result(seconds=float("nan"), report={"err": float("nan"), "top": float("-inf")})
    with ResultStore(str(tmp_path / "r.db")) as store:
        store.put(r)
    with ResultStore(str(tmp_path / "r.db")) as store:
        back = store.get(*r.result_key)
    assert back.seconds != back.seconds and type(back.seconds) is float  # NaN
    assert back.report["err"] != back.report["err"] and back.report["top"] == float("-inf")


def test_text_utf8_cannot_encode_round_trips_and_stays_distinct(tmp_path):
    # A script path with an undecodable byte (os.fsdecode gives a lone surrogate) and an issue
    # title with a lone \ud800 escape: SQLite takes UTF-8 only.
    odd = result("gh-1/\udcff.py", kind="script", title="bad \ud800 title",
                 report={"stdout": "\udcfe"}, extra={"path": "\udcff"})
    near = result("gh-1/\xff.py", kind="script")  # the same character, properly encoded
    with ResultStore(str(tmp_path / "r.db")) as store:
        assert store.put(odd) and store.put(near)
        assert store.put(odd) is False
        assert store.done([odd.result_key, near.result_key]) == {odd.result_key, near.result_key}
    with ResultStore(str(tmp_path / "r.db")) as store:
        assert same(store.get(*odd.result_key), odd)
        assert same(store.get(*near.result_key), near)
        assert [r.key for r in store.latest(odd.key)] == [odd.key]
        assert store.count() == 2


def test_a_bad_result_is_refused_before_anything_is_stored(tmp_path):
    with ResultStore(str(tmp_path / "r.db")) as store:
        with pytest.raises(ValueError, match="outcome"):
            store.put(result(outcome="skipped"))
        with pytest.raises(TypeError):  # not JSON
            store.put(result(report={"x": object()}))
        assert store.count() == 0
        assert store.put(result()) is True  # no transaction left open


# -- idempotence -------------------------------------------------------------------------------

def test_putting_the_same_key_twice_keeps_one_row(tmp_path):
    path = tmp_path / "r.db"
    with ResultStore(str(path)) as store:
        assert store.put(result()) is True
        assert store.put(result()) is False
        assert store.put(result(summary="another run's summary")) is False
        assert store.get(*result().result_key).summary == "diverges"
    assert rows(path) == 1


def test_a_failed_result_is_replaced_and_a_triaged_one_is_final(tmp_path):
    path = tmp_path / "r.db"
    key = result().result_key
    with ResultStore(str(path)) as store:
        assert store.put(result(outcome="failed", error="first")) is True
        assert store.done([key]) == set()
        # A failed result is replaced by a later one, failed or triaged.
        assert store.put(result(outcome="failed", error="second")) is True
        assert store.get(*key).error == "second"
        assert store.put(result(summary="triaged at last")) is True
        assert store.get(*key).outcome == "triaged"
        assert store.done([key]) == {key}
        # A triaged result is replaced by nothing.
        assert store.put(result(outcome="failed", error="late failure")) is False
        assert store.put(result(summary="a second triage")) is False
        got = store.get(*key)
        assert (got.outcome, got.summary, got.error) == ("triaged", "triaged at last", None)
    assert rows(path) == 1


def test_done_is_the_triaged_keys_and_every_part_of_the_key_counts(tmp_path):
    base = result("o/r#1")
    variants = {
        "build": result("o/r#1", build=BUILD_15),
        "content": result("o/r#1", sha=SHA_B),
        "arms": result("o/r#1", arms="cpu,cpu/compile"),
        "key": result("o/r#2"),
    }
    failed = result("o/r#3", outcome="failed")
    with ResultStore(str(tmp_path / "r.db")) as store:
        assert store.put(base) and store.put(failed)
        asked = [base.result_key, failed.result_key, *(v.result_key for v in variants.values())]
        assert store.done(asked) == {base.result_key}
        assert store.done([]) == set()
        for v in variants.values():  # each a row of its own
            assert store.get(*v.result_key) is None
            assert store.put(v) is True
        assert store.done(asked) == {base.result_key, *(v.result_key for v in variants.values())}
        assert store.count() == 6
        # Many keys at once (more than one query's worth), as a sweep of a backlog asks.
        many = [result(f"o/r#{i}", build="b") for i in range(1000)]
        for r in many[::10]:
            store.put(r)
        assert store.done(r.result_key for r in many) == {r.result_key for r in many[::10]}


# -- reading -----------------------------------------------------------------------------------

def test_results_are_in_a_stable_order_and_filter_by_build(tmp_path):
    puts = [result("b#1", build=BUILD_15), result("a#9", build=BUILD_15, arms="cpu"),
            result("b#1", build=BUILD_13), result("a#9", build=BUILD_15, arms=""),
            result("a#9", build=BUILD_13, outcome="failed")]
    with ResultStore(str(tmp_path / "r.db")) as store:
        for r in puts:
            store.put(r)
        order = [(r.key, r.torch_build, r.arms) for r in store.results()]
        assert order == [("a#9", BUILD_13, ""), ("a#9", BUILD_15, ""), ("a#9", BUILD_15, "cpu"),
                         ("b#1", BUILD_13, ""), ("b#1", BUILD_15, "")]
        assert [(r.key, r.arms) for r in store.results(BUILD_15)] == [("a#9", ""), ("a#9", "cpu"),
                                                                       ("b#1", "")]
        assert store.results("1.0.0") == []


def test_latest_is_the_newest_content_on_every_build(tmp_path):
    with ResultStore(str(tmp_path / "r.db")) as store:
        assert store.latest("o/r#7") == []
        # The issue as first swept, on two builds: reproduces on 2.13, not on 2.15.
        store.put(result("o/r#7", sha=SHA_B, build=BUILD_13, verdict_kind="likely-bug"))
        store.put(result("o/r#7", sha=SHA_B, build=BUILD_15, verdict_kind="no-divergence"))
        store.put(result("o/r#8", sha=SHA_A, build=BUILD_15))
        latest = store.latest("o/r#7")
        assert [(r.torch_build, r.verdict_kind) for r in latest] == [
            (BUILD_13, "likely-bug"), (BUILD_15, "no-divergence")]
        # The body was edited (a hash that sorts before the old one): the new text's results only.
        store.put(result("o/r#7", sha=SHA_A, build=BUILD_15, verdict_kind="could-not-run"))
        assert [(r.content_sha256, r.torch_build) for r in store.latest("o/r#7")] == [
            (SHA_A, BUILD_15)]
        assert len(store.results()) == 4  # the old text's results are kept


# -- sweeps ------------------------------------------------------------------------------------

def test_sweep_bookkeeping(tmp_path):
    path = str(tmp_path / "r.db")
    with ResultStore(path) as store:
        first = store.start_sweep(["pytorch/pytorch#1", "fixtures/issues"], [BUILD_13], "")
        second = store.start_sweep(["more"], [BUILD_13, BUILD_15], "cpu,cpu/compile")
        assert second > first
        store.put(result("a#1"), sweep_id=first)
        store.put(result("a#2"), sweep_id=second)
        store.put(result("a#3"), sweep_id=second)
        store.finish_sweep(first, {"triaged": 1, "failed": 0})
        with pytest.raises(StoreError, match="no sweep 999"):
            store.finish_sweep(999, {})
        with pytest.raises(StoreError, match="no sweep 999"):
            store.put(result("a#4"), sweep_id=999)
    with ResultStore(path) as store:
        s1, s2 = store.sweeps()
        assert store.count() == 3
    assert (s1["id"], s1["sources"], s1["torch_builds"], s1["arms"]) == (
        first, ["pytorch/pytorch#1", "fixtures/issues"], [BUILD_13], "")
    assert s1["counts"] == {"triaged": 1, "failed": 0} and s1["results"] == 1
    assert s1["started_at"] <= s1["finished_at"] and s1["started_at"].endswith("+00:00")
    assert (s2["finished_at"], s2["counts"], s2["results"]) == (None, None, 2)
    assert s2["torch_builds"] == [BUILD_13, BUILD_15] and s2["arms"] == "cpu,cpu/compile"


# -- the file ----------------------------------------------------------------------------------

def test_connection_settings_and_schema_marks(tmp_path):
    path = tmp_path / "deep" / "er" / "results.sqlite"  # the folder is created
    with ResultStore(str(path)) as store:
        conn = store.conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    with pytest.raises(StoreError, match="closed"):
        store.count()
    with sqlite3.connect(path) as conn:  # WAL is kept in the file, for every later reader
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path):
    path = tmp_path / "results.sqlite"
    content = b"this is a CSV, not a database\n" * 200
    path.write_bytes(content)
    with pytest.raises(StoreError, match="not a SQLite database"):
        ResultStore(str(path))
    with pytest.raises(StoreError, match="not a SQLite database"):
        ResultStore(str(path), readonly=True)
    assert path.read_bytes() == content


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "r.db"
    with ResultStore(str(path)) as store:
        store.put(result())
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 98}")
    with pytest.raises(StoreError, match=rf"newer triage: results store schema version "
                                         rf"{SCHEMA_VERSION + 98}, this triage reads schema "
                                         rf"version {SCHEMA_VERSION}"):
        ResultStore(str(path))
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 98
        assert conn.execute("SELECT count(*) FROM results").fetchone()[0] == 1


def test_another_programs_database_is_refused_unaltered(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE results (x)")
    with pytest.raises(StoreError, match="another program"):
        ResultStore(str(path))
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA application_id = 42")
        conn.execute("PRAGMA user_version = 1")
    with pytest.raises(StoreError, match="another program .application_id 0x2a"):
        ResultStore(str(path))
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not made WAL
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 1


def test_readonly_opens_without_writing(tmp_path):
    path = tmp_path / "r.db"
    with pytest.raises(StoreError, match="no results store"):
        ResultStore(str(path), readonly=True)
    assert not path.exists()
    with ResultStore(str(path)) as store:
        store.put(result())
    with ResultStore(str(path), readonly=True) as store:
        assert [r.key for r in store.results()] == [result().key]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.put(result("another#1"))


# -- processes ---------------------------------------------------------------------------------

# A sweep's writer: puts results for keys 0..N-1 in order, printing each key once put() returned
# (that is, committed), flushed, so that the parent knows what was committed when it kills it.
WRITER = textwrap.dedent("""
    import sys
    from triage.sweep.model import ItemResult
    from triage.sweep.store import ResultStore
    path, n = sys.argv[1], int(sys.argv[2])
    with ResultStore(path) as store:
        sweep = store.start_sweep(["test"], ["b"], "")
        for i in range(n):
            store.put(ItemResult(key=f"k{i}", kind="script", title="t" * 200, content_sha256="c",
                                 torch_build="b", arms="", outcome="triaged", summary="s" * 500,
                                 report={"i": i, "values": list(range(50))}), sweep_id=sweep)
            print(f"k{i}", flush=True)
""")


def writer(path, n):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def item(i):
    return ItemResult(key=f"k{i}", kind="script", title="t", content_sha256="c", torch_build="b",
                      arms="", outcome="triaged")


def test_kill_9_mid_write_loses_no_committed_result_and_resumes(tmp_path):
    path, n = tmp_path / "r.db", 10_000
    proc = writer(path, n)
    try:
        committed = []
        while len(committed) < 300:
            line = proc.stdout.readline()
            assert line, f"the writer stopped early: {proc.stderr.read()}"
            committed.append(line.strip())
        proc.send_signal(signal.SIGKILL)  # with the next put() most likely mid-transaction
        proc.wait(timeout=30)
        committed += proc.stdout.read().split()  # printed before the kill: committed too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert len(committed) < n  # killed part-way
    # The raw file after the crash: consistent, each committed key exactly once.
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        stored = [k for (k,) in conn.execute("SELECT key FROM results")]
    assert len(stored) == len(set(stored))
    assert set(committed) <= set(stored)
    assert len(stored) - len(committed) <= 1  # at most the put the kill interrupted after COMMIT
    # Resume: every key put again; the stored ones are kept, the rest added, nothing twice.
    with ResultStore(str(path)) as store:
        # What is checked here is idempotence, not durability (the kill was): without an fsync
        # per put, which on a slow or busy disk would make this test take minutes.
        store.conn.execute("PRAGMA synchronous = OFF")
        assert store.done([item(i).result_key for i in range(n)]) == {
            (k, "c", "b", "") for k in stored}
        written = sum(store.put(item(i)) for i in range(n))
        assert written == n - len(stored)
        assert store.count() == n
        (sweep,) = store.sweeps()
        assert sweep["finished_at"] is None and sweep["results"] == len(stored)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(DISTINCT key), count(*) FROM results").fetchone() == (n, n)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        # The schema itself refuses a second row for a key, whoever writes the file.
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            conn.execute("INSERT INTO results (key, content_sha256, torch_build, arms, kind, title, "
                         "outcome, summary, finished_at, extra, stored_at) "
                         "VALUES ('k0', 'c', 'b', '', 'script', 't', 'triaged', '', '', '{}', '')")


def test_a_reader_in_another_process_reads_while_the_sweep_writes(tmp_path):
    path = tmp_path / "r.db"
    # More puts than it can make before it is killed: a full pipe holds the writer within about
    # 10,000 keys of this reader, so it is still writing at the end however fast the disk is
    # (with 10,000 puts, CI's writer had finished before the reader's 400th key).
    proc = writer(path, 10_000_000)
    try:
        first = proc.stdout.readline().strip()
        assert first == "k0", proc.stderr.read()
        # Opened while the writer writes, one of them read-only.
        readers = [ResultStore(str(path)), ResultStore(str(path), readonly=True)]
        seen, reads, started = 0, 0, time.monotonic()
        while seen < 400 and time.monotonic() - started < 10:
            key = proc.stdout.readline().strip()
            assert key, f"the writer stopped: {proc.stderr.read()}"
            seen += 1
            for reader in readers:
                # Each committed put is visible to other processes at once.
                assert reader.get(key, "c", "b", "") is not None, key
                if seen % 20 == 0:
                    count = len(reader.results())
                    assert count >= seen + 1
                    assert len(reader.done([(f"k{i}", "c", "b", "") for i in range(count)])) == count
                    reads += 1
        assert seen >= 100 and reads >= 10
        assert proc.poll() is None  # the writer was writing all along
    finally:
        for reader in locals().get("readers", []):
            reader.close()
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert "locked" not in err and "Error" not in err, err
