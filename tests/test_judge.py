"""The judge end to end (`triage run` in subprocesses): each script in fixtures/judge/ makes
its divergence on purpose — by a formula that cancels or stagnates, a cast the program asks
for, a compiler backend that rewrites a formula — so the verdict holds on any machine."""
import re

import pytest

from tests.conftest import FIXTURES, run_source

JUDGE = FIXTURES / "judge"
pytestmark = pytest.mark.slow


def run(triage, name, arms="cpu", *extra):
    code, report, comment, out = triage(JUDGE / f"{name}.py", arms, *(extra or ("--no-minimize",)))
    assert report is not None, out
    return report, comment


def judgements(report):
    return report["comparison"]["divergence"]["judgements"]


def test_python_loop_cancellation_is_expected_and_a_computational_zero(triage):
    report, _ = run(triage, "loop_cancellation")
    v = report["verdict"]
    assert v["expected"] is True and v["kind"] in ("expected-rounding", "expected-ill-conditioned")
    assert "computational zero" in v["summary"]
    assert report["ablations"] == []  # rounding explains it: no switch is tried


def test_naive_variance_is_ill_conditioned_and_points_at_torch_var(triage):
    report, _ = run(triage, "naive_variance")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-ill-conditioned", True)
    assert "torch.var" in v["summary"]
    assert "module: correctness (silent)" not in v["labels"]


def test_fp16_sum_against_the_fp32_sum_is_rounding_at_fp16(triage):
    report, _ = run(triage, "fp16_sum")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-rounding", True)
    assert {j["zone"] for j in judgements(report)} == {"inside"}
    assert any(j["dtype"] == "float16" for j in judgements(report))


def test_stagnating_running_sum_is_order_dependent_accumulation(triage):
    report, _ = run(triage, "stagnation")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-rounding", True)
    assert "order-dependent" in v["summary"]
    assert judgements(report)[0]["zone"] == "envelope"


def test_script_comparing_exp_minus_one_with_expm1_is_told_to_use_expm1(triage):
    report, _ = run(triage, "expm1_formula")
    v = report["verdict"]
    assert v["expected"] is True and "torch.expm1" in v["summary"]


def test_rank_deficient_matrix_through_svd_names_the_exact_answer(triage):
    # The fault turns the arm's quotient finite (LAPACK's zero singular value gives inf on some
    # CPUs, rounding noise on others); the zero column keeps the float64 reference inf.
    report, _ = run(triage, "rank_deficient_cond", "cpu/fault=div:finite")
    v = report["verdict"]
    (j,) = judgements(report)
    assert j["reference"] == "inf" and j["zone"] == "inside", j
    # A finite value is rounding noise of an exactly singular matrix: the exact answer is named.
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", True), v["summary"]
    assert "exact answer is not finite" in v["summary"] and "rank 2 of 3" in v["summary"]


def test_compiled_exp_minus_one_where_eager_uses_expm1_is_not_excused(triage):
    report, _ = run(triage, "expm1_backend", "cpu,cpu/compile", "--no-ablate")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("likely-bug", False)
    zones = {j["arm"]: j["zone"] for j in judgements(report)}
    assert zones == {"cpu": "inside", "cpu/compile": "outside"}
    assert "`cpu/compile`" in v["summary"]
    # The script's own backend is the script's code: named, and no PyTorch correctness label.
    assert "the script's own compile backend `exp_minus_one_backend`" in v["summary"], v["summary"]
    assert "module: correctness (silent)" not in v["labels"]
    # Minimized with the script's own backend (inductor computes expm1 right): the op it
    # rewrites, in a verified script that defines and uses that backend.
    minimal = report["minimal"]
    assert minimal is not None, report["notes"]
    assert "aten.expm1" in minimal["ops"] and minimal["verified"] is True
    assert "def exp_minus_one_backend(gm, example_inputs):" in minimal["script"]
    assert "backend=exp_minus_one_backend" in minimal["script"]


