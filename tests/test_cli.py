"""End to end: the real CLI, real arm subprocesses, CPU arms (and the fault-injecting test arm)."""
import pytest

from conftest import FIXTURES, ISSUES, SEEDS

pytestmark = pytest.mark.slow


def kind(report):
    return report["verdict"]["kind"], report["verdict"]["expected"]


def scalar_kernels(report):
    """The arms ran ATen's scalar CPU kernels (ATEN_CPU_CAPABILITY=default), and inductor with them."""
    return {a["flags_start"]["cpu_capability"] for a in report["arms"]} == {"DEFAULT"}


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


def test_leaves_are_bit_identical_across_arms(triage):
    _, report, _, _ = triage(FIXTURES / "matmul_chain.py", "cpu,cpu/threads=1")
    assert any("bit-identical weights and inputs" in n for n in report["notes"])


def test_fp16_overflow_is_expected(triage):
    _, report, _, _ = triage(FIXTURES / "fp16_overflow.py")
    assert kind(report) == ("nonfinite-flip", True)
    assert report["verdict"]["policy_section"] == "Extremal values"


@pytest.mark.parametrize("script, op", [("fresh_weights.py", "uniform_"), ("uninitialized.py", "empty")])
def test_fresh_random_or_uninitialized_values_are_nondeterministic(triage, script, op):
    _, report, _, _ = triage(FIXTURES / script)
    assert kind(report) == ("nondeterministic", True)
    assert op in report["verdict"]["summary"]


def test_ill_conditioned_solve(triage):
    _, report, _, _ = triage(FIXTURES / "hilbert_solve.py", "cpu,cpu/fault=linalg_solve_ex")
    assert kind(report) == ("expected-ill-conditioned", True)
    assert "cond =" in report["verdict"]["summary"]


def test_torch_api_error_on_every_arm_is_could_not_run(triage):
    code, report, _, _ = triage(FIXTURES / "api_error.py")
    assert code == 3 and report["verdict"]["kind"] == "could-not-run"
    assert "mat1 and mat2 shapes cannot be multiplied" in report["verdict"]["summary"]


def test_usage_errors_exit_2(triage):
    code, report, _, out = triage(FIXTURES / "matmul_chain.py", "cpu/bogus=1")
    assert code == 2 and "unknown knob 'bogus'" in out and report is None


BAD = FIXTURES / "bad"


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


def test_the_scripts_own_raise_is_kept_as_a_result(triage):
    rc, report, comment, _ = triage(BAD / "raises.py")
    assert rc == 0 and report["arms"][0]["status"] == "raised"
    assert "reporter's script fails here" in report["arms"][0]["failure"] and "reporter's script fails here" in comment


def test_infinite_loop_times_out(triage):
    rc, report, _, _ = triage(BAD / "infinite_loop.py", "cpu", "--timeout", "5")
    assert rc == 3 and report["arms"][0]["status"] == "timeout"
    assert "--timeout" in report["verdict"]["summary"]


def test_memory_blowup_is_killed(triage):
    rc, report, _, _ = triage(BAD / "memory_blowup.py", "cpu", "--memory", "2G")
    assert rc == 3 and report["arms"][0]["status"] == "crashed"
    assert "memory" in report["arms"][0]["failure"]


def test_huge_output_is_capped_and_the_verdict_still_comes(triage):
    rc, report, comment, _ = triage(BAD / "huge_output.py")
    assert rc == 0 and report["verdict"]["kind"] == "not-reproduced"
    assert report["arms"][0]["output_dropped"] > 90 * 1024 * 1024
    assert len(comment) <= 65536


def test_sys_exit_half_way_keeps_what_was_observed(triage):
    rc, report, _, _ = triage(BAD / "exits_early.py")
    assert rc == 0 and report["arms"][0]["status"] == "ok"
    assert any("sys.exit" in n for n in report["notes"]) and report["observables"]


def test_script_without_torch(triage):
    rc, report, _, _ = triage(BAD / "no_torch.py")
    assert rc == 0 and "never produced a tensor" in report["verdict"]["summary"]


def test_tokens_never_reach_the_script(triage):
    rc, report, _, _ = triage(BAD / "steals_token.py", "cpu", env={"GITHUB_TOKEN": "ghp_secret", "MY_API_KEY": "k"})
    assert rc == 0 and "LEAKED: []" in report["arms"][0]["stdout"]


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


def test_gh188225_is_crash_one_arm(triage):
    _, report, _, _ = triage(ISSUES / "gh-188225" / "repro.py", "cpu,cpu/compile")
    assert kind(report) == ("crash-one-arm", False) and "InductorError" in report["verdict"]["summary"]


def test_gh187180_fp16_claim_is_flagged(triage):
    _, report, _, _ = triage(ISSUES / "gh-187180" / "repro.py")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", True) and "float16" in v["summary"]


def test_ddp_seed_needing_two_gpus_could_not_run(triage):
    rc, report, _, _ = triage(SEEDS / "ddp_two_gpus.py", "cpu", "--timeout", "60")
    assert rc == 3 and report["verdict"]["kind"] == "could-not-run"
