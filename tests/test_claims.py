"""The script's own checks are claims about its values, not crashes."""
import textwrap

import pytest
import torch

from triage.worker.claims import claim_summary, is_claim
from triage.worker.observe import ObservationStore, Observer
from triage.worker.opgraph import OpRecorder, script_site


def failure_of(source: str, tmp_path) -> tuple[BaseException, str]:
    """Run `source` as a script file (as the worker does) and return what it raised."""
    path = tmp_path / "repro.py"
    path.write_text(textwrap.dedent(source))
    try:
        exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), {"__name__": "__main__"})
    except BaseException as e:  # noqa: BLE001 - SystemExit included
        return e, str(path)
    raise AssertionError("the script did not fail")


@pytest.mark.parametrize("source", [
    "import torch\nassert torch.ones(2).sum() == 3, 'sum differs'\n",
    "import torch\ntorch.testing.assert_close(torch.ones(2), torch.zeros(2))\n",
    "import torch\nfrom torch.testing import assert_close\nassert_close(torch.ones(2), torch.zeros(2))\n",
    "import numpy as np\nnp.testing.assert_allclose(np.ones(2), np.zeros(2))\n",
    "import sys\nsys.exit(1)\n",
    "import sys\nsys.exit('values differ')\n",
    "exit(2)\n",
    "quit(3)\n",
    "raise SystemExit(1)\n",
    """\
    import torch
    def check(a, b):
        if not torch.allclose(a, b):
            raise ValueError(
                "results differ")
    check(torch.ones(2), torch.zeros(2))
    """,
    """\
    import sys
    import torch
    try:
        torch.testing.assert_close(torch.ones(2), torch.zeros(2))
    except AssertionError:
        print("mismatch")
        sys.exit(1)
    """,
])
def test_the_scripts_own_checks_are_claims(tmp_path, source):
    e, script = failure_of(source, tmp_path)
    assert is_claim(e, script, observed=True)


@pytest.mark.parametrize("source", [
    "import torch\ntorch.ones(2, 3) @ torch.ones(2, 3)\n",  # an op's error
    "import torch\nassert (torch.ones(2, 3) @ torch.ones(2, 3)).sum() > 0\n",  # the op fails, not the assert
    "import torch\ntorch.nn.functional.softmax(torch.ones(2), dim=5)\n",  # raised inside torch's Python code
    "x = {}['missing']\n",
    """\
    import sys
    import torch
    try:
        torch.ones(2, 3) @ torch.ones(2, 3)
    except RuntimeError as e:
        print("failed:", e)
        sys.exit(1)
    """,
    """\
    import torch
    try:
        torch.ones(2, 3) @ torch.ones(2, 3)
    except RuntimeError as e:
        raise ValueError("the model failed") from e
    """,
    "import torch\ntry:\n    torch.ones(2, 3) @ torch.ones(2, 3)\nexcept RuntimeError:\n    raise\n",
    "import argparse\nargparse.ArgumentParser().parse_args(['--bogus'])\n",  # exits from argparse, not the script
])
def test_failures_inside_torch_or_python_are_not_claims(tmp_path, source):
    e, script = failure_of(source, tmp_path)
    assert not is_claim(e, script, observed=True)


def test_a_check_before_anything_was_observed_is_not_a_claim(tmp_path):
    e, script = failure_of("import torch\nassert torch.cuda.device_count() > 8, 'needs 8 GPUs'\n", tmp_path)
    assert not is_claim(e, script, observed=False)


def test_sys_exit_zero_is_not_a_claim(tmp_path):
    e, script = failure_of("import sys\nsys.exit(0)\n", tmp_path)
    assert not is_claim(e, script, observed=True)


def test_the_summary_says_the_scripts_check_failed(tmp_path):
    e, _ = failure_of("import sys\nsys.exit(1)\n", tmp_path)
    assert claim_summary(e, 2) == "the script's own check failed at line 2 (it exited with status 1)"
    e, _ = failure_of("assert 1 == 2, 'first line\\nsecond line'\n", tmp_path)
    assert claim_summary(e, 1) == "the script's own check failed at line 1 (AssertionError: first line)"


def observed_checks(source: str, tmp_path) -> list[tuple[str, int]]:
    """(label, line) of the readbacks and claims recorded while `source` runs under the Observer."""
    path = tmp_path / "repro.py"
    path.write_text(textwrap.dedent(source))
    site = script_site(str(path))
    store = ObservationStore(OpRecorder(torch.device("cpu"), site), site, 1 << 20, lambda message: None)
    with Observer(store, str(path)):
        try:
            exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), {"__name__": "__main__"})
        except AssertionError:
            pass
    return [(r["label"], r["line"]) for r in store.records if r["kind"] in ("readback", "claim")]


