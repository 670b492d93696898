"""The one change to a side's recorded ops that makes two compared values one function in
float64 (triage/worker/counterfactual.py): recorded in-process, each script with one slip."""
import math
import time

import pytest
import torch
import torch.nn.functional as F

from triage.worker.counterfactual import one_change
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64


def changed(ours, ref, *inputs):
    """Record `ours(*inputs)` and `ref(*inputs)` and search: the change found, or None."""
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        a, b = ours(*inputs), ref(*inputs)
    recording = recorder.finish()
    na, nb = recorder.lookup(a).name, recorder.lookup(b).name
    values = replay_fp64(recording.graph, {na, nb}, 60).values
    found = one_change(recording.graph, na, nb, values, time.monotonic() + 10)
    if found is not None:
        assert found.pop("side") == na  # every slip below is on `ours`
    return found


torch.manual_seed(0)
X = torch.randn(5, 5) + 2  # square: a reduction over the wrong axis keeps the shape
PAD = torch.tensor([[False, False, True, True, False]] * 5)  # keys 2 and 3 are padding


@pytest.mark.parametrize("ours, ref, change", [
    # a wrong axis
    (lambda x: x.abs().pow(3).sum(0).pow(1 / 3), lambda x: torch.linalg.vector_norm(x, 3, dim=-1),
     {"op": "aten.sum", "kind": "argument", "argument": "dim", "was": [0], "to": [-1]}),
    # a constant written to five digits: 1/√2
    (lambda x: 0.5 * x * (1 + torch.erf(x * 0.70711)), F.gelu,
     {"op": "aten.mul", "kind": "constant", "argument": "other", "was": 0.70711, "to": 2 ** -0.5, "named": "1/√2"}),
    # a Gaussian log-density's ln √(2π) written as 0.9189
    (lambda x: -0.5 * x * x - 0.9189, lambda x: torch.distributions.Normal(0.0, 1.0).log_prob(x),
     {"op": "aten.sub", "kind": "constant", "was": 0.9189, "named": "ln √(2π)"}),
    # an eps the other side does not add
    (lambda x: ((x[:, None] - x[None]) ** 2).sum(-1).add(1e-4).sqrt(), lambda x: torch.cdist(x, x),
     {"op": "aten.add", "kind": "without", "argument": "other", "was": 1e-4, "to": 0.0}),
    # an eps added after the square root where the layer adds it under the root, and back
    (lambda x: (x - x.mean(0)) / (x.var(0, unbiased=False).sqrt() + 1e-5),
     lambda x: F.batch_norm(x, None, None, training=True, eps=1e-5),
     {"op": "aten.add", "kind": "moved", "argument": "before", "was": 1e-5, "around": "aten.sqrt"}),
    # ... or after the quotient by the root: (x - m) / sqrt(v) + eps
    (lambda x: (x - x.mean(0)) / x.var(0, unbiased=False).sqrt() + 1e-5,
     lambda x: F.batch_norm(x, None, None, training=True, eps=1e-5),
     {"op": "aten.add", "kind": "moved", "argument": "before", "was": 1e-5, "around": "aten.sqrt"}),
    (lambda x: (x.pow(2).sum(1) + 1e-3).sqrt(), lambda x: x.pow(2).sum(1).sqrt() + 1e-3,
     {"op": "aten.add", "kind": "moved", "argument": "after", "was": 1e-3, "around": "aten.sqrt"}),
    # the unbiased deviation by default (`x.std()` passes no correction) where the layer is biased
    (lambda x: (x - x.mean(0)) / x.std(0), lambda x: F.batch_norm(x, None, None, training=True, eps=1e-30),
     {"op": "aten.std", "kind": "argument", "argument": "correction", "was": 1, "to": 0}),
    # the unbiased variance where a normalization layer takes the biased one
    (lambda x: (x - x.mean(0)) / (x.var(0) + 1e-5).sqrt(),
     lambda x: F.batch_norm(x, None, None, training=True, eps=1e-5),
     {"op": "aten.var", "kind": "argument", "argument": "correction", "was": 1, "to": 0}),
    # fused attention against a hand-written one that forgot 1/√d (a twenty-fourth new user's c10)
    (lambda x: F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None]),
     lambda x: torch.softmax(x[None, None] @ x[None, None].transpose(-2, -1), -1) @ x[None, None],
     {"kind": "argument", "argument": "scale", "was": "1/√d", "to": 1.0}),
    # a padding mask (True: drop) passed as SDPA's boolean `attn_mask` (True: take part), c09
    (lambda x: F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None], attn_mask=PAD),
     lambda x: torch.softmax((x[None, None] @ x[None, None].transpose(-2, -1) / 5 ** 0.5).masked_fill(PAD, -math.inf),
                             -1) @ x[None, None],
     {"op": "aten.where", "kind": "negated", "argument": "condition"}),
])
def test_a_single_slip_is_found(ours, ref, change):
    found = changed(ours, ref, X)
    assert found is not None
    assert {k: found[k] for k in change} == pytest.approx(change), found


