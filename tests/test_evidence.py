"""What the script computes, compares and prints, judged as such (issue: a verdict never
contradicts its own evidence).  Each script diverges by construction, on any machine."""
import textwrap

import pytest

pytestmark = pytest.mark.slow


def write(tmp_path, source: str):
    script = tmp_path / "repro.py"
    script.write_text(textwrap.dedent(source))
    return script


def judged(triage, script):
    """(report, verdict) of a one-arm run without the minimizer and ablations, which exits 0."""
    code, report, _, out = triage(script, "cpu", "--no-minimize", "--no-ablate")
    assert code == 0, out
    return report, report["verdict"]


def test_two_paths_that_compute_different_functions_are_not_rounding(triage, tmp_path):
    # Unbiased std against batch norm's biased statistics: a formula difference, not rounding.
    script = write(tmp_path, """\
        import torch
        import torch.nn.functional as F
        torch.manual_seed(3)
        x = torch.randn(16, 5)
        by_hand = (x - x.mean(0)) / x.std(0)
        builtin = F.batch_norm(x, None, None, training=True, eps=1e-6)
        torch.testing.assert_close(by_hand, builtin)
    """)
    report, v = judged(triage, script)
    assert (v["kind"], v["expected"]) == ("likely-bug", False), v["summary"]
    assert "`by_hand` vs `builtin`" in v["summary"] and "compute different functions" in v["summary"]
    assert "nearly constant factor" in v["summary"] or "constant factor" in v["summary"]
    assert "unbiased estimate" in v["summary"] and "line 5" in v["summary"]
    paths = report["comparison"]["divergence"]["paths"]
    assert any(op["op"].startswith("aten.std") for op in paths["only_a"])
    assert any("batch_norm" in op["op"] for op in paths["only_b"])
    assert "module: numerical-stability" not in v["labels"]


def test_a_constant_factor_between_two_formulas_is_named(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        torch.manual_seed(0)
        x = torch.randn(4, 32)
        rms = x / x.pow(2).mean(-1, keepdim=True).sqrt()
        unit = x / x.norm(dim=-1, keepdim=True)
        print(torch.allclose(rms, unit))
    """)
    report, v = judged(triage, script)
    assert v["kind"] == "likely-bug", v["summary"]
    assert "`rms` = 5.65685 × `unit`" in v["summary"]  # √32


def test_a_running_total_off_by_one_is_named_as_a_shift(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        torch.manual_seed(0)
        x = torch.rand(50)
        mine = torch.zeros_like(x)
        for i in range(1, x.shape[0]):
            mine[i] = mine[i - 1] + x[i - 1]
        print(torch.allclose(mine, torch.cumsum(x, dim=0)))
    """)
    report, v = judged(triage, script)
    assert v["kind"] == "likely-bug", v["summary"]
    assert "shifted by one element: `mine[i] = torch.cumsum(x, dim=0)[i - 1]`" in v["summary"], v["summary"]


def test_an_off_by_one_along_a_rows_last_axis_is_named_as_a_shift(triage, tmp_path):
    # A new user's conv1d reading tap k + 1: shifted along the last axis of a batch, which the
    # flattened elements do not show (each row's end meets the next row's start).
    script = write(tmp_path, """\
        import torch
        import torch.nn.functional as F
        torch.manual_seed(0)
        x = torch.rand(3, 40)
        ref = torch.cumsum(x, dim=1)
        mine = F.pad(x, (1, 0))[:, :-1].cumsum(1)
        print(torch.allclose(ref, mine))
    """)
    report, v = judged(triage, script)
    assert v["kind"] == "likely-bug", v["summary"]
    assert "shifted by one element along dimension 1: `ref[i] = mine[i + 1]`" in v["summary"], v["summary"]


def test_a_value_the_script_expects_that_float64_also_misses_is_inconclusive(triage, tmp_path):
    # The float64 replay runs the same kernel: it cannot say whether the kernel or the
    # expectation is wrong.
    script = write(tmp_path, """\
        import torch
        got = torch.tensor([1.0, 2.0, 3.0]).cumsum(0)
        torch.testing.assert_close(got, torch.tensor([1.0, 3.0, 7.0]))
    """)
    report, v = judged(triage, script)
    assert (v["kind"], v["expected"]) == ("inconclusive", None), v["summary"]
    assert "the value the script expects" in v["summary"] and v["labels"] == ["triage review"]
    assert v["withdrawn"] is None and v["conflicts"] == []  # decided by the ladder, not withdrawn by the audit
    assert "inclusive" not in v["summary"]  # not a shift: no scan's definition said
    # Segment start offsets by `cumsum` against a loop's exclusive running sum (a thirty-first
    # new user's): torch's element i takes in the i-th count too, one element ahead.
    script = write(tmp_path, """\
        import torch
        counts = torch.tensor([3, 1, 4, 1, 5])
        offsets = torch.cumsum(counts, dim=0)
        assert torch.equal(offsets, torch.tensor([0, 3, 4, 8, 9]))
    """)
    report, v = judged(triage, script)
    assert v["kind"] == "inconclusive", v["summary"]
    assert "`torch.cumsum` is inclusive" in v["summary"] and "`torch.cumsum(x, dim) - x`" in v["summary"], v["summary"]


