"""Replays stacked along a new first dimension (triage/worker/rounding.py, `RoundingMode.samples`):
the K random replays of small values run as one (the two directed replays with the first), values no
replay changes are taken from the centre replay, and ops whose rounding is not elementwise run
once per sample. Each test compares against the same simulation with stacking switched off."""
import gc
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import recorded

import triage.worker.rounding as rounding
from triage.worker.opclasses import UNIT_ROUNDOFF
from triage.worker.reference import cone
from triage.worker.rounding import SimulationOptions, simulate_rounding

# The module's own, read once: the tests below set it to -1 (the torch paths) and back.
NUMPY_ELEMENTS = rounding.NUMPY_ELEMENTS


def simulate(recording, stacked, samples=29):
    graph, wanted, dtypes, _ = recording
    limit = rounding.STACKED_VALUE_ELEMENTS if stacked else -1
    previous, rounding.STACKED_VALUE_ELEMENTS = rounding.STACKED_VALUE_ELEMENTS, limit
    try:
        options = SimulationOptions(samples=samples, budget_s=600.0)  # K set by the test, not by the time budget
        sim = simulate_rounding(graph, wanted, options, dtypes)
    finally:
        rounding.STACKED_VALUE_ELEMENTS = previous
    (spread,) = sim.spreads.values()
    assert spread.status == "judged", spread.reason
    return sim, spread


def mlp(x, w1, w2):
    h = F.layer_norm(torch.tanh(x @ w1), (w1.shape[1],))  # layer norm replays its decomposition
    return F.softmax(h @ w2, dim=-1).sum(0)


@pytest.fixture(scope="module")
def mlp_recording():
    torch.manual_seed(0)
    return recorded(mlp, torch.randn(32, 16), torch.randn(16, 24) / 4, torch.randn(24, 8) / 4)


def test_stacked_samples_have_the_spread_of_sequential_ones(mlp_recording):
    # Same distribution, other random draws: σ per element estimated from 99 samples each is
    # within a few percent (its relative standard error is 1/√(2·99) ≈ 7 % per element, less
    # averaged over the 8 elements).
    _, stacked = simulate(mlp_recording, stacked=True, samples=99)
    _, sequential = simulate(mlp_recording, stacked=False, samples=99)
    assert stacked.samples == sequential.samples == 99
    ratio = float(stacked.sigma.mean() / sequential.sigma.mean())
    assert 0.85 < ratio < 1.18, ratio
    assert bool((stacked.sigma > 0).all())


def test_stacked_directed_replays_are_the_sequential_ones_exactly(mlp_recording):
    _, stacked = simulate(mlp_recording, stacked=True)
    _, sequential = simulate(mlp_recording, stacked=False)
    assert torch.equal(stacked.up, sequential.up) and torch.equal(stacked.down, sequential.down)
    assert bool((stacked.up > stacked.down).any())


@pytest.mark.parametrize("case", ["pairwise-sum", "fp16-cast", "scalar-loop", "fp16-softmax"])
def test_directed_rounding_of_reductions_casts_and_scalars_is_unchanged_by_stacking(case):
    torch.manual_seed(1)
    if case == "pairwise-sum":  # the directed pairwise walk of a mean, per sample
        recording = recorded(lambda x: (x * 3).mean(0), torch.randn(3000, 4))
    elif case == "fp16-cast":
        recording = recorded(lambda x: (x.half() * 1.1).float().exp().sum(), torch.randn(64))
    elif case == "fp16-softmax":  # decomposed at float32 opmath: its inputs retagged, still stacked
        recording = recorded(lambda x: torch.softmax(x, dim=1), (torch.rand(6, 2, 5) * 8).half())
    else:
        def loop(t):
            total = torch.tensor(2.0 ** 24)
            for _ in range(40):
                total = total + t
            return total

        recording = recorded(loop, torch.tensor(1.0))
    _, stacked = simulate(recording, stacked=True)
    _, sequential = simulate(recording, stacked=False)
    assert torch.equal(stacked.up, sequential.up) and torch.equal(stacked.down, sequential.down)