def test_dims_several_reductions_share_are_changed_in_all_of_them():
    """A hand-written instance norm whose mean and variance both reduce over (1, 2), channels and
    rows, where `F.instance_norm` reduces over (2, 3): one slip, written twice."""
    torch.manual_seed(0)
    x = 2.0 * torch.randn(2, 4, 5, 5) + torch.arange(4.0)[None, :, None, None]

    def mine(t):
        mean = t.mean(dim=(1, 2), keepdim=True)
        var = t.var(dim=(1, 2), keepdim=True, unbiased=False)
        return (t - mean) / torch.sqrt(var + 1e-5)

    found = changed(mine, lambda t: F.instance_norm(t, eps=1e-5), x)
    assert (found["op"], found["argument"], found["was"], found["to"]) == ("aten.mean", "dim", [1, 2], [2, 3]), found
    assert [o["op"] for o in found["also"]] == ["aten.var"]


def test_a_side_through_a_kernel_with_no_float64_version_is_not_searched():
    """A side that reaches a kernel the reference runs at its recorded precision (oneDNN's RNN
    layer): a change that moves a shape upstream reaches that kernel unchecked (it corrupted the
    heap of a bidirectional LSTM's worker), so that side is left alone."""
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        a, b = X.abs().pow(3).sum(0).pow(1 / 3), torch.linalg.vector_norm(X, 3, dim=-1)
    recording = recorder.finish()
    na, nb = recorder.lookup(a).name, recorder.lookup(b).name
    values = replay_fp64(recording.graph, {na, nb}, 60).values
    assert one_change(recording.graph, na, nb, values, time.monotonic() + 10) is not None
    # One side through such a kernel: only the other side is searched (here its dim is a slip too).
    native = frozenset(n.name for n in recording.graph.nodes if n.op == "call_function" and "pow" in str(n.target))
    assert one_change(recording.graph, na, nb, values, time.monotonic() + 10, native)["side"] == nb
    native = frozenset(n.name for n in recording.graph.nodes if n.op == "call_function")
    assert one_change(recording.graph, na, nb, values, time.monotonic() + 10, native) is None


def test_sides_drawn_from_different_random_numbers_are_not_searched(monkeypatch):
    """Two sides computed from their own draws differ by the draws: no change to a formula
    makes them one, and the search (up to its budget of replays) is not run."""
    import triage.worker.counterfactual as counterfactual

    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        a, b = torch.randn(5) * 0.70711, torch.randn(5) * 2 ** -0.5
    recording = recorder.finish()
    na, nb = recorder.lookup(a).name, recorder.lookup(b).name
    values = replay_fp64(recording.graph, {na, nb}, 60).values
    replays = []
    monkeypatch.setattr(counterfactual, "replay_fp64", lambda *args: replays.append(args))
    assert one_change(recording.graph, na, nb, values, time.monotonic() + 10) is None
    assert replays == []


def test_nothing_is_said_where_no_single_change_makes_them_one_function():
    # Two different functions, and one formula computed twice (equal in float64): no change.
    assert changed(lambda x: torch.sin(x) * 2.0, torch.cos, X) is None
    assert changed(lambda x: (x * 3.0).sum(1), lambda x: x.sum(1) * 3.0, X) is None


W = torch.randn(5, 5)
B = torch.randn(5)


