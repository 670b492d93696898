"""The float64 reference of a training loop: the recorded program replayed in float64 from
its leaves must equal the same loop run in float64 end to end (every random draw made in
float32 and cast, so both start from the same numbers). In-place parameter updates by the
optimizers (single-tensor, foreach and fused steps), load_state_dict's copy_, `p.data`
updates and a shuffled DataLoader's order (a randperm leaf) are what it must honour."""
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import FIXTURES
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from triage.worker.opgraph import OpRecorder
from triage.worker.reference import cone, replay_fp64

# Both sides compute the same float64 ops from the same inputs: only float64 rounding separates them.
RTOL = 1e-9


def record_and_replay(fn):
    """fn() run under the recorder in float32; (its value, the float64 reference, the recording)."""
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        out = fn(torch.float32)
    recording = recorder.finish()
    node = recorder.lookup(out)
    assert node is not None
    replay = replay_fp64(recording.graph, {node.name}, 120)
    assert not replay.failed and not replay.approximate
    return out, replay.values[node.name], recording


def training_loop(optimizers, steps=2):
    def run(dtype):
        torch.manual_seed(0)
        x, w, noise = (torch.randn(*shape).to(dtype) for shape in ((24, 3), (3, 1), (24, 1)))
        y = torch.tanh(x @ w) + 0.1 * noise

        def make():
            return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1))

        model, trained = make().to(dtype), make().to(dtype)
        model.load_state_dict(trained.state_dict())
        loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
        for make_optimizer in optimizers:
            optimizer = make_optimizer(model.parameters())
            for _ in range(steps):
                for xb, yb in loader:
                    optimizer.zero_grad()
                    nn.functional.mse_loss(model(xb), yb).backward()
                    optimizer.step()
        return nn.functional.mse_loss(model(x), y)

    return run


IMPLEMENTATIONS = {"single-tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "sgd-then-adam"])
def test_training_loop_reference_is_the_float64_run(optimizer, implementation):
    kw = IMPLEMENTATIONS[implementation]
    sgd = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, **kw)  # noqa: E731
    adam = lambda p: torch.optim.Adam(p, lr=0.01, **kw)  # noqa: E731
    loop = training_loop({"sgd": [sgd], "adam": [adam], "sgd-then-adam": [sgd, adam]}[optimizer])
    value, reference, recording = record_and_replay(loop)
    float64 = loop(torch.float64)
    assert math.isclose(reference.item(), float64.item(), rel_tol=RTOL)
    # The float32 run is a different computation: the reference is not just its value upcast.
    assert reference.item() != value.item()
    # Parameters updated in place stay on their recorded producers (views of them included):
    # none is re-anchored to its float32 value mid-training.
    assert not [leaf for leaf in recording.leaves if leaf.kind == "stale"]
    # The loader's order is a recorded randperm, used as is.
    assert any(leaf.op == "randperm" for leaf in recording.leaves)


@pytest.mark.parametrize("update", ["data-add", "data-assign", "no-grad-sub"])
def test_updates_through_data_are_followed(update):
    """`p.data` has a version counter of its own: an update through it does not move the
    parameter's, and `p.data = t` swaps its memory without any op."""
    def run(dtype):
        torch.manual_seed(0)
        w = nn.Parameter(torch.randn(3, 2).to(dtype))
        x = torch.randn(4, 3).to(dtype)
        for _ in range(3):
            (x @ w).square().sum().backward()
            if update == "data-add":
                w.data.add_(w.grad.data, alpha=-0.01)
            elif update == "data-assign":
                w.data = w.data - 0.01 * w.grad
            else:
                with torch.no_grad():
                    w -= 0.01 * w.grad
            w.grad = None
        return (x @ w).square().sum()

    _, reference, recording = record_and_replay(run)
    assert math.isclose(reference.item(), run(torch.float64).item(), rel_tol=RTOL)
    assert not [leaf for leaf in recording.leaves if leaf.kind == "stale"]