def test_ops_without_elementwise_rounding_run_once_per_sample(monkeypatch):
    # linalg's perturbed inputs are drawn per sample: the stack runs solve sample by sample.
    torch.manual_seed(2)
    a = torch.randn(6, 6) + 6 * torch.eye(6)
    recording = recorded(lambda m, v: torch.tanh(torch.linalg.solve(m, v)), a, torch.randn(6))
    ran = []
    original = rounding.RoundingMode.each_sample

    def each_sample(self, fn, args, kwargs):
        if self.samples:
            ran.append(self.samples)
        return original(self, fn, args, kwargs)

    monkeypatch.setattr(rounding.RoundingMode, "each_sample", each_sample)
    _, stacked = simulate(recording, stacked=True, samples=59)
    assert ran == [2 + 9, 10, 40]  # up, down and 9 samples; then the samples up to 19 and to 59
    monkeypatch.setattr(rounding.RoundingMode, "each_sample", original)
    _, sequential = simulate(recording, stacked=False, samples=59)
    assert torch.equal(stacked.up, sequential.up) and torch.equal(stacked.down, sequential.down)
    ratio = float(stacked.sigma.mean() / sequential.sigma.mean())
    assert 0.75 < ratio < 1.33, ratio


def test_decompositions_replay_their_trace_after_the_centre_replay(monkeypatch, mlp_recording):
    replayed = []
    original = rounding._DecompositionTrace.replay

    def replay(self, mode, args, kwargs):
        replayed.append((mode.samples, mode.generator is None and not mode.directed))
        return original(self, mode, args, kwargs)

    monkeypatch.setattr(rounding._DecompositionTrace, "replay", replay)
    simulate(mlp_recording, stacked=True)
    simulate(mlp_recording, stacked=False)
    assert any(samples for samples, _ in replayed)  # the stack
    assert any(not samples and not centre for samples, centre in replayed)  # one replay at a time


def layer_norms(x, y):
    return (F.layer_norm(x, (8,)) * F.layer_norm(y, (8,))).sum()


@pytest.mark.parametrize("stacked", [True, False])
def test_a_call_like_an_earlier_one_replays_its_trace_with_the_same_result(monkeypatch, stacked):
    # Two layer norms of same-shaped values: the centre replay runs the decomposition's code
    # once and replays its ops for the second; the spread is the one of running it twice.
    torch.manual_seed(1)
    recording = recorded(layer_norms, torch.randn(4, 8), torch.randn(4, 8) * 3)
    ran = []
    decompositions = dict(rounding.decomposition_table)
    layer_norm = torch.ops.aten.native_layer_norm.default

    def counted(*args, **kwargs):
        ran.append(1)
        return decompositions[layer_norm](*args, **kwargs)

    monkeypatch.setitem(rounding.decomposition_table, layer_norm, counted)
    _, shared = simulate(recording, stacked=stacked)
    assert len(ran) == 1
    monkeypatch.setattr(rounding, "_signature", lambda *a: None)
    _, separate = simulate(recording, stacked=stacked)
    assert len(ran) == 3  # the centre replay ran it for each call
    assert torch.equal(shared.up, separate.up) and torch.equal(shared.down, separate.down)


def test_an_alias_is_its_inputs_value_in_every_replay():
    torch.manual_seed(2)
    recording = recorded(lambda x: (torch.tanh(x).detach() * x).sum(), torch.randn(6))
    order = cone(recording[0], [n for n in recording[0].nodes if n.name in recording[1]])
    same_as = rounding._ReplayPlan.of(order).same_as
    (alias,) = [n for n in order if n.target is torch.ops.aten.detach.default]
    assert same_as[alias].target is torch.ops.aten.tanh.default
    _, stacked = simulate(recording, stacked=True)
    _, sequential = simulate(recording, stacked=False)
    assert torch.equal(stacked.up, sequential.up) and bool((stacked.up > stacked.down).all())


def test_a_decomposition_that_reads_a_value_is_not_traced():
    step = (torch.ops.aten._local_scalar_dense.default, (torch.ones(()),), {}, [1.0])
    assert rounding._DecompositionTrace.of((torch.ones(()),), {}, [step], torch.ones(())) is None
    made_in_python = torch.ones(2)
    assert rounding._DecompositionTrace.of((torch.ones(2),), {}, [], made_in_python) is None