def _binned_mean(x, bins, off_by_one):
    """A hand-written adaptive average pool over the last axis: bin i spans
    [floor(i·L/bins), ceil((i+1)·L/bins)); `off_by_one` ends each bin one late (the last one's
    end past the axis, where slicing stops anyway)."""
    length = x.shape[-1]
    out = []
    for i in range(bins):
        start = (i * length) // bins
        end = -((-(i + 1) * length) // bins) + off_by_one
        out.append(x[..., start:end].mean(-1))
    return torch.stack(out, -1)


@pytest.mark.parametrize("ours, ref, change", [
    # a sign inside a formula: x·y added where the formula subtracts it
    (lambda x: x * x + x * 2.0, lambda x: x * x - x * 2.0,
     {"op": "aten.add", "kind": "sign", "was": "add", "to": "sub", "operand": {"op": "aten.mul", "line": None}}),
    # a term the other side does not have
    (lambda x: x.exp() + x.sin(), lambda x: x.exp(),
     {"op": "aten.add", "kind": "dropped", "argument": "other", "operand": {"op": "aten.sin", "line": None}}),
    # `x @ W` where `F.linear` computes `x @ W.T`
    (lambda x: x @ W + B, lambda x: F.linear(x, W, B),
     {"op": "aten.mm", "kind": "transposed", "argument": "mat2", "was": False, "to": True}),
    # a causal mask one diagonal off
    (lambda x: x.tril(-1).sum(1), lambda x: x.tril().sum(1),
     {"op": "aten.tril", "kind": "argument", "argument": "diagonal", "was": -1, "to": 0}),
    # the other triangle masked: `tril(-1)` where a causal mask is `triu(1)`, a fully masked row NaN
    (lambda x: x.masked_fill(torch.ones(5, 5, dtype=torch.bool).tril(-1), float("-inf")).softmax(-1),
     lambda x: x.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf")).softmax(-1),
     {"op": "aten.tril", "kind": "triangle", "argument": "diagonal", "was": -1, "to": 1}),
    # a causal mask that blocks the diagonal too: `triu()` (its default diagonal 0) for `triu(1)`
    (lambda x: x.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(), 0.0).sum(1),
     lambda x: x.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), 0.0).sum(1),
     {"op": "aten.triu", "kind": "argument", "argument": "diagonal", "was": 0, "to": 1}),
    # a Huber loss's linear branch without its ½: `d - delta` for `d - 0.5 * delta`
    (lambda x: torch.where(x.abs() < 1, 0.5 * x * x, 1.0 * (x.abs() - 1.0)),
     lambda x: F.huber_loss(x, torch.zeros_like(x), reduction="none", delta=1.0),
     {"op": "aten.sub", "kind": "argument", "argument": "other", "was": 1.0, "to": 0.5}),
    # a mean square over n - 1 where an RMS norm divides by n
    (lambda x: x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / 4 + 1e-6),
     lambda x: F.rms_norm(x, (5,), eps=1e-6),
     {"op": "aten.div", "kind": "argument", "argument": "other", "was": 4, "to": 5}),
    # attention scores scaled by 1/d where they are scaled by 1/√d
    (lambda x: (x @ x.T / 16.0).softmax(-1), lambda x: (x @ x.T / 4.0).softmax(-1),
     {"op": "aten.div", "kind": "argument", "argument": "other", "was": 16.0, "to": 4.0}),
    # a flag left at its default: scatter_reduce's include_self
    (lambda x: torch.zeros(5).scatter_reduce(0, torch.tensor([0, 1, 1, 2, 4]), x[0], "amax"),
     lambda x: torch.zeros(5).scatter_reduce(0, torch.tensor([0, 1, 1, 2, 4]), x[0], "amax", include_self=False),
     {"kind": "argument", "argument": "include_self", "was": True, "to": False}),
    # a dequantization adding its zero point where it subtracts it (a thirty-first new user's)
    (lambda x: (torch.round(x / 0.05) + 7 + 7) * 0.05, lambda x: (torch.round(x / 0.05) + 7 - 7) * 0.05,
     {"kind": "opposite", "argument": "other", "was": 7, "to": -7}),
    # int8's range written as [-128, 128]
    (lambda x: torch.clamp(torch.round(x / 0.01), -128, 128) * 0.01,
     lambda x: torch.fake_quantize_per_tensor_affine(x, 0.01, 0, -128, 127),
     {"op": "aten.clamp", "kind": "argument", "argument": "max", "was": 128, "to": 127}),
])
def test_a_slip_in_the_formula_is_found(ours, ref, change):
    found = changed(ours, ref, X - 2.5)
    assert found is not None
    assert {k: found[k] for k in change} == change, found


