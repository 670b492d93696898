"""The script's kernels under triage's modes are the ones plain python runs: nn.MultiheadAttention
and nn.TransformerEncoderLayer take their fused native kernel where no argument "has a torch
function", which triage's own TorchFunctionModes made true in every arm (a reporter's
fused-kernel difference vanished: "not-reproduced")."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from triage.worker.observe import FAST_PATH_MODULES, ObservationStore, Observer, install_compile, install_fast_paths
from triage.worker.opgraph import OpRecorder


class ScriptMode(TorchFunctionMode):
    """A script's own function mode: it keeps its effect (no fast path), as in plain python."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return func(*args, **(kwargs or {}))


@pytest.fixture
def fast_paths(monkeypatch):
    for cls in FAST_PATH_MODULES:  # restored after the test
        monkeypatch.setattr(cls, "forward", cls.forward)
    install_fast_paths()


def modules():
    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    encoder = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    return {"_native_multi_head_attention": lambda x: attention(x, x, x, need_weights=False)[0],
            "_transformer_encoder_layer_fwd": encoder}, torch.randn(2, 10, 32)


def recorded_ops(fn, x, *modes):
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    store = ObservationStore(recorder, lambda: None, 10**6, lambda message: None)
    with torch.no_grad(), recorder, Observer(store, __file__):
        for mode in modes:
            mode.__enter__()
        try:
            out = fn(x)
        finally:
            for mode in reversed(modes):
                mode.__exit__(None, None, None)
    ops = {n.target.overloadpacket.__name__ for n in recorder.finish().graph.nodes
           if isinstance(n.target, torch._ops.OpOverload)}
    return out, ops


def test_the_fused_kernels_run_under_triages_modes_as_in_plain_python(fast_paths):
    layers, x = modules()
    for fused, fn in layers.items():
        with torch.no_grad():
            plain = fn(x)
        out, ops = recorded_ops(fn, x)
        assert fused in ops, ops
        assert torch.equal(out, plain)
        _, ops = recorded_ops(fn, x, ScriptMode())
        assert fused not in ops  # the script's own mode: the Python path, as plain python takes


def test_without_the_fix_triages_modes_took_the_python_path():
    layers, x = modules()
    for fused, fn in layers.items():
        assert fused not in recorded_ops(fn, x)[1]


def test_a_compiled_attention_still_compiles(fast_paths, monkeypatch):
    # Under dynamo the forward is torch's own: a check of triage's modes there broke the graph,
    # and the compile arm compiled nothing.
    monkeypatch.setattr(torch, "compile", torch.compile)  # `install_compile` replaces it: restored after
    torch._dynamo.reset()
    _, x = modules()
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    store = ObservationStore(recorder, lambda: None, 10**6, lambda message: None)
    install_compile(store, recorder, True, None)
    attention = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad(), recorder, Observer(store, __file__):
        torch.compile(attention, backend="eager")(x, x, x, need_weights=False)  # dynamo's tracing, no C++
    recorder.finish()
    assert recorder.compiled_graphs >= 1