def test_a_decomposition_writing_into_views_of_a_fresh_tensor_keeps_its_writes():
    """`torch.polar`'s decomposition makes a complex tensor and writes its real and imaginary
    parts through `view_as_real` views: every replay keeps those writes (the float32 view of a
    complex64 value is exact, not a rounding that copies it), and a stack replays the trace one
    sample at a time, since stacked samples would write into copies or into one shared tensor."""
    r, t = torch.tensor([1.5, 3.0, 0.25]), torch.tensor([-2.25, 0.5, 7.0])
    graph, wanted, _, _ = recorded(lambda r, t: torch.polar(r, t) * 1.0, r, t)
    by_name = {n.name: n for n in graph.nodes}
    plan = rounding._ReplayPlan.of(cone(graph, [by_name[w] for w in wanted]))
    options, cache = SimulationOptions(), rounding._CallCache()
    centre = rounding._replay(plan, set(wanted), rounding.RoundingMode(options, cache, 0, None))
    directions = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    stacked = rounding._replay(plan, set(wanted), rounding.RoundingMode(
        options, cache, directions, rounding.Draws(0), samples=len(directions)))
    assert centre.failed is None and stacked.failed is None, stacked.failed
    (name,) = wanted
    exact = torch.polar(r.double(), t.double())
    assert torch.allclose(centre.values[name], exact, rtol=1e-6, atol=0)
    assert torch.allclose(stacked.values[name], exact.expand(len(directions), -1), rtol=1e-5, atol=0)


def test_a_stack_that_fails_is_replayed_one_sample_at_a_time(monkeypatch, mlp_recording):
    def refuse(outs):
        raise rounding.NotStackable("refused")

    monkeypatch.setattr(rounding, "_stack_samples", refuse)
    monkeypatch.setattr(rounding, "_vmapped", lambda *a: (False, None))
    sim, spread = simulate(mlp_recording, stacked=True)
    assert sim.samples == spread.samples == 29 and bool((spread.sigma > 0).all())


def test_views_of_leaves_are_kept_from_the_centre_replay_and_rounded_ops_are_not(monkeypatch):
    kept = []
    original = rounding._CallCache.keep

    def keep(self, n, value, calls, **kwargs):
        kept.append(n)
        return original(self, n, value, calls, **kwargs)

    monkeypatch.setattr(rounding._CallCache, "keep", keep)
    torch.manual_seed(3)
    recording = recorded(lambda x: torch.tanh(x[1:].t()).sum(), torch.randn(5, 4))
    simulate(recording, stacked=True)
    ops = {n.target.overloadpacket.__name__ for n in kept if n.op == "call_function"}
    assert {"slice", "t"} <= ops and not ops & {"tanh", "sum"}
    assert any(n.op == "placeholder" for n in kept)


def test_upstream_summary_is_each_cone(mlp_recording):
    graph = mlp_recording[0]
    order = list(graph.nodes)
    noted = {n.name for n in order[::3]}
    targets = {n for n in order if n.op == "call_function"}
    found = rounding._upstream(order, targets, noted)
    for t in targets:
        names = {n.name for n in cone(graph, [t])}
        assert found[t][1] == names & noted
        assert found[t][0] == {n.meta.get("dtype") for n in cone(graph, [t])} & set(UNIT_ROUNDOFF)


# -- cheaper passes over large values, checked against their definitions ----------------------
SPECIALS = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e308, -1e308, 5e-324, 1e-40, 1.0, 3e38])


def cancellation_by_definition(a, b, out):
    """max (|a|+|b|)/|a±b| over the elements where both are finite (inf where a±b = 0 < |a|+|b|)."""
    magnitude = torch.as_tensor(a.abs() + (b.abs() if isinstance(b, torch.Tensor) else abs(b)))
    result = out.abs()
    ok = torch.isfinite(result) & torch.isfinite(magnitude)
    ratios = [math.inf if r == 0 and m > 0 else m / r if r > 0 else 0.0
              for m, r, o in zip(magnitude.expand_as(result).flatten().tolist(), result.flatten().tolist(),
                                 ok.flatten().tolist(), strict=True) if o]
    return max(ratios, default=0.0)


