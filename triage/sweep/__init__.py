"""Backlog sweeps: many items through the same pipeline as `triage run`/`triage issue`, as Ray
tasks, with results kept in SQLite, duplicates bucketed by divergence signature, and one report."""