def test_bounds_one_off_in_every_slice_are_found_together():
    x = torch.randn(3, 56)
    found = changed(lambda t: _binned_mean(t, 7, True), lambda t: F.adaptive_avg_pool1d(t, 7), x)
    assert found is not None
    assert (found["op"], found["kind"], found["argument"], found["to"] - found["was"]) == ("aten.slice", "shifted", "end", -1)
    assert found["places"] == 7 and len(found["also"]) == 6, found


def test_a_sign_in_a_hand_written_complex_product_is_found():
    """`(ar·br + ai·bi) + i(ar·bi + ai·br)` against complex64 `a * b`: complex values compared
    by their moduli' gap."""
    torch.manual_seed(1)
    a, b = torch.randn(6, dtype=torch.complex64), torch.randn(6, dtype=torch.complex64)

    def mine(a, b):
        return torch.complex(a.real * b.real + a.imag * b.imag, a.real * b.imag + a.imag * b.real)

    found = changed(mine, lambda a, b: a * b, a, b)
    assert found is not None and (found["kind"], found["op"], found["was"]) == ("sign", "aten.add", "add"), found


def test_a_change_undoing_an_in_place_write_both_sides_read_names_that_write():
    """A helper divides its argument in place (`logits /= t`); the inline version then reads the
    divided logits and divides again. Dropping the inline division makes them agree, but the
    in-place write is what the reporter did not mean."""
    def helper(logits):
        logits /= 2.0
        return torch.softmax(logits, -1)

    x = X.clone()
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        a = helper(x)
        b = torch.softmax(x / 2.0, -1)
    recording = recorder.finish()
    na, nb = recorder.lookup(a).name, recorder.lookup(b).name
    values = replay_fp64(recording.graph, {na, nb}, 60).values
    found = one_change(recording.graph, na, nb, values, time.monotonic() + 10)
    assert found is not None and (found["kind"], found["op"]) == ("without", "aten.div"), found
    assert found["written"]["op"] == "aten.div_"
    # A step whose input no in-place op wrote names no write.
    assert changed(lambda t: (t * 2.0).exp(), torch.exp, X)["written"] is None


def test_a_slip_is_found_where_the_sides_read_float32_inputs_differently():
    """A trapezoid rule written with h = 0.01 and `y[-2]` for `y[-1]`, against
    `torch.trapezoid(y, x)` over a float32 `linspace`: corrected, the two still differ by the
    float32 rounding of x's spacing (1e-9), far below the slip's 5e-5, and are one function."""
    x = torch.linspace(0.0, 1.0, 101)

    def mine(x):
        y = torch.exp(-x * x)
        return 0.01 * (y.sum() - 0.5 * y[0] - 0.5 * y[-2])

    found = changed(mine, lambda x: torch.trapezoid(torch.exp(-x * x), x), x)
    assert found is not None and (found["kind"], found["op"], found["was"], found["to"]) == \
        ("shifted", "aten.select", -2, -1), found
    assert 0 < found["residual"] < 1e-8
    # The same slip read from float64 inputs leaves float64's noise only.
    x64 = torch.linspace(0.0, 1.0, 101, dtype=torch.float64)
    assert changed(mine, lambda x: torch.trapezoid(torch.exp(-x * x), x), x64)["residual"] is None


def test_a_forgotten_conjugate_and_an_untransposed_solve_are_found():
    torch.manual_seed(3)
    z = torch.randn(8, dtype=torch.complex128)
    found = changed(lambda z: (z * z).real.sum(), lambda z: (z * z.conj()).real.sum(), z)
    assert found is not None and (found["kind"], found["op"]) == ("conjugated", "aten.mul"), found
    L = torch.randn(4, 4, dtype=torch.float64).tril() + 4 * torch.eye(4, dtype=torch.float64)
    b = torch.randn(4, 1, dtype=torch.float64)
    found = changed(lambda L, b: torch.linalg.solve_triangular(L, b, upper=True),
                    lambda L, b: torch.linalg.solve_triangular(L.T, b, upper=True), L, b)
    assert found is not None and (found["kind"], found["argument"]) == ("transposed", "self"), found