def test_cancellation_ratio_is_its_definition_on_special_values():
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    g = torch.Generator().manual_seed(4)
    for op in (torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor):
        node = graph.call_function(op, (x, y))
        for trial in range(400):
            a = SPECIALS.double()[torch.randint(0, len(SPECIALS), (5,), generator=g)] \
                * torch.randn(5, generator=g, dtype=torch.float64)
            b = -a if trial % 3 == 0 else 2.5 if trial % 7 == 0 else \
                SPECIALS.double()[torch.randint(0, len(SPECIALS), (5,), generator=g)]
            out = op(a, b)
            expected = cancellation_by_definition(a, b, out)
            site = rounding.cancellation_at(node, (a, b), out)
            if expected <= 1e3:
                assert site is None
            else:
                lost = math.inf if math.isinf(expected) else round(math.log10(expected), 1)
                assert site is not None and site["digits_lost"] == lost


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rounding_on_the_bits_is_refused_exactly_outside_the_normal_range(dtype):
    bits, largest, tiny = rounding.FORMATS[dtype]
    g = torch.Generator().manual_seed(5)
    for _ in range(300):
        t = SPECIALS.double()[torch.randint(0, len(SPECIALS), (3,), generator=g)] * torch.rand(3, generator=g) * 2
        m = t.abs()
        normal = bool((((m >= tiny) & (m <= largest)) | (m == 0)).all())
        assert (rounding._round_bits(t, bits, largest, tiny, 1, None) is not None) == normal


@pytest.mark.parametrize("path", ["bits", "spacing"])
def test_a_direction_per_sample_rounds_each_sample_as_its_own_direction(path):
    x = torch.randn(2, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(6)) * 1e3
    x[:, 0] = 1e39 if path == "spacing" else 0.0  # past bfloat16's range: `_round_bits` refuses it
    both = rounding.round_to(x, torch.bfloat16, torch.tensor([[1.0], [-1.0]], dtype=torch.float64), None)
    for k, direction in enumerate((1, -1)):
        assert torch.equal(both[k], rounding._round_by_spacing(x[k], *rounding.FORMATS[torch.bfloat16], direction,
                                                               None))


def test_a_reduction_of_values_no_replay_changes_is_stacked_too(monkeypatch):
    # The mean of a leaf is the same in every replay, and each directed replay adds it its own
    # way: the stack expands it rather than failing over to one replay per sample.
    replays = []
    original = rounding._replay

    def replay(plan, wanted, mode, *args):
        result = original(plan, wanted, mode, *args)
        replays.append((mode.samples, result.failed))
        return result

    monkeypatch.setattr(rounding, "_replay", replay)
    torch.manual_seed(0)
    recording = recorded(lambda t: (t - t.mean()).sum(), torch.randn(5) * 1e3)
    _, stacked = simulate(recording, stacked=True)
    assert [samples for samples, _ in replays] == [0, 11, 10, 10] and not any(failed for _, failed in replays)
    monkeypatch.setattr(rounding, "_replay", original)
    _, sequential = simulate(recording, stacked=False)
    assert torch.equal(stacked.up, sequential.up) and torch.equal(stacked.down, sequential.down)


def test_the_simulation_runs_with_the_existing_objects_frozen_and_unfreezes_them(monkeypatch, mlp_recording):
    seen = []
    original = rounding._simulate

    def simulate_frozen(*args):
        seen.append(gc.get_freeze_count())
        return original(*args)

    monkeypatch.setattr(rounding, "_simulate", simulate_frozen)
    assert gc.get_freeze_count() == 0
    simulate(mlp_recording, stacked=True)
    assert seen[0] > 0 and gc.get_freeze_count() == 0