def test_a_train_mode_call_between_two_eval_calls_changes_the_modules_state(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6))
        x = torch.randn(8, 6)
        net.eval()
        with torch.no_grad():
            first = net(x)
        net.train()
        with torch.no_grad():
            net(torch.randn(32, 6) * 3 + 2)
        net.eval()
        with torch.no_grad():
            second = net(x)
        print(torch.equal(first, second))
    """)
    report, v = judged(triage, script)
    assert (v["kind"], v["expected"]) == ("nondeterministic", True), v["summary"]
    assert "`net.1.running_mean`" in v["summary"] and "line 10" in v["summary"]
    assert "eval()" in v["summary"]


def test_a_printed_equality_is_judged_through_its_operands(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        x = torch.linspace(0, 1, 5)
        exact = x.exp()
        taylor = 1 + x + x * x / 2
        print(exact == taylor)
    """)
    report, v = judged(triage, script)
    claims = [o for o in report["observables"] if o["kind"] == "claim"]
    assert [(o["label"], o["name"]) for o in claims] == [("== operand 1", "`exact`"), ("== operand 2", "`taylor`")]
    assert v["kind"] == "likely-bug" and "`exact` vs `taylor` (`==`)" in v["summary"], v["summary"]


def test_one_function_run_twice_with_fresh_random_draws_is_nondeterministic(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        torch.manual_seed(0)
        data = torch.randn(64, 4)
        def run():
            w = torch.zeros(4)
            for i in torch.randperm(64).tolist()[:32]:
                w = w * 0.9 + data[i]
            return w.sum().item()
        first = run()
        second = run()
        print("same result:", first == second)
    """)
    report, v = judged(triage, script)
    assert (v["kind"], v["expected"]) == ("nondeterministic", True), v["summary"]
    assert "the calls at lines 9 and 10" in v["summary"] and "`aten.randperm` at line 6" in v["summary"]
    assert "seed each run identically" in v["summary"]


def test_a_script_that_raises_after_producing_values_is_judged_on_them(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        terms = torch.tensor([1e8, 1.0, -1e8])
        print(terms.sum())
        print(undefined_name)
    """)
    report, v = judged(triage, script)
    assert (v["kind"], v["expected"]) == ("expected-ill-conditioned", True), v["summary"]
    assert "did not finish" in v["summary"] and "NameError" in v["summary"]


def test_a_bound_below_the_dtypes_rounding_is_said_to_ask_for_less_than_it_leaves(triage, tmp_path):
    # bfloat16 keeps 8 bits: rounding x in [1, 2] moves it by up to 2^-9 ≈ 0.002 on any
    # machine, and the float64 replay of the same cast gives 0 (a cast is exact there).
    script = write(tmp_path, """\
        import torch
        x = torch.linspace(1, 2, 1000)
        y = x.bfloat16().float()
        diff = (y - x).abs().max()
        assert diff < 1e-4, f"bf16 too coarse: {diff}"
    """)
    _, v = judged(triage, script)
    assert (v["kind"], v["expected"]) == ("expected-rounding", True), v["summary"]
    assert "check at line 5 (`diff < 0.0001`) asks for less than this computation's rounding leaves" in v["summary"]
    assert "float64 replay gives 0" in v["summary"]


def test_log_of_a_softmax_that_underflows_is_the_dtypes_range_and_names_log_softmax(triage, tmp_path):
    # exp(-200) and exp(-400) are below float32's smallest positive value on any machine.
    script = write(tmp_path, """\
        import torch
        logits = torch.tensor([[0.0, 200.0, -200.0]])
        manual = torch.log(torch.softmax(logits, dim=1))
        builtin = torch.log_softmax(logits, dim=1)
        torch.testing.assert_close(manual, builtin)
    """)
    _, v = judged(triage, script)
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", True), v["summary"]
    assert "`aten._softmax` at line 3 underflows" in v["summary"] and "`torch.log_softmax`" in v["summary"]
    assert "module: correctness (silent)" not in v["labels"]