@pytest.mark.parametrize("restore", ["deepcopy", "torch.load"])
def test_weights_rebuilt_from_a_storage_are_leaves_of_their_values(restore):
    """`copy.deepcopy(model.state_dict())` and `torch.load` rebuild each tensor by setting a
    storage's bytes into an empty one (`set_(storage, …)`). Replayed as that op, float64
    read a float32 storage's bytes (a new user's reference was 3.5e151 where the output is
    0.52, and a correct training loop was called a bug)."""
    import copy
    import io

    def run(dtype):
        torch.manual_seed(0)
        base = nn.Linear(8, 1).to(dtype)
        if restore == "deepcopy":
            state = copy.deepcopy(base.state_dict())
        else:
            buffer = io.BytesIO()
            torch.save(base.state_dict(), buffer)
            buffer.seek(0)
            state = torch.load(buffer)
        model = nn.Linear(8, 1).to(dtype)
        model.load_state_dict(state)
        return model(torch.randn(4, 8).to(dtype)).sum()

    value, reference, recording = record_and_replay(run)
    assert math.isclose(reference.item(), run(torch.float64).item(), rel_tol=1e-6)
    assert math.isclose(reference.item(), value.item(), rel_tol=1e-5)
    assert "set_" not in {getattr(n.target, "__name__", "").split(".")[0] for n in recording.graph.nodes}


def test_a_module_deep_copied_before_it_runs_keeps_its_own_history():
    """`copy.deepcopy(model)` clones each tensor's storage through a byte view `set_` onto
    it; counted as a write there, the original model's every buffer and weight went "stale"
    (re-anchored to the arm's float32 values), and a float32-against-float64 training check
    was withdrawn as "computed where triage records no ops (compiled kernels)"."""
    import copy

    def run(dtype):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)).to(dtype)
        twin = copy.deepcopy(net).double()
        return net(torch.randn(8, 4).to(dtype)).square().sum() + 0 * twin[0].bias.sum().to(dtype)

    _, reference, recording = record_and_replay(run)
    assert math.isclose(reference.item(), run(torch.float64).item(), rel_tol=RTOL)
    assert not [leaf for leaf in recording.leaves if leaf.kind == "stale"]


def test_an_output_a_kernel_leaves_empty_without_gradients_is_not_read_past_its_end():
    """Sparse `mm` with the `amax` reduction computes its argmax indices only where an input
    requires a gradient: the float64 replay (no gradients) got them empty, and the recorded
    backward read them past their end and crashed the process. A replayed output whose shape
    is not the recording's stops the replay there."""
    a = torch.randn(5, 5).relu().to_sparse_csr().requires_grad_()
    b = torch.randn(5, 3, requires_grad=True)
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with torch.enable_grad(), recorder:
        (grad,) = torch.autograd.grad(torch.sparse.mm(a, b, "amax").sum(), b)
    node = recorder.lookup(grad)
    replay = replay_fp64(recorder.finish().graph, {node.name}, 60)
    assert node.name not in replay.values
    assert "shape (0,) where the recording's had (5, 3)" in replay.failed[node.name]


def test_foreach_step_moves_version_counters_under_the_recorder():
    """Under a dispatch mode a foreach op moves no version counter; the recorder advances
    them, as the op does outside one, so autograd and staleness checks still see the write."""
    p, g = torch.zeros(3), torch.ones(3)
    with OpRecorder(torch.device("cpu"), site=lambda: None):
        before = p._version
        torch._foreach_add_([p], [g])
    assert p._version > before


