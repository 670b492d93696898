"""One `Settings` object, carried whole: the flags of `run`, `issue` and `sweep` become the same
settings, the sweep hands them to each item's task unchanged, and a stage that runs arms its own
way (the item on its node, the minimal script's verification) changes only what it documents.
Each check starts from settings where every field differs from its default, so an option added
later that some step copies by hand, or forgets, fails here."""
from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import triage.pipeline
from triage import cli
from triage.arms.spec import parse_arms
from triage.model import DivergenceKind, Repro
from triage.settings import AblationSettings, MinimizeSettings, RunSettings, Settings

# Every run option's flag with a value other than its default, and the setting it gives.
FLAGS = {
    ("--timeout", "17"): ("run", "timeout_s", 17.0),
    ("--memory", "1G"): ("run", "memory_bytes", 1 << 30),
    ("--no-reference",): ("run", "reference", False),
    ("--rounding-samples", "5"): ("run", "rounding_samples", 5),
    ("--rounding-budget", "7"): ("run", "rounding_budget_s", 7.0),
    ("--seed", "3"): ("run", "seed", 3),
    ("--jobs", "2"): ("run", "jobs", 2),
    ("--isolation", "process"): ("run", "isolation", "process"),
    ("--no-ablate",): ("ablation", "enabled", False),
    ("--ablate-budget", "13"): ("ablation", "budget_s", 13.0),
    ("--all-ablations",): ("ablation", "exhaustive", True),
    ("--no-minimize",): ("minimize", "enabled", False),
    ("--minimize-budget", "11"): ("minimize", "budget_s", 11.0),
    ("--keep-data",): ("minimize", "reduce_data", False),
}


class _Stop(Exception):
    """Raised by a stand-in once it has seen the settings it was called with."""


def _flags() -> list[str]:
    return [word for flag in FLAGS for word in flag]


def _from_flags(script_args: tuple[str, ...] = ()) -> Settings:
    """The settings `FLAGS` stand for."""
    parts: dict[str, dict[str, Any]] = {"run": {"script_args": script_args}, "ablation": {}, "minimize": {}}
    for part, name, value in FLAGS.values():
        parts[part][name] = value
    return Settings(run=RunSettings(**parts["run"]), ablation=AblationSettings(**parts["ablation"]),
                    minimize=MinimizeSettings(**parts["minimize"]))


