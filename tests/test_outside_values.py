"""A failing check that compares a recorded value with one the script computed outside torch
(NumPy, plain Python): the worker keeps the check's float operands, the ladder weighs the
outside value against the recorded value's float64 replay and rounding spread."""
import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.test_ladder import REPRO, arm, fp
from triage.arms.output import read_result, read_values
from triage.arms.run import _operand
from triage.classify.ladder import classify
from triage.compare import compare
from triage.model import Observable, Repro
from triage.untrusted import UntrustedOutput
from triage.worker.claims import MAX_OPERAND_ELEMENTS, check_operands


# -- the worker: what the failing check read ------------------------------------------------
def _failed(tmp_path: Path, source: str, max_bytes: int = 1 << 30) -> list[dict]:
    path = tmp_path / "repro.py"
    path.write_text(textwrap.dedent(source))
    try:
        exec(compile(path.read_bytes(), str(path), "exec"), {"__name__": "__main__"})
    except BaseException as e:  # noqa: BLE001 - the script's check
        return check_operands(e, str(path), path.read_bytes(), max_bytes=max_bytes)
    raise AssertionError("the script did not fail")


def test_an_asserts_float_operands_are_kept_and_nothing_else(tmp_path):
    ops = _failed(tmp_path, """\
        import numpy as np
        class Sneaky(float):
            def __float__(self):
                raise RuntimeError("read")
        t = 1.5
        n = np.float32(1.25)
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        k = 3
        s = Sneaky(2.0)
        big = np.zeros(MAX + 1)
        assert t == n and k == 3 and s == big.sum() and a is None and len(a) == flag, "no"
    """.replace("MAX", str(MAX_OPERAND_ELEMENTS)))
    assert [(o["name"], o["dtype"], o["shape"]) for o in ops] == [
        ("t", "float64", []), ("n", "float32", []), ("a", "float32", [2, 3])]
    assert ops[0]["values"].tolist() == 1.5 and ops[2]["values"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_a_list_of_plain_numbers_is_an_operand_and_nothing_else_in_a_list(tmp_path):
    """`assert rounded.tolist() == [math.floor(v + 0.5) for v in vals]` (a thirty-first new
    user's): the expected list was not kept, and the failing check read as "every value
    agrees with float64". A list of exact ints and floats is kept; a list holding anything
    else, a ragged one, or integers float64 does not hold exactly, is not."""
    ops = _failed(tmp_path, """\
        class Sneaky(float):
            pass
        expected = [1, 2, 3.5]
        nested = [[1, 2], [3, 4]]
        ragged = [[1], [2, 3]]
        sneaky = [1.0, Sneaky(2.0)]
        huge = [2 ** 60]
        flags = [True, False]
        assert expected == nested or ragged == sneaky or huge == flags == 0, "no"
    """)
    assert [(o["name"], o["shape"]) for o in ops] == [("expected", [3]), ("nested", [2, 2])]
    assert ops[0]["values"].tolist() == [1.0, 2.0, 3.5] and ops[0]["dtype"] == "float64"


def test_operands_are_read_in_the_helper_that_raised_and_of_a_testing_call(tmp_path):
    ops = _failed(tmp_path, """\
        import math
        def check(a, b):
            if not abs(a - b) <= 1e-9:
                raise ValueError("apart")
        x = 0.1 * 3
        check(x, math.nan)
    """)
    assert [o["name"] for o in ops] == ["a", "b"] and ops[0]["values"] == 0.1 * 3 and math.isnan(ops[1]["values"])
    ops = _failed(tmp_path, """\
        import numpy as np
        t = np.array([1.0, np.inf], dtype=np.float32)
        n = np.array([1.0, 2.0])
        np.testing.assert_allclose(t, n, rtol=1e-7)
    """)
    assert [(o["name"], o["values"].tolist()) for o in ops] == [("t", [1.0, math.inf]), ("n", [1.0, 2.0])]
    # Within the worker's budget: the first array fits 16 bytes, the second no longer does.
    ops = _failed(tmp_path, """\
        import numpy as np
        t = np.array([1.0, 2.0])
        n = np.array([1.0, 3.0])
        np.testing.assert_allclose(t, n)
    """, max_bytes=16)
    assert [o["name"] for o in ops] == ["t"]


def test_the_rewritten_script_keeps_operands_written_in_the_check_itself(tmp_path):
    from triage.worker.expressions import CHECK_HOOK, CheckOperands, compile_observing_expressions

    path = tmp_path / "repro.py"
    path.write_text("import numpy as np\nx = np.linspace(0, 1, 5, dtype=np.float32)\n"
                    "assert float(x.sum()) == sum(x.tolist()) + 1e-3, 'apart'\n")
    kept = CheckOperands()
    try:
        exec(compile_observing_expressions(path.read_bytes(), str(path)),
             {"__name__": "__main__", CHECK_HOOK: kept, "__triage_observe_expression_statement__": lambda *a: None})
    except AssertionError as e:
        ops = check_operands(e, str(path), path.read_bytes(), kept.values)
    assert [(o["name"], o["values"].tolist()) for o in ops] == [("float(x.sum())", 2.5), ("sum(x.tolist())", 2.5)]


@pytest.mark.parametrize("check, pairs", [
    ("assert t == n", {("n", "t")}),
    ("assert abs(t - n) < 1e-5", {("n", "t")}),
    ("assert (a.var(0).numpy() / np.var(b, 0) - 1).max() < 1e-6", {("a.var(0).numpy()", "np.var(b, 0)")}),
    ("np.testing.assert_allclose(x.sum().item(), sum(x.tolist()), rtol=1e-7)", {("sum(x.tolist())", "x.sum().item()")}),
    ("assert err < tol", set()),  # a measure and its bound
    ("if not math.isclose(t, n):\n    raise SystemExit(1)", {("n", "t")}),
    ("if t != n:\n    sys.exit(1)", {("n", "t")}),
])
def test_a_check_equates_only_the_sides_it_expects_equal(check, pairs):
    from triage.worker.claims import equated_pairs

    found = {tuple(sorted(p)) for p in equated_pairs("import math\n" + check + "\n", check.count("\n") + 2)}
    assert found == pairs


def test_the_check_at_a_line_is_located_once_for_every_reader():
    # `check_parts` finds the check the threshold, length and operand readers each read: the
    # innermost `if` whose own body fails at the line (not an `if` guarding it), its `else`
    # as what passes, a multi-line assert, a testing call.
    import ast

    from triage.classify.facts import threshold_checks
    from triage.worker.claims import _names_read, check_parts, equated_pairs

    source = ("if n > 10:\n"                      # 1: guards the check below, is not it
              "    if err > 1e-6:\n"              # 2
              "        assert False, err\n"       # 3: an `if` failing by `assert False`
              "if torch.allclose(t, n):\n"        # 4
              "    print('ok')\n"                 # 5
              "else:\n"                           # 6
              "    raise SystemExit(gap)\n"       # 7: the `else` fails: the test is what passes
              "assert (\n"                        # 8
              "    t == n\n"                      # 9: inside a multi-line assert
              ")\n"
              "np.testing.assert_allclose(t, n)\n")  # 11
    tree = ast.parse(source)
    assert [(kind, ast.unparse(part)) for kind, part in check_parts(tree, 3)] == [("if", "err > 1e-06"),
                                                                                  ("assert", "False")]
    assert threshold_checks(source, 3) == [("err", 1e-6, "<=")]  # not `n <= 10`
    assert [(kind, ast.unparse(part)) for kind, part in check_parts(tree, 7)] == [("else", "torch.allclose(t, n)")]
    assert _names_read(tree, 7) == ["t", "n"] and equated_pairs(source, 7) == {frozenset(("t", "n"))}
    assert [kind for kind, _ in check_parts(tree, 9)] == ["assert"] and equated_pairs(source, 9) == {frozenset(("t", "n"))}
    assert [kind for kind, _ in check_parts(tree, 11)] == ["call"] and _names_read(tree, 11) == ["t", "n"]


def test_a_value_held_in_a_narrower_dtype_is_told_by_its_bits():
    # Whether an outside value holds only numbers of torch's dtype decides whether the directed
    # replays' reach counts (`_outside_value`): bfloat16 too, as float32 with 16 low bits zero.
    from triage.numerics.literals import held_in

    x = np.array([1.0, 1 + 2.0 ** -7, -3.5, np.inf])
    assert held_in(x, "bfloat16") and held_in(x, "float16") and held_in(x, "float32")
    assert not held_in(np.array([1 + 2.0 ** -8]), "bfloat16") and held_in(np.array([1 + 2.0 ** -8]), "float16")
    assert not held_in(np.array([0.1]), "float32") and held_in(np.array([float(np.float32(0.1))]), "float32")
    assert not held_in(np.array([70000.0]), "float16")  # past float16's range
    assert not held_in(np.array([np.nan]), "float32") and not held_in(x, "float64")


def test_the_parent_holds_operands_to_their_schema(tmp_path):
    result = {"status": "raised", "exception": {"type": "AssertionError", "message": "", "line": 4, "claim": True},
              "observables": [], "check_operands": [{"name": "t", "dtype": "float32", "shape": [2]}]}
    path, npz = tmp_path / "result.json", tmp_path / "values.npz"
    path.write_text(json.dumps(result))
    np.savez(npz, chk0=np.array([1.0, math.inf]))
    read = read_result(path, script_started=True)
    held = _operand(read["check_operands"][0], read_values(npz, read, 1 << 20)["chk0"])
    assert held["value"].shape == (2,) and math.isinf(held["value"][1])
    assert _operand(read["check_operands"][0], None) is None  # values.npz did not hold it
    for values in ({"chk0": np.array([1.0, 2.0, 3.0])}, {"chk0": np.array([1, 2])}, {"chk1": np.array([1.0, 2.0])}):
        np.savez(npz, **values)
        with pytest.raises(UntrustedOutput):
            read_values(npz, read, 1 << 20)
    for bad in ({"name": "t\n@maintainer", "dtype": "float32", "shape": []},
                {"name": "", "dtype": "float32", "shape": []},
                {"name": "t", "dtype": "object", "shape": []},
                {"name": "t", "dtype": "float32", "shape": [], "values": [1.0]}):
        path.write_text(json.dumps(dict(result, check_operands=[bad])))
        with pytest.raises(UntrustedOutput):
            read_result(path, script_started=True)


# -- the ladder, on hand-built runs -----------------------------------------------------------
SOURCE = "import numpy as np\nimport torch\nx = torch.randn(1000)\nt = x.var().item()\nn = other()\nassert t == n\n"


def _recorded(value, reference, sigma, node="sum_default"):
    value = np.asarray(value, dtype=np.float32)
    o = Observable(index=0, kind="readback", label=".item()", line=4, fingerprint=fp(value),
                   reference={"fingerprint": fp(np.asarray(reference), "float64"), "note": None, "approximate": False},
                   ancestors=[0], node=node, name="`x.var().item()`", value=value,
                   reference_value=np.asarray(reference, dtype=np.float64))
    o.rounding = {"status": "judged", "samples": 29, "sample_stats": list(np.linspace(0.2, 2.0, 29)),
                  "precision": "float32", "unmeasured": []}
    o.spread = {"sig": np.full(value.shape, sigma), "up": o.reference_value + sigma, "dn": o.reference_value - sigma,
                "mu": o.reference_value.copy(), "sd": np.full(value.shape, sigma / 10),
                "nf": np.ones(value.shape, np.uint8)}
    return o


LEAF = {"index": 0, "kind": "random", "op": "randn", "line": 3,
        "fingerprint": {"shape": [1000], "dtype": "float32", "sha256": "aa"}}


def _verdict(o, outside, source=SOURCE, name="n"):
    run = arm("cpu", [o], status="raised", leaves=(LEAF,),
              exception={"type": "AssertionError", "message": "", "line": 6, "claim": True})
    run.check_operands = [{"name": "t", "dtype": "float64", "value": np.asarray(o.value, dtype=np.float64)},
                          {"name": name, "dtype": "float64", "value": np.asarray(outside, dtype=np.float64)}]
    return classify(Repro(path=REPRO.path, name=REPRO.name, source=source), compare([run]))


def test_an_outside_value_at_the_float64_value_makes_the_failed_check_rounding():
    ref = 50027.62224692106
    v = _verdict(_recorded([50027.625], [ref], 2.7e-3), [ref])
    assert (v.kind, v.expected) == ("expected-rounding", True), v.summary
    assert "`n`, which the script computes outside torch (line 5: `n = other()`)" in v.summary
    assert "bit for bit" in v.summary and "rtol 1.3e-6, atol 1e-5" in v.summary


def test_a_slip_a_few_spreads_out_is_not_rounding_unless_the_outside_value_rounds_as_torch_does():
    # 5σ out: a float64 value computed with a constant short of its digits (0.5772 for Euler's
    # γ) is no rounding of the float32 one; the same distance in a float32 number NumPy computed
    # is within what float32 rounding in another order reaches (the directed replays: ±σ).
    near = 2.0 + 5e-6
    v = _verdict(_recorded([2.0], [2.0], 1e-6), [near])
    assert v.kind == "inconclusive" and "not one quantity rounded twice" in v.summary, v.summary
    v = _verdict(_recorded([2.0], [2.0], 1e-6), [float(np.float32(near))])
    assert v.kind == "expected-rounding", v.summary


def test_an_outside_value_beyond_the_rounding_reach_is_not_decided():
    v = _verdict(_recorded([2.0], [2.0], 1e-7), [1.5])
    assert v.kind == "inconclusive" and "not one quantity rounded twice" in v.summary, v.summary
    assert "Bessel" not in v.summary and "module: correctness (silent)" not in v.labels


def test_variances_a_bessel_factor_apart_are_named():
    ref = 1.0582143695037352
    v = _verdict(_recorded([1.0582144], [ref], 1.3e-7, node="var_correction"), [ref * 999 / 1000])
    assert v.kind == "inconclusive", v.summary
    assert "exactly N/(N − 1) for N = 1000" in v.summary and "`ddof=0`" in v.summary
    # Not for a ratio that is no count the value reduces, nor for an op that is no variance.
    assert "Bessel" not in _verdict(_recorded([1.0582144], [ref], 1.3e-7, node="var_correction"),
                                    [ref * 998 / 999]).summary
    assert "Bessel" not in _verdict(_recorded([1.0582144], [ref], 1.3e-7), [ref * 999 / 1000]).summary


def test_an_outside_value_is_weighed_only_as_the_check_equates_it_and_the_source_names_it():
    ref = 50027.62224692106
    assert _verdict(_recorded([50027.625], [ref], 2.7e-3), [ref]).kind == "expected-rounding"
    # A bound, not the same quantity.
    bound = SOURCE.replace("assert t == n", "assert t < n")
    assert _verdict(_recorded([50027.625], [ref], 2.7e-3), [ref], source=bound).kind != "expected-rounding"
    # A name the worker wrote that the script does not spell is never quoted.
    forged = _verdict(_recorded([50027.625], [ref], 2.7e-3), [ref], name="n` @maintainer")
    assert forged.kind != "expected-rounding" and "@maintainer" not in forged.summary
    # Nor one holding a terminal escape, even where the source spells it.
    escape = "f('\x1b]52;c;AAAA\x07')"
    forged = _verdict(_recorded([50027.625], [ref], 2.7e-3), [ref], name=escape,
                      source=SOURCE.replace("assert t == n", f"assert t == {escape}"))
    assert forged.kind != "expected-rounding" and "\x1b" not in forged.summary


def test_a_named_factor_a_negated_read_back_and_a_definition_are_said():
    # `t = -(p * p.log2()).sum().item()` against a natural-log entropy: minus torch's value, ln 2 apart.
    o = _recorded([-3.9], [-3.9], 1e-6)
    run = arm("cpu", [o], status="raised", leaves=(LEAF,),
              exception={"type": "AssertionError", "message": "", "line": 6, "claim": True})
    run.check_operands = [{"name": "t", "dtype": "float64", "value": -np.asarray(o.value, dtype=np.float64)},
                          {"name": "n", "dtype": "float64", "value": np.array([3.9 * math.log(2)])}]
    v = classify(Repro(path=REPRO.path, name=REPRO.name, source=SOURCE), compare([run]))
    assert v.kind == "inconclusive" and "minus torch's" in v.summary, v.summary
    assert "times exactly ln 2" in v.summary
    odd = dict(LEAF, fingerprint={"shape": [1001], "dtype": "float32", "sha256": "aa"})
    for leaf, said in ((LEAF, True), (odd, False)):
        o = _recorded([0.25], [0.25], 1e-8, node="median_default")
        run = arm("cpu", [o], status="raised", leaves=(leaf,),
                  exception={"type": "AssertionError", "message": "", "line": 6, "claim": True})
        run.check_operands = [{"name": "t", "dtype": "float64", "value": np.array([0.25])},
                              {"name": "n", "dtype": "float64", "value": np.array([0.2625])}]
        v = classify(Repro(path=REPRO.path, name=REPRO.name, source=SOURCE), compare([run]))
        assert v.kind == "inconclusive" and ("lower of the two middle values" in v.summary) == said, v.summary


def test_round_and_floor_division_are_said_as_definitions_by_their_recorded_ops():
    """`torch.round` against `math.floor(v + 0.5)`, `torch.floor_divide` against C's truncating
    division (a thirty-first new user's): the two definitions are said. By the recorded op's
    whole name: `floor_divide_default` is floor division, `floor_default` is not."""
    for node, said in (("round_default", "rounds a half to the nearest even integer"),
                       ("floor_divide_default", "round a quotient toward −∞"), ("floor_default", None)):
        v = _verdict(_recorded([2.0], [2.0], 1e-7, node=node), [3.0], source=SOURCE.replace("x.var()", "f(x)"))
        assert v.kind == "inconclusive", v.summary
        assert (said in v.summary) if said else "A possible difference of definition" not in v.summary, v.summary


def test_the_element_quoted_is_one_that_differs_not_a_signed_zero_no_rounding_reaches():
    """`torch.fmod` against `np.mod` (a thirty-first new user's): where torch's value is exact
    (no rounding reaches it), a -0.0 against NumPy's 0.0 was quoted as the element farthest
    out, "differs from that replay by 0"."""
    v = _verdict(_recorded([-0.0, -1.5], [-0.0, -1.5], 0.0), [0.0, 0.5])
    assert v.kind == "inconclusive", v.summary
    assert "(-1.5 at element 1)" in v.summary and "differs from that replay by 2" in v.summary, v.summary


def test_of_equal_read_backs_the_one_the_check_spells_is_the_operand():
    """`q_floor` and `q_div` are equal: the check's `q_floor.tolist()` was matched to the last
    of them (`q_div` at exit), whose op says nothing of floor division."""
    spelled = _recorded([2.0], [2.0], 1e-7, node="floor_divide_default")
    spelled.name = "`t`"
    other = _recorded([2.0], [2.0], 1e-7, node="div_tensor_mode")
    other.index, other.name = 1, "`q_div`"
    run = arm("cpu", [spelled, other], status="raised", leaves=(LEAF,),
              exception={"type": "AssertionError", "message": "", "line": 6, "claim": True})
    run.check_operands = [{"name": "t", "dtype": "float64", "value": np.array([2.0])},
                          {"name": "n", "dtype": "float64", "value": np.array([3.0])}]
    v = classify(Repro(path=REPRO.path, name=REPRO.name, source=SOURCE), compare([run]))
    assert "round a quotient toward −∞" in v.summary, v.summary


def test_a_constant_written_short_of_its_digits_is_named_where_it_can_account_for_the_gap():
    source = SOURCE.replace("n = other()", "n = other(0.7978)")  # √(2/π) is 0.79788456…, 1.1e-4 short
    near = _verdict(_recorded([1.0], [1.0], 1e-7), [1.0 + 1.2e-4], source=source)
    assert near.kind == "inconclusive" and "line 5 writes 0.7978 where √(2/π) is 0.7978845608" in near.summary
    # Not where the gap is far past what that shortfall moves, nor for the constant in full.
    assert "short of its digits" not in _verdict(_recorded([1.0], [1.0], 1e-7), [1.05], source=source).summary
    full = SOURCE.replace("n = other()", "n = other(0.7978845608028654)")
    assert "short of its digits" not in _verdict(_recorded([1.0], [1.0], 1e-7), [1.0 + 1.2e-4], source=full).summary


def test_a_composite_ops_definition_is_found_by_the_call_on_torchs_line():
    # `torch.quantile` is recorded by the ops it is made of (no node is named for it): the call
    # on torch's value's line names it, and the argument choosing another method is quoted.
    source = SOURCE.replace("t = x.var().item()", 't = torch.quantile(x, 0.9, interpolation="nearest").item()')
    v = _verdict(_recorded([2.0], [2.0], 1e-7, node="squeeze_dim"), [2.5], source=source)
    assert v.kind == "inconclusive", v.summary
    assert 'Torch\'s side passes `interpolation="nearest"` (line 4)' in v.summary and "`np.percentile`" in v.summary
    plain = _verdict(_recorded([2.0], [2.0], 1e-7, node="squeeze_dim"), [2.5],
                     source=SOURCE.replace("t = x.var().item()", "t = torch.quantile(x, 0.9).item()"))
    assert "`np.percentile`" in plain.summary and "passes" not in plain.summary


def test_one_number_of_a_read_back_list_is_matched_only_where_it_is_one_element():
    # `t = torch.tensor([16777217.0, 3.0, 1e8 + 1])`, then `for got, want in zip(t.tolist(), values)`.
    source = ("import torch\nvalues = [16777217.0, 3.0, 100000001.0]\nt = torch.tensor(values)\n"
              "for got, want in zip(t.tolist(), values):\n    assert got == want\n")
    for stored, said in (([16777216.0, 3.0, 1e8], True), ([16777216.0, 16777216.0, 1e8], False)):
        o = _recorded(stored, [16777217.0, 3.0, 100000001.0], 1.0)
        o.line = 4
        run = arm("cpu", [o], status="raised", leaves=(LEAF,),
                  exception={"type": "AssertionError", "message": "", "line": 5, "claim": True})
        run.check_operands = [{"name": "got", "dtype": "float64", "value": np.array(16777216.0)},
                              {"name": "want", "dtype": "float64", "value": np.array(16777217.0)}]
        v = classify(Repro(path=REPRO.path, name=REPRO.name, source=source), compare([run]))
        assert (v.kind == "expected-rounding" and "element 0" in v.summary) == said, v.summary


def test_a_recorded_value_outside_its_own_spread_is_not_excused_by_an_outside_value():
    o = _recorded([2.0], [2.5], 1e-7)
    o.rounding["sample_stats"] = [0.5] * 29
    assert _verdict(o, [2.5]).kind != "expected-rounding"


# -- end to end: the worker's operands reach the verdict ----------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("body, kind, said", [
    # A float32 sum against Python's float64 sum of the same numbers: 50027.625 against
    # 50027.6222…, float32's rounding on any machine (its spacing there is 0.0039).
    ("x = torch.rand(100000)\ns = x.sum().item()\np = sum(x.tolist())\nassert s == p, (s, p)\n",
     "expected-rounding", "`p` agrees with triage's float64 replay"),
    # torch's unbiased variances against NumPy's biased ones, written in the check itself: a
    # ratio of 40/39 in every column on any machine.
    ("a = torch.randn(40, 6)\nnp.testing.assert_allclose(a.var(dim=0).numpy(), np.var(a.numpy(), axis=0), "
     "rtol=1e-6)\n", "inconclusive", "exactly N/(N − 1) for N = 40"),
    # Column means against NumPy's row means (nu22's c13): torch's mean over the other axis is
    # NumPy's value in float64, which the worker finds by replaying that one change.
    ("M = torch.rand(64, 64)\nt = M.mean(dim=0).numpy()\nn = np.mean(M.numpy().astype(np.float64), axis=1)\n"
     "np.testing.assert_allclose(t, n, rtol=1e-5)\n", "likely-bug",
     "`aten.mean` at line 5 reduces over dim [0]: over dim [-1] instead, `t` equals `n` in float64 — the axis is the "
     "difference."),
])
def test_a_check_against_numpy_or_python_is_judged_end_to_end(triage, tmp_path, body, kind, said):
    script = tmp_path / "repro.py"
    script.write_text("import numpy as np\nimport torch\ntorch.manual_seed(0)\n" + body)
    code, report, _, out = triage(script, "cpu", "--no-minimize", "--no-ablate")
    assert report is not None, out
    v = report["verdict"]
    assert v["kind"] == kind and said in v["summary"], v["summary"]
    assert "check_operands" not in report["arms"][0]