def test_a_view_taken_before_an_update_is_stale_after_it():
    def run(dtype):
        w = torch.arange(6.0).reshape(2, 3).to(dtype)
        view = w[0]
        w.mul_(2)
        return view.sum()

    value, reference, recording = record_and_replay(run)
    assert value.item() == reference.item() == 6.0
    assert [leaf.kind for leaf in recording.leaves].count("stale") == 1


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_in_place_gates_on_the_splits_of_one_gemm_keep_their_history(cell):
    """A GRU or LSTM cell splits its GEMM's output into gates and updates them in place: each
    write moved the version counter the splits share (or the storage's write count, for
    `unsafe_split`'s pieces), so every gate read after a sibling's write was a stale leaf
    holding the arm's float32 values, and the spread of a new user's compiled GRU loop
    covered only what came after them ("inconclusive"). A write to other elements leaves a
    view's value as it was."""
    def run(dtype):
        torch.manual_seed(0)
        module = (nn.GRUCell if cell == "gru" else nn.LSTMCell)(6, 8).to(dtype)
        h = c = torch.zeros(3, 8, dtype=dtype)
        with torch.no_grad():
            for x in torch.randn(4, 3, 6).to(dtype):
                h = module(x, h) if cell == "gru" else module(x, (h, c))
                if cell == "lstm":
                    h, c = h
        return h

    value, reference, recording = record_and_replay(run)
    assert not [leaf for leaf in recording.leaves if leaf.kind == "stale"]
    # Not bitwise: MKL's float64 GEMM rounds differently with its buffers' alignment, so two
    # float64 runs of one loop differ in the last bits. A gate left at float32 is 1e-8 away.
    expected = run(torch.float64)
    assert torch.allclose(reference, expected, rtol=RTOL, atol=0)
    assert not torch.allclose(value.double(), expected, rtol=RTOL, atol=0)


@pytest.mark.parametrize("split", ["rows", "columns", "unsafe-columns"])
def test_a_write_to_one_split_leaves_its_siblings_and_reaches_what_overlaps_it(split):
    def run(dtype):
        torch.manual_seed(2)
        base = torch.randn(4, 9).to(dtype) * 3
        parts = (base.split(3, 0)[:2] + (base[3:],) if split == "rows" else base.unsafe_split(3, 1)
                 if split == "unsafe-columns" else base.split(3, 1))
        parts[0].mul_(2)
        sibling = parts[1] + 1  # untouched: its recorded history
        whole = base.sum() if split != "unsafe-columns" else parts[0].sum()  # the written elements
        return sibling.sum() * whole

    value, reference, recording = record_and_replay(run)
    assert math.isclose(reference.item(), run(torch.float64).item(), rel_tol=RTOL)
    assert not [leaf for leaf in recording.leaves if leaf.kind == "stale"]


@pytest.mark.parametrize("fill", ["element", "slice", "column", "flat-view", "diagonal"])
def test_a_tensor_filled_through_its_views_keeps_its_history(fill):
    """`g = torch.empty(n); g[i] = …` (a finite-difference gradient, a preallocated buffer):
    each write goes through a view of `g`, and `g` is the old one with the view's new value
    scattered in, so its float64 reference is the float64 computation of every element, not
    a stale leaf holding the arm's own float32 values."""
    def run(dtype):
        torch.manual_seed(1)
        w = torch.randn(6).to(dtype)
        loss = lambda v: torch.log1p(torch.exp(3.0 * v)).sum() + (v ** 2).sum()  # noqa: E731
        h = 2.0 ** -13  # the same step in float32 and float64
        g = (torch.empty(2, 6, dtype=dtype) if fill == "column" else torch.zeros(6, 6, dtype=dtype)
             if fill == "diagonal" else torch.empty(6, dtype=dtype))
        for i in range(6):
            e = torch.zeros(6, dtype=dtype)
            e[i] = h
            d = (loss(w + e) - loss(w - e)) / (2 * h)
            if fill == "element":
                g[i] = d
            elif fill == "slice":
                g[i:i + 1] = d
            elif fill == "column":
                g[:, i] = d
            elif fill == "flat-view":
                g.view(-1)[i] = d
            else:  # an element of the diagonal view (a view of a view: its place in memory)
                g.diagonal()[i] = d
        if fill == "diagonal":
            g.diagonal().mul_(2)  # the diagonal view of `g` itself: diagonal_scatter
        return g

    value, reference, recording = record_and_replay(run)
    assert not [leaf for leaf in recording.leaves if leaf.kind == "stale"]
    expected = run(torch.float64)
    assert torch.allclose(reference, expected, rtol=RTOL, atol=0)
    # The cancelling difference keeps few float32 digits: the reference is not the arm's value.
    assert not torch.equal(reference, value.double())