def _changed(default: Any, annotation: str) -> Any:
    """A value of the field's type other than its default."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1
    if isinstance(default, str):
        return default + "-changed"
    if isinstance(default, tuple):
        return (*default, "changed")
    if isinstance(default, dict):
        return {**default, "changed": "changed"}
    if default is None:  # `X | None`: a value of X
        return {"int": 7, "float": 7.5, "str": "changed"}[annotation.split("|")[0].strip()]
    raise AssertionError(f"no changed value for a field of type {annotation}")


def _all_changed(cls: type) -> Any:
    """`cls` with every field other than its default."""
    default = cls()
    values = {f.name: _changed(getattr(default, f.name), str(f.type)) for f in dataclasses.fields(cls)}
    changed = cls(**values)
    assert all(getattr(changed, name) != getattr(default, name) for name in values)
    return changed


def _everything_changed() -> Settings:
    return Settings(run=_all_changed(RunSettings), ablation=_all_changed(AblationSettings),
                    minimize=_all_changed(MinimizeSettings))


def test_every_flag_changes_a_setting_and_the_flags_show_the_settings_defaults():
    assert len({(part, name) for part, name, _ in FLAGS.values()}) == len(FLAGS)
    expected = _from_flags()
    for part, name, value in FLAGS.values():
        assert getattr(getattr(Settings(), part), name) != value, name
        assert getattr(getattr(expected, part), name) == value
    shown = {p.name: p.default for p in cli.run_command.params}
    assert (shown["timeout"], shown["rounding_samples"], shown["minimize_budget"], shown["ablate_budget"]) == (
        RunSettings.timeout_s, RunSettings.rounding_samples, MinimizeSettings.budget_s, AblationSettings.budget_s)


def test_run_and_sweep_build_the_same_settings_from_the_same_flags(tmp_path, monkeypatch):
    from triage.sweep import driver

    seen: dict[str, Any] = {}

    def pipeline(path, arms, settings, *rest):
        seen["run"] = settings
        raise _Stop

    def sweep(options, engine, *rest, **kw):
        seen["sweep"] = options.settings
        raise _Stop

    monkeypatch.setattr(triage.pipeline, "triage_script", pipeline)
    monkeypatch.setattr(driver, "run_sweep", sweep)
    script = tmp_path / "s.py"
    script.write_text("x = 1\n")
    ran = CliRunner().invoke(cli.main, ["run", str(script), "--arms", "cpu", "--quiet", *_flags(), "--", "--x"])
    # The flags include --isolation process, which a sweep takes only knowingly (the local Ray's sockets).
    swept = CliRunner().invoke(cli.main, ["sweep", str(tmp_path), "--out", str(tmp_path / "out"), "--quiet",
                                          "--allow-weak-sandbox", *_flags()])
    assert isinstance(ran.exception, _Stop) and isinstance(swept.exception, _Stop), (ran.output, swept.output)
    # `run` adds the script's arguments; an arm on this torch needs no other interpreter.
    assert seen["run"] == _from_flags(script_args=("--x",))
    assert seen["sweep"] == _from_flags()


def test_the_sweep_ships_the_settings_to_each_item_unchanged(tmp_path, monkeypatch):
    from triage.sweep import engine, item
    from triage.sweep.driver import SweepOptions, run_sweep
    from triage.sweep.model import SweepItem

    settings = _everything_changed()
    assert pickle.loads(pickle.dumps(settings)) == settings  # how Ray carries it to the task
    shipped = []

    def run_items(work, triage_one, on_result, options, progress=None):
        shipped.extend(w.settings for w in work)

    monkeypatch.setattr(engine, "run_items", run_items)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    run_sweep(SweepOptions(sources=[str(tmp_path / "src")], out_dir=str(tmp_path / "out"),
                           db_path=str(tmp_path / "db.sqlite"), arms=("cpu",), settings=settings),
              engine.EngineOptions(cpus_per_arm=0.25))
    (task,) = shipped
    assert task.settings == settings and (task.torch, task.cpus_per_arm) == (None, 0.25)

    ran = []

    def pipeline(path, arms, settings, *rest):
        ran.append(settings)
        raise _Stop

    monkeypatch.setattr(triage.pipeline, "triage_script", pipeline)
    with pytest.raises(_Stop):
        item.triage_item(SweepItem(key="a.py", kind="script", title="a", text="x = 1\n"), ("cpu",), "b", task)
    # On the node: its own interpreters (none for arms on its torch); the memory asked for is kept.
    assert ran == [dataclasses.replace(settings, run=dataclasses.replace(settings.run, interpreters={}))]


def test_the_minimal_scripts_verification_keeps_every_run_setting_but_three(tmp_path, monkeypatch):
    from triage.minimize import standalone

    options = _all_changed(RunSettings)
    seen = []

    def run_arms(repro, arms, options, reporter=None):
        seen.append(options)
        raise _Stop

    monkeypatch.setattr(standalone, "extract_repro", lambda path: Repro(path=path, name="minimal.py", source=""))
    monkeypatch.setattr(standalone, "run_arms", run_arms)
    a, b = parse_arms("cpu,cpu/compile")
    with pytest.raises(_Stop):
        standalone.verify(Path(tmp_path), a, b, DivergenceKind("mismatch"), options)
    # No float64 replay (the verdict is read off the printed values), no op graphs (nothing is
    # minimized further), none of the reporter's arguments (this is triage's own script).
    assert seen == [dataclasses.replace(options, reference=False, export_graphs=False, script_args=())]