@pytest.mark.parametrize("times_largest, sampled", [(3.0, True), (5.0, True), (5.9, True), (6.5, False)])
def test_a_value_just_past_the_fragile_margin_is_sampled_further(times_largest, sampled):
    # 29 samples scattered ±1e-7 about the reference: each scores 1 against the others. A value
    # that many times that far out, with no directed envelope to fall in, asks for more samples
    # up to 1.5 × FRAGILE_MARGIN (the decision between a finding and a fragile one firms up
    # with them), and not beyond.
    ref = torch.tensor([1.0], dtype=torch.float64)
    samples = [rounding._Replayed(values={"v": ref + (1e-7 if k % 2 else -1e-7)}, discrete={}, nodes={})
               for k in range(29)]
    directed = {d: rounding._Replayed(values={"v": ref.clone()}, discrete={}, nodes={}) for d in (1, -1)}
    largest = max(rounding._spread(ref, [s.values["v"] for s in samples], ref, ref).sample_stats)
    value = ref + times_largest * largest * 1e-7
    got = rounding._near_floor({"v": ref}, samples, {"v": value}, {"v": torch.float64}, directed, {})
    assert got is sampled


@pytest.mark.parametrize("stacked", [True, False])
def test_an_in_place_op_is_ill_conditioned_where_its_out_of_place_form_is(stacked):
    # lerp of nearly opposite values cancels: the kernel's error there is relative to its
    # inputs. Found on the inputs before the op writes over the first of them, as for the
    # out-of-place lerp (found on its result, the first input looks well conditioned).
    g = torch.Generator().manual_seed(4)
    start = torch.randn(16, generator=g)
    end = -start * (1 + 1e-3 * torch.randn(16, generator=g))
    _, in_place = simulate(recorded(lambda s, e: s.clone().lerp_(e, 0.5) * 3, start, end), stacked=stacked)
    _, pure = simulate(recorded(lambda s, e: torch.lerp(s, e, 0.5) * 3, start, end), stacked=stacked)
    assert torch.equal(in_place.up, pure.up) and torch.equal(in_place.down, pure.down)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_small_values_round_on_the_bits_in_numpy_exactly_as_in_torch(monkeypatch, dtype):
    bits, largest, tiny = rounding.FORMATS[dtype]
    g = torch.Generator().manual_seed(8)
    stack = torch.tensor([1.0, -1.0] + [0.0] * 9, dtype=torch.float64).view(-1, 1)
    compared = 0
    for trial in range(60):
        t = torch.randn((11, 7) if trial % 2 else (5,), generator=g, dtype=torch.float64) * 10.0 ** (trial % 7 - 3)
        t[torch.rand(t.shape, generator=g) < 0.2] = 0.0
        if trial % 5 == 0:
            t.view(-1)[0] = SPECIALS.double()[trial % len(SPECIALS)]
        for direction in ([1, -1, 0, stack] if t.dim() == 2 else [1, -1, 0]):
            results = []
            for elements in (NUMPY_ELEMENTS, -1):  # NumPy, then torch
                monkeypatch.setattr(rounding, "NUMPY_ELEMENTS", elements)
                draws = rounding.Draws(trial)
                results.append(rounding._round_bits(t.clone(), bits, largest, tiny, direction, draws))
            numpy_result, torch_result = results
            assert (numpy_result is None) == (torch_result is None)
            if torch_result is not None:
                assert torch.equal(numpy_result, torch_result)
                compared += 1
    assert compared > 150


