"""The CLI: end to end (slow: real arm subprocesses, CPU arms and the fault-injecting test arm),
and its terminal output (fast: the pipeline replaced by a made-up report)."""
import pytest
from conftest import FIXTURES, ISSUES, SEEDS


def kind(report):
    return report["verdict"]["kind"], report["verdict"]["expected"]


def scalar_kernels(report):
    """The arms ran ATen's scalar CPU kernels (ATEN_CPU_CAPABILITY=default), and inductor with them."""
    return {a["flags_start"]["cpu_capability"] for a in report["arms"]} == {"DEFAULT"}


@pytest.mark.slow
@pytest.mark.parametrize("arms, expected", [
    ("cpu,cpu/threads=1", ("not-reproduced", None)),
    ("cpu,cpu/fault=mm:ulp", ("expected-rounding", True)),
    ("cpu,cpu/fault=mm", ("likely-bug", False)),
    ("cpu,cpu/fault=mm:raise", ("crash-one-arm", False)),
    ("cpu,cpu/fault=mm:nan", ("nonfinite-flip", False)),
])
def test_verdicts_on_a_well_conditioned_script(triage, arms, expected):
    code, report, comment, out = triage(FIXTURES / "matmul_chain.py", arms)
    assert code == 0, out
    assert kind(report) == expected, report["verdict"]["summary"]
    assert comment.startswith("<!-- triage:report digest=") and f"<code>{expected[0]}</code>" in comment


@pytest.mark.slow
def test_leaves_are_bit_identical_across_arms(triage):
    _, report, _, _ = triage(FIXTURES / "matmul_chain.py", "cpu,cpu/threads=1")
    assert any("bit-identical weights and inputs" in n for n in report["notes"])


@pytest.mark.slow
def test_fp16_overflow_is_expected(triage):
    _, report, _, _ = triage(FIXTURES / "fp16_overflow.py")
    assert kind(report) == ("nonfinite-flip", True)
    assert report["verdict"]["policy_section"] == "Extremal values"


@pytest.mark.slow
@pytest.mark.parametrize("script, op", [("fresh_weights.py", "uniform_"), ("uninitialized.py", "empty")])
def test_fresh_random_or_uninitialized_values_are_nondeterministic(triage, script, op):
    _, report, _, _ = triage(FIXTURES / script)
    assert kind(report) == ("nondeterministic", True)
    assert op in report["verdict"]["summary"]


@pytest.mark.slow
def test_ill_conditioned_solve(triage):
    _, report, _, _ = triage(FIXTURES / "hilbert_solve.py", "cpu,cpu/fault=linalg_solve_ex")
    assert kind(report) == ("expected-ill-conditioned", True)
    assert "cond =" in report["verdict"]["summary"]


@pytest.mark.slow
def test_torch_api_error_on_every_arm_is_could_not_run(triage):
    code, report, _, _ = triage(FIXTURES / "api_error.py")
    assert code == 3 and report["verdict"]["kind"] == "could-not-run"
    assert "mat1 and mat2 shapes cannot be multiplied" in report["verdict"]["summary"]


@pytest.mark.slow
def test_usage_errors_exit_2(triage):
    code, report, _, out = triage(FIXTURES / "matmul_chain.py", "cpu/bogus=1")
    assert code == 2 and "unknown knob 'bogus'" in out and report is None


