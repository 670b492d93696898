"""`triage run SCRIPT -- ARGS`: the script's arguments, exactly as given, in every arm that runs it
(ablations included) and never in the minimal script's verification."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import triage.pipeline
from triage import cli
from triage.arms.spec import parse_arms
from triage.model import Report, Repro, Verdict
from triage.settings import RunSettings

# Spaces, quotes, a shell's specials, an empty one, unicode, a newline, a second `--` and
# triage's own option names: data, passed on as they are.
ODD_ARGS = ["two words", "it's \"quoted\"", "$HOME", "*", "", "ünïcødé ✓", "a\nb", "--", "--arms", "cuda"]


def _made_up_report(path: str) -> Report:
    verdict = Verdict(kind="not-reproduced", expected=None, policy_section="none", policy_url="", labels=[],
                      summary="s")
    return Report(repro=Repro(path=path, name="s.py", source="x = 1\n"), arms_requested=["cpu"], comparison=None,
                  verdict=verdict, triage_version="t", seconds=0.1)


def _cli_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[object, list]:
    """`triage run` with the pipeline replaced: (click's result, the (run settings, notes) it was called with)."""
    script = tmp_path / "s.py"
    script.write_text("x = 1\n")
    calls = []

    def pipeline(path, arms, settings, reporter, notes, *rest):
        calls.append((settings.run, notes))
        return _made_up_report(path)

    monkeypatch.setattr(triage.pipeline, "triage_script", pipeline)
    result = CliRunner().invoke(cli.main, ["run", str(script), "--comment", "-", "--minimal", "-", "--quiet",
                                           *argv])
    return result, calls


def test_arguments_after_the_double_dash_are_the_scripts_exactly(tmp_path, monkeypatch):
    result, calls = _cli_run(tmp_path, monkeypatch, "--arms", "cpu", "--", "--n", "7", *ODD_ARGS)
    assert result.exit_code == 0, result.output
    (options, notes), = calls
    assert options.script_args == ("--n", "7", *ODD_ARGS)
    assert any(n.startswith("The script ran with the arguments (`sys.argv[1:]`): --n 7 'two words'") for n in notes)


def test_without_the_double_dash_the_script_gets_no_arguments(tmp_path, monkeypatch):
    result, calls = _cli_run(tmp_path, monkeypatch, "--arms", "cpu")
    assert result.exit_code == 0, result.output
    (options, notes), = calls
    assert options.script_args == () and not any("arguments" in n for n in notes)


@pytest.mark.parametrize("args, message", [
    (["x"] * (cli.MAX_SCRIPT_ARGS + 1), "257 arguments after `--`; a script may be given at most 256"),
    (["y" * 40000, "z" * 40000], "take 80002 bytes; a script may be given at most 64 KiB"),
])
def test_too_many_arguments_is_a_usage_error_before_any_arm(tmp_path, monkeypatch, args, message):
    result, calls = _cli_run(tmp_path, monkeypatch, "--arms", "cpu", "--", *args)
    assert result.exit_code == 2 and message in result.output and calls == []
    assert "Traceback" not in result.output


def test_the_arguments_note_is_cut_to_a_notes_size():
    note = cli._args_note(tuple(["w" * 100] * 200))
    assert len(note) < 5000 and note.endswith("… (200 arguments, 20200 bytes in all)")


def test_every_arms_job_carries_the_arguments(tmp_path, monkeypatch):
    import triage.arms.run

    jobs = []

    def launched(argv, **kw):
        jobs.append(json.loads(Path(argv[-1]).read_text()))
        return triage.arms.run.ProcessOutcome(exit_code=1, signal=None, timed_out=False, memory_exceeded=False,
                                         elapsed_s=0.0, stdout="", stderr="", output_dropped=0, messages=[],
                                         peak_rss_bytes=0)

    monkeypatch.setattr(triage.arms.run, "run_isolated", launched)
    repro = Repro(path=str(tmp_path / "s.py"), name="s.py", source="x = 1\n")
    options = RunSettings(cache_dir=str(tmp_path / "cache"), isolation="process", script_args=("--n", "7", "a b"))
    cpu = parse_arms("cpu")[0]
    triage.arms.run.run_arm(repro, cpu, options, 1 << 30)
    triage.arms.run.run_arm(repro, cpu, RunSettings(cache_dir=str(tmp_path / "cache"), isolation="process"), 1 << 30)
    assert [job["script_args"] for job in jobs] == [["--n", "7", "a b"], []]


def test_the_minimal_scripts_verification_gets_no_arguments(tmp_path, monkeypatch):
    from triage.minimize import standalone
    from triage.model import DivergenceKind

    seen = []

    def run_arms(repro, arms, options):
        seen.append(options)
        raise _Launched

    monkeypatch.setattr(standalone, "extract_repro", lambda path: Repro(path=path, name="minimal.py", source=""))
    monkeypatch.setattr(standalone, "run_arms", run_arms)
    a, b = parse_arms("cpu,cpu/compile")
    with pytest.raises(_Launched):
        standalone.verify(tmp_path, a, b, DivergenceKind("mismatch"), RunSettings(script_args=("--n", "7")))
    assert [o.script_args for o in seen] == [()]


class _Launched(Exception):
    """Stops `verify` once it has launched its arms."""


SCRIPT = """\
import sys
import torch

print("ARGV", repr(sys.argv[1:]), sys.argv[0] == __file__)
n = int(sys.argv[sys.argv.index("--n") + 1])
count = torch.ones(n).sum()
product = torch.ones(n, n) @ torch.ones(n, n)
"""


@pytest.mark.slow
def test_every_arm_and_ablation_runs_the_script_with_its_arguments(tmp_path):
    """The script needs `--n` (it raises without it): every arm observes n, and the ablation's
    re-runs of the diverging pair (the fault arm perturbs the matmul) compare rather than fail."""
    script = tmp_path / "needs_n.py"
    script.write_text(SCRIPT)
    argv = [sys.executable, "-m", "triage", "run", str(script), "--arms", "cpu,cpu/fault=mm", "--json", "r.json",
            "--comment", "c.md", "--minimal", "-", "--no-minimize", "--no-reference", "--", "--n", "7", *ODD_ARGS]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=dict(os.environ, TRIAGE_TEST_ARMS="1"))
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for arm in report["arms"]:
        assert arm["status"] == "ok", arm["failure"]
        assert f"ARGV {['--n', '7', *ODD_ARGS]!r} True" in arm["stdout"]
    counts = [o for o in report["observables"] if "count" in o["label"]]
    assert len(counts) == 2 and all(o["fingerprint"]["sample"] == [7.0] for o in counts)
    assert report["ablations"] and all(a["outcome"] != "not-comparable" for a in report["ablations"])
    assert any("The script ran with the arguments" in n for n in report["notes"])