def _values(trial, g, shape):
    """Small float64 values over many magnitudes, with zeros and a special now and then."""
    t = torch.randn(shape, generator=g, dtype=torch.float64) * 10.0 ** (trial % 7 - 3)
    t[torch.rand(t.shape, generator=g) < 0.2] = 0.0
    if trial % 5 == 0:
        t.view(-1)[0] = SPECIALS.double()[trial % len(SPECIALS)]
    return t


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf: nan, on purpose (NumPy warns, torch does not)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_library_kernels_error_and_rounding_in_numpy_are_the_torch_paths_exactly(monkeypatch, dtype):
    # `RoundingMode._round` of a small value takes the kernel's error and the rounding in one
    # NumPy pass: the same draws and the same IEEE operations as `_relative_noise` then
    # `round_to` in torch, directed, sampled and as a stack of both.
    g = torch.Generator().manual_seed(9)
    stack = torch.tensor([1.0, -1.0] + [0.0] * 9, dtype=torch.float64)
    compared = 0
    for trial in range(40):
        t = _values(trial, g, (11, 6) if trial % 2 else (7,))
        for direction, sampled in ([(stack, True)] if t.dim() == 2 else []) + [(1, False), (-1, False), (0, True)]:
            for library in (0.0, 3.5):
                results = []
                for elements in (NUMPY_ELEMENTS, -1):  # NumPy, then torch
                    monkeypatch.setattr(rounding, "NUMPY_ELEMENTS", elements)
                    mode = rounding.RoundingMode(SimulationOptions(), rounding._CallCache(), direction=direction,
                                                 generator=rounding.Draws(trial) if sampled else None)
                    results.append(mode._round(t.clone(), dtype, library))
                assert torch.equal(results[0].nan_to_num(), results[1].nan_to_num()), (trial, direction, library)
                assert torch.equal(results[0].isnan(), results[1].isnan())
                compared += 1
    assert compared > 200


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_the_directed_pairwise_sum_in_numpy_is_the_torch_one_exactly(monkeypatch, name):
    g = torch.Generator().manual_seed(10)
    stack = torch.tensor([1.0, -1.0] + [0.0] * 3, dtype=torch.float64)
    for trial in range(30):
        x = _values(trial, g, (5, 3, 13 + trial))
        for direction, stacked in ((stack, True), (1, False), (-1, False)):
            results = []
            for elements in (NUMPY_ELEMENTS, -1):  # NumPy, then torch
                monkeypatch.setattr(rounding, "NUMPY_ELEMENTS", elements)
                args = (x if stacked else x[0], [-1], trial % 2 == 1)
                results.append(rounding._directed_pairwise_sum(name, args, {}, torch.float32, direction, stacked))
            assert torch.equal(results[0].nan_to_num(), results[1].nan_to_num()), (trial, direction)
            assert torch.equal(results[0].isnan(), results[1].isnan())


def test_views_of_a_stack_shift_their_dimensions_as_vmap_does():
    # `_stacked_view` replaces functorch's batching rule for a few view ops: the same result,
    # for every dimension argument (negative ones too), and None where it does not apply.
    aten = torch.ops.aten
    x = rounding._mark_stacked(torch.randn(5, 3, 4, 2, dtype=torch.float64))
    vector = rounding._mark_stacked(torch.randn(5, 6, dtype=torch.float64))
    scalar = rounding._mark_stacked(torch.randn(5, dtype=torch.float64))
    twice = rounding._mark_stacked(x * 2)
    calls = ([(aten.select.int, (x, d, i)) for d in range(-3, 3) for i in (0, -1)]
             + [(aten.transpose.int, (x, a, b)) for a in range(-3, 3) for b in range(-3, 3)]
             + [(aten.unsqueeze.default, (x, d)) for d in range(-4, 4)]
             + [(aten.permute.default, (x, p)) for p in ([2, 0, 1], [-1, -3, 1], [0, 1, 2])]
             + [(aten.view.default, (x, s)) for s in ([24], [4, -1], [3, 8])]
             + [(aten._unsafe_view.default, (x, [6, 4]))]
             + [(aten.t.default, (a,)) for a in (rounding._mark_stacked(torch.randn(5, 3, 2, dtype=torch.float64)),
                                                 vector)]
             + [(aten.unsqueeze.default, (scalar, 0)), (aten.view.default, (scalar, [1, 1])),
                (aten.t.default, (scalar,)), (aten.permute.default, (scalar, []))]
             + [(aten.stack.default, ([x, twice],) + d) for d in ((), (0,), (3,), (-1,), (-4,), (2,))]
             + [(aten.cat.default, ([x, twice, x],) + d) for d in ((), (0,), (2,), (-1,), (-3,))]
             + [(aten.stack.default, ([scalar, scalar],)), (aten.cat.default, ([vector, vector], -1))])
    for func, args in calls:
        direct = rounding._stacked_view(func, args, {})
        batched, expected = rounding._vmapped(func, args, {}, 5)
        assert batched and direct is not None, (func, args[1:])
        assert rounding._is_stacked(direct) and direct.shape == expected.shape and torch.equal(direct, expected), \
            (func, args[1:])
    # Not these: a keyword, an op with no rule here, a stacked second argument, a bad dimension.
    assert rounding._stacked_view(aten.select.int, (x, 3, 0), {}) is None
    assert rounding._stacked_view(aten.select.int, (scalar, 0, 0), {}) is None
    assert rounding._stacked_view(aten.select.int, (x,), {"dim": 0, "index": 0}) is None
    assert rounding._stacked_view(aten.expand.default, (x, [3, 4, 2]), {}) is None
    assert rounding._stacked_view(aten.view.default, (rounding._mark_stacked(x.transpose(1, 2)), [24]), {}) is None
    # Nor a join of a stacked and an unstacked tensor, of two ranks, or past a sample's dimensions.
    assert rounding._stacked_view(aten.stack.default, ([x, torch.randn(3, 4, 2, dtype=torch.float64)],), {}) is None
    assert rounding._stacked_view(aten.cat.default, ([x, vector],), {}) is None
    assert rounding._stacked_view(aten.stack.default, ([x, x], 4), {}) is None