@pytest.mark.parametrize("literal, rounding", [("0.3", True), ("0.31", False)])
def test_an_exact_equality_fails_by_rounding_only_against_the_true_answer(triage, tmp_path, literal, rounding):
    # float32(0.1)·3 is 0.30000001192 under IEEE rounding on any machine; float64 of the same
    # computation is 0.30000000447, within rounding of 0.3 and far from 0.31.
    script = write(tmp_path, f"""\
        import torch
        x = torch.tensor(0.1) * 3
        print(x.item())
        assert x.item() == {literal}, "not {literal}"
    """)
    _, v = judged(triage, script)
    if not rounding:
        assert v["kind"] != "expected-rounding", v["summary"]
        return
    assert (v["kind"], v["expected"]) == ("expected-rounding", True), v["summary"]
    assert "`x.item()` with the literal 0.3 using `==`" in v["summary"]
    assert "line 4" in v["summary"] and "isclose" in v["summary"]


def test_a_second_side_that_starts_from_what_the_first_left_is_a_testing_method_problem(triage, tmp_path):
    # A training step between two calls of one model: the second output is computed from the
    # first (through the loss, backward and the optimizer's step), not from the same weights.
    stepped = write(tmp_path, """\
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 8)
        before = model(x)
        before.pow(2).sum().backward()
        opt.step()
        after = model(x)
        torch.testing.assert_close(after, before)
    """)
    report, v = judged(triage, stepped)
    assert (v["kind"], v["expected"]) == ("nondeterministic", True), v["summary"]
    assert "`after` is computed from `before`" in v["summary"] and "lines 7, 8" in v["summary"], v["summary"]
    # A function that writes its argument in place, called for each side on one tensor; the
    # two arms differ besides (by the thread count, on purpose), within float32's tolerance:
    # the check failing on both arms is what the script reports, not that difference.
    written = write(tmp_path, """\
        import torch
        torch.manual_seed(0)
        def prepare(img):
            img.sub_(0.5)
            img.mul_(2.0)
            return torch.clamp(img, -1, 1).mean(dim=1) + 1e-6 * torch.get_num_threads()
        x = torch.rand(4, 64)
        ref = prepare(x)
        res = prepare(x)
        torch.testing.assert_close(res, ref)
    """)
    code, report, _, out = triage(written, "cpu,cpu/threads=1", "--no-minimize", "--no-ablate")
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nondeterministic", True), v["summary"]
    assert "`sub_` (line 4) writes its input in place" in v["summary"] and "`x.clone()`" in v["summary"]


def test_a_wrong_backward_that_gradcheck_catches_is_a_bug_not_its_perturbation(triage, tmp_path):
    """A custom Function's backward missing its minus sign: `gradcheck`'s two Jacobians differ
    by −1 in float64. Its in-place ±eps (written back) was read as state carried from one side
    to the other, and the script's data, drawn before gradcheck's own input, as random numbers
    drawn anew for each side: `nondeterministic`, "expected", a planted bug excused."""
    script = write(tmp_path, """\
        import torch
        torch.manual_seed(0)

        class ExpNeg(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = torch.exp(-x)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, grad_out):
                (y,) = ctx.saved_tensors
                return grad_out * y

        x = torch.rand(16, requires_grad=True)
        t = torch.rand(16)
        ((ExpNeg.apply(x) - t) ** 2).sum().backward()
        print("gradcheck:", torch.autograd.gradcheck(ExpNeg.apply, (torch.rand(5, dtype=torch.float64, requires_grad=True),),
                                                     raise_exception=False))
    """)
    _, v = judged(triage, script)
    assert (v["kind"], v["expected"]) == ("likely-bug", False), v["summary"]
    assert "-1 ×" in v["summary"], v["summary"]


def test_a_check_that_moves_an_input_in_place_and_writes_it_back_carries_nothing(triage, tmp_path):
    """float32 `gradcheck` moves each input element by ±eps in place, writes it back, and then
    compares the analytical Jacobian with the central differences: both computations read the
    tensor the writes touched, but the float64 replays of the two agree — nothing carried from
    one to the other. The differences cancel in float32 (eps = 1e-6 against values near 1):
    ill-conditioned, the documented reason gradcheck wants float64."""
    script = write(tmp_path, """\
        import torch
        torch.manual_seed(0)
        x = torch.randn(4, 6, requires_grad=True)
        w = torch.randn(6, 5, requires_grad=True)
        ok = torch.autograd.gradcheck(lambda a, b: torch.tanh(a @ b).sum(dim=1), (x, w), raise_exception=False)
        assert ok, "gradcheck fails in float32"
    """)
    _, v = judged(triage, script)
    assert (v["kind"], v["expected"]) == ("expected-ill-conditioned", True), v["summary"]
    assert "cancels" in v["summary"], v["summary"]
    # gradcheck's own torch.allclose compares what gradcheck computed: said so.
    assert "`gradcheck`'s finite-difference Jacobian keeps only" in v["summary"], v["summary"]