def test_compared_tensors_are_observed_when_the_script_checks_them(tmp_path):
    assert observed_checks("""\
        import torch
        a = torch.tensor([1.0, 2.0])
        b = a + 1
        mask = a > 0          # not checked: nothing recorded
        if torch.all(a == b):
            pass
        c = a * 2
        assert (a - c).abs().max() < 1e-6
    """, tmp_path) == [("== operand 1", 5), ("== operand 2", 5),
                       ("max abs(a - b) operand 1", 8), ("max abs(a - b) operand 2", 8),  # its error measure claims a ≈ c
                       ("`<` operand in a check", 8)]


def test_a_checked_comparison_is_recorded_once(tmp_path):
    assert observed_checks("""\
        import torch
        a, b = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])
        same = (a == b).all()
        bool(same)
        if same:
            pass
        if not (a.exp() != b.exp()).any():   # `a` again, but other values
            pass
        if not (a != b.sin()).any():         # `a` is recorded already, unchanged
            pass
    """, tmp_path) == [("== operand 1", 4), ("== operand 2", 4),  # an equality check is a claim
                       ("`!=` operand 1 in a check", 7), ("`!=` operand 2 in a check", 7),
                       ("`!=` operand 2 in a check", 9)]


def test_a_scripts_own_error_measure_of_two_values_claims_they_agree(tmp_path):
    """`(a - b).abs().max()` read back or checked: the script measures how far apart a and b
    are. A loss of a prediction and a target (`((p - y) ** 2).mean()`), a difference of two
    shapes, or a maximum along a dimension claim nothing."""
    assert observed_checks("""\
        import torch
        a, b = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])
        print((a - b).abs().max().item())
        assert torch.max(torch.abs(torch.sub(a, b))) < 1.0
        print(((a - b) ** 2).mean().item())
        print((a - b[:1]).abs().max())
        print((a - b).abs().max(dim=0).values)
    """, tmp_path) == [(".item()", 3), ("max abs(a - b) operand 1", 3), ("max abs(a - b) operand 2", 3),
                       ("max abs(a - b) operand 1", 4), ("max abs(a - b) operand 2", 4), ("`<` operand in a check", 4),
                       (".item()", 5), ("print/repr", 6), ("print/repr", 7)]


def test_a_claim_from_a_read_back_error_measure_names_that_readback(tmp_path):
    """Two error measures of equal values are both 0 in float64: compare must know which
    readbacks are measures not to pair them as one quantity."""
    path = tmp_path / "repro.py"
    path.write_text("import torch\na, b = torch.tensor([1.0]), torch.tensor([1.5])\n"
                    "print((a - b).abs().max().item())\nassert (a - b).abs().max() < 0.1\n")
    site = script_site(str(path))
    store = ObservationStore(OpRecorder(torch.device("cpu"), site), site, 1 << 20, lambda message: None)
    with Observer(store, str(path)):
        with pytest.raises(AssertionError):
            exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), {"__name__": "__main__"})
    readback = next(r["index"] for r in store.records if r["kind"] == "readback")
    claims = [r["claim"] for r in store.records if r["kind"] == "claim"]
    assert [c.get("measure") for c in claims] == [readback, readback, None, None]  # a checked one: no readback


def test_an_error_measure_of_two_complex_values_claims_they_agree(tmp_path):
    """A complex64 FFT against its complex128 counterpart, measured by `.abs().max()`, was
    judged as one number against float64's 0, not as the comparison the script made."""
    assert observed_checks("""\
        import torch
        x = torch.randn(4, 8)
        X32, X64 = torch.fft.fft(x), torch.fft.fft(x.double())
        print((X32.to(torch.complex128) - X64).abs().max().item())
        print((torch.tensor([1, 2]) - torch.tensor([2, 2])).abs().max().item())
    """, tmp_path) == [(".item()", 4), ("max abs(a - b) operand 1", 4), ("max abs(a - b) operand 2", 4),
                       (".item()", 5)]  # integers: no error measure


def test_a_relative_error_measure_claims_its_two_values_agree(tmp_path):
    """`((mine - ref) / ref).abs().max()`, a relative error: the same two values measured (a
    new user's custom Bessel I0 against `torch.special.i0`, printed only so, was "nothing
    diverges"). Divided by anything else it is no measure of them. Of two scalars the absolute
    difference is the measure; of two vectors it is many values, not one measure."""
    assert observed_checks("""\
        import torch
        mine, ref = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])
        print(((mine - ref) / ref).abs().max().item())
        print(((mine - ref) / 3.0).abs().max().item())
        print((mine.sum() - ref.sum()).abs().item())
        print((mine - ref).abs())
        print(((ref - mine) / ref).abs().max().item())
    """, tmp_path) == [(".item()", 3), ("max abs((a - b) / b) operand 1", 3), ("max abs((a - b) / b) operand 2", 3),
                       (".item()", 4), (".item()", 5), ("max abs(a - b) operand 1", 5),
                       ("max abs(a - b) operand 2", 5), ("print/repr", 6),
                       (".item()", 7), ("max abs((a - b) / a) operand 1", 7), ("max abs((a - b) / a) operand 2", 7)]


