"""Integer arithmetic that wraps around (two's complement, as NumPy's does): the
worker notes an integer op whose exact result leaves its dtype's range, and a verdict on a
value it feeds names the op and the fix. Before, a uint8 `a + b` against `a.int() + b.int()`
was "different functions" that listed where the two parted, and an int64 cumprod's failing
check was `inconclusive`."""
import math
import textwrap

import numpy as np
import pytest
import torch

from tests.conftest import run_source
from tests.test_ladder import arm, obs
from triage.classify.ladder import classify
from triage.compare import compare
from triage.model import Repro
from triage.worker.conditioning import integer_wraparound

A = torch.ops.aten


@pytest.mark.parametrize("func, args, kwargs, noted", [
    (A.add.Tensor, (torch.tensor([200, 100, 50], dtype=torch.uint8), torch.tensor([100, 200, 30], dtype=torch.uint8)),
     {}, (300, 44, 2)),
    (A.mul.Tensor, (torch.tensor([100, 7], dtype=torch.int8), 2), {}, (200, -56, 1)),
    (A.sub.Tensor, (torch.tensor([3, 200], dtype=torch.uint8), 128), {}, (-125, 131, 1)),
    (A.abs.default, (torch.tensor([-128, 5], dtype=torch.int8),), {}, (128, -128, 1)),
    (A.cumprod.default, (torch.arange(1, 23), 0), {}, (math.factorial(21), -4249290049419214848, 2)),
    (A._to_copy.default, (torch.tensor([300, 20]),), {"dtype": torch.uint8}, (300, 44, 1)),
    (A.add.Tensor, (torch.tensor([100, 27], dtype=torch.uint8), torch.tensor([100, 27], dtype=torch.uint8)), {}, None),
    (A.sum.default, (torch.tensor([True, True]),), {}, None),  # a count: int64 fits it
    (A.mul.Tensor, (torch.tensor([1.5e38]), 10.0), {}, None),  # a float overflow is not this note's
])
def test_an_integer_op_past_its_dtypes_range_is_noted(func, args, kwargs, noted):
    out = func(*args, **kwargs)
    note = integer_wraparound(func, func.overloadpacket.__name__, args, kwargs, out)
    if noted is None:
        assert note is None
        return
    exact, got, count = noted
    assert (note["exact"], note["got"], note["wrapped"]) == (float(exact), got, count), note
    assert f"gives {got}" in note["figure"]


def _wrapped_run(exception):
    note = {"op": "cumprod", "kind": "integer-wraparound", "shape": [22], "dtype": "int64", "singular": False,
            "ill_conditioned": False, "node": "n1", "line": 3, "exact": 5.1e19, "got": -4249290049419214848,
            "figure": "its exact result 5.109e+19 does not fit int64 (−2^63 to 2^63 − 1): integer arithmetic is "
                      "modular (modulo 2^64, as NumPy's, with no warning) and gives -4249290049419214848"}
    fact = np.array([1.0, 2.0, -4.0], dtype=np.float32)
    return arm("cpu", [obs(0, fact, fact.astype(np.float64), kind="readback", label="print/repr", cond=[0])],
               status="raised" if exception else "ok", exception=exception, conditioning=[note])


def test_a_failed_check_on_wrapped_integers_names_the_overflow_not_a_conflict():
    exc = {"type": "AssertionError", "message": "went negative", "claim": True, "line": 5, "traceback": ""}
    v = classify(Repro(path="/x/r.py", name="r.py", source=""), compare([_wrapped_run(exc)]))
    assert (v.kind, v.expected, v.labels) == ("likely-bug", False, ["triage review"]), v.summary
    assert "`aten.cumprod` at line 3 overflows int64" in v.summary and "script's own overflow" in v.summary


def test_a_value_of_wrapped_integers_that_agrees_says_it_wrapped():
    v = classify(Repro(path="/x/r.py", name="r.py", source=""), compare([_wrapped_run(None)]))
    assert v.kind == "not-reproduced" and "reads integer arithmetic that wrapped" in v.summary, v.summary


def test_two_values_apart_by_a_wrapped_sum_name_the_overflow(triage, tmp_path):
    report = run_source(triage, tmp_path, "uint8", textwrap.dedent("""\
        import torch
        a = torch.tensor([200, 100, 50], dtype=torch.uint8)
        b = torch.tensor([100, 200, 30], dtype=torch.uint8)
        small = (a + b).float().mean()
        wide = (a.int() + b.int()).float().mean()
        print(torch.allclose(small, wide))
    """))
    verdict = report["verdict"]
    assert (verdict["kind"], verdict["labels"]) == ("likely-bug", ["triage review"]), verdict["summary"]
    assert "`aten.add` at line 4 overflows uint8: its exact result 300" in verdict["summary"]


def test_a_forged_note_missing_its_fields_is_read_without_a_traceback():
    """The notes are the arm's output, which the script can rewrite: a wraparound note with no
    figure or line (the parent's check lets one through) and a length note with no numbers are
    not read, and the verdict is what it was without them."""
    from tests.test_ladder import _arange_length_run

    run = _wrapped_run({"type": "AssertionError", "message": "", "claim": True, "line": 5, "traceback": ""})
    run.conditioning = [{"kind": "integer-wraparound", "op": "cumprod", "shape": [22], "dtype": "int64"}]
    v = classify(Repro(path="/x/r.py", name="r.py", source=""), compare([run]))
    assert v.kind == "inconclusive" and "overflows" not in v.summary
    exc = {"type": "AssertionError", "message": "", "claim": True, "line": 4, "traceback": ""}
    run = _arange_length_run(exc)
    run.conditioning = [{"kind": "range-length", "op": "arange", "shape": [4], "dtype": "float32", "line": 2,
                         "exact_length": "three", "start": 0.1, "step": 0.1, "figure": ""}]
    source = "import torch\ngrid = torch.arange(0.1, 0.4, 0.1)\nn = len(grid)\nassert n == 3\n"
    assert classify(Repro(path="/x/r.py", name="r.py", source=source), compare([run], source)).kind == "inconclusive"