def test_a_backend_that_picks_nodes_by_a_functional_is_minimized_with_it(triage):
    """The backend tests `node.target is F.gelu`, as dynamo's graphs hold it. The candidates
    called `aten.gelu` through `torch.gelu`, which does not exist, so the aten op itself: the
    test matched nothing and the minimizer said the backend "depends on more than the op
    graph". They call `F.gelu` now, and the one op is found."""
    report, _ = run(triage, "gelu_backend", "cpu,cpu/compile", "--no-ablate")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("likely-bug", False), v["summary"]
    minimal = report["minimal"]
    assert minimal is not None, report["notes"]
    assert minimal["ops"] == ["aten.gelu"] and minimal["verified"] is True
    assert "torch.nn.functional.gelu(x0)" in minimal["script"] and "backend=tanh_gelu_backend" in minimal["script"]


def test_compiled_acosh_that_overflows_is_a_bug_not_an_extremal_value(triage):
    report, _ = run(triage, "acosh_backend", "cpu,cpu/compile")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", False)
    zones = {j["arm"]: j["zone"] for j in judgements(report)}
    assert zones == {"cpu": "inside", "cpu/compile": "outside"}


def test_a_compiled_fma_contraction_of_two_equal_products_is_not_rounding(triage):
    # gh-122260 (Triton on CUDA, a maintainer-filed bug): `x*s - x*s` is 0 under any rounding,
    # since one kernel given the same inputs twice rounds the same way twice; inside a
    # compiled region too, so the contracted inf is outside, never "where rounding leads".
    report, _ = run(triage, "fma_backend", "cpu,cpu/compile", "--no-minimize", "--no-ablate")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", False), v["summary"]
    zones = {j["arm"]: j["zone"] for j in judgements(report)}
    assert zones == {"cpu": "inside", "cpu/compile": "outside"}


def test_mid_graph_half_cast_under_compile_leaves_eager_inside(triage):
    report, _ = run(triage, "midgraph_half_compile", "cpu,cpu/compile")
    v = report["verdict"]
    assert v["expected"] is True and v["kind"] in ("expected-rounding", "expected-precision-mode",
                                                   "not-reproduced")
    if report["comparison"]["divergence"] is not None:
        zones = {j["arm"]: j["zone"] for j in judgements(report)}
        assert zones.get("cpu") == "inside"


def _flush_to_zero_works_here():
    import torch

    supported = torch.set_flush_denormal(True)
    torch.set_flush_denormal(False)
    return supported


@pytest.mark.skipif(not _flush_to_zero_works_here(), reason="this CPU has no flush-to-zero mode")
def test_the_scripts_flush_to_zero_is_its_precision_mode_and_named(triage):
    """The replay flushes where the script had flush-to-zero on, and only there: the same
    formula computed before the call is not taken for a repeat of the flushed one."""
    report, _ = run(triage, "flush_to_zero")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-precision-mode", True), v["summary"]
    assert "flush-to-zero at line 9 (`torch.set_flush_denormal(True)`)" in v["summary"]
    zones = {j["label"]: j["zone"] for j in judgements(report)}
    assert set(zones.values()) == {"inside"}, zones