def test_an_unusable_cache_folder_is_a_usage_error_not_a_traceback(triage, tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    code, report, _, out = triage(FIXTURES / "matmul_chain.py", "cpu", env={"TRIAGE_CACHE_DIR": str(taken / "triage")})
    assert code == 2 and report is None, out
    assert f"the cache folder {taken / 'triage'} cannot be used" in out and "Traceback" not in out


BAD = FIXTURES / "bad"


@pytest.mark.slow
@pytest.mark.parametrize("script, status, message, code", [
    ("syntax_error.py", None, "syntax error", 3),
    ("not_utf8.py", None, "not valid UTF-8", 3),
    ("missing.py", None, "no such file", 3),
    ("segfault.py", "crashed", "SIGSEGV", 3),
    ("reads_stdin.py", "raised", "keyboard input", 3),
])
def test_bad_input_gets_a_clear_report(triage, script, status, message, code):
    rc, report, comment, out = triage(BAD / script)
    assert rc == code, out
    assert report["verdict"]["kind"] == "could-not-run"
    assert message in report["verdict"]["summary"]
    if status:
        assert report["arms"][0]["status"] == status
    assert "Traceback (most recent call last)" not in out.split("triage:")[0]


@pytest.mark.slow
def test_the_scripts_own_raise_is_kept_as_a_result(triage):
    rc, report, comment, _ = triage(BAD / "raises.py")
    assert rc == 0 and report["arms"][0]["status"] == "raised"
    assert "reporter's script fails here" in report["arms"][0]["failure"] and "reporter's script fails here" in comment


@pytest.mark.slow
def test_infinite_loop_times_out(triage):
    rc, report, _, _ = triage(BAD / "infinite_loop.py", "cpu", "--timeout", "5")
    assert rc == 3 and report["arms"][0]["status"] == "timeout"
    assert "--timeout" in report["verdict"]["summary"]


@pytest.mark.slow
def test_memory_blowup_is_killed(triage):
    rc, report, _, _ = triage(BAD / "memory_blowup.py", "cpu", "--memory", "2G")
    assert rc == 3 and report["arms"][0]["status"] == "crashed"
    assert "memory" in report["arms"][0]["failure"]


@pytest.mark.slow
def test_huge_output_is_capped_and_the_verdict_still_comes(triage):
    rc, report, comment, _ = triage(BAD / "huge_output.py")
    assert rc == 0 and report["verdict"]["kind"] == "not-reproduced"
    assert report["arms"][0]["output_dropped"] > 90 * 1024 * 1024
    assert len(comment) <= 65536


@pytest.mark.slow
def test_sys_exit_half_way_keeps_what_was_observed(triage):
    rc, report, _, _ = triage(BAD / "exits_early.py")
    assert rc == 0 and report["arms"][0]["status"] == "ok"
    assert any("sys.exit" in n for n in report["notes"]) and report["observables"]


@pytest.mark.slow
def test_script_without_torch(triage):
    rc, report, _, _ = triage(BAD / "no_torch.py")
    assert rc == 0 and "never produced a tensor" in report["verdict"]["summary"]


@pytest.mark.slow
def test_tokens_never_reach_the_script(triage):
    rc, report, _, _ = triage(BAD / "steals_token.py", "cpu", env={"GITHUB_TOKEN": "ghp_secret", "MY_API_KEY": "k"})
    assert rc == 0 and "LEAKED: []" in report["arms"][0]["stdout"]


@pytest.mark.slow
def test_logdet_seed_on_cpu_reports_singular_input_and_exact_minus_inf(triage):
    _, report, comment, _ = triage(SEEDS / "logdet_cpu_vs_cuda.py")
    v = report["verdict"]
    # The CPU's answer depends on its LAPACK: -inf (agrees with the exact value) or a finite
    # rounding-noise value (a nonfinite flip against it). Either way it is expected.
    assert v["kind"] in ("expected-ill-conditioned", "nonfinite-flip") and v["expected"] is True
    assert "singular" in v["summary"] and "rank 1 of 4" in v["summary"]
    logdet = next(o for o in report["observables"] if o["label"].startswith("Model() call #1 output 0"))
    assert logdet["reference"]["fingerprint"]["neginf"] == 1
    assert "collect_env" in comment


@pytest.mark.slow
def test_gh183768_acosh_compiled_side_is_wrong(triage):
    _, report, _, _ = triage(ISSUES / "gh-183768" / "repro.py", "cpu,cpu/compile")
    v = report["verdict"]
    if scalar_kernels(report):
        # The overflow is in inductor's vectorized acosh; its scalar code (no vector ISA) is right.
        assert v["kind"] == "not-reproduced", v["summary"]
        return
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", False)
    assert "`cpu/compile`" in v["summary"] and "no rounding of this computation gives +inf" in v["summary"]
    zones = {j["arm"]: j["zone"] for j in report["comparison"]["divergence"]["judgements"]}
    assert zones == {"cpu": "inside", "cpu/compile": "outside"}


@pytest.mark.slow
def test_gh188225_is_crash_one_arm(triage):
    _, report, _, _ = triage(ISSUES / "gh-188225" / "repro.py", "cpu,cpu/compile")
    assert kind(report) == ("crash-one-arm", False) and "InductorError" in report["verdict"]["summary"]


@pytest.mark.slow
def test_gh187180_fp16_claim_is_flagged(triage):
    _, report, _, _ = triage(ISSUES / "gh-187180" / "repro.py")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", True) and "float16" in v["summary"]


@pytest.mark.slow
def test_ddp_seed_needing_two_gpus_could_not_run(triage):
    rc, report, _, _ = triage(SEEDS / "ddp_two_gpus.py", "cpu", "--timeout", "60")
    assert rc == 3 and report["verdict"]["kind"] == "could-not-run"


# -- the terminal summary, piped and in a terminal (fast: the pipeline is replaced) ---------------
LONG_URL = "https://docs.pytorch.org/docs/stable/notes/numerical_accuracy.html#" + "batched-computations-" * 12
LONG_CODE_LINE = "x = torch.tensor([" + ", ".join(f"{i}.25" for i in range(60)) + "], dtype=torch.float16)"
LONG_NOTE = " ".join(["a note that goes on"] * 12)


def _long_lines_report(script):
    from triage.model import ArmRun, Comparison, Minimal, Report, Repro, Verdict

    run = ArmRun(spec="cpu", device="cpu", mode="eager", status="ok", elapsed_s=0.1)
    comparison = Comparison(arms=[run], aligned=1, alignment_note=None, leaves_identical=None, leaves_note=None,
                            divergence=None, divergences=0, claims=[], conditioning=[])
    minimal = Minimal(ops=["aten.mm"], script=f"import torch\n{LONG_CODE_LINE}\nprint(x.sum())\n", verified=True,
                      queries=3, seconds=1.0, arms=["cpu", "cpu/compile"], kind="mismatch", reliability="3/3",
                      original_ops=9, verification="fresh runs show it")
    verdict = Verdict(kind="likely-bug", expected=False, policy_section="Batched computations", policy_url=LONG_URL,
                      labels=["module: numerical-stability"], summary="a summary that goes on " * 12,
                      evidence=[f"see {LONG_URL}"])
    return Report(repro=Repro(path=str(script), name="repro.py", source="import torch\n"), arms_requested=["cpu"],
                  comparison=comparison, verdict=verdict, triage_version="t", seconds=0.2, minimal=minimal,
                  notes=[LONG_NOTE])


def _run_piped(tmp_path, monkeypatch, env=None, columns=None):
    """`triage run` through click's runner (stdout and stderr are pipes there), on a made-up report;
    the pipeline reports two arm events, as the real one does."""
    from click.testing import CliRunner

    import triage.pipeline
    from triage import cli

    def pipeline(path, arms, settings, reporter, *rest):
        reporter.arm_started("cpu")
        reporter.arm_ended("cpu", "ok")
        return _long_lines_report(path)

    script = tmp_path / "repro.py"
    script.write_text("import torch\n")
    monkeypatch.setattr(triage.pipeline, "triage_script", pipeline)
    monkeypatch.delenv("COLUMNS", raising=False)
    if columns:
        monkeypatch.setenv("COLUMNS", str(columns))
    return CliRunner().invoke(cli.main, ["run", str(script), "--arms", "cpu", "--comment", "-", "--minimal", "-"],
                              env=env)


def _wrapped_at(stdout, width):
    """The lines of the piped summary wider than `width`, less those printed whole on purpose
    (the minimal repro's code, a line holding a URL)."""
    return [line for line in stdout.splitlines()
            if len(line) > width and line != LONG_CODE_LINE and "://" not in line]


def test_piped_output_without_columns_wraps_at_a_readable_width(tmp_path, monkeypatch):
    from triage.cli import PIPED_WIDTH

    result = _run_piped(tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert _wrapped_at(result.stdout, PIPED_WIDTH) == []
    assert max(len(line) for line in lines if line.startswith("│")) == PIPED_WIDTH  # the box fills the width
    boxed = " ".join(line.strip("│ ") for line in lines if line.startswith("│"))
    assert boxed.count("a summary that goes on") == 12  # wrapped inside the box, nothing cropped
    assert " ".join(line.strip() for line in lines).count("a note that goes on") == 12  # prose wraps, whole
    # Code and URLs are still printed whole: a wrapped line no longer runs or opens.
    assert LONG_CODE_LINE in lines and len(LONG_CODE_LINE) > 200
    assert f"policy: Batched computations {LONG_URL}" in lines and f" • see {LONG_URL}" in lines


def test_piped_with_columns_the_summary_wraps_at_columns(tmp_path, monkeypatch):
    result = _run_piped(tmp_path, monkeypatch, columns=60)
    assert result.exit_code == 0, result.output
    assert _wrapped_at(result.stdout, 60) == []
    assert max(len(line) for line in result.stdout.splitlines() if line.startswith("│")) == 60
    boxed = " ".join(line.strip("│ ") for line in result.stdout.splitlines() if line.startswith("│"))
    assert boxed.count("a summary that goes on") == 12  # wrapped inside the box, nothing cropped
    assert LONG_CODE_LINE in result.stdout.splitlines()  # code is still never wrapped


def test_piped_progress_is_plain_lines_even_when_colour_is_forced(tmp_path, monkeypatch):
    result = _run_piped(tmp_path, monkeypatch, env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stderr and "\x1b" not in result.stdout  # no colour, cursor or spinner codes
    assert result.stderr.startswith("arm cpu: ok after ")


def test_in_a_terminal_code_and_urls_are_never_broken(tmp_path):
    import io
    import re

    from rich.console import Console

    from triage.report.data import report_json
    from triage.report.terminal import render_terminal

    out = io.StringIO()
    render_terminal(report_json(_long_lines_report(tmp_path / "repro.py")), Console(file=out, width=80, force_terminal=True))
    lines = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).splitlines()
    assert LONG_CODE_LINE in lines and f"policy: Batched computations {LONG_URL}" in lines
    # Prose is still wrapped to the terminal's width.
    assert any(line.startswith(" · a note") and len(line) <= 80 for line in lines)


@pytest.mark.slow
def test_a_check_that_fails_on_agreeing_arms_is_said_not_hidden(triage, tmp_path):
    """The arms agree bitwise but the script's own check fails on both (here it asserts the
    reported wrong result, an overflow that does not happen): not-reproduced, and the summary
    says the check failed instead of claiming every comparison holds."""
    script = tmp_path / "asserts_the_bug.py"
    script.write_text("import torch\n"
                      "x = torch.linspace(2.0, 3.0, 8)\n"
                      "y = torch.acosh(x * 1e20)\n"
                      "print(y)\n"
                      "assert torch.isinf(y).all(), 'acosh overflows'\n")
    code, report, _, out = triage(script, "cpu,cpu/threads=1", "--no-minimize")
    assert code == 0, out
    assert kind(report) == ("not-reproduced", None)
    summary = report["verdict"]["summary"]
    assert "the script's own check fails on every arm (the script's own check failed at line 5 " \
           "(AssertionError: acosh overflows))" in summary, summary
    assert "every comparison the script makes holds" not in summary
    # The progress lines say the script's check failed, not that the arm "raised" (a crash).
    assert "arm cpu: the script's check failed after" in out and "raised after" not in out, out