def test_a_relative_error_over_the_absolute_value_of_one_side_is_a_measure_too(tmp_path):
    """`((a - b).abs() / b.abs()).max()` and `((a - b) / b.abs()).abs().max()`: a new user's
    float16 pooling against float32 was judged as a lone scalar ("a computational zero")."""
    assert observed_checks("""\
        import torch
        mine, ref = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])
        print(((mine - ref).abs() / ref.abs()).max().item())
        print(((mine - ref) / ref.abs()).abs().max().item())
        print(((mine - ref).abs() / mine.abs().sum()).max().item())
    """, tmp_path) == [(".item()", 3), ("max abs((a - b) / b) operand 1", 3), ("max abs((a - b) / b) operand 2", 3),
                       (".item()", 4), ("max abs((a - b) / b) operand 1", 4), ("max abs((a - b) / b) operand 2", 4),
                       (".item()", 5)]


def test_a_stencil_or_a_difference_a_function_returns_is_no_error_measure(tmp_path):
    """A new user's image gradient, `img[..., 1:] - img[..., :-1]`, whose maximum they printed,
    was "two values off by one index" (a `likely-bug`); a difference of Gaussians returned by
    their `dog()` and printed as `d.abs().max()` was "two different functions". A finite
    difference reads shifted windows of one tensor, and a function's returned difference is a
    quantity the script computes. Two rows of one batch, a matrix against its transpose, or
    a helper taking the measure, are measures as before."""
    assert observed_checks("""\
        import torch
        img = torch.rand(1, 1, 6, 6)
        print((img[..., :, 1:] - img[..., :, :-1]).abs().max().item())
        def dog(x):
            return torch.sin(x) - torch.cos(x)
        print(dog(img).abs().max().item())
        y = torch.rand(2, 3)
        print((y[0] - y[1]).abs().max().item())
        m = torch.rand(3, 3)
        print((m - m.T).abs().max().item())
        def worst(e):
            return e.abs().max().item()
        print(worst(torch.sin(y) - torch.cos(y)))
    """, tmp_path) == [(".item()", 3), (".item()", 6), (".item()", 8), ("max abs(a - b) operand 1", 8),
                       ("max abs(a - b) operand 2", 8), (".item()", 10), ("max abs(a - b) operand 1", 10),
                       ("max abs(a - b) operand 2", 10), (".item()", 12), ("max abs(a - b) operand 1", 13),
                       ("max abs(a - b) operand 2", 13)]


def test_a_value_read_back_already_is_not_recorded_again_by_its_check(tmp_path):
    assert observed_checks("""\
        import torch
        diff = torch.tensor(0.5)
        print(diff.item())
        if diff > 0:
            pass
    """, tmp_path) == [(".item()", 3)]


def test_each_readback_of_a_line_is_spelled_as_the_script_spells_its_call(tmp_path):
    """Two `.item()` calls on one line: the parent's source reading cannot tell which value is
    which (both are `.item()`), the worker's instruction span can."""
    path = tmp_path / "repro.py"
    path.write_text("import torch\na, b = torch.ones(2), torch.zeros(2)\n"
                    "print('é', a.sum().item(), float(b[0]), b.tolist(), a)\n")  # columns count UTF-8 bytes
    site = script_site(str(path))
    store = ObservationStore(OpRecorder(torch.device("cpu"), site), site, 1 << 20, lambda message: None)
    with Observer(store, str(path)):
        exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), {"__name__": "__main__"})
    assert [(r["label"], r["expression"]) for r in store.records] == [
        (".item()", "a.sum().item()"), ("float()", "float(b[0])"), (".tolist()", "b.tolist()"),
        ("print/repr", "a")]


def test_each_printed_value_is_named_by_the_name_bound_to_it(tmp_path):
    """`print(y, z)`: one call shows two values, so its span names neither; the one name in it
    bound to the very tensor printed does. An expression (`y + 1`) or two names for one tensor
    name nothing."""
    path = tmp_path / "repro.py"
    path.write_text("import torch\n"
                    "def show(u, v):\n"
                    "    print('u, v:', u, v)\n"
                    "y, z = torch.ones(2), torch.zeros(2)\n"
                    "w = y\n"
                    "print(z, y + 1, f'{y}')\n"
                    "show(y, z)\n"
                    "print(y, w)\n")
    site = script_site(str(path))
    store = ObservationStore(OpRecorder(torch.device("cpu"), site), site, 1 << 20, lambda message: None)
    with Observer(store, str(path)):
        exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), {"__name__": "__main__"})
    assert [(r["line"], r["expression"]) for r in store.records] == [
        (6, "y"), (6, "z"), (6, None), (3, "u"), (3, "v"), (8, None), (8, None)]  # the f-string runs first


