"""A test of the tests: the verdicts the end-to-end tests assert must not depend on which CPU
kernels this host picks. A few representative cases run again with ATEN_CPU_CAPABILITY=default
(the scalar kernels every x86 and ARM CPU has, in a different summation order from the AVX2 and
AVX-512 ones) and must give the verdicts test_cli.py, test_explain.py and test_corpus.py assert."""
import pytest
from conftest import FIXTURES, ISSUES, emulated_casts_round_as_eager

pytestmark = pytest.mark.slow


# Each divergence is made on purpose (a fault arm, a float16 range overflow, an ill-conditioned
# solve, a cast eager makes and inductor does not): a kernel difference can move digits, not these.
@pytest.mark.parametrize("script, arms, expected", [
    (FIXTURES / "matmul_chain.py", "cpu,cpu/fault=mm", ("likely-bug", False)),
    (FIXTURES / "matmul_chain.py", "cpu,cpu/fault=mm:ulp", ("expected-rounding", True)),
    (FIXTURES / "hilbert_solve.py", "cpu,cpu/fault=linalg_solve_ex", ("expected-ill-conditioned", True)),
    (ISSUES / "gh-187180" / "repro.py", "cpu", ("nonfinite-flip", True)),
    # Inductor generates and compiles C++ for the capability too (and must not reuse code
    # cached for another one); it keeps the float16 intermediate in float32 with any kernels.
    (FIXTURES / "fp16_intermediate_compile.py", "cpu,cpu/compile", ("expected-precision-mode", True)),
], ids=["fault", "ulp-fault", "ill-conditioned", "gh-187180", "fp16-compile"])
def test_verdict_with_the_scalar_cpu_kernels(triage, script, arms, expected):
    _, report, _, out = triage(script, arms, "--no-minimize", env={"ATEN_CPU_CAPABILITY": "default"})
    assert report is not None, out
    # The variable must reach the arms (the sandbox passes only listed variables through).
    assert {a["flags_start"]["cpu_capability"] for a in report["arms"]} == {"DEFAULT"}
    v = report["verdict"]
    if script.name == "fp16_intermediate_compile.py" and not emulated_casts_round_as_eager(
            {"ATEN_CPU_CAPABILITY": "default"}):
        # This torch's emulate_precision_casts leaves the float32 intermediate (test_explain.py says why).
        expected = ("nonfinite-flip", False)
    assert (v["kind"], v["expected"]) == expected, v["summary"]
