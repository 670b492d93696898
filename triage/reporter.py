"""Progress of one triage run, told to whoever watches it (the CLI's status line).

A `Reporter` has one method per event and each does nothing, as resolvelib's `BaseReporter`:
a stage says what it reached and never asks who listens; a display overrides the events it
shows. `QUIET` stands in where nobody watches.
"""
from __future__ import annotations


class Reporter:
    def arm_started(self, arm: str) -> None:
        """The worker of `arm` (its spec) is starting."""

    def arm_phase(self, arm: str, phase: str) -> None:
        """The worker reached `phase`: imported, script-start, script-done, reference-start,
        rounding-start (what the worker itself announces)."""

    def arm_ended(self, arm: str, status: str) -> None:
        """The arm finished with `status` (ok, raised, crashed, timeout, …)."""

    def minimize_step(self, step: str) -> None:
        """The minimizer began `step`: start, reliability, localize, reduce, data, float64,
        render, verify."""

    def minimize_ended(self, verified: bool) -> None:
        """The minimizer wrote its script, which a fresh run did (or did not) verify."""


QUIET = Reporter()