def test_small_values_scored_together_have_each_ones_own_figures():
    # `_settled` scores every small value in one pass over their elements side by side: each
    # value's spread and statistic are the ones `_scored` computes alone (float64 sums in
    # another order: equal to 1e-12), for every stored dtype and a discrete value; a value with
    # a nonfinite element (in a sample or the arm's) is left to `_scored`.
    g = torch.Generator().manual_seed(0)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
    shapes = [(), (1,), (5,), (3, 4), (16, 1), (7,), (2, 2), (4,), (40, 30)]
    for k in (9, 19):
        samples = [rounding._Replayed(values={}, discrete={}, nodes={}) for _ in range(k)]
        live, arm, stored = {}, {}, {}
        for i, shape in enumerate(shapes):
            w = f"v{i}"
            live[w] = torch.randn(shape, generator=g, dtype=torch.float64)
            stored[w] = dtypes[i % 4]
            arm[w] = live[w].to(stored[w])
            for s in samples:  # v3 has no spread: every sample is the reference
                s.values[w] = live[w] if i == 3 else live[w] * (1 + 1e-3 * torch.randn(shape, generator=g,
                                                                                        dtype=torch.float64))
        live["count"], arm["count"], stored["count"] = torch.tensor(7.0, dtype=torch.float64), torch.tensor(8), None
        for j, s in enumerate(samples):
            s.values["count"] = torch.tensor(7 + j % 3)
        samples[2].values["v5"] = samples[2].values["v5"].clone().fill_(math.inf)
        arm["v6"] = arm["v6"].clone().fill_(math.nan)
        together, alone = {}, {}
        found = rounding._scored_together(live, samples, arm, stored, together)
        assert sorted(found) == sorted(set(live) - {"v5", "v6"})
        assert together.keys() == found.keys() and all(together[w][1] is found[w][0] for w in found)
        for w, (partial, t, unmoved) in found.items():
            single, t_single, unmoved_single = rounding._scored(w, live[w], arm[w], samples, stored, alone)
            assert t == pytest.approx(t_single, rel=1e-12), w
            assert unmoved == unmoved_single and partial.sample_unmoved == single.sample_unmoved, w
            assert partial.sample_stats == pytest.approx(single.sample_stats, rel=1e-12), w
            for figure in ("sigma", "mean", "sd", "up", "down", "nonfinite"):
                a, b = getattr(partial, figure), getattr(single, figure)
                assert a.shape == b.shape and a.dtype == b.dtype, (w, figure)
                assert torch.allclose(a, b, rtol=1e-12, atol=0), (w, figure)
        # No spread: the arm's float64 value on the reference scores 0, a step off it inf.
        assert found["v3"][1] == 0.0 and max(found["v3"][0].sample_stats) == 0.0
        arm["v3"] = arm["v3"] + 1e-9
        _, t, unmoved = rounding._scored_together(live, samples, arm, stored, {})["v3"]
        assert t == math.inf and unmoved == arm["v3"].numel()