def test_checks_inside_torch_are_not_the_scripts(tmp_path):
    # torch.distributions validates its arguments with tensor comparisons of its own.
    assert observed_checks("""\
        import torch
        torch.distributions.Normal(torch.zeros(2), torch.ones(2), validate_args=True)
    """, tmp_path) == []


# -- end to end ------------------------------------------------------------------------------

def write(tmp_path, source: str):
    script = tmp_path / "repro.py"
    script.write_text(textwrap.dedent(source))
    return script


def assert_compared_not_crashed(report):
    assert report["verdict"]["kind"] not in ("crash-one-arm", "could-not-run"), report["verdict"]["summary"]


@pytest.mark.slow
def test_a_failing_assert_close_is_a_claim_and_its_operands_are_compared(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        from torch.testing import assert_close
        a = torch.tensor([1.0, 2.0, 3.0])
        b = a + 1
        assert_close(a, b)
    """)
    code, report, _, out = triage(script, "cpu", "--no-minimize")
    assert code == 0, out
    arm = report["arms"][0]
    assert arm["status"] == "raised" and arm["exception"]["claim"] is True
    assert "the script's own check failed at line 5" in arm["failure"]
    assert_compared_not_crashed(report)
    operands = [o for o in report["observables"] if o["kind"] == "claim"]
    assert [o["label"] for o in operands] == ["torch.testing.assert_close operand 1",
                                              "torch.testing.assert_close operand 2"]
    # Shown by the script's own expressions, not "operand 1/2".
    assert [o["name"] for o in operands] == ["`a`", "`b`"]
    assert [o["fingerprint"]["sample"] for o in operands] == [[1.0, 2.0, 3.0], [2.0, 3.0, 4.0]]


@pytest.mark.slow
def test_sys_exit_after_a_failed_comparison_is_a_claim_on_every_arm(triage, tmp_path):
    script = write(tmp_path, """\
        import sys
        import torch
        a = torch.tensor([1.0, 2.0, 3.0])
        b = a * 3
        if not torch.equal(a, b):
            print("MISMATCH")
            sys.exit(1)
    """)
    code, report, _, out = triage(script, "cpu,cpu/threads=1", "--no-minimize")
    assert code == 0, out
    for arm in report["arms"]:
        assert arm["status"] == "raised" and arm["exception"]["claim"] is True
        assert arm["failure"] == "the script's own check failed at line 7 (it exited with status 1)"
    assert_compared_not_crashed(report)
    assert any("the script's own check failed at line 7" in note for note in report["notes"])


@pytest.mark.slow
def test_a_plain_assert_is_a_claim_and_the_compared_value_is_observed(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        a = torch.tensor([1.0, 2.0, 3.0])
        b = a + 1
        assert (a - b).abs().max() < 1e-6, "a and b differ"
    """)
    code, report, _, out = triage(script, "cpu", "--no-minimize")
    assert code == 0, out
    arm = report["arms"][0]
    assert arm["status"] == "raised" and arm["exception"]["claim"] is True
    assert_compared_not_crashed(report)
    [checked] = [o for o in report["observables"] if o["label"] == "`<` operand in a check"]
    assert checked["kind"] == "readback" and checked["line"] == 4 and checked["fingerprint"]["sample"] == [1.0]


@pytest.mark.slow
def test_a_torch_error_after_observing_values_is_not_a_claim(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        a = torch.ones(2, 3)
        print(a.sum().item())
        c = a @ torch.ones(2, 3)
    """)
    code, report, _, out = triage(script, "cpu", "--no-minimize")
    arm = report["arms"][0]
    assert arm["status"] == "raised" and arm["exception"]["claim"] is False
    assert arm["failure"].startswith("RuntimeError at line 4")


@pytest.mark.slow
def test_a_check_at_the_top_of_the_script_is_not_a_claim(triage, tmp_path):
    script = write(tmp_path, """\
        import torch
        assert torch.cuda.device_count() > 8, "needs 8 GPUs"
        print(torch.ones(2))
    """)
    code, report, _, out = triage(script, "cpu", "--no-minimize")
    arm = report["arms"][0]
    assert arm["status"] == "raised" and arm["exception"]["claim"] is False