def test_one_dim_that_two_reductions_share_is_changed_in_both():
    """An instance norm over the channels (dim 1) where `F.instance_norm` normalizes over the
    length (dim 2): the mean and the variance both slipped."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 50) * 2 + 1

    def mine(t):
        return (t - t.mean(dim=1, keepdim=True)) / torch.sqrt(t.var(dim=1, keepdim=True, unbiased=False) + 1e-5)

    found = changed(mine, lambda t: F.instance_norm(t, eps=1e-5), x)
    assert found is not None and (found["argument"], found["was"], found["to"], found["places"]) == ("dim", [1], [2], 2)


def test_flags_a_kernel_does_not_check_are_never_tried():
    """`instance_norm`'s use_input_stats=False with no running statistics reached a native
    kernel that does not check them, and the worker died of SIGSEGV mid-search."""
    from triage.worker.counterfactual import _candidates

    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        F.instance_norm(torch.randn(2, 3, 8), eps=1e-5)
    nodes = [n for n in recorder.finish().graph.nodes if n.op == "call_function"
             and isinstance(n.target, torch._ops.OpOverload)]
    tried = {c["argument"] for _, c in _candidates(nodes)}
    assert not tried & {"use_input_stats", "cudnn_enabled", "training"}, tried


def test_the_search_runs_in_a_child_whose_crash_costs_only_its_answer():
    """A replay with arguments the script never gave may crash a native kernel: the search runs
    in a forked child, and a child that dies, overruns or raises answers None."""
    import os
    import signal

    from triage.worker.session import _in_a_child

    assert _in_a_child(lambda: {"1": {"kind": "sign"}}, 10) == {"1": {"kind": "sign"}}
    assert _in_a_child(lambda: os.kill(os.getpid(), signal.SIGSEGV), 10) is None
    assert _in_a_child(lambda: time.sleep(30), 0.5) is None
    assert _in_a_child(lambda: 1 / 0, 10) is None


def test_a_value_computed_outside_torch_is_matched_by_changing_torchs_side_only():
    """A check of torch's value against NumPy's (nu22's c13: `M.mean(dim=0)` against
    `np.mean(..., axis=1)`): the other side has no ops, so only torch's are changed, to give
    the outside value in float64. Its random input is the one both sides read, not a draw of
    one side's own."""
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        m = torch.rand(16, 16, generator=torch.Generator().manual_seed(3))
        t = m.mean(dim=0)
    recording = recorder.finish()
    node = recorder.lookup(t).name
    values = replay_fp64(recording.graph, {node}, 60).values
    outside = torch.from_numpy(m.double().numpy().mean(axis=1))
    found = one_change(recording.graph, node, "chk:n", dict(values, **{"chk:n": outside}), time.monotonic() + 10)
    assert found is not None and found.pop("side") == node
    assert {k: found[k] for k in ("op", "kind", "argument", "was", "to")} == \
        {"op": "aten.mean", "kind": "argument", "argument": "dim", "was": [0], "to": [-1]}
    # The value torch computes itself: no change to find.
    same = torch.from_numpy(m.double().numpy().mean(axis=0))
    assert one_change(recording.graph, node, "chk:n", dict(values, **{"chk:n": same}), time.monotonic() + 10) is None


def test_a_slip_between_two_integer_values_is_found():
    """`torch.bucketize(ages, edges)` against `(ages[:, None] >= edges).sum(1)`, ages on the
    edges (a thirty-first new user's): two integer values were never searched; `right=True`."""
    ages = torch.tensor([18.0, 30.0, 45.0, 65.0, 29.0, 31.0, 70.0])
    edges = torch.tensor([18.0, 30.0, 45.0, 65.0])
    found = changed(lambda a: torch.bucketize(a, edges), lambda a: (a[:, None] >= edges).sum(1), ages)
    assert found is not None and {k: found[k] for k in ("op", "argument", "was", "to")} == {
        "op": "aten.bucketize", "argument": "right", "was": False, "to": True}, found


def _line_in_this_file() -> int | None:
    """The recorder's site: the line of this file the op was called from."""
    import sys
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != __file__:
        frame = frame.f_back
    return frame.f_lineno if frame is not None else None


