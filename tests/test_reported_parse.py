"""The reporter's printed output read back as intervals and lined up with this machine's
(triage/reported/printed.py, align.py): no arm runs here."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.model import Observable
from triage.reported.align import find_observable, pair_groups
from triage.reported.printed import flat_index, interval, parse_output, parse_record


def numbers(text):
    return [(n.text, n.index) for r in parse_output(text) for g in r.groups for n in g.numbers]


@pytest.mark.parametrize("token,low,high", [
    ("-13.0520", -13.05205, -13.05195),
    ("5.5936e+00", 5.59355, 5.59365),
    ("1.", 1.0, 1.0),  # torch's and numpy's integral values are exact
    ("500,000", 499999.5, 500000.5),
    ("-inf", -math.inf, -math.inf),
])
def test_a_printed_number_is_the_interval_of_its_digits(token, low, high):
    n = interval(token)
    assert n.low == pytest.approx(low, rel=1e-12, abs=1e-15) and n.high == pytest.approx(high, rel=1e-12, abs=1e-15)


def test_tensor_reprs_give_positions_keywords_and_elision():
    (r,) = parse_output("tensor([[1.0000e+00, inf],\n        [-nan, 2.5000e-01]], device='cuda:0', dtype=torch.float16)")
    (g,) = r.groups
    assert (g.kind, g.device, g.dtype, g.elided) == ("tensor", "cuda:0", "float16", False)
    assert [n.index for n in g.numbers] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert math.isinf(g.numbers[1].value) and math.isnan(g.numbers[2].value)
    (r,) = parse_output("tensor([0.1000, 0.2000, 0.3000,  ..., 0.7000, 0.8000, 0.9000])")
    (g,) = r.groups
    assert g.elided and [n.index for n in g.numbers] == [(0,), (1,), (2,), (-3,), (-2,), (-1,)]
    assert flat_index((-3,), [1000]) == 997 and flat_index((5,), [3]) is None
    (r,) = parse_output("tensor(-13.0520)")
    assert r.groups[0].numbers[0].index == () and r.skeleton == "T"


def test_labels_versions_and_names_are_not_values():
    assert numbers("GPU logdet: -108.34196472167969 (PyTorch 2.9.1+cu128, sm_89, float16)") == [
        ("-108.34196472167969", None)]
    assert numbers("CPU is inf: True GPU is nan: False") == []
    r = parse_record("N = 500,000 and x = [1. 2. 3.]")
    assert [g.kind for g in r.groups] == ["scalar", "list"] and r.skeleton == "N = # and x = L"


def test_a_record_joins_lines_while_a_bracket_is_open():
    records = parse_output("first 1.5\ntensor([[1., 2.],\n        [3., 4.]])\nlast 2")
    assert [len(r.groups) for r in records] == [1, 1, 1] and len(records[1].groups[0].numbers) == 4


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_parsing_never_raises_and_every_interval_holds_its_value(text):
    for r in parse_output(text):
        for piece, own in r.segments():
            assert isinstance(piece.skeleton, str) and all(g in r.groups for g in own)
        for g in r.groups:
            for n in g.numbers:
                assert math.isnan(n.value) or n.low <= n.value <= n.high


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["tensor(", "[", "]", ")", "...", "1.5e+00", "-inf", "nan", ",", " ", "\n",
                                 "device='cuda:0'", "dtype=torch.float16", "GPU:", ";"]), max_size=60))
def test_parsing_never_raises_on_broken_reprs(parts):
    for r in parse_output("".join(parts)):
        r.segments()


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "1.5" + "]" * 3,  # deeper than any tensor
    "(\n" * 50_000,  # a bracket left open over many lines
    "; ".join(["GPU: 1.5"] * 20_000),  # many joined pieces
    " ".join(["1,000"] * 20_000) + " 2.5",
])
def test_pathological_output_parses_without_error(text):
    records = parse_output(text)
    assert records and all(isinstance(r.skeleton, str) for r in records)
    pair_groups(records, parse_output("GPU: 1.0\n"))


def _observable(index, value, kind="readback", line=1):
    value = np.asarray(value, dtype=np.float32)
    return Observable(index=index, kind=kind, label=".item()", line=line, node=f"n{index}",
                      fingerprint={"shape": list(value.shape), "dtype": "float32"}, reference=None, value=value)


HERE = "CPU logdet: -inf\nGPU logdet: -inf\nloss 0.25\n"


def _pairs(reported):
    return [(p.reported.text, p.here.text if p.here else None, p.how) for p in
            pair_groups(parse_output(reported), parse_output(HERE))]


def test_lines_pair_by_skeleton_past_extra_and_missing_lines():
    # A warning the reporter's machine printed, and their output cut short.
    assert _pairs("UserWarning: TF32 is on 1\nCPU logdet: -inf\nGPU logdet: -108.34196472167969\n") == [
        ("1", None, None), ("-inf", "-inf", "line"), ("-108.34196472167969", "-inf", "line")]


def test_joined_and_annotated_lines_pair_by_piece():
    assert _pairs("CPU logdet: -inf; GPU logdet: -108.3 (RTX 6000, torch 2.9.1); loss 0.3") == [
        ("-inf", "-inf", "segment"), ("-108.3", "-inf", "segment"), ("6000", None, None), ("0.3", "0.25", "segment")]


def test_unlabelled_values_pair_by_order_only_when_both_sides_agree():
    here = parse_output("tensor(0.)\ntensor(0.)\n")
    pairs = pair_groups(parse_output("CPU: tensor(-inf); GPU: tensor(0., device='cuda:0')"), here)
    assert [(p.how, p.context.split(":")[0]) for p in pairs] == [("order", "CPU"), ("order", "GPU")]
    # Three values against two printed here: nothing is guessed.
    pairs = pair_groups(parse_output("tensor(1.) tensor(2.) tensor(3.)"), here)
    assert all(p.here is None for p in pairs)


def test_a_printed_value_finds_the_observable_that_prints_so():
    obs = [_observable(0, -np.inf, line=5), _observable(1, 0.25, line=6), _observable(2, -np.inf, line=7)]
    (r,) = parse_output("GPU logdet: -inf")
    found, positions = find_observable(r.groups[0], obs, after=0)
    assert (found.index, positions) == (2, [0])  # the first in program order after the last one tied
    (r,) = parse_output("loss 0.2500")
    assert find_observable(r.groups[0], obs, after=-1)[0].index == 1
    (r,) = parse_output("loss 0.4")  # [0.35, 0.45]: no value prints so
    assert find_observable(r.groups[0], obs, after=-1) is None


def test_extract_keeps_what_the_reporter_saw_for_the_reported_arm(tmp_path):
    """`triage extract` writes the displayed values beside the script, and `triage run` on a
    transcript pasted into a .py file says how to get both."""
    import subprocess
    import sys

    from tests.conftest import ISSUES
    from triage.extract import extract_repro

    proc = subprocess.run([sys.executable, "-m", "triage", "extract", str(ISSUES / "transcript.md"), "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "reported.txt").read_text().splitlines() == [
        "tensor([88.1818, 89.2804, 86.5792,  1.3170])", "tensor([inf, inf, inf, 1.3170])"]
    pasted = tmp_path / "session.py"
    pasted.write_text(">>> import torch\n>>> torch.ones(2).sum()\ntensor(2.)\n")
    assert "`triage extract session.py`" in extract_repro(pasted).problem
