"""The results store of a sweep: one SQLite file that keeps one result per item, script, torch
build and arms, written as each item finishes, so that a sweep can be stopped at any moment and
resumed without repeating the work it had finished.

Why SQLite, and why these settings:

* **One file, embedded.**  No server to run next to the Ray cluster: the driver of a sweep is the
  only writer, and the file can be copied, attached to a bug, or opened with the ``sqlite3`` shell
  (text columns are plain text, ``report`` and ``extra`` are JSON text).
* **Resumable.**  :meth:`ResultStore.put` commits each result in its own transaction before it
  returns, so a sweep killed with ``kill -9`` (or a lost driver, or a power cut: see
  ``synchronous``) loses nothing it had finished.  A resumed sweep asks :meth:`ResultStore.done`
  which of its keys already hold a final result and skips them.
* **Idempotent.**  A result is keyed on :attr:`ItemResult.result_key`, ``(key, content_sha256,
  torch_build, arms)``, with a UNIQUE constraint: storing the same key again never adds a row.  A
  ``triaged`` result is final and is never replaced; a ``failed`` one (triage could not produce
  a report: a lost node, triage's own error) is replaced by a later result for its key, so that a
  resumed sweep retries it.  An edited issue body or script has another ``content_sha256``, and
  so another key: its old results stay, and :meth:`ResultStore.latest` shows the newest text's.
* **WAL journal.**  In write-ahead-log mode a reader (``triage sweep report`` on the file while the
  sweep still writes, a second shell) reads the last committed state without waiting for the
  writer and without making it wait; in the default rollback-journal mode every commit would lock
  readers out.  A busy timeout covers what still waits: two writers, or a reader that opens the
  file while the WAL is being recovered after a crash.
* **synchronous=FULL.**  Each commit is fsynced to the WAL before :meth:`put` returns.  A
  ``kill -9`` of the sweep alone would lose nothing without it (the kernel keeps what was
  written); the fsync is for a power cut or a lost machine.  A sweep makes at most a few puts a
  second, each at the end of seconds to minutes of triage, so durability is worth far more than
  the millisecond or so an fsync costs.

The schema has a version, ``PRAGMA user_version`` (:data:`SCHEMA_VERSION`), and an
``application_id`` that says the file is a triage store; a file that is not SQLite, another
program's database, or a store written by a newer triage is refused with a :class:`StoreError`
that says which, rather than read wrongly or altered.

Text that UTF-8 cannot encode (lone surrogates: a script path with undecodable bytes, which
Python decodes with ``surrogateescape``, or an issue body's ``\\ud800`` escape) is stored as the
BLOB of its ``surrogatepass`` encoding, and read back as the same ``str``; every other string is
stored as TEXT.  ``report`` and ``extra`` are JSON with ASCII escapes, so they round-trip the same
way; a float NaN or infinity in them round-trips as a float (Python's JSON extension), and a
string such as ``"nan"`` stays a string.  What JSON cannot tell apart comes back as JSON reads it
(a tuple as a list, an integer dict key as a string), as it would from report.json.  A NaN
``seconds`` is stored as NULL, SQLite's only way to keep it, and read back as NaN.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from triage.sweep.model import ItemResult

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "ResultKey", "ResultStore", "StoreError"]

ResultKey = tuple[str, str, str, str]  # (key, content_sha256, torch_build, arms): ItemResult.result_key

SCHEMA_VERSION = 1
# PRAGMA application_id: what marks the file as a triage results store ("TRGS" in ASCII).
APPLICATION_ID = 0x54524753
OUTCOMES = ("triaged", "failed")

# How many result keys one query of done() asks about: 4 bound parameters each, well under
# SQLite's limit on parameters (32766 since 3.32, 999 before).
_DONE_CHUNK = 200

_SCHEMA = f"""
CREATE TABLE sweeps (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at   TEXT NOT NULL,               -- ISO 8601, UTC
    finished_at  TEXT,                        -- NULL while it runs, or when it was killed
    sources      TEXT NOT NULL,               -- JSON list
    torch_builds TEXT NOT NULL,               -- JSON list
    arms         TEXT NOT NULL,
    counts       TEXT                         -- JSON object, set by finish_sweep
);
CREATE TABLE results (
    -- AUTOINCREMENT: ids only grow, never reused, so the largest id of a key is its newest row
    -- (a replaced failed result gets a new id), which is what latest() reads.
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    key            TEXT NOT NULL,
    content_sha256 TEXT NOT NULL,
    torch_build    TEXT NOT NULL,
    arms           TEXT NOT NULL,
    kind           TEXT NOT NULL,
    title          TEXT NOT NULL,
    outcome        TEXT NOT NULL CHECK (outcome IN {OUTCOMES!r}),
    url            TEXT,
    verdict_kind   TEXT,
    expected       INTEGER CHECK (expected IN (0, 1)),   -- NULL, 0 or 1
    summary        TEXT NOT NULL,
    report         TEXT,                      -- JSON object, NULL where there is none
    error          TEXT,
    seconds        REAL,                      -- NULL stands for NaN (SQLite stores NaN as NULL)
    node           TEXT,
    finished_at    TEXT NOT NULL,
    extra          TEXT NOT NULL,             -- JSON object
    sweep_id       INTEGER REFERENCES sweeps (id),
    stored_at      TEXT NOT NULL,             -- ISO 8601, UTC: when this row was written
    UNIQUE (key, content_sha256, torch_build, arms)
);
CREATE INDEX results_by_build ON results (torch_build, key, arms);
"""

_FIELDS = ("key", "content_sha256", "torch_build", "arms", "kind", "title", "outcome", "url",
           "verdict_kind", "expected", "summary", "report", "error", "seconds", "node",
           "finished_at", "extra")
_COLUMNS = ", ".join(_FIELDS)
_READ = _COLUMNS + ", id"  # what a result is read from: its fields, then its row id


class StoreError(Exception):
    """The file cannot be used as a results store (not SQLite, another program's database, a
    newer schema), or a request the store cannot honour (an unknown sweep id)."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _enc(text: str | None) -> str | bytes | None:
    """A string as SQLite can bind it: TEXT where UTF-8 encodes it, else (lone surrogates) the
    BLOB of its surrogatepass encoding.  Injective: TEXT never equals a BLOB in SQLite."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
    return text


def _dec(value: str | bytes | None) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogatepass")
    return value


def _json(value: Any) -> str:
    # ASCII escapes keep lone surrogates (\\udcff) representable; allow_nan (the default) keeps
    # float NaN/inf as floats.
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


def _key_params(key: str, content_sha256: str, torch_build: str, arms: str) -> tuple:
    return (_enc(key), _enc(content_sha256), _enc(torch_build), _enc(arms))


class ResultStore:
    """One sweep results database.  ``ResultStore(path)`` opens the file, creating it (and its
    folder) where there is none; ``readonly=True`` opens an existing one without writing to it.
    ``timeout`` is how many seconds a statement waits for another connection's lock.

    A store may be used from several threads of one process (calls are serialised) and from
    several processes at once (SQLite's locking; one writer at a time)."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False,
                 timeout: float = 60.0) -> None:
        self.path = os.fspath(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        if readonly:
            if not os.path.exists(self.path):
                raise StoreError(f"{self.path}: no results store there")
            from urllib.parse import quote
            target, uri = f"file:{quote(os.path.abspath(self.path))}?mode=ro", True
        else:
            parent = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(parent, exist_ok=True)
            target, uri = self.path, False
        if os.path.isdir(self.path):
            raise StoreError(f"{self.path}: is a folder, not a results store")
        # isolation_level=None: no implicit transactions; each write below opens its own.
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            target, uri=uri, timeout=timeout, isolation_level=None, check_same_thread=False)
        try:
            self._setup(timeout)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    # -- opening ---------------------------------------------------------------------------

    def _setup(self, timeout: float) -> None:
        conn = self._conn
        assert conn is not None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            # The first statement that reads the file's header: where the file is not SQLite,
            # this is what raises ("file is not a database").
            app_id, version = self._identity()
            # Refuse another program's database, or a newer store, before changing anything in
            # it (the journal mode is kept in the file).
            if (app_id, version) != (0, 0):
                self._check(app_id, version)
            elif not self.readonly:
                self._refuse_foreign()
            if not self.readonly:
                conn.execute("PRAGMA journal_mode = WAL")  # a no-op where it already is WAL
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            if (app_id, version) == (0, 0) and not self.readonly:
                self._create()
                app_id, version = self._identity()
        except sqlite3.DatabaseError as e:
            if "not a database" in str(e):
                raise StoreError(f"{self.path}: not a triage sweep results store: the file is "
                                 f"not a SQLite database ({e})") from e
            if "malformed" in str(e):
                raise StoreError(f"{self.path}: the results store is corrupt ({e})") from e
            raise StoreError(f"{self.path}: cannot open the results store: {e}") from e
        self._check(app_id, version)

    def _refuse_foreign(self) -> None:
        """A SQLite database with no application_id and no schema version is ours to create only
        where it is empty: one with tables belongs to another program."""
        assert self._conn is not None
        tables = self._conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchone()[0]
        if tables:
            raise StoreError(f"{self.path}: not a triage sweep results store: a SQLite database "
                             f"of another program ({tables} tables or indexes, no "
                             f"application_id or schema version)")

    def _identity(self) -> tuple[int, int]:
        assert self._conn is not None
        app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        return app_id, version

    def _create(self) -> None:
        """Create the schema in an empty file, under the write lock: of two processes opening a
        new file at once, one creates it and the other finds it created."""
        assert self._conn is not None
        with self._write():
            if self._identity() != (0, 0):
                return
            self._refuse_foreign()
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._conn.execute(statement)
            self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _check(self, app_id: int, version: int) -> None:
        if (app_id, version) == (0, 0):  # only read-only opening of an empty database gets here
            raise StoreError(f"{self.path}: not a triage sweep results store: an empty or "
                             f"foreign SQLite database (no application_id, no schema version)")
        if app_id != APPLICATION_ID:
            raise StoreError(f"{self.path}: not a triage sweep results store: a SQLite "
                             f"database of another program (application_id {app_id:#x}, a "
                             f"triage store has {APPLICATION_ID:#x})")
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: written by a newer triage: results store schema "
                             f"version {version}, this triage reads schema version "
                             f"{SCHEMA_VERSION}; upgrade triage to read it")
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: unknown results store schema version {version} "
                             f"(this triage reads schema version {SCHEMA_VERSION})")

    # -- plumbing --------------------------------------------------------------------------

    @property
    def conn(self) -> sqlite3.Connection:
        """The underlying connection (for tests and one-off queries); raises once closed."""
        if self._conn is None:
            raise StoreError(f"{self.path}: the results store is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One committed write transaction.  BEGIN IMMEDIATE takes the write lock up front (and
        waits for it under the busy timeout), so a read-then-write never fails half-way with
        SQLITE_BUSY; COMMIT returns once the WAL is fsynced (synchronous=FULL)."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResultStore({self.path!r}{', readonly=True' if self.readonly else ''})"

    # -- results ---------------------------------------------------------------------------

    @staticmethod
    def _row(result: ItemResult) -> tuple:
        if result.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {result.outcome!r}")
        if result.expected not in (None, True, False):
            raise ValueError(f"expected must be None, True or False, not {result.expected!r}")
        seconds = float(result.seconds)
        return (_enc(result.key), _enc(result.content_sha256), _enc(result.torch_build),
                _enc(result.arms), _enc(result.kind), _enc(result.title), result.outcome,
                _enc(result.url), _enc(result.verdict_kind),
                None if result.expected is None else int(result.expected), _enc(result.summary),
                None if result.report is None else _json(result.report), _enc(result.error),
                None if math.isnan(seconds) else seconds, _enc(result.node),
                _enc(result.finished_at), _json(result.extra))

    @staticmethod
    def _result(row: sqlite3.Row | tuple) -> ItemResult:
        """A row (its `_FIELDS`, then its id) as an ItemResult. A row whose `report` or `extra`
        is not JSON (the file was edited, or damaged inside one cell) is read as a failed
        result whose error names the row; the other rows are unaffected."""
        values = dict(zip(_FIELDS, row, strict=False))
        row_id = row[len(_FIELDS)] if len(row) > len(_FIELDS) else None
        for name in ("key", "content_sha256", "torch_build", "arms", "kind", "title", "outcome",
                     "url", "verdict_kind", "summary", "error", "node", "finished_at"):
            values[name] = _dec(values[name])
        values["expected"] = None if values["expected"] is None else bool(values["expected"])
        values["seconds"] = math.nan if values["seconds"] is None else float(values["seconds"])
        unreadable = []
        for name, empty in (("report", None), ("extra", {})):
            try:
                text = values[name]
                values[name] = None if text is None and name == "report" else json.loads(text)
                if not isinstance(values[name], dict if name == "extra" else (dict, type(None))):
                    raise ValueError(f"a JSON {type(values[name]).__name__}, not an object")
            except (TypeError, ValueError, RecursionError) as e:
                values[name] = empty
                unreadable.append(f"its {name} column is not a JSON object ({str(e)[:120] or type(e).__name__})")
        if unreadable:
            where = f"row {row_id}" if row_id is not None else "a row"
            delete = f" (DELETE FROM results WHERE id = {row_id})" if row_id is not None else ""
            values.update(outcome="failed", verdict_kind=None, expected=None,
                          error=f"the stored result cannot be read: {where} of the results store: "
                                f"{'; '.join(unreadable)}. Delete the row{delete} to run the item again.")
        return ItemResult(**values)

    def put(self, result: ItemResult, sweep_id: int | None = None) -> bool:
        """Store one result, committed before this returns.  Idempotent on ``result_key``: where
        the key has a ``triaged`` result this does nothing; where it has a ``failed`` one, this
        result replaces it.  True where the row was written (new or replacing), False where
        ignored.  ``sweep_id`` records which sweep wrote it (see :meth:`start_sweep`)."""
        row = self._row(result)  # before the transaction: a bad result raises without locking
        key = row[:4]
        with self._lock:
            try:
                with self._write() as conn:
                    found = conn.execute(
                        "SELECT id, outcome FROM results WHERE key = ? AND content_sha256 = ? "
                        "AND torch_build = ? AND arms = ?", key).fetchone()
                    if found is not None:
                        if found[1] == "triaged":
                            return False
                        # A new id rather than an UPDATE: the newest row of a key has its
                        # largest id, which latest() relies on.
                        conn.execute("DELETE FROM results WHERE id = ?", (found[0],))
                    conn.execute(
                        f"INSERT INTO results ({_COLUMNS}, sweep_id, stored_at) "
                        f"VALUES ({', '.join('?' * (len(_FIELDS) + 2))})",
                        (*row, sweep_id, _now()))
            except sqlite3.IntegrityError as e:
                if sweep_id is not None and "FOREIGN KEY" in str(e):
                    raise StoreError(f"{self.path}: no sweep {sweep_id} in this store") from e
                raise
            return True

    def get(self, key: str, content_sha256: str, torch_build: str, arms: str) -> ItemResult | None:
        """The stored result for one result key, or None."""
        with self._lock:
            row = self.conn.execute(
                f"SELECT {_READ} FROM results WHERE key = ? AND content_sha256 = ? "
                f"AND torch_build = ? AND arms = ?",
                _key_params(key, content_sha256, torch_build, arms)).fetchone()
        return None if row is None else self._result(row)

    def done(self, result_keys: Iterable[ResultKey]) -> set[ResultKey]:
        """Those of ``result_keys`` that already have a ``triaged`` result: what a resumed sweep
        skips.  Keys with a ``failed`` result, or none, are not in it."""
        wanted = {tuple(k): _key_params(*k) for k in result_keys}
        by_params = {params: k for k, params in wanted.items()}
        params = list(by_params)
        found: set[ResultKey] = set()
        with self._lock:
            for start in range(0, len(params), _DONE_CHUNK):
                chunk = params[start:start + _DONE_CHUNK]
                rows = self.conn.execute(
                    "SELECT key, content_sha256, torch_build, arms FROM results "
                    "WHERE outcome = 'triaged' AND (key, content_sha256, torch_build, arms) IN "
                    f"(VALUES {', '.join(['(?, ?, ?, ?)'] * len(chunk))})",
                    [value for p in chunk for value in p]).fetchall()
                found.update(by_params[tuple(r)] for r in rows)
        return found

    def results(self, torch_build: str | None = None) -> list[ItemResult]:
        """Every stored result, or those of one torch build, ordered by key, torch build and
        arms (and, for one key's several content hashes, oldest first)."""
        sql = f"SELECT {_READ} FROM results"
        params: tuple = ()
        if torch_build is not None:
            sql, params = sql + " WHERE torch_build = ?", (_enc(torch_build),)
        with self._lock:
            rows = self.conn.execute(sql + " ORDER BY key, torch_build, arms, id", params).fetchall()
        return [self._result(r) for r in rows]

    def latest(self, key: str) -> list[ItemResult]:
        """The results of item ``key`` for its newest stored content hash (the text of the row
        stored last), on every torch build and arms, ordered by torch build and arms: e.g.
        "reproduces on 2.13.0, not on 2.15.0".  Empty where the key has no result."""
        with self._lock:
            rows = self.conn.execute(
                f"SELECT {_READ} FROM results WHERE key = ?1 AND content_sha256 = "
                f"(SELECT content_sha256 FROM results WHERE key = ?1 ORDER BY id DESC LIMIT 1) "
                f"ORDER BY torch_build, arms", (_enc(key),)).fetchall()
        return [self._result(r) for r in rows]

    def count(self) -> int:
        """How many results are stored."""
        with self._lock:
            return self.conn.execute("SELECT count(*) FROM results").fetchone()[0]

    # -- sweeps ----------------------------------------------------------------------------

    def start_sweep(self, sources: list[str], torch_builds: list[str], arms: str) -> int:
        """Record a sweep's start; returns its id, for :meth:`put` and :meth:`finish_sweep`."""
        with self._lock, self._write() as conn:
            cursor = conn.execute(
                "INSERT INTO sweeps (started_at, sources, torch_builds, arms) VALUES (?, ?, ?, ?)",
                (_now(), _json(list(sources)), _json(list(torch_builds)), _enc(arms)))
            return int(cursor.lastrowid)

    def finish_sweep(self, sweep_id: int, counts: dict[str, int]) -> None:
        """Record a sweep's end and its counts (e.g. ``{"triaged": 950, "failed": 3}``)."""
        with self._lock, self._write() as conn:
            cursor = conn.execute("UPDATE sweeps SET finished_at = ?, counts = ? WHERE id = ?",
                                  (_now(), _json(dict(counts)), sweep_id))
            if cursor.rowcount != 1:
                raise StoreError(f"{self.path}: no sweep {sweep_id} in this store")

    def sweeps(self) -> list[dict[str, Any]]:
        """Every sweep recorded, oldest first: ``id``, ``started_at``, ``finished_at`` (None
        while running, or where it was killed), ``sources``, ``torch_builds``, ``arms``,
        ``counts`` (None until finished) and ``results`` (how many stored rows it wrote)."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT s.id, s.started_at, s.finished_at, s.sources, s.torch_builds, s.arms, "
                "s.counts, (SELECT count(*) FROM results r WHERE r.sweep_id = s.id) "
                "FROM sweeps s ORDER BY s.id").fetchall()
        return [{"id": r[0], "started_at": r[1], "finished_at": r[2],
                 "sources": json.loads(r[3]), "torch_builds": json.loads(r[4]), "arms": _dec(r[5]),
                 "counts": None if r[6] is None else json.loads(r[6]), "results": r[7]}
                for r in rows]