@pytest.mark.slow
def test_fixture_reference_equals_the_float64_run(triage):
    script = FIXTURES / "training_loop_reference.py"
    code, report, _, output = triage(script, "cpu", "--no-minimize", "--no-ablate", "--rounding-samples", "0")
    assert report is not None, output
    final = [o for o in report["observables"] if o["label"] == ".item()" and o["line"] == 39]
    assert len(final) == 1, output
    reference = final[0]["reference"]["fingerprint"]["sample"][0]
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True,
                         env=dict(os.environ, TRAINING_LOOP_DTYPE="float64"))
    float64 = float(run.stdout.split("final loss:")[1])
    assert math.isclose(reference, float64, rel_tol=RTOL)


@pytest.mark.slow
def test_two_trainings_with_an_unseeded_shuffle_name_the_shuffle(triage):
    """The loader's permutation reaches the data only as Python indices, so it is no leaf
    of the weights; the two sides' float64 values differ, and the shuffle is named."""
    _, report, _, out = triage(FIXTURES / "shuffled_loader_twice.py", "cpu", "--no-minimize")
    assert report is not None, out
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nondeterministic", True), v["summary"]
    assert "aten.randperm" in v["summary"] and "DataLoader" in v["summary"]


def test_a_value_reading_torch_empty_is_found_even_where_its_bytes_were_nan():
    """`acc = torch.empty(16); acc += x`: the replay with the empty leaf NaN-filled told a read
    by a NaN its reference did not have. Where the allocator's reused block held NaN bytes
    already (it did in one suite run), the reference was NaN too, and the read went unseen.
    A zero-filled replay is the baseline now."""
    from triage.worker.session import _mark_uninitialized_reads

    rec = OpRecorder(torch.device("cpu"), site=lambda: None)
    x = torch.randn(16, generator=torch.Generator().manual_seed(0))
    with rec:
        acc = torch.empty(16)
        acc += x
        total = acc.sum()
        buf = torch.empty(16)
        buf[:] = x * 2
        other = buf.sum()
    recording = rec.finish()
    for leaf in recording.leaves:
        if leaf.kind == "uninitialized":
            leaf.value.fill_(math.nan)  # the bytes this run's allocator happened to hand out
    leaves = {leaf.node.name: leaf.index for leaf in recording.leaves}
    records = []
    for t in (total, other):
        node = rec.lookup(t)
        ancestors = [leaves[n.name] for n in cone(recording.graph, [node]) if n.name in leaves]
        records.append({"node": node.name, "ancestors": ancestors})
    _mark_uninitialized_reads(recording, records, 60)
    assert [r["uninitialized"] for r in records] == [True, False]


@pytest.mark.parametrize("layout", ["time-major", "batch-first-bidirectional"])
def test_an_lstm_on_onednn_replays_in_float64_as_the_lstm_it_is(layout):
    """nn.LSTM on the CPU is `aten.mkldnn_rnn_layer`, a oneDNN kernel with no float64: its
    float64 reference was the arm's own float32 value, and its rounding was not simulated (a
    500-step LSTM unjudged). It replays as the LSTM it computes; the same module in float64
    (which ATen runs without oneDNN) gives the same value."""
    batch_first = layout != "time-major"

    def run(dtype):
        torch.manual_seed(0)
        lstm = nn.LSTM(5, 4, num_layers=2, batch_first=batch_first, bidirectional=batch_first).to(dtype)
        x = torch.randn(3, 7, 5).to(dtype)
        with torch.no_grad():
            out, (h, c) = lstm(x)
        return out.sum(-1) + h.sum() + c.sum()

    value, reference, recording = record_and_replay(run)
    assert any("mkldnn_rnn_layer" in str(n.target) for n in recording.graph.nodes)
    expected = run(torch.float64)
    assert torch.allclose(reference, expected, rtol=RTOL, atol=0)
    assert not torch.allclose(value.double(), expected, rtol=RTOL, atol=0)