def test_flush_to_zero_reads_a_subnormal_input_as_zero(triage, tmp_path):
    """x86's flush-to-zero sets denormals-are-zero too (ARM's FZ flushes inputs as well): a
    subnormal leaf made before the call is 0 to the multiplication. Flushing outputs only,
    the replay kept it, and `y` was "7.5e6σ outside": likely-bug."""
    report = run_source(triage, tmp_path, "denormals_are_zero", (
        "import torch\n"
        "x = torch.tensor([1e-40, 3e-39, 1.0])  # float32 subnormals, then a normal value\n"
        "torch.set_flush_denormal(True)\n"
        "y = x * 1e38\n"
        "torch.set_flush_denormal(False)\n"
        "z = x * 1e38\n"
        "print(torch.allclose(y, z))\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-precision-mode", True), v["summary"]
    assert "flush-to-zero at line 3 (`torch.set_flush_denormal(True)`)" in v["summary"]



@pytest.mark.skipif(not _flush_to_zero_works_here(), reason="this CPU has no flush-to-zero mode")
def test_a_subnormal_product_flushed_to_zero_is_the_mode_though_within_tolerance(triage, tmp_path):
    """`x * 3` of a subnormal before and after `set_flush_denormal(True)`: 3e-39 and 0 meet
    float32's tolerance through its atol, but the zero is the mode's, not rounding's (it was
    'ordinary floating-point rounding')."""
    report = run_source(triage, tmp_path, "flushed_product", (
        "import torch\n"
        "x = torch.full((8,), 1e-39)\n"
        "a = x * 3\n"
        "torch.set_flush_denormal(True)\n"
        "b = x * 3\n"
        "torch.set_flush_denormal(False)\n"
        "assert torch.equal(a, b)\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-precision-mode", True), v["summary"]
    assert "with zeros where its float64 value is below the smallest normal float32" in v["summary"], v["summary"]


def test_a_value_that_reads_torch_empty_is_nondeterministic_and_a_filled_buffer_is_not(triage, tmp_path):
    """`acc = torch.empty(64); acc += x` agrees with its float64 replay (which reads the same
    bytes) and with any other arm of this machine: "nothing diverges" was the verdict. A NaN-
    filled replay tells it from buffers every element of which is written first."""
    report = run_source(triage, tmp_path, "accumulate", (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(16)\n"
        "acc = torch.empty(16)\n"
        "acc += x\n"
        "buf = torch.empty(16)\n"
        "buf[:] = x * 2\n"
        "out = torch.empty(16)\n"
        "torch.add(x, 1.0, out=out)\n"
        "print(acc.sum().item(), buf.sum().item(), out.sum().item())\n"))
    reads = {o["expression"]: o["uninitialized"] for o in report["observables"] if o.get("expression")}
    assert reads == {"acc.sum().item()": True, "buf.sum().item()": False, "out.sum().item()": False}, reads
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nondeterministic", True), v["summary"]  # the script's testing method
    assert "`acc.sum().item()` (line 10) reads memory that `torch.empty` at line 4 leaves uninitialized" in v["summary"]


def test_a_divergence_that_reads_torch_empty_is_nondeterministic_not_a_different_function(triage, tmp_path):
    """A padded buffer summed whole: its 24 unwritten elements hold whatever bytes were there,
    so the check against the data's own sum fails by those bytes. In float64 too, which made it
    "the two sides compute different functions": likely-bug."""
    report = run_source(triage, tmp_path, "padded_buffer", (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "data = torch.randn(1000)\n"
        "junk = torch.randn(1024) * 1e30\n"
        "del junk  # its block is likely the next one of its size\n"
        "buf = torch.empty(1024)\n"
        "buf[:1000] = data\n"
        "total = buf.sum()\n"
        "torch.testing.assert_close(total, data.sum())\n"))
    # Whatever the bytes held (zeros: then nothing diverges), the verdict is the same.
    v = report["verdict"]
    assert v["kind"] == "nondeterministic", v["summary"]
    assert "reads memory that `torch.empty` at line 6 leaves uninitialized" in v["summary"], v["summary"]


def test_complex_values_that_are_different_functions_are_a_bug(triage, tmp_path):
    """A hand-written complex multiply with a sign error against `a * b`: their float64 values
    differ by 4.5, which the comparison of references skipped for complex values, so the
    verdict read "their float64 replays agree" (expected-rounding), or blamed the correct
    `a * b` where its simulated rounding was one rounding per part."""
    report = run_source(triage, tmp_path, "complex_sign", (
        "import torch\n"
        "torch.manual_seed(13)\n"
        "a = torch.randn(256, dtype=torch.complex64)\n"
        "b = torch.randn(256, dtype=torch.complex64)\n"
        "ours = torch.complex(a.real * b.real + a.imag * b.imag, a.real * b.imag + a.imag * b.real)\n"
        "ref = a * b\n"
        "torch.testing.assert_close(ours, ref)\n"))
    v = report["verdict"]
    assert v["kind"] == "likely-bug", v["summary"]
    assert "`ours` vs `ref`" in v["summary"] and "compute different functions" in v["summary"], v["summary"]
    assert "view_as_real" not in v["summary"]  # a part of a complex value is a view, not a computation


def test_a_half_precision_overflow_names_the_op_that_leaves_the_range(triage, tmp_path):
    """A float16 skewness is nan where float32's is finite: expected, and the op whose result
    first leaves float16's range is named (the verdict said only "where the range leads")."""
    report = run_source(triage, tmp_path, "skew16", (
        "import torch\n"
        "torch.manual_seed(2)\n"
        "x = torch.randn(4096) * 20 + 3\n"
        "def skewness(t):\n"
        "    c = t - t.mean()\n"
        "    return (c ** 3).mean() / (c ** 2).mean() ** 1.5\n"
        "s32, s16 = skewness(x), skewness(x.half())\n"
        "assert torch.isfinite(s16), (s32.item(), s16.item())\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", True), v["summary"]
    assert "`aten.pow` at line 6 is where the values leave float16's range" in v["summary"], v["summary"]
    assert "the largest finite float16 is 65504" in v["summary"]


def test_an_overflow_is_named_before_a_cancellation_upstream_of_it(triage, tmp_path):
    """float16 attention scores past 65504 give inf, and softmax nan. The scores' matmul also
    cancels (its worst element's terms sum to 1/300 of their magnitudes): the verdict named
    that cancellation, which explains lost digits, and not the overflow, which explains the nan."""
    report = run_source(triage, tmp_path, "attn16", (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "q, k, v = torch.randn(1, 8, 64) * 80, torch.randn(1, 8, 64) * 80, torch.randn(1, 8, 64)\n"
        "def attn(q, k, v):\n"
        "    return torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1) @ v\n"
        "o32, o16 = attn(q, k, v), attn(q.half(), k.half(), v.half())\n"
        "torch.testing.assert_close(o16.float(), o32, atol=1e-2, rtol=1e-2)\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", True), v["summary"]
    assert "`aten.bmm` at line 5 is where the values leave float16's range" in v["summary"], v["summary"]


def test_a_fully_masked_row_is_nan_in_exact_arithmetic_not_an_overflow(triage, tmp_path):
    """A twenty-fourth new user's c18: attention written by hand over a mask that allows no key
    (softmax of a row of −inf: 0/0) against `scaled_dot_product_attention`, which returns 0
    there. The verdict said `masked_fill` "leaves float32's range … from finite inputs" (the
    −inf is the script's own fill value) and called SDPA's 0 "the exact answer". Each side is
    at its own float64 value; those part in finiteness."""
    report = run_source(triage, tmp_path, "masked", (
        "import torch\n"
        "import torch.nn.functional as F\n"
        "q, k = torch.ones(1, 1, 1, 2), torch.ones(1, 1, 3, 2)\n"
        "v = torch.arange(6.).reshape(1, 1, 3, 2)\n"
        "keep = torch.zeros(1, 3, dtype=torch.bool)\n"
        "manual = torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~keep, float('-inf')), dim=-1) @ v\n"
        "sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)\n"
        "torch.testing.assert_close(sdpa, manual, equal_nan=True)\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", True), v["summary"]
    assert "`manual` is nan at 2 element(s) where `sdpa` is finite" in v["summary"], v["summary"]
    assert "`aten._softmax` at line 6 normalizes over a slice" in v["summary"]
    assert "leave" not in v["summary"] and "exact answer" not in v["summary"]


def test_a_different_function_names_the_one_change_that_makes_it_the_other(triage, tmp_path):
    """A GELU written with 0.707 for 1/√2 against `F.gelu`: likely-bug, and the verdict names
    the constant (it listed the parting ops only: every op of the hand-written side). 0.707 is
    1.5e-4 off, beyond float32 rounding on any CPU (0.70711's 4.5e-6 is inside the spread
    of the default capability's GELU)."""
    report = run_source(triage, tmp_path, "gelu_constant", (
        "import torch\n"
        "import torch.nn.functional as F\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(1000) * 3\n"
        "ours = 0.5 * x * (1 + torch.erf(x * 0.707))\n"
        "ref = F.gelu(x)\n"
        "print((ours - ref).abs().max().item())\n"))
    v = report["verdict"]
    assert v["kind"] == "likely-bug", v["summary"]
    assert ("`aten.mul` at line 5 takes 0.707, 1/√2 to 4 digits: with 1/√2 (0.7071067811865475) there, `ours` "
            "equals `ref` in float64 — the constant is the difference") in v["summary"], v["summary"]


def test_two_models_built_unseeded_and_measured_apart_are_nondeterministic(triage, tmp_path):
    """The script prints its own `(out1 - out2).abs().max()` of two models built by one
    function: nothing compared them, and one arm said "nothing diverges". The error measure
    is the script's claim that they agree, and their weights are two different draws."""
    report = run_source(triage, tmp_path, "two_builds", (
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))\n"
        "torch.manual_seed(0)\n"
        "data = torch.randn(5, 8)\n"
        "out1, out2 = build()(data), build()(data)\n"
        "print('max diff:', (out1 - out2).abs().max().item())\n"))
    v = report["verdict"]
    assert v["kind"] == "nondeterministic", v["summary"]
    assert "`out1` vs `out2` (`max abs(a - b)`) (line 7)" in v["summary"] and "line 3 draws new numbers" in v["summary"]
    assert "eval()" not in v["summary"]  # a weight initializer's draws: train mode has nothing to do with it


def test_the_headline_is_the_nan_tensor_not_the_boolean_that_summarizes_it(triage, tmp_path):
    """A backend swaps softmax for exp/sum, which overflows to NaN. The script prints
    `torch.isnan(compiled).any().item()` first: a boolean, judged "at most 0σ" as the headline
    (likely-bug), with the NaN tensor itself only among the others."""
    report = run_source(triage, tmp_path, "naive_softmax", (
        "import torch\n"
        "def naive_softmax(x, dim=-1):\n"
        "    e = torch.exp(x)\n"
        "    return e / e.sum(dim=dim, keepdim=True)\n"
        "def backend(gm, example_inputs):\n"
        "    for node in gm.graph.nodes:\n"
        "        if node.op == 'call_function' and node.target is torch.softmax:\n"
        "            node.target = naive_softmax\n"
        "    gm.recompile()\n"
        "    return gm.forward\n"
        "def head(logits):\n"
        "    return torch.softmax(logits * 2.0, dim=-1)\n"
        "torch.manual_seed(0)\n"
        "logits = torch.randn(4, 10) * 20 + 20\n"
        "compiled = torch.compile(head, backend=backend)(logits)\n"
        "print('nan in compiled:', torch.isnan(compiled).any().item())\n"
        "print(compiled[0])\n"), "cpu,cpu/compile")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", False), v["summary"]
    assert "nan where no rounding of this computation gives nan" in v["summary"], v["summary"]


def test_a_tiny_residual_measured_by_the_script_does_not_hide_the_error_it_reports(triage, tmp_path):
    """The script prints a Vandermonde solve's residual, `(V @ coef - y).abs().max()`, within
    float32's tolerance, then the coefficients' error, 17 % and the point of the report. The
    residual's pair became the headline, "ordinary rounding"; an error measure within tolerance
    is what the script expected, and the coefficients' ill-conditioning is named."""
    report = run_source(triage, tmp_path, "vandermonde", (
        "import torch\n"
        "t = torch.linspace(0, 1, 10)\n"
        "V = torch.linalg.vander(t)\n"
        "true_coef = torch.ones(10)\n"
        "y = V @ true_coef\n"
        "coef = torch.linalg.solve(V, y)\n"
        "print('residual', (V @ coef - y).abs().max().item())\n"
        "print('error', (coef - true_coef).abs().max().item())\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-ill-conditioned", True), v["summary"]
    assert "`coef` vs `true_coef`" in v["summary"], v["summary"]


def test_an_error_measure_within_tolerance_is_judged_where_nothing_else_diverges(triage, tmp_path):
    """The script's one complaint: two orders of one sum differ, `(a - b).abs().max()`, within
    float32's tolerance, alike on both arms. Where nothing else diverges that difference is
    what to judge (a new user's compiled GRU loop: "not-reproduced", then "inconclusive"), not
    "nothing diverges"."""
    report = run_source(triage, tmp_path, "two_orders", (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(1000) * 100\n"
        "whole = x.sum()\n"
        "halves = x[::2].sum() + x[1::2].sum()\n"
        "print((whole - halves).abs().max().item())\n"), arms="cpu,cpu/threads=1")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-rounding", True), v["summary"]
    assert "`whole` vs `halves`" in v["summary"], v["summary"]


def test_a_small_value_with_no_correct_digit_does_not_agree_with_float64(triage, tmp_path):
    """The textbook small root in float32 is 0 where float64 gives -1e-4. With dynamo's 1e-3 as
    the absolute tolerance too, it "agreed with the reference" and one arm said nothing
    diverges; by float32's atol it does not, and its spread shows the cancellation."""
    report = run_source(triage, tmp_path, "small_root", (
        "import torch\n"
        "a, b, c = torch.tensor(1.0), torch.tensor(1e4), torch.tensor(1.0)\n"
        "root = (-b + torch.sqrt(b * b - 4 * a * c)) / (2 * a)\n"
        "print(root.item())\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-ill-conditioned", True), v["summary"]
    assert "computational zero" in v["summary"] and "cancels" in v["summary"], v["summary"]


def test_log_of_one_plus_a_tiny_value_has_no_digit_and_points_at_log1p(triage, tmp_path):
    """A new user compared `log(1 + x)` with `log1p(x)` for x ≈ 1e-10: float32 gives 0 every
    time. Every random rounding agreed on it, which read as "7.2 significant digits" and
    "one value computed by different operations"; no digit of it is right, and the addition
    that rounds x away is the cause."""
    report = run_source(triage, tmp_path, "log_one_plus", (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "x = torch.rand(4096) * 1e-10\n"
        "naive = torch.log(1 + x)\n"
        "stable = torch.log1p(x)\n"
        "torch.testing.assert_close(naive, stable, rtol=1e-3, atol=0)\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-ill-conditioned", True), v["summary"]
    assert "`aten.add` at line 4 rounds away every digit" in v["summary"], v["summary"]
    # Every rounding gives exactly 0 there: a computational zero at float32, no digit of it right.
    assert "torch.log1p(x)" in v["summary"] and "is a computational zero at float32" in v["summary"]
    assert "7.2 significant" not in v["summary"]


def test_a_value_computed_in_bfloat16_and_read_as_float32_is_named_by_its_precision(triage, tmp_path):
    """`out16.float()` is float32 as read, bfloat16 as computed: the cause was "different
    operations, which round differently" (both are `addmm`), not bfloat16's rounding."""
    report = run_source(triage, tmp_path, "bf16_linear", (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "lin = torch.nn.Linear(64, 8)\n"
        "x = torch.randn(4, 64)\n"
        "with torch.no_grad():\n"
        "    out32 = lin(x)\n"
        "    out16 = lin.to(torch.bfloat16)(x.to(torch.bfloat16))\n"
        "print(torch.allclose(out32, out16.float()))\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-rounding", True), v["summary"]
    assert "computed at different precisions (`out16.float()` in bfloat16, `out32` in float32)" in v["summary"]
    assert "different operations" not in v["summary"]


def test_a_bug_is_not_withdrawn_behind_the_scripts_own_error_measure(triage, tmp_path):
    """The script prints `(eager - compiled).abs().max()` first: on the compile arm's replay a
    computational zero, so "outside" there is withdrawn (no digit), while the compiled output
    itself is a thousand σ outside. The headline is the value with digits."""
    report = run_source(triage, tmp_path, "fast_gelu", (
        "import torch\n"
        "import torch.nn.functional as F\n"
        "def fast_backend(gm, example_inputs):\n"
        "    for node in gm.graph.nodes:\n"
        "        if node.op == 'call_function' and node.target is F.gelu:\n"
        "            node.kwargs = {**node.kwargs, 'approximate': 'tanh'}\n"
        "    gm.recompile()\n"
        "    return gm.forward\n"
        "def f(x):\n"
        "    return F.gelu(x) * 2.0\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(64) * 3\n"
        "eager = f(x)\n"
        "compiled = torch.compile(f, backend=fast_backend)(x)\n"
        "print((eager - compiled).abs().max().item())\n"
        "print(compiled[:5])\n"), "cpu,cpu/compile")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("likely-bug", False), v["summary"]
    # The compiled values themselves (the measure's operand `compiled`, or `compiled[:5]`), never
    # the measure: on the eager arm's replay it is a computational zero.
    assert re.search(r"`cpu/compile` `compiled(\[:5\])?` lies outside its own rounding spread", v["summary"]), \
        v["summary"]


def test_an_eager_arm_hands_the_script_the_module_wrapper_torch_compile_returns(triage, tmp_path):
    """The eager arm runs what the script wrote: `torch.compile(module)` is the wrapper the
    script reaches through (`_orig_mod`, its state_dict's prefixed keys), run eagerly. Returning
    the module itself failed there on the eager arm alone, a 'crash-one-arm' of triage's making."""
    report = run_source(triage, tmp_path, "orig_mod", (
        "import torch\n"
        "from torch._dynamo.eval_frame import OptimizedModule\n"
        "model = torch.nn.Linear(4, 2)\n"
        "compiled = torch.compile(model)\n"
        "assert isinstance(compiled, OptimizedModule) and compiled._orig_mod is model\n"
        "assert all(k.startswith('_orig_mod.') for k in compiled.state_dict())\n"
        "out = compiled(torch.ones(3, 4)).sum()\n"
        "out.backward()\n"
        "print(compiled._orig_mod.weight.grad.sum().item())\n"))
    (arm,) = report["arms"]
    assert arm["status"] == "ok", arm.get("failure") or arm.get("exception")
    # The module ran eagerly, under the recorder: its ops (the linear's) are in the graph.
    assert report["verdict"]["kind"] == "not-reproduced", report["verdict"]["summary"]
    assert any(o["reference"]["fingerprint"] for o in report["observables"]), report["observables"]


def test_a_hand_written_bce_parts_from_the_builtin_where_its_one_minus_p_cancels(triage, tmp_path):
    """A typical element of `-(y log p + (1 - y) log(1 - p))` keeps 5 digits, so the value's
    spread is not wide; but the sides differ most at z = 12, where `1 - p` keeps 2: that is
    the divergence, named with the op that cancels (not the exact `1 - y` of 0/1 labels, nor
    log near 0, which is well conditioned)."""
    report = run_source(triage, tmp_path, "bce", (
        "import torch\n"
        "import torch.nn.functional as F\n"
        "z = torch.linspace(-12, 12, 201)\n"
        "y = (torch.arange(201) % 2).float()\n"
        "p = torch.sigmoid(z)\n"
        "by_hand = -(y * torch.log(p) + (1 - y) * torch.log(1 - p))\n"
        "builtin = F.binary_cross_entropy_with_logits(z, y, reduction='none')\n"
        "torch.testing.assert_close(by_hand, builtin)\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-ill-conditioned", True), v["summary"]
    assert "where they differ most (element 200)" in v["summary"], v["summary"]
    assert re.search(r"`aten\.rsub` at line 6 cancels its operands, losing [45]\.\d digits", v["summary"]), v["summary"]


POLYNOMIAL_FIT = """
import torch
t = torch.linspace(0, 1, 50, dtype=torch.float64)
y = torch.sin(2 * torch.pi * t)
A = torch.vander(t, N=10, increasing=True)
c64 = torch.linalg.lstsq(A, y[:, None]).solution.squeeze()
c32 = torch.linalg.lstsq(A.float(), y.float()[:, None]).solution.squeeze()
print("max coeff diff:", (c32.double() - c64).abs().max().item())
"""


def test_a_float32_fit_of_condition_1e7_is_ill_conditioned_whatever_the_solvers_error_model(triage, tmp_path):
    """A degree-9 polynomial fit (a new user's): its float32 coefficients keep under one
    significant digit. On some CPUs the real solver lay 19σ beyond the simulated roundings
    (its backward error is wider than the model's), which the ladder called a likely bug and
    the audit withdrew as inconclusive. A spread that keeps no digit has no value outside it:
    the conditioning explains the divergence, and the verdict names it."""
    report = run_source(triage, tmp_path, "polyfit", POLYNOMIAL_FIT)
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-ill-conditioned", True), v["summary"]
    assert "linalg_lstsq" in v["summary"] and v["conflicts"] == []


MEDIUM_MATMUL_PRECISION = """
import torch
torch.set_float32_matmul_precision("medium")
torch.manual_seed(0)
lin = torch.nn.Linear(512, 512)
x = torch.randn(64, 512)
with torch.no_grad():
    y = lin(x)
    y64 = lin.double()(x.double())
print("max diff:", (y.double() - y64).abs().max().item())
"""


def _reads_float32_matmuls_as_bfloat16() -> bool:
    """Whether this CPU's oneDNN computes the script's Linear from bfloat16 inputs under
    "medium": measured, as triage's recorder measures it (an Intel Xeon with AMX does; an AMD
    EPYC with AVX512-BF16 computed it at float32)."""
    import torch

    previous = torch.get_float32_matmul_precision()
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(512, 512), torch.randn(64, 512)
    try:
        torch.set_float32_matmul_precision("medium")
        with torch.no_grad():
            y = lin(x).double()
    finally:
        torch.set_float32_matmul_precision(previous)
    w, b = lin.weight.detach(), lin.bias.detach()
    exact = x.double() @ w.double().T + b.double()
    rounded = x.bfloat16().double() @ w.bfloat16().double().T + b.bfloat16().double()
    return bool((y - rounded).norm() < (y - exact).norm())


def test_a_float32_matmul_precision_of_medium_is_a_precision_mode_not_a_bug(triage, tmp_path):
    """On a CPU whose oneDNN computes float32 matmuls from bfloat16 inputs under
    `set_float32_matmul_precision("medium")`: 6e-3 from float64 on a new user's Linear, which
    was a likely bug. Elsewhere the setting changes nothing, and the difference is float32's
    rounding: it was called bfloat16's on an AMD EPYC whose oneDNN has bfloat16 support but
    computed this Linear at float32 (the recorder assumed what the setting asks for)."""
    report = run_source(triage, tmp_path, "medium", MEDIUM_MATMUL_PRECISION)
    v = report["verdict"]
    assert v["kind"] != "likely-bug", v["summary"]
    if _reads_float32_matmuls_as_bfloat16():
        assert (v["kind"], v["expected"]) == ("expected-precision-mode", True), v["summary"]
        assert "bfloat16 inputs" in v["summary"] and "module: tf32" not in v["labels"]
    else:
        assert (v["kind"], v["expected"]) == ("expected-rounding", True), v["summary"]
        assert "bfloat16" not in v["summary"] and "computed at float32" in v["summary"], v["summary"]


def test_a_check_failing_on_a_nan_gradient_the_exact_arithmetic_gives_is_expected(triage, tmp_path):
    """`torch.where(x > 0, torch.log(x), 0)` at x = 0.0: the gradient is 0 · (1/0) = nan, in
    float64 too, because log reads its domain's edge exactly. The script's finiteness check
    fails on values that agree with float64, which was `inconclusive` ("the check failed
    although every value agrees with its float64 reference"); it is the exact arithmetic's
    answer, with the masking pitfall named for a gradient."""
    report = run_source(triage, tmp_path, "where_grad", (
        "import sys\n"
        "import torch\n"
        "x = torch.tensor([0.0, 0.5, 1.0, 2.0], requires_grad=True)\n"
        "y = torch.where(x > 0, torch.log(x), torch.zeros_like(x))\n"
        "y.sum().backward()\n"
        "print(x.grad)\n"
        "if not torch.isfinite(x.grad).all():\n"
        "    sys.exit(1)\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", True), v["summary"]
    assert "`x.grad`" in v["summary"] and "At `aten.log` (line 4)" in v["summary"], v["summary"]
    assert "0 · ∞ is nan" in v["summary"]
    assert len(v["evidence"]) == len(set(v["evidence"]))


def test_a_loss_of_sigmoid_probabilities_that_round_to_one_is_ill_conditioned_and_named(triage, tmp_path):
    """`F.binary_cross_entropy(torch.sigmoid(z), 0)` against `binary_cross_entropy_with_logits`
    for z up to 25: float32's sigmoid is exactly 1 there and the clamped log gives 100 for 20.
    It was `expected-rounding`, "addition is not associative", and the simulation's noise
    carried sigmoid past 1 (nan losses no kernel gives); it is ill-conditioned at the edge
    of the probability, with the rewrite named."""
    report = run_source(triage, tmp_path, "bce_sigmoid", (
        "import torch\n"
        "import torch.nn.functional as F\n"
        "z = torch.tensor([2.0, 8.0, 15.0, 20.0, 25.0])\n"
        "y = torch.zeros(5)\n"
        "two_step = F.binary_cross_entropy(torch.sigmoid(z), y, reduction='none')\n"
        "fused = F.binary_cross_entropy_with_logits(z, y, reduction='none')\n"
        "torch.testing.assert_close(two_step, fused)\n"))
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("expected-ill-conditioned", True), v["summary"]
    assert "`aten.binary_cross_entropy` at line 5" in v["summary"], v["summary"]
    assert "`F.binary_cross_entropy_with_logits`" in v["summary"]
    assert not any("finite under some roundings" in e for e in v["evidence"]), v["evidence"]
