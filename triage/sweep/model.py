"""What a sweep is made of: the items it triages and the one result it keeps per item, script,
torch build and arms.  Plain data, shared by the sources, the Ray engine, the SQLite store, the
duplicate buckets and the sweep report."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SweepItem:
    """One thing to triage.

    ``kind`` is ``issue`` (``key`` is ``OWNER/REPO#N``; ``text`` is the issue body, from which
    the repro is extracted as `triage issue` does) or ``script`` (``key`` is the script's path
    relative to the swept folder, e.g. ``gh-183768/repro.py``; ``text`` is the script itself).
    ``arms`` is empty where triage chooses the arms from the script, as `triage run` does."""

    key: str
    kind: str  # issue | script
    title: str
    text: str
    url: str | None = None
    path: str | None = None  # script items: the file on this machine
    arms: tuple[str, ...] = ()
    issue: dict[str, Any] | None = None  # issue items: repo, number, title, url, author, labels

    @property
    def content_sha256(self) -> str:
        """What decides whether a stored result still applies: the text triage runs."""
        return hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class ItemResult:
    """The outcome of one item on one torch build.

    ``outcome`` is ``triaged`` when triage produced a report (its verdict may itself be
    could-not-run: a syntax error, a hang) and ``failed`` when triage could not produce one (a
    lost node after its retries, triage's own error; ``error`` says which)."""

    key: str
    kind: str
    title: str
    content_sha256: str
    torch_build: str  # e.g. "2.13.0+cpu (git 1a2b3c4)": version and build, see `sweep.builds`
    arms: str  # the arms asked for, comma-separated; "" where triage chose them from the script
    outcome: str  # triaged | failed
    url: str | None = None
    verdict_kind: str | None = None
    expected: bool | None = None
    summary: str = ""
    report: dict[str, Any] | None = None  # report.json
    error: str | None = None
    seconds: float = 0.0
    node: str | None = None  # the Ray node that ran it
    finished_at: str = ""  # ISO 8601, UTC
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def result_key(self) -> tuple[str, str, str, str]:
        """The key a sweep is idempotent on."""
        return (self.key, self.content_sha256, self.torch_build, self.arms)
