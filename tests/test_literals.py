"""Leaves a script writes as Python numbers (triage/worker/opgraph.py, `Leaf.literal`):
`torch.tensor(math.pi / 2)` is float32's nearest value to π/2, 4.4e-8 away. The float64 reference
computes from the numbers written, and every simulated replay rounds them to the leaf's dtype, so
the rounding of the input is part of the arm's rounding: cos of it is -4.37e-8, not 0, and a check
`== 0.0` fails by that rounding alone (a new user's `torch.polar(1, math.pi / 2)`, which triage
called inconclusive, "a kernel wrong in every precision agrees with itself")."""
import math
import textwrap

import pytest
import torch

from tests.conftest import run_source
from triage.worker.observe import ObservationStore, Observer
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64
from triage.worker.rounding import SimulationOptions, simulate_rounding


def recorded_script(source: str, tmp_path):
    """Run `source` under the recorder and the observer: (recording, recorder, its globals)."""
    path = tmp_path / "repro.py"
    path.write_text(textwrap.dedent(source))
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    store = ObservationStore(recorder, lambda: None, 1 << 20, lambda message: None)
    namespace = {"__name__": "__main__"}
    with recorder, Observer(store, str(path)):
        exec(compile(path.read_bytes(), str(path), "exec"), namespace)
    return recorder.finish(), recorder, namespace


@pytest.mark.parametrize("source, literal", [
    ("x = torch.tensor([math.pi / 2, math.pi])", [math.pi / 2, math.pi]),
    ("x = torch.as_tensor(0.1)", 0.1),
    # A float64 array is its own float64 leaf, and the cast to float32 a recorded op.
    ("x = torch.tensor(np.array([0.1, 0.25]), dtype=torch.float32)", None),
    ("x = torch.tensor([1.0, 0.5, 3])", None),  # every number held exactly: nothing to note
    ("x = torch.tensor([0.1], dtype=torch.float64)", None),  # the numbers themselves
    ("x = torch.as_tensor(torch.ones(2) / 3)", None),  # a tensor's values, not the script's numbers
    # An object of the script's: reading its value again would run its `__float__` twice.
    ("class Third(float):\n            def __float__(self): print('read'); return 1 / 3\n        "
     "x = torch.tensor([Third(0.1)])", None),
])
def test_a_leaf_written_as_numbers_its_dtype_misses_keeps_them(source, literal, tmp_path):
    recording, recorder, ns = recorded_script(f"""\
        import math
        import numpy as np
        import torch
        {source}
        y = torch.sin(x)
    """, tmp_path)
    leaf = recorder.lookup(ns["x"])
    while leaf.op != "placeholder":
        leaf = leaf.args[0]
    kept = leaf.meta["leaf"].literal
    if literal is None:
        assert kept is None
    else:
        assert kept.dtype == torch.float64 and torch.equal(kept, torch.tensor(literal, dtype=torch.float64))


def test_the_reference_and_the_spread_start_from_the_numbers_written(tmp_path):
    recording, recorder, ns = recorded_script("""\
        import math
        import torch
        angle = torch.tensor([math.pi / 2])
        real = torch.cos(angle)
    """, tmp_path)
    node = recorder.lookup(ns["real"])
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    assert abs(float(reference)) < 1e-16  # cos(π/2) in float64, not cos(float32's π/2) = -4.37e-8
    sim = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=29),
                            {node.name: torch.float32}, {node.name: ns["real"]})
    spread = sim.spreads[node.name]
    assert spread.status == "judged"
    # π/2 rounds up (to cos -4.37e-8) or down (to +7.5e-8): the input's rounding is the spread.
    assert 2e-8 < float(spread.sigma) < 2e-7
    directed = sorted((float(spread.up), float(spread.down)))
    assert directed[0] < -4e-8 and directed[1] > 7e-8


