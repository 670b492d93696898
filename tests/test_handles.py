"""Handles instead of references (issue 28 item 2): a run keeps its parsed arm, a comparison
resolves a side to its run and observable, the "explains" rule is written once (with a twin
for report.json's dicts), and distinct random draws are a fact compare finds."""
import itertools

import pytest
from test_ladder import LEAF, arm, obs

from triage.arms.spec import TEST_ARMS_ENV, parse_arm
from triage.compare import compare
from triage.model import AGREEING_OUTCOMES, Ablation, ArmRun, ArmSpec, Side, to_jsonable
from triage.sweep.buckets import _parts, explains

SPECS = ["cpu", "cuda:1", "mps", "cpu/compile", "cuda/compile=aot_eager", "cuda/tf32=off", "cpu/threads=1",
         "cpu/compile=inductor/fallback_random=on/threads=2", "cpu/compile@2.15.0", "cpu/mkldnn=off@2.13.0",
         "cpu/fault=aten.mm:nan"]


@pytest.mark.parametrize("text", SPECS)
def test_reading_a_spec_back_gives_the_arm_it_was_written_from(text, monkeypatch):
    monkeypatch.setenv(TEST_ARMS_ENV, "1")
    arm_spec = parse_arm(text)
    assert ArmSpec.read(arm_spec.spec) == arm_spec


def test_a_run_built_from_its_spec_alone_reads_its_arm():
    assert ArmRun(spec="cpu/compile=aot_eager/threads=1", device="cpu", mode="compile", status="ok").arm == \
        ArmSpec("cpu", "compile", "aot_eager", (("threads", "1"),))
    given = ArmSpec("cpu", knobs=(("threads", "1"),))
    assert ArmRun(spec=given.spec, arm=given, device="cpu", mode="eager", status="ok").arm is given


@pytest.mark.parametrize("spec, parts", [
    ("cpu", ("cpu", None, {}, None)),
    ("cuda:1/compile", ("cuda", "inductor", {}, None)),
    ("cuda/compile=", ("cuda", "inductor", {}, None)),
    ("cpu/compile=aot_eager/threads=1", ("cpu", "aot_eager", {"threads": "1"}, None)),
    ("cpu/eager/tf32=off/tf32=on", ("cpu", None, {"tf32": "on"}, None)),
    ("cpu/Compile=x/fault=aten.mm:nan@2.15.0", ("cpu", None, {"Compile": "x", "fault": "aten.mm:nan"}, "2.15.0")),
    ("cpu@", ("cpu", None, {}, "")),
    ("", ("", None, {}, None)),
])
def test_the_buckets_read_a_reports_spec_without_checking_it(spec, parts):
    """The lenient reading sweep/buckets.py had of its own, now `ArmSpec.read`'s."""
    assert _parts(spec) == parts


OUTCOMES = AGREEING_OUTCOMES + ("still-diverges", "not-comparable", "skipped")


@pytest.mark.parametrize("outcome, supports, inside", list(itertools.product(
    OUTCOMES, ("expected-precision-mode", "nondeterministic", "evidence"), (True, False, None))))
def test_the_buckets_twin_of_explains_agrees_with_the_property(outcome, supports, inside):
    ablation = Ablation(switch="threads=1", arms=["cpu/threads=1"], outcome=outcome, detail="", section="General",
                        setting="torch.set_num_threads(1)", supports=supports, inside_spread=inside)
    assert explains(to_jsonable(ablation)) == ablation.explains
    assert ablation.explains == (outcome in ("agree-bitwise", "within-tolerance") and supports != "evidence"
                                 and inside is not False)


def _claim_runs(second_leaf_shape, second_kind="random", second_op="uniform_"):
    leaves = [dict(LEAF), {"index": 1, "kind": "random", "op": "uniform_", "line": 5,
                           "fingerprint": {"shape": [2, 4], "sha256": "b"}},
              {"index": 2, "kind": second_kind, "op": second_op, "line": 6,
               "fingerprint": {"shape": second_leaf_shape, "sha256": "c"}}]
    a = obs(0, [0.3], [0.3], kind="claim", label="torch.allclose operand 1", ancestors=(0, 1),
            claim={"id": 0, "func": "torch.allclose", "operand": 0, "holds": False})
    b = obs(1, [0.9], [0.9], kind="claim", label="torch.allclose operand 2", ancestors=(0, 2),
            claim={"id": 0, "func": "torch.allclose", "operand": 1, "holds": False})
    return [arm("cpu", [a, b], leaves=leaves)]


def test_compare_finds_the_distinct_draws_of_a_claim_and_report_json_leaves_them_out():
    d = compare(_claim_runs([2, 4])).divergence
    assert d.source == "claim"
    assert d.distinct_draws == [{"index": 1, "kind": "random", "op": "uniform_", "line": 5, "shape": [2, 4],
                                 "differs": True}]
    assert "distinct_draws" not in to_jsonable(d)
    assert compare(_claim_runs([3])).divergence.distinct_draws == []  # draws of different things


def test_a_comparison_resolves_a_side_to_its_run_and_observable():
    c = compare([arm("cpu", [obs(0, [1.0, 2.0], [1, 2])]), arm("cuda", [obs(0, [1.5, 2.0], [1, 2])])])
    d = c.divergence
    run, o = c.resolve(d.b)
    assert (run.spec, o.index) == ("cuda", 0) and run is c.run("cuda") and o is run.observables[0]
    assert c.find(d.b) == (run, o) and c.find(None) is None and c.run("mps") is None
    missing = Side(arm="cuda", observable=7, label="x", line=None, dtype="float32", summary="")
    assert c.find(missing) is None
    with pytest.raises(LookupError):
        c.resolve(missing)


def test_a_drawn_value_against_a_deterministic_one_of_its_shape_is_no_second_draw():
    """`(X @ A - torch.eye(64))` with A drawn: the identity is made, not drawn again."""
    assert compare(_claim_runs([2, 4], "factory", "eye")).divergence.distinct_draws == []
    assert compare(_claim_runs([2, 4], "input", None)).divergence.distinct_draws == []
    for kind in ("uninitialized", "compiled", "stale"):  # a compiled call's own buffers may be draws
        assert compare(_claim_runs([2, 4], kind, None)).divergence.distinct_draws != []
