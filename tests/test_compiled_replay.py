"""A compiled region's replay (triage/worker/rounding.py, `_run_compiled`): its dynamo graph calls
torch functions, whose composite ops decide from a value's memory layout which aten ops to make
(`reshape` views or copies). Every replay must make the centre replay's ops, in its order: the
figures the centre notes per call (a decomposition's ops, where an accumulator overflows) are
found by the call's index, and a call of another op at that index must not take them."""
import pytest
import torch

from triage.worker.observe import ObservationStore, Observer, install_compile
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64
from triage.worker.rounding import Draws, RoundingMode, SimulationOptions, _CallCache, simulate_rounding

aten = torch.ops.aten


@pytest.mark.parametrize("direction, generator", [(1, None), (-1, None), (0, 7)])
def test_rounding_keeps_the_values_memory_layout(direction, generator):
    # The centre replay rounds by a cast, which keeps a permuted layout; the others round in
    # NumPy on a contiguous copy. A flash attention's output is permuted: transposed back, it
    # is contiguous in the centre replay and `reshape` views it, and elsewhere it copied first.
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64).permute(0, 2, 1, 3)
    x._arm_dtype = torch.float32
    mode = RoundingMode(SimulationOptions(), _CallCache(), direction=direction,
                        generator=None if generator is None else Draws(generator))
    centre = RoundingMode(SimulationOptions(), _CallCache(), direction=0, generator=None)
    for m in (centre, mode):
        out = m.round_op(aten.sin.default, (x,), {})
        assert out.stride() == x.stride()


def test_a_call_of_another_op_at_a_decompositions_index_runs_its_own_decomposition():
    # The centre replay decomposed `var_mean` at call 0; a replay whose call 0 is a layer norm
    # (its op sequence shifted by one) replayed var_mean's ops and returned its two outputs.
    torch.manual_seed(0)
    x = torch.randn(4, 8, dtype=torch.float64)
    x._arm_dtype = torch.float32
    weight, bias = torch.ones(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)
    for t in (weight, bias):
        t._arm_dtype = torch.float32
    cache = _CallCache()
    centre = RoundingMode(SimulationOptions(), cache, direction=0, generator=None)
    centre.round_op(aten.var_mean.correction, (x, [1]), {"correction": 0, "keepdim": True})
    up = RoundingMode(SimulationOptions(), cache, direction=1, generator=None)
    out = up.round_op(aten.native_layer_norm.default, (x, [8], weight, bias, 1e-5), {})
    assert len(out) == 3 and out[0].shape == x.shape
    expected = torch.nn.functional.layer_norm(x, [8], weight, bias, 1e-5)
    assert torch.allclose(out[0], expected, atol=1e-5)


def test_a_compiled_decoder_layer_is_judged_within_its_spread(monkeypatch):
    # A new user's report: an eval-mode TransformerDecoderLayer under torch.compile. Its region's
    # replay failed ("Expected Tensor but got None": a layer norm given var_mean's ops), and the
    # compiled arm was not judged at all.
    monkeypatch.setattr(torch, "compile", torch.compile)  # `install_compile` replaces it: restored after
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = torch.nn.TransformerDecoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True).eval()
    tgt, mem = torch.randn(2, 7, 32), torch.randn(2, 9, 32)
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    store = ObservationStore(recorder, lambda: None, 10**6, lambda message: None)
    install_compile(store, recorder, True, None)
    with torch.no_grad(), recorder, Observer(store, __file__):
        out = torch.compile(layer, backend="eager")(tgt, mem)
    recording = recorder.finish()
    assert recorder.compiled_graphs >= 1
    node = recorder.lookup(out)
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    sim = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=9),
                            {node.name: out.dtype}, {node.name: out})
    spread = sim.spreads[node.name]
    assert spread.status == "judged", spread.reason
    # The eager backend computes the layer's own ops: its value is rounding of them.
    assert bool(((out.double() - reference).abs() <= 8 * spread.sigma + 1e-12).all())


def test_a_value_from_a_compiled_call_names_the_line_that_called_it(monkeypatch):
    # A script comparing eager against `torch.compile(run)(...)` in one process: the compiled
    # side's value comes through a compiled region, whose top-level call line the report names.
    from triage.worker.session import _ancestry

    monkeypatch.setattr(torch, "compile", torch.compile)
    torch._dynamo.reset()
    recorder = OpRecorder(torch.device("cpu"), site=lambda: 3, outer_site=lambda: 18)
    store = ObservationStore(recorder, lambda: None, 10**6, lambda message: None)
    install_compile(store, recorder, True, None)
    x = torch.randn(8)
    with torch.no_grad(), recorder, Observer(store, __file__):
        eager = torch.sin(x).sum()
        compiled = torch.compile(lambda t: torch.sin(t).sum(), backend="eager")(x)
    recorder.finish()
    assert _ancestry(recorder.lookup(compiled), {}, {})[2] == 18
    assert _ancestry(recorder.lookup(eager), {}, {})[2] is None