def changed_by_line(ours, ref, *inputs):
    recorder = OpRecorder(torch.device("cpu"), site=_line_in_this_file)
    with recorder:
        a, b = ours(*inputs), ref(*inputs)
    recording = recorder.finish()
    na, nb = recorder.lookup(a).name, recorder.lookup(b).name
    values = replay_fp64(recording.graph, {na, nb}, 60).values
    return one_change(recording.graph, na, nb, values, time.monotonic() + 10)


def test_a_gate_on_the_wrong_term_in_every_step_of_a_loop_is_found():
    """A hand-written GRU cell's update `z * n + (1 - z) * h` where GRUCell computes
    `(1 - z) * n + z * h`, in each of a loop's steps: which term each factor takes, exchanged
    on that line in every step, makes the two one function (it was "computes something else")."""
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(4, 6)
    xs = torch.randn(5, 3, 4)

    def mine(xs):
        h = torch.zeros(3, 6)
        for x in xs:
            r, z, n = (x @ cell.weight_ih.t() + cell.bias_ih).chunk(3, 1)
            hr, hz, hn = (h @ cell.weight_hh.t() + cell.bias_hh).chunk(3, 1)
            r, z = torch.sigmoid(r + hr), torch.sigmoid(z + hz)
            n = torch.tanh(n + r * hn)
            h = z * n + (1 - z) * h
        return h

    def builtin(xs):
        h = torch.zeros(3, 6)
        for x in xs:
            h = cell(x, h)
        return h

    with torch.no_grad():
        found = changed_by_line(mine, builtin, xs)
    assert found is not None and found["kind"] == "exchanged" and found["op"] == "aten.mul"
    assert found["places"] == 10  # two products in each of five steps


def test_a_quotient_upside_down_is_found():
    x, y = torch.rand(8) + 1, torch.rand(8) + 2
    found = changed_by_line(lambda x, y: y / x, lambda x, y: torch.div(x, y), x, y)
    assert found is not None and found["kind"] == "swapped" and found["op"] == "aten.div"


def test_a_constant_wrong_in_every_step_of_a_loop_is_found_once_for_all_steps():
    """1/√2 written 0.70711 in each of a loop's twelve steps: changed in one step alone, the
    sides still differ; changed in every repeat of the line at once, they agree (the twelve
    single changes were tried one by one and none agreed)."""
    xs = torch.rand(12, 4) + 0.5

    def mine(xs):
        acc = torch.zeros(4)
        for x in xs:
            acc = acc + torch.erf(x * 0.70711)
        return acc

    def ref(xs):
        return torch.erf(xs * 2 ** -0.5).sum(0)

    found = changed_by_line(mine, ref, xs)
    assert found is not None and (found["kind"], found["named"], found["places"]) == ("constant", "1/√2", 12), found


def test_a_sign_wrong_in_every_step_of_a_loop_is_found_once_for_all_steps():
    """A difference where a sum is meant, in each of a loop's steps: the rewrite (`sub` for
    `add`) made to every repeat of the line at once."""
    xs, ys = torch.rand(10, 4), torch.rand(10, 4)

    def mine(xs, ys):
        acc = torch.zeros(4)
        for x, y in zip(xs, ys, strict=True):
            acc = acc + torch.exp(x - y)
        return acc

    found = changed_by_line(mine, lambda xs, ys: torch.exp(xs + ys).sum(0), xs, ys)
    assert found is not None and (found["kind"], found["places"]) == ("sign", 10), found


def test_two_inputs_used_in_each_others_roles_are_found():
    """ImageNet's mean and std folded into a 1×1 convolution with their roles exchanged over
    two lines (`1 / MEAN`, `-STD / MEAN`): the two inputs exchanged wherever that side reads
    them make it the reference normalization."""
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    img = torch.rand(2, 3, 8, 8)

    def folded(img, mean, std):
        scale = 1.0 / mean
        bias = -std / mean
        return F.conv2d(img, scale.view(3, 1, 1, 1), bias, groups=3)

    def reference(img, mean, std):
        return (img - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)

    found = changed_by_line(folded, reference, img, mean, std)
    assert found is not None and found["kind"] == "inputs", found