def test_a_check_that_a_written_angle_gives_an_exact_zero_fails_by_rounding(triage, tmp_path):
    report = run_source(triage, tmp_path, "polar", textwrap.dedent("""\
        import math
        import torch
        z = torch.polar(torch.tensor([1.0]), torch.tensor([math.pi / 2]))
        re = z[0].real.item()
        assert re == 0.0, f"expected 0, got {re}"
    """))
    verdict = report["verdict"]
    assert verdict["kind"] == "expected-rounding", verdict["summary"]
    assert "compares `re` with the literal 0.0" in verdict["summary"]
    assert "written as Python numbers at line 3 is not exactly representable in float32" in verdict["summary"]


def test_samples_that_are_one_value_have_that_value_as_their_mean():
    # The flush-to-zero fixture from its written numbers: every replay flushes (1e-20)² to 0,
    # float64 gives 0.01, and the mean taken as reference + mean deviation was 1.7e-18, not 0:
    # the judge read a spread there (0 digits) and called the flushed zeros ill-conditioned.
    from triage.worker.rounding import _finite_figures, _spread_figures

    ref = torch.tensor([0.009999999999999998, 0.5], dtype=torch.float64)
    stack = torch.zeros(9, 2, dtype=torch.float64)  # 9 samples: ref - 9·ref/9 leaves 1.7e-18
    stack[:, 1] = 0.5 + torch.linspace(-1, 1, 9, dtype=torch.float64) * 2 ** -30
    for figures in (_finite_figures, _spread_figures):
        mean = figures(ref, stack, torch.zeros(2, dtype=torch.float64))[1]
        assert mean[0].item() == 0.0 and abs(mean[1].item() - 0.5) < 2 ** -40


def test_a_number_written_beyond_the_dtypes_range_is_named_as_the_overflow(triage, tmp_path):
    report = run_source(triage, tmp_path, "big", "import torch\nx = torch.tensor([1e40, 1.0])\ny = x / 1e10\nprint(y)\n")
    verdict = report["verdict"]
    assert (verdict["kind"], verdict["expected"]) == ("nonfinite-flip", True), verdict["summary"]
    assert "The number written at line 2 (1e+40) lies beyond the largest finite float32" in verdict["summary"]
    assert report["arms"][0]["leaves"][0]["literal_beyond_range"] == 1e40


@pytest.mark.parametrize("call, noted", [
    ("torch.arange(0.1, 0.4, 0.1)", (4, 3)),  # (0.4 - 0.1)/0.1 = 3.0000000000000004: the end is in
    ("torch.arange(start=0.2, end=0.8, step=0.2, dtype=torch.float64)", (4, 3)),
    ("torch.arange(0, 0.3, 0.1)", None),  # 2.9999999999999996: three elements, as written
    ("torch.arange(0.0, 1.0, 1 / 3)", None),  # exactly 3.0
    ("torch.arange(0, 10, 3)", None),  # whole numbers: no rounding decides anything
    ("torch.arange(0.0, 1.0000001, 0.1)", None),  # 10.000001: the end is in by the numbers written
])
def test_an_arange_whose_length_rounding_decided_is_noted(call, noted, tmp_path):
    recording, recorder, ns = recorded_script(f"""\
        import torch
        x = {call}
        y = x * 2
    """, tmp_path)
    notes = [c for c in recording.conditioning if c["kind"] == "range-length"]
    if noted is None:
        assert not notes
    else:
        (note,) = notes
        assert len(ns["x"]) == noted[0]  # torch's own length, which the note must state
        assert (note["length"], note["exact_length"]) == noted and note["node"] == recorder.lookup(ns["x"]).name


def test_a_comparison_an_arange_longer_than_written_breaks_is_expected_rounding(triage, tmp_path):
    """A new user's `torch.arange(0.1, 0.4, 0.1)` has four elements, and `allclose` against the
    three they expected raises: torch's error, caused by the range's rounding, not a crash to
    report (it was `could-not-run`)."""
    report = run_source(triage, tmp_path, "arange", textwrap.dedent("""\
        import torch
        grid = torch.arange(0.1, 0.4, 0.1)
        print(torch.allclose(grid, torch.tensor([0.1, 0.2, 0.3])))
    """))
    verdict = report["verdict"]
    assert (verdict["kind"], verdict["expected"]) == ("expected-rounding", True), verdict["summary"]
    assert "(0.4 − 0.1)/0.1 is 3.0000000000000004" in verdict["summary"]
