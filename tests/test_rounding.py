"""The rounding judge in-process: the simulation (triage/worker/rounding.py) on recorded
graphs, and the decision (triage/judge) on the values a real arm, a biased accumulation, a
different formula or an injected error give. Every divergence here is made on purpose."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import recorded, simulated_spread

from triage.judge import RoundingSpread, judge_value
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64
from triage.worker.rounding import Draws, SimulationOptions, round_to, simulate_rounding


def spread_of(fn, *inputs, samples=29):
    """Record fn eagerly, simulate its rounding; (arm value, RoundingSpread)."""
    return simulated_spread(fn, *inputs, samples=samples)[:2]


def judge(value, spread):
    v = value.detach().double().numpy() if isinstance(value, torch.Tensor) else np.asarray(value, dtype=np.float64)
    return judge_value(v, spread, "arm", 0, "value", None)


# -- stochastic rounding itself ------------------------------------------------------------
def test_stochastic_rounding_lands_on_the_dtype_and_is_unbiased():
    x = torch.full((20000,), 1.0 + 2.0 ** -30, dtype=torch.float64)
    r = round_to(x, torch.float32, 0, Draws(0))
    assert torch.equal(r.to(torch.float32).double(), r)  # representable in float32
    assert set(r.unique().tolist()) == {1.0, 1.0 + 2.0 ** -23}
    assert abs(r.mean().item() - x[0].item()) < 2.0 ** -23 * 0.05


@pytest.mark.parametrize("elements", [16, 1 << 13])  # the NumPy path, the torch one
def test_rounding_a_format_without_a_dtype_to_nearest_draws_nothing(elements):
    """The centre replay rounds a TF32 arm's matmul inputs to nearest: the nearer of the two
    neighbours, the same every time (it drew from torch's global generator, so a test's
    verdict moved with whichever tests ran before it in the process)."""
    x = torch.linspace(-3, 3, elements, dtype=torch.float64) * (1 + 2.0 ** -15)
    nearest = round_to(x, "tf32", 0, None)
    assert torch.equal(nearest, round_to(x, "tf32", 0, None))
    up, down = round_to(x, "tf32", 1, None), round_to(x, "tf32", -1, None)
    tie = (x - down) == (up - x)
    expected = torch.where((x - down) < (up - x), down, up)
    assert torch.equal(nearest[~tie], expected[~tie])


def test_directed_rounding_brackets_the_value_and_overflows_past_the_range():
    x = torch.tensor([1.0 + 2.0 ** -30, -(1.0 + 2.0 ** -30), 70000.0, 3.0], dtype=torch.float64)
    up, down = round_to(x, torch.float16, 1, None), round_to(x, torch.float16, -1, None)
    assert bool((up >= x).all()) and bool((down <= x).all())
    assert up[2] == math.inf and down[2] == 65504.0
    assert up[3] == down[3] == 3.0  # exactly representable: never moved


def test_exact_ops_of_representable_values_have_no_spread():
    x = torch.tensor([1.5, -2.25, 3.0])
    _, spread = spread_of(lambda t: torch.relu(t.abs().neg()).flip(0), x)
    assert np.all(spread.sigma == 0)


# -- the anchors' examples (docs: ../shared/anchors §B4) ----------------------------------
def test_cancelling_python_loop_is_inside_and_a_computational_zero():
    torch.manual_seed(0)
    x = torch.randn(5) * 1e38

    def loop(t):
        total = torch.zeros(())
        for d in (t - t.mean()).unbind():
            total = total + d
        return total

    out, spread = spread_of(loop, x)
    j = judge(out, spread)
    assert j.zone == "inside" and j.computational_zero and j.wide


def test_well_conditioned_norm_detects_an_error_of_1e_5():
    y = torch.rand(1000, generator=torch.Generator().manual_seed(1))
    out, spread = spread_of(lambda t: torch.sqrt(torch.sum(t * t)), y)
    assert judge(out, spread).zone == "inside"
    assert judge(out.double() * (1 + 1e-5), spread).zone == "outside"
    assert judge(out.double() * (1 + 1e-3), spread).zone == "outside"


def test_stagnating_sum_is_outside_the_spread_but_inside_the_directed_envelope():
    def running(t):
        for _ in range(300):
            t = t + 1.0
        return t

    out, spread = spread_of(running, torch.tensor(2.0 ** 24))
    assert out.item() == 2.0 ** 24  # round to nearest, ties to even, never moves
    j = judge(out, spread)
    assert j.zone == "envelope" and j.p < 0.05


def test_naive_variance_at_a_large_mean_is_a_computational_zero():
    z = torch.randn(1000, generator=torch.Generator().manual_seed(2)) + 1e4
    out, spread = spread_of(lambda t: (t * t).mean() - t.mean() ** 2, z)
    j = judge(out, spread)
    assert j.zone == "inside" and j.wide


def test_log_of_one_plus_a_tiny_value_keeps_no_digit():
    # Every random rounding of 1 + 1e-10 gives 1 (the chance of rounding up is 1e-10/2^-23),
    # so the samples agree on log = 0; rounding up gives 2^-23. Agreement by chance is no
    # precision: the value has no significant digit, and log1p of the same input keeps them.
    x = torch.rand(512, generator=torch.Generator().manual_seed(5)) * 1e-10
    out, spread = spread_of(lambda t: torch.log(1 + t), x)
    assert float(out.abs().max()) == 0.0
    digits = spread.element_digits()
    assert (np.isnan(digits) | (digits <= 1)).mean() > 0.95
    j = judge(out, spread)
    assert j.zone == "inside" and j.wide
    _, accurate = spread_of(torch.log1p, x)
    assert accurate.digits() > 5 and not accurate.wide()


def test_a_bfloat16_value_that_keeps_no_digit_is_wide():
    """bfloat16 has 2.4 digits: no computation can lose 3 of them, yet `h * 1.01 - h` keeps
    a fifth of one (a new user's compiled case read "0.0 significant digits" beside plain
    rounding). An ordinary bfloat16 sum keeps its two and is not wide."""
    h = (torch.randn(256, generator=torch.Generator().manual_seed(0)) * 10).bfloat16()
    out, spread = spread_of(lambda t: t * 1.01 - t, h)
    assert spread.digits() < 1 and spread.wide()
    assert judge(out, spread).wide
    _, plain = spread_of(lambda t: t.sum(), torch.randn(4096, generator=torch.Generator().manual_seed(0)).bfloat16())
    assert plain.digits() > 1.5 and not plain.wide()


def test_samples_that_agree_keep_the_digits_the_directed_replays_leave():
    ref = np.array([1.0, 1.0, 0.0, 1e-3])
    spread = RoundingSpread(
        dtype="float32", samples=9, sample_stats=np.zeros(9), reference=ref, sigma=np.zeros(4),
        up=np.array([1.0, 1.0 + 1e-4, 0.0, 1e-3 + 2e-3]), down=ref.copy(), mean=ref.copy(), sd=np.zeros(4),
        nonfinite=np.ones(4, np.uint8))
    digits = spread.element_digits()
    assert digits[0] == pytest.approx(24 * math.log10(2))  # exact: no replay moves it
    assert digits[1] == pytest.approx(4.0)  # the directed replays' distance, not the samples'
    assert digits[2] == pytest.approx(24 * math.log10(2))  # an exact 0 is no computational zero
    assert math.isnan(digits[3])  # moved by more than its size: every digit is rounding's
    assert list(spread.computational_zeros()) == [False, False, False, True]


def test_fp16_sum_cast_to_float_keeps_fp16_precision():
    h = torch.rand(20000, generator=torch.Generator().manual_seed(3))
    out, spread = spread_of(lambda t: t.half().sum().float(), h)
    assert spread.precision == "float16"
    j = judge(out, spread)
    assert j.zone == "inside" and not j.wide and j.dtype == "float16"
    # The float32 sum is a more accurate answer to the same question: inside too.
    assert judge(h.sum(), spread).zone == "inside"


def test_a_complex64_computation_held_in_complex128_keeps_complex64_precision():
    # An FFT of float32 values is complex64; cast to complex128 it keeps complex64's digits.
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(5))
    _, spread = spread_of(lambda t: torch.fft.fft(t).to(torch.complex128), x)
    assert spread.precision == "complex64"
    _, wide = spread_of(lambda t: torch.fft.fft(t.double()), x)
    assert wide.precision == "complex128"


def test_a_view_of_a_value_the_arm_had_contiguous_is_replayed_from_a_copy():
    """A decoder layer's cross-attention: its `.contiguous()` copied nothing in the arm and
    recorded no op, and the replay's attention (decomposed) lays its result out otherwise:
    the recorded `view` then failed and the whole layer went unjudged."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    tgt, memory = torch.randn(2, 7, 32), torch.randn(2, 9, 32)
    with torch.no_grad():
        out, spread = spread_of(layer, tgt, memory, samples=9)
    assert judge(out, spread).zone == "inside"


def test_mid_graph_half_cast_rounds_where_the_program_says():
    m = torch.randn(100, generator=torch.Generator().manual_seed(4)) * 3
    out, spread = spread_of(lambda t: (t.half().float() * 1.1).sum(), m)
    assert judge(out, spread).zone == "inside"
    elided = (m * 1.1).sum()  # what a compiler that drops the round trip computes
    assert judge(elided, spread).zone == "inside"


def test_a_different_formula_is_not_excused():
    e = torch.linspace(-1e-6, 1e-6, 11)
    out, spread = spread_of(torch.expm1, e)
    assert judge(out, spread).zone == "inside"
    assert judge(torch.exp(e) - 1, spread).zone == "outside"


def test_a_count_of_elements_two_formulas_round_apart_is_simulated_not_read_off_float64():
    """`(lerp(s, e, w) != s + w·(e − s)).sum()`: in float64 the two formulas agree almost
    everywhere, in float32 they round apart in a third of the elements. The count is judged
    against its own simulated roundings, which decide `ne` anew each time, not against 195."""
    g = torch.Generator().manual_seed(2)
    start, end, weight = torch.randn(5000, generator=g), torch.randn(5000, generator=g) * 3, torch.rand(5000, generator=g)
    out, spread = spread_of(lambda s, e, w: (torch.lerp(s, e, w) != s + w * (e - s)).sum(), start, end, weight)
    assert out.dtype == torch.int64 and out.item() > 20 * max(float(spread.reference), 1.0)
    judged = judge(out, spread)
    assert judged.zone == "inside" and any(u.startswith("`aten.ne`") for u in judged.unstable), judged.unstable
    # A count rounding does not reach (every element) is still outside.
    assert judge(torch.tensor(5000), spread).zone == "outside"


def test_a_count_of_differences_round_to_nearest_keeps_low_is_no_evidence():
    """Two bfloat16 values of formulas 1e-5 apart: round-to-nearest rounds them alike almost
    everywhere (a new user's count: 1,536 of 131,072), the random replays round them
    independently (tens of thousands differ in each), and the count was "34.9σ outside", the
    reason given for a likely bug. That side of the spread is not judged; the compared values
    are (and a count beyond the spread on the other side still is: the test above)."""
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(3)) * 2 + 1
    out, spread = spread_of(lambda t: ((t * 1.00001).bfloat16() != t.bfloat16()).sum(), x)
    assert out.item() < float(spread.mean)
    judged = judge(out, spread)
    assert judged.status == "not-judged" and "round-to-nearest" in judged.reason


@pytest.mark.parametrize("bits", [torch.int32, torch.int16])
def test_a_float_s_bits_read_as_integers_are_not_judged(bits):
    """`x.view(torch.int32)` reads a float32's bits: its float64 stand-in has other bits (and,
    as int16, twice as many elements). Not judged, rather than a spread of float64's bits, or
    the arm's worker failing on the shapes (gh-194347's repro printed its results' bits)."""
    from conftest import recorded

    graph, wanted, dtypes, _ = recorded(lambda x: (x * 1.5).view(bits), torch.tensor([0.1, -2.0]))
    (name, _), = wanted.items()
    spread = simulate_rounding(graph, wanted, SimulationOptions(samples=9), dtypes).spreads[name]
    assert spread.status == "not-judged" and "bits" in spread.reason, spread.reason


def test_a_subtraction_of_exact_operands_is_no_cancellation_figure():
    """A difference of the recorded inputs themselves is rounded once (new user m08 blamed an
    exact `a - b` of coordinates); of computed operands, it amplifies their rounding."""
    a = torch.tensor([1000.0, 2000.0, 3000.0])
    b = a + torch.tensor([1e-2, -2e-2, 3e-2])
    _, _, sim = simulated_spread(lambda x, y: (x - y) * 3.0, a, b)
    assert [c for s in sim.spreads.values() for c in s.cancellations] == []
    _, _, sim = simulated_spread(lambda x, y: (x * 1.1 - y * 1.1) * 3.0, a, b)
    [site] = [c for s in sim.spreads.values() for c in s.cancellations]
    assert site["op"] == "aten.sub" and site["digits_lost"] > 3

    # Labels cast from integers are exact in float32, and `1 - y` of them cancels nothing a
    # replay could move (a hand-written BCE's `(1 - y)` was named as losing every digit).
    labels = torch.arange(3) % 2
    _, _, sim = simulated_spread(lambda i, x: ((1 - i.float()) * x) * 3.0, labels, a)
    assert [c for s in sim.spreads.values() for c in s.cancellations] == []
    _, _, sim = simulated_spread(lambda i, x: ((1 - (i.float() * 0.99999)) * x) * 3.0, labels, a)
    assert [c["op"] for s in sim.spreads.values() for c in s.cancellations] == ["aten.rsub"]


def test_a_cancellation_notes_its_typical_loss_beside_its_worst():
    """A running update `row - mean` in float32 of values near 50 ± 0.1 (a thirtieth new user's
    Welford loop): about 2.7 digits lost at a typical element, every digit where an element
    is exactly 0. The note kept only the worst, and the summary said "losing every digit" of a
    value keeping 4.2; the median over the elements whose difference is not 0 is noted too."""
    g = torch.Generator().manual_seed(0)
    row = 50 + 0.1 * torch.randn(64, generator=g)
    mean = row + 0.1 * torch.randn(64, generator=g)
    mean[:3] = row[:3]  # exactly 0 there
    _, _, sim = simulated_spread(lambda r, m: (r * 1.0000001 - m * 1.0000001) * 3.0, row, mean)
    [site] = [c for s in sim.spreads.values() for c in s.cancellations]
    assert site["digits_lost"] == math.inf
    assert 2.0 < site["typical_digits_lost"] < 3.5, site
    # Zero everywhere: no typical loss.
    _, _, sim = simulated_spread(lambda r: r * 1.0000001 - r * 1.0000001, row)
    assert [c["typical_digits_lost"] for s in sim.spreads.values() for c in s.cancellations] in ([], [None])


def test_a_histograms_counts_and_a_floor_are_decisions_rounding_switches():
    """`torch.histc` of decimals 0.00 … 0.99 in 100 bins (a thirtieth new user's): 0.29 as a
    float32 lies below its bin's edge, and which bin it lands in is rounding's. The counts are
    floats, and were read as a value the computation amplifies "as a division by values near
    zero does"; they are decisions, flipped as an argmax's."""
    x = torch.tensor([round(0.01 * i, 2) for i in range(100)])
    _, _, sim = simulated_spread(lambda t: torch.histc(t * 1.0000001, bins=100, min=0, max=1), x)
    (spread,) = sim.spreads.values()
    assert [f["op"] for f in spread.flips] == ["aten.histc"], spread.flips
    # A rounding to an integer decides as much: `floor(p * 100)` of prices in float32 (0.53 is
    # 52.99999 there), the `.long()` after it only keeps what floor decided.
    prices = torch.tensor([0.53, 0.59, 1.05, 2.10, 4.20])
    _, _, sim = simulated_spread(lambda p: torch.floor(p * 100).long(), prices)
    (spread,) = sim.spreads.values()
    assert [f["op"] for f in spread.flips][:1] == ["aten.floor"], spread.flips
    # A floor of a NaN is NaN in every replay: no flip.
    _, _, sim = simulated_spread(lambda p: torch.floor(p * 100) + 1.0, torch.tensor([float("nan"), 2.345]))
    assert [f["op"] for s in sim.spreads.values() for f in s.flips] == []


def test_a_per_channel_fake_quantization_is_replayed_with_its_float32_scales():
    """`torch.fake_quantize_per_channel_affine` takes float32 scales only ("Scale must be Float
    or BFloat16, found Double"): widened to float64, the replay failed, and every value of the
    script went unjudged with it (a thirty-first new user's, a dim slip then `inconclusive`)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 16, generator=g)
    zero = torch.zeros(4, dtype=torch.int32)

    def quantized(x):
        scale = x.abs().amax(dim=1) / 127
        return torch.fake_quantize_per_channel_affine(x, scale, zero, 0, -128, 127)

    out, spread, sim = simulated_spread(quantized, w)
    (judged,) = sim.spreads.values()
    assert judged.status == "judged", judged.reason
    assert judge(out, spread).zone == "inside"


def test_an_in_place_subtraction_that_cancels_is_a_figure_too():
    """`F.cosine_embedding_loss` computes 1 − cos in place (`ones.sub_(cos)`): of near-parallel
    vectors it cancels every digit. An in-place op was not read as a subtraction, and its
    operand had already been written over by its result when the centre replay looked."""
    torch.manual_seed(0)
    x1 = torch.randn(8, 64)
    x2 = x1 + 1e-4 * torch.randn(8, 64)
    _, _, sim = simulated_spread(lambda a, b: F.cosine_embedding_loss(a, b, torch.ones(8), reduction="none"), x1, x2)
    [site] = [c for s in sim.spreads.values() for c in s.cancellations]
    assert site["op"] == "aten.sub_" and site["digits_lost"] > 5, site


def test_an_addition_a_logarithm_reads_is_named_where_it_absorbs_its_operand():
    """`log(1 + x)` of a small x: the addition keeps none of x's digits (exact operands or
    not), which is the figure behind the wide spread, with log1p as the rewrite; the same
    addition read by something else (`sqrt(v) + eps`) is no figure at all."""
    x = torch.tensor([1e-10, 3e-9, 2e-12])
    _, _, sim = simulated_spread(lambda t: torch.log(1 + t), x)
    [site] = [c for s in sim.spreads.values() for c in s.cancellations]
    assert site["kind"] == "absorbs" and site["op"] == "aten.add" and site["digits_lost"] == math.inf
    assert "torch.log1p(x)" in site["hint"]
    _, _, sim = simulated_spread(lambda t: torch.log(1 - t * 3.0), x)
    [site] = [c for s in sim.spreads.values() for c in s.cancellations]
    assert site["kind"] == "absorbs" and "torch.log1p(-x)" in site["hint"]
    _, _, sim = simulated_spread(lambda t: torch.log(torch.sqrt(t + 1.0) + 1.0), torch.tensor([1e-3, 4.0]))
    assert [c for s in sim.spreads.values() for c in s.cancellations] == []  # digits kept: no figure
    _, _, sim = simulated_spread(lambda t: (torch.sqrt(t) + 1e-8) * 2.0, torch.tensor([1e-3, 4.0]))
    assert [c for s in sim.spreads.values() for c in s.cancellations] == []


def test_writes_through_views_are_replayed_in_every_sample_of_a_stack():
    """A buffer filled through views of its views (`as_strided_scatter`, by the view's place in
    memory) and of itself (`select_scatter`, `diagonal_scatter`): in a stack of samples each
    sample's value lands in its own place, and the zeros no write reached stay exact."""
    def fill(x):
        g = torch.zeros(2, 4)
        g.view(-1)[1:5] = x * 3.0
        g[:, 0] = 7.0 * x[:2]
        g.diagonal()[:] = x[:2] / 3.0
        return g

    # (Not 1.1, 2.2, 4.4: their float32 values divide by 3 exactly, and a correctly rounded
    # division leaves an exact quotient exact.)
    x = torch.tensor([1.7, 3.3, 4.1, 5.7])
    out, spread = spread_of(fill, x)
    assert judge(out, spread).zone == "inside"
    assert np.array_equal(spread.sigma[1, 2:], [0.0, 0.0]) and np.array_equal(spread.mean[1, 2:], [0.0, 0.0])
    assert (spread.sigma[spread.reference != 0] > 0).all()


@pytest.mark.parametrize("smallest", [2e-5, 1e-8])
def test_a_pseudoinverse_rounds_as_its_svd_and_drops_what_the_arm_drops(smallest):
    """`linalg_pinv` reaches the recorder whole: its error is the SVD's, κ·u (σ₅ = 2e-5 of 3:
    κ = 1.5e5), not a library function's few ulps; and with no cutoff given, the kernel drops
    singular values below eps·max(m, n)·σ₁ of the arm's dtype (1e-8 of 3, in float32), which
    a float64 replay at float64's eps would keep and invert."""
    g = torch.Generator().manual_seed(4)
    u, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))
    a = (u[:, :5] @ torch.diag(torch.tensor([3.0, 1.0, 0.5, 0.2, smallest], dtype=torch.float64)) @ v.T).float()
    out, spread = spread_of(torch.linalg.pinv, a)
    judged = judge(out, spread)
    assert judged.zone == "inside", (judged.statistic, judged.max_sample_stat)
    if smallest == 1e-8:  # the rank-4 pseudoinverse, as the arm's cutoff makes it
        assert float(out.abs().max()) < 10 and float(np.abs(spread.mean).max()) < 10


def test_a_repeated_product_rounds_as_the_first_so_a_contracted_one_is_outside():
    """gh-122260: exp(x*s - x*s) is exactly 1 however the product rounds, since a kernel rounds
    the same inputs the same way; a fused multiply-add of one product (Triton's contraction)
    leaves its rounding error, and exp of it overflows: another evaluation, not rounding."""
    x, s = torch.tensor([1134139801600.0]), torch.tensor([0.180336877703666687])
    out, spread = spread_of(lambda x, s: torch.exp(x * s - x * s), x, s)
    assert out.item() == 1.0 and judge(out, spread).zone == "inside"
    contracted = torch.exp(torch.tensor([float(x.double() * s.double() - x * s)]))
    assert judge(contracted, spread).zone == "outside"


def test_two_calls_of_one_convolution_are_not_taken_for_one():
    """The same conv on the same inputs may run other kernels between calls (oneDNN off):
    each keeps its own rounding, so their difference has a spread."""
    conv = torch.nn.Conv2d(4, 4, 3).eval()
    img = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        _, spread = spread_of(lambda i: conv(i) - conv(i), img)
    assert float(np.max(spread.sigma)) > 0


def test_an_overflow_the_true_computation_does_not_have_is_outside():
    a = torch.tensor([1e20, 3.0, 1e30])
    out, spread = spread_of(torch.acosh, a)
    assert judge(out, spread).zone == "inside"
    textbook = torch.log(a + torch.sqrt(a * a - 1))  # x² overflows float32
    j = judge(textbook, spread)
    assert j.zone == "outside" and j.nonfinite.startswith("outside")


def test_an_fp16_overflow_the_program_asks_for_is_inside():
    h = torch.tensor([100.0, 200.0, 300.0], dtype=torch.float16)
    out, spread = spread_of(lambda t: t * 1000 * 1000 / 1000 / 1000, h)
    assert torch.isinf(out).all()
    assert judge(out, spread).zone == "inside"
    kept_in_fp32 = (h.float() * 1000 * 1000 / 1000 / 1000).half()  # inductor-style upcast
    assert judge(kept_in_fp32, spread).zone == "outside"


@pytest.mark.parametrize("threads", [1, 2])
def test_a_real_matmul_chain_is_inside_and_an_injected_error_is_not(threads):
    g = torch.Generator().manual_seed(5)
    x, w1, w2 = torch.randn(64, 256, generator=g), torch.randn(256, 256, generator=g), torch.randn(256, 10, generator=g)

    def model(t):
        return torch.nn.functional.gelu(t @ w1) @ w2

    out, spread = spread_of(model, x)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        again = model(x)
    finally:
        torch.set_num_threads(previous)
    assert judge(again, spread).zone == "inside"
    hidden = torch.nn.functional.gelu(x @ w1) * (1 + 1e-4)
    assert judge(hidden @ w2, spread).zone == "outside"


SCATTER_BINS = torch.randint(0, 16, (40_000,), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("op", [
    lambda w: torch.zeros(16).scatter_add_(0, SCATTER_BINS, w),
    lambda w: torch.ones(16).index_add(0, SCATTER_BINS, w, alpha=0.5),
    lambda w: torch.zeros(16).index_put_((SCATTER_BINS,), w, accumulate=True),
    lambda w: torch.zeros(16).scatter_reduce(0, SCATTER_BINS, w, "mean", include_self=False),
], ids=["scatter_add_", "index_add", "index_put_accumulate", "scatter_reduce_mean"])
def test_a_scatter_sum_rounds_as_its_terms_add_up_and_an_injected_error_is_outside(op):
    """`scatter_add_` of 200,000 weights into 64 bins against a one-hot matmul (a new user's
    histogram): each bin adds 3,000 float32 terms one after another, but the simulation
    rounded the result once (the op's measured error on OpInfo's few terms, or none at all:
    `index_put_(accumulate=True)` counted as a move), and the correct kernel was "16.9σ
    outside", a likely bug. Each output element now carries the walk of its own terms, and
    the worst case of a sequential sum, (n − 1)·u·Σ|t| (2,500 terms here: 1.5e-4 relative),
    bounds its envelope; an error beyond that is outside."""
    w = torch.rand(40_000, generator=torch.Generator().manual_seed(4)) * 10
    out, spread = spread_of(op, w)
    assert judge(out, spread).zone == "inside"
    assert judge(out * (1 + 1e-3), spread).zone == "outside"


def test_an_embeddings_gradient_of_equal_terms_is_rounding_not_outside():
    """An embedding's gradient adds each row's upstream gradients one after another; equal
    terms (a constant upstream gradient) round alike at every addition, so the error grows as
    n, not as the walk's √n: the real kernel (bit for bit the sequential float32 sum) was 11σ
    of the walk. It lies within the sequential sum's directed envelope."""
    idx = torch.randint(0, 32, (20_000,), generator=torch.Generator().manual_seed(0))
    scale = torch.linspace(0, 1, 8)

    def gradient(w):
        w = w.detach().requires_grad_()
        (torch.nn.functional.embedding(idx, w) * scale).sum().backward()
        return w.grad

    out, spread = spread_of(gradient, torch.randn(32, 8, generator=torch.Generator().manual_seed(1)))
    assert judge(out, spread).zone in ("inside", "envelope")
    assert judge(out * (1 + 1e-3), spread).zone == "outside"


EMBEDDING_ROWS = torch.randn(1000, 64, generator=torch.Generator().manual_seed(6))
BAG_INDICES = torch.randint(0, 1000, (400,), generator=torch.Generator().manual_seed(7))
BAG_OFFSETS = torch.arange(0, 400, 20)


@pytest.mark.parametrize("mode, weighted, padding", [("mean", False, None), ("sum", True, None),
                                                     ("sum", False, 3), ("max", False, None)])
def test_an_embedding_bag_adds_each_bags_rows_and_an_injected_error_is_outside(mode, weighted, padding):
    """`embedding_bag(mode="mean")` against a gather and mean (a new user's check): each bag
    adds its 20 rows one after another, but the simulation rounded the result once (a library
    kernel's few ulps), so the correct kernel was "560σ outside", a likely bug; with
    `per_sample_weights` (a sum of products), 680σ. Each bag now carries its own terms' walk
    and the sequential sum's bound; a max adds nothing."""
    weights = torch.rand(400, generator=torch.Generator().manual_seed(8)) if weighted else None
    indices = BAG_INDICES.clone()
    if padding is not None:
        indices[::7] = padding

    def bag(rows, *per_sample):
        return torch.nn.functional.embedding_bag(indices, rows, BAG_OFFSETS, mode=mode, padding_idx=padding,
                                                 per_sample_weights=per_sample[0] if per_sample else None)

    out, spread = spread_of(bag, EMBEDDING_ROWS, *([weights] if weighted else []))
    assert judge(out, spread).zone == "inside"
    assert judge(out * (1 + 1e-4), spread).zone == "outside"
    if mode == "max":
        assert float(np.max(spread.sd)) == 0.0


@pytest.mark.parametrize("layer", ["attention", "encoder", "encoder-gelu-norm-first"])
def test_a_native_attention_fast_path_is_replayed_op_by_op_and_an_injected_error_is_outside(layer):
    """nn.MultiheadAttention and nn.TransformerEncoderLayer in eval mode without grad run one
    fused native kernel (`_native_multi_head_attention`, `_transformer_encoder_layer_fwd`),
    which reached the simulation as an unmeasured library op: a correct kernel 262σ outside.
    Each is replayed as attention.cpp and transformer.cpp compute it."""
    torch.manual_seed(0)
    if layer == "attention":
        module = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()

        def run(x):
            return module(x, x, x, need_weights=False)[0]
        fused = "_native_multi_head_attention"
    else:
        module = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True,
                                                  activation="gelu" if "gelu" in layer else "relu",
                                                  norm_first="norm-first" in layer).eval()
        run, fused = module, "_transformer_encoder_layer_fwd"
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        graph = recorded(run, x)[0]
        out, spread, _ = simulated_spread(run, x)
    assert fused in {n.target.overloadpacket.__name__ for n in graph.nodes if isinstance(n.target, torch._ops.OpOverload)}
    assert judge(out, spread).zone == "inside"
    assert judge(out * (1 + 1e-4), spread).zone == "outside"


def test_a_power_of_two_scaling_is_exact_and_a_float64_computation_of_exact_inputs_is_float64():
    """`w = torch.randn(...) / 8`, then a float64 convolution of `w.double()`: the division by 8
    is exact, but it took `div`'s measured kernel error, and the float64 result "kept 6.2
    significant digits at float32". A product or quotient by a power of two rounds as a
    correctly rounded op (exact in range), and a computation's precision counts the dtypes that
    rounded something, not those of exact values."""
    w = torch.randn(8, 4, 3, 3, generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 8, 6, 6, generator=torch.Generator().manual_seed(1))

    def conv64(x, w, scale):
        return torch.nn.functional.conv_transpose2d(x.double(), (w / scale).double())

    for scale, precision in ((8.0, "float64"), (0.5, "float64"), (3.0, "float32")):
        out, spread = spread_of(conv64, x, w, scale)
        assert spread.precision == precision, scale
        relative = float(np.max(spread.sigma) / np.max(np.abs(spread.reference)))
        assert (relative < 1e-13) == (precision == "float64"), (scale, relative)
        assert judge(out, spread).zone == "inside"


@pytest.mark.parametrize("mode", ["train", "eval", "affine-train"])
def test_batch_norm_rounds_as_the_kernels_x_times_alpha_plus_beta(mode):
    """ATen's CPU batch norm computes x·alpha + beta (alpha = invstd·w, beta = b − mean·alpha),
    not the decomposition's (x − mean)·rstd, whose rounding is relative to the output: ATen's
    scalar build (`ATEN_CPU_CAPABILITY=default`) was 4.03σ outside the decomposition's spread
    at 199 samples on these values (the vectorized builds err less)."""
    torch.manual_seed(3)
    x = torch.randn(16, 5)
    module = torch.nn.BatchNorm1d(5, affine=mode == "affine-train")
    if mode == "affine-train":
        with torch.no_grad():
            module.weight.copy_(torch.linspace(0.5, 2, 5))
            module.bias.copy_(torch.linspace(-1, 1, 5))
    if mode == "eval":
        module(x)
        module.eval()
    out, spread = spread_of(lambda v: module(v), x)
    assert judge(out, spread).zone == "inside"
    assert judge(out * (1 + 1e-4) + 1e-4, spread).zone == "outside"


def test_every_output_of_an_unbind_keeps_its_arm_dtype():
    """An op with a list of outputs (`unbind`, `split`) returns as many as its input's size
    gives, but its output dtypes were memoized per op and input dtypes from its first call: a
    GRU's first `unbind` (of one hidden state) had one output, its next (over 30 time steps)
    tagged only the first step float32, and every later step was replayed unrounded (float64):
    a correct float32 GRU sat outside its own spread."""
    def later_step(h, steps):
        first = h.unbind(0)[0]  # one output: the first call, memoized
        return steps.unbind(0)[2] * 1.1 + first

    out, spread = spread_of(later_step, torch.randn(1, 4), torch.randn(3, 4))
    assert float(np.median(spread.sigma / np.abs(spread.reference))) > 1e-9  # float32 rounding, not float64's
    assert judge(out, spread).zone == "inside"


def test_a_scatter_that_only_moves_values_adds_no_rounding():
    w = torch.rand(16, generator=torch.Generator().manual_seed(4))
    order = torch.randperm(16, generator=torch.Generator().manual_seed(5))
    out, spread = spread_of(lambda v: torch.zeros(16).index_put_((order,), v), w)
    assert float(np.max(spread.sd)) == 0.0
    assert judge(out, spread).zone == "inside"


def test_float32_gelus_cancelling_tail_is_inside_and_the_tanh_approximation_is_not():
    """The CPU's float32 GELU computes x·(1 + erf(x/√2))/2, which cancels for x ≪ 0: −0 below
    about −6, where the function is −1e-15, and 46 u of its result at x = −2. Central
    differences of float64 GELU saw a plateau there (float64's own 1 + erf moves in steps of
    1e-16) and called it well conditioned, so the correct kernel was 1e6σ outside, and a
    backend's planted tanh approximation was blamed on the eager arm. The slope now comes
    from erfc, and the kernel's measured error relative to its input applies wherever the
    function amplifies it."""
    x = torch.linspace(-9, 3, 4096)
    out, spread = spread_of(torch.nn.functional.gelu, x)
    assert judge(out, spread).zone == "inside"
    assert judge(torch.nn.functional.gelu(x, approximate="tanh"), spread).zone == "outside"


def _spread_under(kernels, fn, *inputs):
    """`spread_of` with the simulation reading `kernels` (a KernelTable)."""
    from triage.judge import RoundingSpread

    graph, wanted, dtypes, out = recorded(fn, *inputs)
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29, kernels=kernels), dtypes)
    (name, reference), = wanted.items()
    return out, RoundingSpread.of_simulation(sim.spreads[name], reference.numpy(), str(out.dtype)[6:])


def _with_softplus(sensitivity_u):
    from triage.worker.kernel_errors import KernelError, KernelTable
    from triage.worker.rounding import kernel_table

    measured = kernel_table("cpu")
    # AVX2's float32 softplus as measured on OpInfo: 0.0161 u·|x| where ill-conditioned, and
    # (with the slope) 1.0 u·|x·f′(x)|.
    return KernelTable(dict(measured.ops, softplus={"float32": KernelError(5.78, 944732, 6, None, 0.0161,
                                                                           sensitivity_u)}), "this test")


@pytest.mark.parametrize("sensitivity_u", [1.0, None])
def test_softplus_far_left_errs_by_its_slope_not_by_its_input(sensitivity_u):
    """softplus(−18) = log1p(e⁻¹⁸) = 1.5e-8, condition |x·σ(x)/f| ≈ 18: its kernel is accurate
    for its input, off by about κ·u of the result. Scaled by u·|x| (a cancelling formula's
    error, GELU's 1 + erf) its noise was ±100 % of the value, and a backend returning
    log(1 + exp(x)) = 0 there was rounding. With the slope's measured figure the spread is
    the kernel's: the real value inside, the planted 0 outside; a table without that figure
    keeps the wide scale."""
    x = torch.tensor([-18.0, -25.0, -40.0])
    out, spread = _spread_under(_with_softplus(sensitivity_u), F.softplus, x)
    assert judge(out, spread).zone == "inside"
    planted = torch.log(1 + torch.exp(x))
    assert float(planted[0]) == 0.0
    assert judge(planted, spread).zone == ("outside" if sensitivity_u is not None else "inside")


@pytest.mark.parametrize("capability", ["AVX2", "AVX512"])
def test_each_shipped_cpu_entry_tells_a_planted_softplus_from_the_kernel(capability):
    """The slope figures each CPU entry ships (softplus backward stable on its samples) put
    a backend's `log(1 + exp(x))`, 0 at x = −18, outside the kernel's spread on a host of
    either capability, and the real kernel inside."""
    from triage.worker.kernel_errors import KernelTable

    kernels = KernelTable.load("cpu", capability, torch.__version__)
    assert kernels.sensitivity_ratio("softplus", torch.float32) is not None
    x = torch.tensor([-18.0, -25.0, -40.0])
    out, spread = _spread_under(kernels, F.softplus, x)
    assert judge(out, spread).zone == "inside"
    assert judge(torch.log(1 + torch.exp(x)), spread).zone == "outside"


@pytest.mark.parametrize("capability", [None, "AVX2", "AVX512"])
def test_a_slope_figure_never_narrows_gelus_cancelling_tail(capability):
    """GELU's x·(1 + erf(x/√2))/2 errs by u·|x| where it cancels, which outgrows its slope's
    scale without bound (10⁹ u of it at x = −8): OpInfo's samples measured 79.6 u of it on
    AVX2 and 241 u on AVX-512, and taking that figure as a bound put the correct kernel
    outside from x = −3 down. A kernel not backward stable on its samples keeps the input's
    scale, under the tables that have the slope figures (both CPU entries) too."""
    from triage.worker.kernel_errors import KernelTable
    from triage.worker.rounding import kernel_table

    kernels = kernel_table("cpu") if capability is None else KernelTable.load("cpu", capability, torch.__version__)
    assert capability is None or kernels.get("gelu", torch.float32).sensitivity_u is not None
    x = torch.linspace(-9, 3, 4096)
    out, spread = _spread_under(kernels, torch.nn.functional.gelu, x)
    assert judge(out, spread).zone == "inside"


def test_rank_deficient_svd_reaches_the_exact_infinity_in_the_reference():
    from triage.worker.conditioning import exact_rank

    A = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    assert exact_rank(A) == 2
    assert exact_rank(torch.eye(3)) == 3


def test_tf32_arms_get_the_spread_of_10_bit_inputs():
    """On a CUDA arm with TF32 on, fp32 matmuls read 10-bit mantissas: a result computed that
    way is inside that arm's spread and outside a full-fp32 arm's (emulated here, on the CPU)."""
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(32, 128, generator=g), torch.randn(128, 16, generator=g)
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        out = a @ b
    node = recorder.lookup(out)
    graph = recorder.finish().graph
    reference = replay_fp64(graph, {node.name}, 60).values[node.name]

    def spread(tf32):
        sim = simulate_rounding(graph, {node.name: reference}, SimulationOptions(matmul_tf32=tf32), {node.name: out.dtype})
        return RoundingSpread.of_simulation(sim.spreads[node.name], reference.numpy(), "float32")

    tf32_inputs = (round_to(a.double(), "tf32", 0, None) @ round_to(b.double(), "tf32", 0, None)).float()
    assert judge(tf32_inputs, spread(True)).zone == "inside"
    assert judge(tf32_inputs, spread(False)).zone == "outside"


def test_a_conjugate_view_is_simulated_like_any_complex_value():
    """`fft.ihfft` returns a conjugate view, which has no real view until resolved: its spread
    is still simulated (it crashed the worker), and the kernel's value lies inside."""
    x = torch.linspace(-1, 1, 16)
    out, spread, _ = simulated_spread(torch.fft.ihfft, x)
    assert out.is_conj() and spread.samples >= 9
    judged = judge_value(out.resolve_conj().to(torch.complex128).numpy(), spread, "cpu", 0, "y", None)
    assert judged.status == "judged" and judged.zone == "inside", judged


def test_complex_and_polar_replay_their_values():
    """`torch.complex` and `torch.polar` write into views of a fresh tensor, which the replays
    lost (every sample came back empty or as uninitialized memory): `complex` is exact, `polar`'s
    decomposition keeps its writes, and a value downstream is judged on a rounding-sized spread."""
    re, im = torch.tensor([1.5, 3.0, -0.25]), torch.tensor([-2.25, 0.5, 7.0])
    out, spread, _ = simulated_spread(torch.complex, re, im)
    assert float(spread.sigma.max()) == 0.0 and np.allclose(spread.mean, spread.reference)
    out, spread, _ = simulated_spread(lambda r, a: torch.polar(r, a).exp().abs(), re.abs(), im)
    assert 0 < float(spread.sigma.max()) < 1e-5 * float(np.abs(spread.reference).max())
    assert np.allclose(spread.mean, spread.reference, rtol=1e-5, atol=0)
    assert judge_value(out.double().numpy(), spread, "cpu", 0, "y", None).zone == "inside"
    assert judge_value((out.double() * (1 + 1e-4)).numpy(), spread, "cpu", 0, "y", None).zone == "outside"


def test_the_first_op_to_leave_its_range_is_noted_where_a_value_is_not_finite():
    """A float16 skewness: `c ** 3` overflows float16 (65504) where its inputs are finite, and
    the mean of ±inf is nan. The centre replay notes that op, upstream of the nan; where every
    value is finite it checks nothing."""
    torch.manual_seed(2)
    x = (torch.randn(4096) * 20 + 3).half()

    def skewness(t):
        c = t - t.mean()
        return (c ** 3).mean() / (c ** 2).mean() ** 1.5

    graph, wanted, dtypes, out = recorded(skewness, x)
    assert out.isnan()
    spread = simulate_rounding(graph, wanted, SimulationOptions(samples=9), dtypes, {n: out for n in wanted})
    (noted,) = [s.overflow for s in spread.spreads.values()]
    assert (noted["op"], noted["dtype"], noted["largest"], noted["kind"]) == ("aten.pow", "float16", 65504.0, "overflow")
    graph, wanted, dtypes, out = recorded(skewness, x.float())
    spread = simulate_rounding(graph, wanted, SimulationOptions(samples=9), dtypes, {n: out for n in wanted})
    assert [s.overflow for s in spread.spreads.values()] == [None]


def test_an_in_place_op_that_leaves_the_range_is_noted_by_its_inputs_before_the_write():
    """`c.pow_(3)` writes its overflow into its own input: the inputs it read were finite."""
    torch.manual_seed(2)
    x = (torch.randn(4096) * 20 + 3).half()

    def skewness(t):
        c = t - t.mean()
        return c.clone().pow_(3).mean() / (c ** 2).mean() ** 1.5

    graph, wanted, dtypes, out = recorded(skewness, x)
    assert out.isnan()
    spread = simulate_rounding(graph, wanted, SimulationOptions(samples=9), dtypes, {n: out for n in wanted})
    (noted,) = [s.overflow for s in spread.spreads.values()]
    assert (noted["op"], noted["dtype"], noted["kind"]) == ("aten.pow_", "float16", "overflow")


def test_a_write_through_a_view_reaches_every_stacked_replay():
    """`total = terms[0]; total += terms[i]` writes into `terms` through a view (the graph's
    `as_strided_scatter`), so `terms.sum()` afterwards sums the accumulated first element. The
    stacked replays' samples are slices of the stack, and that write missed every sample but
    the first: a float64 sum of 200 terms had a spread of ±0.39."""
    def aliased(terms):
        total = terms[0]
        for i in range(1, terms.numel()):
            total += terms[i]
        return terms.sum()

    k = torch.arange(1, 41, dtype=torch.float64)
    out, spread, _ = simulated_spread(aliased, (1.0 / (k * k)).clone(), samples=9)
    assert float(out) == pytest.approx(float(spread.reference), rel=1e-14)
    assert float(np.abs(spread.mean - spread.reference).max()) < 1e-13
    assert float(spread.sigma.max()) < 1e-13


def test_a_scan_errs_relative_to_each_of_its_outputs():
    """A float16 cumprod of 40 factors in [1.5, 2) grows from 1.7 past 65504: its kernel error
    taken relative to the output's overall scale put ±2e4 on its first elements, every sample
    came back garbage, and the correct kernel's 2866 was 'nonfinite in every rounding'."""
    torch.manual_seed(0)
    growth = (1.5 + 0.5 * torch.rand(40)).half()
    out, spread, _ = simulated_spread(lambda t: torch.cumprod(t, 0), growth)
    finite = torch.isfinite(out).numpy()
    assert judge_value(out.double().numpy(), spread, "cpu", 0, "y", None).zone == "inside"
    relative = spread.sigma[finite] / np.abs(spread.reference[finite])
    assert relative.max() < 0.01, relative.max()  # a few float16 roundings, not the scale of the largest


def test_a_complex_product_rounds_each_product_and_sum_of_its_parts():
    """A complex64 `a * b` is (ac − bd) + (ad + bc)i, each product and sum rounded: where ac
    and bd nearly cancel, the real part keeps their rounding. Simulated as one rounding of the
    exact product per part, such a part's spread was a hundredth of what the kernel gives, and
    the correct kernel 'outside' (958σ, a new user's complex multiply called a bug)."""
    torch.manual_seed(13)
    a, b = torch.randn(256, dtype=torch.complex64), torch.randn(256, dtype=torch.complex64)
    out, spread, _ = simulated_spread(torch.mul, a, b)
    assert judge_value(torch.view_as_real(out).double().numpy(), spread, "cpu", 0, "y", None).zone == "inside"
    exact = a.to(torch.complex128) * b.to(torch.complex128)
    products = (a.real.double() * b.real.double()).abs().numpy()
    cancelling = int(np.argmax(products / exact.real.abs().numpy()))  # |ac| / |ac − bd| ≈ 115 here
    assert spread.sigma[cancelling, 0] > 0.3 * 2.0 ** -24 * products[cancelling]


@pytest.mark.parametrize("op", [
    lambda x, y: x / y, lambda x, y: x / 3.0, lambda x, y: torch.sqrt(x), lambda x, y: torch.reciprocal(x),
    lambda x, y: torch.square(x), lambda x, y: x.clone().mul_(y), lambda x, y: x * (2 - 3j),
    lambda x, y: x.reshape(16, 32) @ y.reshape(32, 16), lambda x, y: (x * y).sum(), lambda x, y: torch.cumsum(x, 0),
])
def test_a_complex_kernel_lies_inside_its_own_spread(op):
    """Complex kernels combine the parts: quotients, roots and moduli err relative to the
    modulus, products round their parts' products, contractions and sums accumulate each part
    at the parts' precision (a contraction took float64's unit roundoff). Before, the kernel's
    value was 'outside' for seven of these ten."""
    torch.manual_seed(5)
    a, b = torch.randn(512, dtype=torch.complex64), torch.randn(512, dtype=torch.complex64)
    out, spread, _ = simulated_spread(op, a, b)
    judged = judge_value(torch.view_as_real(out.reshape(-1)).double().numpy().reshape(spread.reference.shape),
                         spread, "cpu", 0, "y", None)
    assert judged.zone == "inside", judged


@pytest.mark.parametrize("p, mode", [(1.0, None), (0.5, None), (2.0, "donot_use_mm_for_euclid_dist"), (2.0, None)])
def test_cdist_is_replayed_as_the_kernel_computes_it(p, mode):
    """`cdist` adds |x − y|^p over the features one after another (the CPU kernel's scalar
    loop), or for p = 2 on more than 25 rows takes ‖x‖² + ‖y‖² − 2x·y from one matmul. As one
    library op with a per-op bound, its error did not grow with the 257 features, and a new
    user's correct `cdist(p=1)` was 'outside' (5.2σ, where 199 samples reached 2.5σ)."""
    torch.manual_seed(1)
    x, y = torch.randn(32, 257), torch.randn(48, 257)
    out, spread, _ = simulated_spread(lambda a, b: torch.cdist(a, b, p=p, **({"compute_mode": mode} if mode else {})),
                                      x, y)
    assert judge_value(out.double().numpy(), spread, "cpu", 0, "y", None).zone == "inside"


def test_cdist_of_near_points_through_its_matmul_keeps_the_cancellation():
    """Points 1e-3 apart: ‖x‖² + ‖y‖² − 2x·y cancels to a few digits, which the spread shows."""
    torch.manual_seed(2)
    x = torch.randn(40, 16)
    y = x + 1e-3 * torch.randn(40, 16)
    out, spread, _ = simulated_spread(torch.cdist, x, y)
    assert judge_value(out.double().numpy(), spread, "cpu", 0, "y", None).zone == "inside"
    diagonal = np.diag(spread.sigma / np.abs(spread.reference))
    assert np.median(diagonal) > 1e-3  # four significant digits at most, where float32 has seven


@pytest.mark.parametrize("reduce", [
    lambda x: x.mean(dim=1), lambda x: x.sum(dim=1), lambda x: torch.cumsum(x, dim=0)[:1],
    lambda x: (x.T.unsqueeze(-1) @ x.T.unsqueeze(-2)).sum((0,)),  # a matmul over an inner dimension of one
    # torch's references (var_mean's) call prims that move values without arithmetic
    lambda x: torch.ops.prims.broadcast_in_dim(x, [4, 1, 3], [0, 1]),
])
def test_a_reduction_of_one_term_adds_nothing(reduce):
    """A sum, mean or matrix product over one term makes no addition, and a prim that only
    moves values (`broadcast_in_dim`) rounds nothing: the result is the term itself in every
    replay, as the kernel computes it."""
    x = torch.tensor([[1.5], [-2.25], [0.75], [0.5]])  # any product of two is exact in float32
    out, spread, _ = simulated_spread(reduce, x)
    assert float(np.abs(spread.sigma).max()) == 0.0, spread.sigma
    assert np.array_equal(spread.mean, out.double().numpy())


def test_a_sum_over_the_dimension_of_a_zero_dim_value_is_its_one_term():
    """`x.sum([0], keepdim=True)` of a 0-dim `x` (an OpInfo sample) reduces nothing: the
    directed replays' pairwise sum permuted a dimension the value does not have, failed, and
    the simulation raised instead of judging."""
    out, spread, _ = simulated_spread(lambda x: x.sum([0], keepdim=True), torch.tensor(2.5))
    assert float(np.asarray(spread.up)) == float(np.asarray(spread.down)) == 2.5
    assert judge(out, spread).zone == "inside"


def test_a_directed_replay_that_fails_leaves_the_value_not_judged(monkeypatch):
    """Only the directed replays add a sum pairwise: where that fails, the value is not judged,
    with the reason, rather than the simulation raising on the missing replay."""
    from conftest import recorded

    import triage.worker.rounding as rounding

    def failing(*args, **kwargs):
        raise RuntimeError("no pairwise sum here")

    monkeypatch.setattr(rounding, "_directed_pairwise_sum", failing)
    graph, wanted, dtypes, _ = recorded(lambda x: (x * 1.5).sum(), torch.linspace(-1, 1, 64))
    (spread,) = simulate_rounding(graph, wanted, SimulationOptions(samples=9), dtypes).spreads.values()
    assert spread.status == "not-judged" and "no pairwise sum here" in spread.reason, spread.reason


@pytest.mark.parametrize("elements", [2, 10_000])
def test_a_half_decomposition_measured_at_float32_on_few_elements_may_also_overflow(elements):
    """fp16 `soft_margin_loss` of a margin of 20 is log1p(e²⁰) = 20 in float32 and inf where
    the kernel exponentiates in half (the CPU's does). A table that measured float32 opmath on
    2 elements cannot tell: both are rounding of this computation. Measured on 10,000, the
    table is believed, and inf is outside."""
    from conftest import recorded

    from triage.worker.kernel_errors import KernelError, KernelTable
    from triage.worker.rounding import kernel_table

    x = torch.tensor([-20.0, 0.5, -1.0, 2.0], dtype=torch.float16)
    y = torch.tensor([1.0, -1.0, 1.0, 1.0], dtype=torch.float16)
    graph, wanted, dtypes, _ = recorded(F.soft_margin_loss, x, y)
    measured = kernel_table("cpu")
    ops = dict(measured.ops, soft_margin_loss={"float16": KernelError(0.2, elements, 1, True)})
    options = SimulationOptions(samples=29, kernels=KernelTable(ops, "this test"))
    (name, reference), = wanted.items()
    spread = RoundingSpread.of_simulation(simulate_rounding(graph, wanted, options, dtypes).spreads[name],
                                          reference.numpy(), "float16")
    assert judge(float(reference), spread).zone == "inside"  # the float32 computation, rounded
    assert judge(math.inf, spread).zone == ("inside" if elements == 2 else "outside")


def _as_strided_in_place(v):
    w = v.view(-1)  # a view of the partial view, whose geometry `as_strided_` rewrites
    w.as_strided_((2, 2), (1, 2), 0)
    return w + 0.5


@pytest.mark.parametrize("strided", [lambda v: v.as_strided((2, 2), (1, 2), 0) + 0.5, _as_strided_in_place],
                         ids=["as_strided", "as_strided_"])
def test_as_strided_of_a_partial_view_replays_what_the_arm_read(strided):
    """`as_strided` reads its input's storage, not its elements: of a view into a larger tensor
    (OpInfo's `partial_views` samples) the arm reads the base's memory, which a replay from the
    view's own elements cannot, so the view's value is recorded as it was (a `storage` leaf)
    and the correct kernel is not called infinitely far from its reference. The in-place form
    too: it read the base's first elements, the replay read the view's."""
    base = torch.arange(10.0) * 1.5 - 4.0
    out, spread, _ = simulated_spread(strided, base[2:])
    assert np.array_equal(spread.mean, out.double().numpy()) and float(spread.sigma.max()) == 0.0
    assert judge_value(out.double().numpy(), spread, "cpu", 0, "y", None).zone == "inside"


def test_a_nearest_pixel_a_coordinates_rounding_away_is_either_pixel():
    """`grid_sample` unnormalizes each coordinate in the grid's dtype: a point 1.2e-7 grid
    units from the boundary between two pixels lands on either, depending on how the kernel
    rounds ((x + 1)/2)·(W − 1) in float32. The random replays move the coordinates as far, so
    either pixel's value is rounding of this computation, and a third is not."""
    image = torch.tensor([[[[0.0, 10.0, 20.0, 30.0]]]])
    grid = torch.tensor([[[[-2.0 ** -23, 0.0]]]])  # 1.5 − 1.8e-7 pixels: pixel 1's side, by less than 3u
    out, spread, _ = simulated_spread(
        lambda i, g: F.grid_sample(i, g, mode="nearest", align_corners=True), image, grid)
    assert float(out) == 10.0

    def zone(value):
        return judge_value(np.full((1, 1, 1, 1), value), spread, "cpu", 0, "y", None).zone

    assert zone(10.0) == "inside" and zone(20.0) == "inside" and zone(30.0) == "outside"

def test_an_adaptive_max_pool_is_a_selection_whatever_its_windows():
    """Adaptive max pooling picks one input element per window: exact. Its decomposition
    covers evenly divided windows only (torch returns NotImplemented otherwise), and the
    value went unjudged ("getitem could not be replayed")."""
    x = torch.randn(1, 2, 5, 7, 6, generator=torch.Generator().manual_seed(0))
    for pool in (lambda t: F.adaptive_max_pool2d(t[0], (2, 3)), lambda t: F.adaptive_max_pool3d(t, (2, 3, 4))):
        out, spread, _ = simulated_spread(pool, x)
        assert float(spread.sigma.max()) == 0.0
        assert np.array_equal(spread.mean, out.double().numpy())


def test_a_gradient_through_a_grid_sampler_moves_its_coordinates_too():
    """`grid_sampler_2d_backward` unnormalizes the grid again, in its dtype: the float32
    gradient of the image differs from float64's by the bilinear weights those roundings move
    (thousands of σ outside a spread that moved the forward's coordinates only), and is inside
    the spread that moves the backward kernel's too."""
    g = torch.Generator().manual_seed(0)
    image = torch.randn(1, 3, 40, 50, generator=g)
    grid = torch.rand(1, 30, 20, 2, generator=g) * 2 - 1
    cotangent = torch.randn(1, 3, 30, 20, generator=g)

    def image_gradient(i, coordinates):
        i = i.detach().requires_grad_()
        (grad,) = torch.autograd.grad(F.grid_sample(i, coordinates, mode="bilinear", align_corners=False), i,
                                      cotangent)
        return grad

    out, spread, _ = simulated_spread(image_gradient, image, grid)
    assert judge_value(out.double().numpy(), spread, "cpu", 0, "grad", None).zone == "inside"



def test_a_function_of_an_infinite_argument_gets_no_infinite_noise():
    """logaddexp(x, −inf) is x: IEEE's infinities make a function exact there. The noise of an
    ill-conditioned function was scaled by Σ|xᵢ| = inf, every sample was nan, and the correct x
    was "finite where every rounding of this computation is not" (OpInfo's masked.logaddexp)."""
    x = torch.tensor([-8.4784, -1.7658, 3.1285])
    out, spread, _ = simulated_spread(lambda a: torch.logaddexp(a, torch.full_like(a, -math.inf)), x)
    assert np.allclose(spread.mean, out.double().numpy(), rtol=1e-6, atol=0)
    assert judge_value(out.double().numpy(), spread, "cpu", 0, "y", None).zone == "inside"


def test_a_failing_simulation_costs_the_judgement_not_the_arms_values(monkeypatch, capsys):
    """The simulation runs in the script's process after the script: a state the script left
    made it fail on an H200 (a CUDA_VISIBLE_DEVICES set after CUDA started), and the arm was
    reported as a crash of its configuration. Its values and reference stay; each value with a
    reference is left unjudged, saying why."""
    from triage.worker import rounding, session
    from triage.worker.protocol import OBSERVED, REFERENCE, SPREAD_ARRAYS

    def broken(graph, records, references, values, *rest, **options):
        values["sig0"] = np.zeros(2)  # a spread written before the failure is not kept
        raise AssertionError("Invalid device id")

    monkeypatch.setattr(rounding, "simulate_observables", broken)
    values = {f"{OBSERVED}0": np.ones(2), f"{REFERENCE}0": np.ones(2), f"{OBSERVED}1": np.ones(1)}
    records = [{"index": 0, "node": "mul"}, {"index": 1, "node": None, "rounding": None}]
    summary = session._simulated(None, records, {}, values, {}, "cuda", {})
    assert set(values) == {f"{OBSERVED}0", f"{REFERENCE}0", f"{OBSERVED}1"}
    assert not any(k.startswith(SPREAD_ARRAYS) for k in values)
    assert records[0]["rounding"]["status"] == "not-judged"
    assert records[0]["rounding"]["reason"] == "triage's rounding simulation failed (AssertionError: Invalid device id)"
    assert records[1]["rounding"] is None
    assert summary["note"] == records[0]["rounding"]["reason"]
    assert "AssertionError: Invalid device id" in capsys.readouterr().err


def test_a_value_observed_three_times_is_simulated_and_kept_once_for_all_its_records():
    """A compiled call's output, then the script's `(eager - compiled).abs().max()` operand,
    then at exit: three records of one node. The spread budget counted it three times, so the
    other large value was too large to keep; and the second and third records, the ones the
    comparison reads, were "too large to keep" though their node was simulated (a 1M-element
    normalization: the verdict rested on float64 alone). One node is counted and kept once;
    its other records point at it, and the parent reads the same arrays for all three."""
    from triage.arms.run import _fill_from_result
    from triage.model import ArmRun
    from triage.worker.protocol import OBSERVED, REFERENCE, SPREAD_ARRAYS
    from triage.worker.rounding import simulate_observables, spread_bytes

    x = torch.linspace(1, 2, 500)
    rec = OpRecorder(torch.device("cpu"), site=lambda: None)
    with rec:
        y, z = x * 3 + 1, x.exp()
    recording = rec.finish()
    ny, nz = rec.lookup(y).name, rec.lookup(z).name
    refs = replay_fp64(recording.graph, {ny, nz}, 60).values
    records, values = [], {}
    for i, (node, t) in enumerate([(ny, y), (nz, z), (ny, y), (ny, y)]):
        fp = {"shape": list(t.shape), "dtype": "float32", "numel": t.numel(), "sha256": "0"}
        records.append({"index": i, "node": node, "fingerprint": fp, "kind": "call", "label": f"v{i}", "line": None})
        values[f"{OBSERVED}{i}"], values[f"{REFERENCE}{i}"] = t.numpy(), refs[node].numpy()
    # Room for one spread and a half: y's, counted once, and not z's.
    job = {"rounding": {"samples": 9, "value_bytes": spread_bytes(refs[ny], torch.float32) * 3 // 2}, "seed": 0}
    simulate_observables(recording.graph, records, refs, values, job, "cpu", {})
    assert [r["rounding"]["status"] for r in records] == ["judged", "not-judged", "judged", "judged"]
    assert records[1]["rounding"]["reason"] == "the spread is too large to keep"
    assert [r["rounding"].get("spread_of") for r in records] == [None, None, 0, 0]
    assert all(f"{k}0" in values for k in SPREAD_ARRAYS)
    assert not any(f"{k}{i}" in values for k in SPREAD_ARRAYS for i in (1, 2, 3))

    result = {"status": "ok", "observables": [dict(r, reference=None) for r in records]}
    run = ArmRun(spec="cpu", device="cpu", mode="eager", status="ok")
    _fill_from_result(run, result, values)
    assert [o.spread is not None for o in run.observables] == [True, False, True, True]
    assert np.array_equal(run.observables[3].spread["sig"], values["sig0"])
    assert run.observables[3].spread["sig"].dtype == np.float64  # sent in float32, read in float64
    # A pointer to another node's record is not followed: that record's arrays are another value's.
    result["observables"][1]["rounding"] = dict(records[1]["rounding"], spread_of=0)
    run = ArmRun(spec="cpu", device="cpu", mode="eager", status="ok")
    _fill_from_result(run, result, values)
    assert run.observables[1].spread is None


def test_a_zero_where_the_computation_gives_a_tiny_value_is_outside():
    """The envelope's half ulp for the arm's own final rounding was taken at 1.0 for a value of
    0 (6e-8 in float32): a 0 where every rounding gives 3e-30 was "inside". At 0 it is half the
    smallest subnormal."""
    from triage.worker.rounding import within_envelope

    x = torch.tensor([3.0, 5.0])
    out, spread, _ = simulated_spread(lambda a: a * 1e-30, x)
    assert judge_value(out.double().numpy(), spread, "cpu", 0, "y", None).zone == "inside"
    assert judge_value(np.zeros(2), spread, "cpu", 0, "y", None).zone == "outside"
    tiny = torch.tensor([3e-30], dtype=torch.float64)
    assert not within_envelope(torch.zeros(1), tiny, tiny, tiny, torch.float32)
    assert within_envelope(torch.tensor([2.0 ** -150]), torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.float32)
    zero = torch.zeros((), dtype=torch.float64)  # a 0-d value (a scalar loss): NumPy's scalars are no arrays
    assert within_envelope(torch.tensor(0.0), zero, zero, zero, torch.float32)


def test_a_sum_of_an_overflowed_term_stays_inf_in_every_replay():
    """`log(exp(t).sum())` with exp(100) past float32's range: inf in every rounding of it.
    The sum's walk is inf there too, and inf plus a walk drawn negative was a nan in some
    replays: "finite under some roundings" of a value none makes finite."""
    t = torch.tensor([[100.0, 90.0, 80.0], [1.0, 2.0, 3.0]])
    out, spread = spread_of(lambda x: torch.log(torch.exp(x).sum(-1)), t)
    assert math.isinf(float(out[0]))
    assert int(spread.nonfinite[0]) == 2  # +inf in every random replay, never finite, never nan
    assert not spread.unstable_elements().any() and not spread.computational_zeros()[0]


@pytest.mark.parametrize("op", ["mm", "bmm"])
def test_a_contraction_written_to_an_out_buffer_accumulates_as_the_plain_call(op):
    """An inductor backward computes a weight's gradient with `extern_kernels.mm(a, b, out=buf)`:
    the out= overload's accumulation is modelled as the plain call's (it had none, so a correct
    compiled gradient 15 ulp from float64 was judged 7e3σ outside a spread of one rounding)."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 24, 64, generator=g), torch.randn(2, 64, 16, generator=g)
    plain_op, (a, b) = (torch.mm, (a[0], b[0])) if op == "mm" else (torch.bmm, (a, b))

    def into_buffer(a, b):
        return plain_op(a, b, out=torch.empty(plain_op(a, b).shape))

    _, expected = spread_of(plain_op, a, b)
    out, spread = spread_of(into_buffer, a, b)
    assert np.array_equal(out.numpy(), plain_op(a, b).numpy())
    # The plain call's walk per element, far wider than the output's one rounding.
    np.testing.assert_allclose(spread.sd, expected.sd, rtol=0.5)
    assert np.median(spread.sd / np.abs(spread.mean)) > 2 * 2.0 ** -24


def test_an_in_place_op_of_unchanging_inputs_is_replayed_once():
    """`_representable` evaluates a correctly rounded op of unchanging inputs again to see
    whether its result is exact: an in-place one (`y.add_(1)` of 0/1 labels) run again wrote
    over the replay's own value."""
    labels = (torch.arange(4) % 2).float()
    x = torch.tensor([1.5, 2.5, 3.5, 4.5])
    out, spread = spread_of(lambda y, v: (y.clone().add_(1.0) * v).sum(), labels, x)
    assert float(spread.reference) == float(out) == 19.0
    assert abs(float(spread.mean) - 19.0) < 1e-5, spread.mean  # the replays' own value, not (y + 2)·v


def test_a_one_hot_matrix_cast_to_float_is_kept_not_rounded_in_every_replay():
    """`F.one_hot(idx, 64).T.float() @ w` over 200,000 indices (a new user's histogram check):
    every replay rounded the 12.8M exact elements of the cast again (0.16 s each, 81 s in all
    with the samples a false alarm asked for). A view of a kept value costs no memory, a leaf
    as recorded costs none, and an exact cast of unchanging values is kept."""
    from triage.worker import rounding

    idx = torch.randint(0, 64, (200_000,), generator=torch.Generator().manual_seed(0))
    w = torch.rand(200_000, generator=torch.Generator().manual_seed(1))
    rounded = []
    original = rounding._round_bits

    def counting(t, *args):
        rounded.append(t.numel())
        return original(t, *args)

    rounding._round_bits = counting
    try:
        out, spread = spread_of(lambda v: F.one_hot(idx, 64).T.float() @ v, w, samples=9)
    finally:
        rounding._round_bits = original
    assert max(rounded, default=0) < 1_000_000, rounded
    assert judge(out, spread).zone == "inside"


def test_a_matmul_onednn_computed_from_bfloat16_inputs_is_replayed_so():
    """`torch.set_float32_matmul_precision("medium")` on a CPU with bfloat16 arithmetic: oneDNN
    reads a float32 matmul's inputs as bfloat16, 6e-3 from float32's product on a 768-wide
    Linear, which the simulation called 2e4σ outside (a likely bug). The recorder marks such
    an op (`matmul_inputs`; here by hand, the setting and its measurement faked: not every CPU
    reads them so), and every replay rounds its inputs to bfloat16; an error beyond that is
    still outside."""
    from triage.worker import opgraph

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 256, generator=g), torch.randn(256, 16, generator=g)
    original, measured = opgraph.onednn_fp32_precision, opgraph.OpRecorder._bfloat16_candidates
    opgraph.onednn_fp32_precision = lambda name: "bf16"
    opgraph.OpRecorder._bfloat16_candidates = lambda self, func, name, args, kwargs: ("mm", None, None)
    try:
        out, spread = spread_of(lambda x: torch.mm(x, b), a)
    finally:
        opgraph.onednn_fp32_precision, opgraph.OpRecorder._bfloat16_candidates = original, measured
    bf16 = a.bfloat16().float() @ b.bfloat16().float()
    assert judge(bf16, spread).zone == "inside"
    assert spread.precision == "bfloat16"
    assert judge(bf16 + 0.05 * bf16.abs().max(), spread).zone == "outside"


def test_a_matmul_the_cpu_computed_at_float32_under_a_bfloat16_setting_is_not_replayed_from_bfloat16(monkeypatch):
    """oneDNN's float32 precision "bf16" lets it read a matmul's inputs as bfloat16; whether it
    does depends on the CPU and the sizes (an AMD EPYC with AVX512-BF16 computed a new user's
    Linear at float32). The recorder assumed it did, and the explanation said "computed at
    bfloat16" of a float32 result. It measures: this mm is float32's (the setting is faked, the
    kernel is not), so nothing is marked and the spread is float32's."""
    from triage.worker import opgraph

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 256, generator=g), torch.randn(256, 16, generator=g)
    monkeypatch.setattr(opgraph, "onednn_fp32_precision", lambda name: "bf16")
    out, spread = spread_of(lambda x: torch.mm(x, b), a)
    assert spread.precision == "float32"
    assert judge(out, spread).zone == "inside"
    assert judge(a.bfloat16().float() @ b.bfloat16().float(), spread).zone == "outside"


@torch.library.custom_op("triage_test::layer_norm", mutates_args=())
def _custom_layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    mu = xf.mean(-1, keepdim=True)
    var = xf.var(-1, keepdim=True)
    print("a script's own print, which a replay must not repeat")
    return ((xf - mu) / torch.sqrt(var + eps)).to(x.dtype)


@_custom_layer_norm.register_fake
def _(x, eps):
    return torch.empty_like(x)


def test_a_scripts_custom_op_is_replayed_through_its_own_code(capsys):
    """A `torch.library.custom_op` reached the simulation whole, as an unmeasured kernel: 16
    bfloat16 ulps of conservative noise, a spread keeping 0.9 digits, "ill-conditioned" for an
    ordinary layer norm (a new user's). Replayed through its Python code, its `x.float()`, var
    and `.to(x.dtype)` round where they do (torch's own prims, custom ops too, are not: their
    decompositions call them back)."""
    x = (torch.randn(16, 512, generator=torch.Generator().manual_seed(0)) * 2 + 1).bfloat16()
    out, spread = spread_of(lambda t: _custom_layer_norm(t, 1e-5), x)
    captured = capsys.readouterr().out
    assert captured.count("a script's own print") == 1  # the recorded call's, none from the replays
    j = judge(out.float(), spread)
    assert j.zone == "inside" and j.digits > 1.5, (j.zone, j.digits)
    assert judge(out.float() * 1.02, spread).zone == "outside"


def test_more_samples_near_the_floor_stop_at_the_budget_by_their_own_cost(monkeypatch):
    """Sampling past K where a value sits near the Monte Carlo floor is bounded by the time
    budget, at what the samples cost: a compiled graph's samples cost more than its centre
    replay, and 199 of them ran 78 s of a 60 s budget. On a clock where the centre replay takes
    1 s and each sample 1.5 s, no more samples are taken than fit."""
    import triage.worker.rounding as rounding

    clock = [0.0]
    monkeypatch.setattr(rounding.time, "monotonic", lambda: clock[0])
    replay = rounding._replay

    def timed(plan, wanted, mode, *args, **kwargs):
        centre = mode.generator is None and not mode.directed
        clock[0] += 1.0 if centre else 1.5 * max(1, mode.samples)
        return replay(plan, wanted, mode, *args, **kwargs)

    monkeypatch.setattr(rounding, "_replay", timed)
    monkeypatch.setattr(rounding, "_near_floor", lambda *args: True)  # every check asks for more
    graph, wanted, dtypes, out = recorded(lambda x: (x * 1.1).sum(), torch.linspace(0, 1, 64))
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29, budget_s=60.0), dtypes,
                            {n: out * 1.001 for n in wanted})
    assert sim.samples >= 29
    assert clock[0] <= 60.0, (sim.samples, clock[0])


@pytest.mark.parametrize(("fn", "low", "high"), [(torch.sigmoid, 0, 1), (torch.tanh, -1, 1), (torch.erf, -1, 1),
                                                 (torch.sin, -1, 1), (torch.cos, -1, 1), (torch.exp, 0, math.inf)])
def test_a_bounded_function_s_noise_stays_within_its_image(fn, low, high):
    """A library function's simulated error never carries its value out of the function's
    image: a noisy float32 sigmoid of 25 was 1 + 2⁻²³ in some replays, no kernel's value, and
    `binary_cross_entropy` of it nan (a "finite under some roundings" note and the wrong
    verdict on a correct BCE of sigmoid outputs); sigmoid and exp of −40, ill-conditioned
    there, were negative."""
    x = torch.tensor([25.0, 40.0, -40.0, 1e-3, 1.5707964, 3.1415927, 0.0])
    graph, wanted, dtypes, out = recorded(fn, x)
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29), dtypes)
    (name, reference), = wanted.items()
    spread = sim.spreads[name]
    assert spread.status == "judged"
    for values in (spread.up, spread.down, spread.mean):
        assert bool(((values >= low) & (values <= high)).all()), values


def test_a_loss_of_sigmoid_probabilities_that_round_to_one_is_finite_in_every_replay():
    """`F.binary_cross_entropy(torch.sigmoid(z), 0)` at z = 20, 25: the float32 probability is
    exactly 1, and PyTorch clamps log(1 − p) at −100, so the loss is 100 in float32 (20 in
    exact arithmetic): no digit, but never inf or nan."""
    z = torch.tensor([2.0, 15.0, 20.0, 25.0])
    graph, wanted, dtypes, out = recorded(lambda t: F.binary_cross_entropy(torch.sigmoid(t), torch.zeros(4),
                                                                           reduction="none"), z)
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29), dtypes)
    (name, _), = wanted.items()
    spread = sim.spreads[name]
    assert spread.status == "judged"
    assert bool((spread.nonfinite == 1).all()), spread.nonfinite
    assert bool(torch.isfinite(spread.up).all()) and bool(torch.isfinite(spread.down).all())


def test_an_exact_infinity_stays_itself_in_the_directed_replays():
    """log1p(−1) is −inf exactly, and a loss clamps it at −100 next: the directed replays moved
    it by b·|x| (−inf + inf, nan), and the clamp passed the nan on."""
    p = torch.tensor([0.5, 1.0, 1.0])
    graph, wanted, dtypes, out = recorded(lambda t: torch.clamp(torch.log1p(-t), min=-100.0), p)
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=9), dtypes)
    (name, _), = wanted.items()
    spread = sim.spreads[name]
    assert torch.equal(spread.up[1:], torch.tensor([-100.0, -100.0], dtype=torch.float64)), spread.up
    assert torch.equal(spread.down[1:], torch.tensor([-100.0, -100.0], dtype=torch.float64)), spread.down


def test_a_nansum_s_nan_terms_add_no_rounding():
    """`torch.nanmean` is `nansum` over a count: the walk of its sum read the nan terms, so every
    replay of a row with a nan was nan, and a correct float32 nanmean was "finite where every
    rounding of this computation is not" (a new user's: `nonfinite-flip`, NOT expected)."""
    torch.manual_seed(0)
    data = torch.randn(20, 50)
    data[torch.rand(20, 50) < 0.2] = float("nan")
    out, spread = spread_of(lambda t: torch.nanmean(t, dim=1), data)
    assert bool(np.isfinite(spread.sigma).all()) and bool((spread.nonfinite == 1).all()), spread.nonfinite
    assert judge(out, spread).zone == "inside"


@pytest.mark.parametrize("make", [
    lambda: torch.logspace(0, 4, steps=9, dtype=torch.float16),
    lambda: torch.linspace(0, 3, 10, dtype=torch.bfloat16),
    lambda: torch.linspace(-7.3, 123.1, 12345),  # near 0 its kernel errs 7,800 ulp of the element
    lambda: torch.arange(0.1, 100.3, 0.1, dtype=torch.float16),
])
def test_a_factory_in_a_narrow_dtype_is_the_rounding_of_its_float64_call(make):
    """`torch.logspace(0, 4, 9, dtype=torch.float16)` against the same call in float64: the
    float16 values were their own float64 reference with a spread of 0, and a correctly rounded
    logspace was "a different function" (a new user's false `likely-bug`). The float64 call is
    the reference, and the arm's values are inside the spread of the kernel's rounding of it."""
    out, spread = spread_of(lambda: make().double())
    reference = torch.from_numpy(spread.reference)
    assert not torch.equal(reference, out), "the reference is the float64 call, not the arm's values"
    assert judge(out, spread).zone == "inside"


def test_a_factory_whose_float64_call_leaves_every_range_keeps_its_values():
    """`torch.logspace(-400, 0, 5, dtype=torch.float16)`: its float64 call underflows to 0, whose
    exponent is -inf; no error bound follows from it, and the values stay as recorded."""
    out, spread = spread_of(lambda: torch.logspace(-400, 0, 5, dtype=torch.float16).double())
    assert judge(out, spread).zone == "inside"


def test_the_fewest_samples_are_taken_where_only_the_clock_is_slow(monkeypatch):
    """On a machine busy with other jobs a centre replay's clock time ran 10× its work (5.9 s
    for 25 ops), one replay short of "9 samples", and the value went unjudged: the fewest
    samples are decided by the replay's own CPU time where the clock says more, within a
    quarter past the budget. Where the work itself is that slow, the budget still says no."""
    import triage.worker.rounding as rounding

    clock, cpu = [0.0], [0.0]
    monkeypatch.setattr(rounding.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(rounding.time, "process_time", lambda: cpu[0])
    replay = rounding._replay

    def slow_clock(plan, wanted, mode, *args, **kwargs):
        clock[0] += busy[0]  # at 6 s: 60 / 6 − 2 = 8 replays by the clock, one short
        cpu[0] += working[0]
        return replay(plan, wanted, mode, *args, **kwargs)

    monkeypatch.setattr(rounding, "_replay", slow_clock)
    graph, wanted, dtypes, out = recorded(lambda x: (x * 1.1).sum(), torch.linspace(0, 1, 64))
    busy, working = [6.0], [0.5]
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29, budget_s=60.0), dtypes)
    assert sim.samples >= 9 and all(s.status == "judged" for s in sim.spreads.values()), sim.note
    # The work itself that slow, or the clock so slow that 9 samples overrun the budget by more
    # than a quarter: not judged, as before.
    for busy[0], working[0] in ((6.0, 6.0), (12.0, 0.5)):
        clock[0] = cpu[0] = 0.0
        sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29, budget_s=60.0), dtypes)
        assert sim.samples == 0 and "do not fit the 60 s budget" in sim.note


def test_a_centre_replay_that_imports_modules_is_timed_again_without_them(monkeypatch):
    """A meta function's or a decomposition's first call imports torch's symbolic shapes and
    sympy: 0.6 s here, 40 s on a machine busy with other jobs, inside the centre replay whose
    time the budget multiplies by the samples. gh-37130's 8 ops and gh-158310's 17 went
    unjudged so, and a correct fp16 LogSoftmax was called a bug by float64 alone. An import
    happens once per process: the replay is timed again without it."""
    import sys
    import types

    import triage.worker.rounding as rounding

    clock = [0.0]
    monkeypatch.setattr(rounding.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(rounding.time, "process_time", lambda: clock[0])
    replay, calls = rounding._replay, []

    def importing_first(plan, wanted, mode, *args, **kwargs):
        if not calls:  # the first replay imports a module, and takes most of the budget
            monkeypatch.setitem(sys.modules, "triage_test_imported_once", types.ModuleType("imported_once"))
            clock[0] += 50.0
        clock[0] += 0.1
        calls.append(mode.generator is None and not mode.directed)
        return replay(plan, wanted, mode, *args, **kwargs)

    monkeypatch.setattr(rounding, "_replay", importing_first)
    graph, wanted, dtypes, out = recorded(lambda x: (x * 1.1).sum(), torch.linspace(0, 1, 64))
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29, budget_s=60.0), dtypes)
    assert sim.samples >= 9 and all(s.status == "judged" for s in sim.spreads.values()), sim.note
    assert calls[:2] == [True, True]  # the centre replay, then its timing without the import
    # Where nothing was imported, a replay that slow is every replay's cost: not judged.
    calls.clear()
    clock[0] = 0.0
    monkeypatch.setattr(rounding, "_replay", lambda *a, **k: (clock.__setitem__(0, clock[0] + 50.1),
                                                               replay(*a, **k))[1])
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29, budget_s=60.0), dtypes)
    assert sim.samples == 0 and "do not fit the 60 s budget" in sim.note


def test_a_softmax_errs_relative_to_each_probability_so_an_underflow_stays_zero_and_is_named():
    """exp(-200) is 1.4e-87, below float32's smallest positive value: the kernel gives 0, and
    log of it −inf. At the output scale's error (±2e-7) the replays gave negative and finite
    probabilities, never 0, and the arm's −inf was "no rounding gives it"."""
    logits = torch.tensor([[0.0, 200.0, -200.0]])
    graph, wanted, dtypes, out = recorded(lambda x: torch.log(torch.softmax(x, dim=1)), logits)
    (name, reference), = wanted.items()
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29), dtypes, {name: out.double()})
    spread = sim.spreads[name]
    assert spread.status == "judged", spread.reason
    assert out[0, 0] == -math.inf and math.isfinite(float(reference[0, 0]))
    # Every random replay gives −inf there (bit 4), as every float32 softmax does.
    assert spread.nonfinite[0, 0] == 4 and spread.nonfinite[0, 2] == 4 and spread.nonfinite[0, 1] == 1
    assert spread.overflow["op"] == "aten.log" and spread.overflow["underflow"]["op"] == "aten._softmax"
    assert spread.overflow["underflow"]["smallest"] == pytest.approx(1.4e-45, rel=0.01)
    assert spread.overflow["zeros"] is True


def test_a_log_of_a_difference_float16_cancels_to_zero_is_its_exact_answer_at_zero():
    """A focal loss in float16 (nu25 c20): sigmoid(9) rounds to 1, `1 - p` to 0, and log of it
    is −inf — the log's exact answer at 0, which the verdict says with the cancelling op, not
    "a value past the range"."""
    from tests.test_ladder import arm, obs, verdict

    x = torch.tensor([9.0, 0.5], dtype=torch.float16)
    graph, wanted, dtypes, out = recorded(lambda t: torch.log(1 - torch.sigmoid(t)), x)
    (name, reference), = wanted.items()
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29), dtypes, {name: out.double()})
    spread = sim.spreads[name]
    assert spread.overflow["op"] == "aten.log" and spread.overflow["zeros"] is True and spread.overflow["underflow"] is None
    o = obs(0, [-math.inf, -0.97], [-9.0001, -0.974], dtype="float16", label="`loss`")
    o.rounding = {"status": "judged", "samples": 29, "sample_stats": [0.0] * 29, "flips": [], "precision": "float16",
                  "unmeasured": [], "overflow": dict(spread.overflow, line=8),
                  "cancellations": [{"op": "aten.rsub", "line": 7, "kind": "cancels", "digits_lost": "inf"}]}
    o.spread = {"sig": np.array([0.0, 1e-3]), "up": np.array([-math.inf, -0.97]), "dn": np.array([-math.inf, -0.98]),
                "mu": np.array([-math.inf, -0.974]), "sd": np.array([0.0, 1e-4]), "nf": np.array([4, 1], np.uint8)}
    v = verdict(arm("cpu", [o]))
    assert v.kind == "nonfinite-flip" and v.expected is True, v.summary
    assert ("`aten.rsub` at line 7 cancels its operands to 0 at float16, and `aten.log` at line 8 turns the 0 into ±inf, "
            "its exact answer at 0") in v.summary, v.summary


def test_a_softmax_replay_never_gives_a_negative_probability():
    x = torch.tensor([[0.0, 30.0, -30.0, 5.0]])
    out, spread, _ = simulated_spread(lambda t: torch.softmax(t, dim=1), x)
    assert (spread.down >= 0).all() and (spread.mean >= 0).all()


def _rk4(y0, h, steps=200):
    """Classical RK4 for dy/dt = -2ty + sin t, its time kept as `t = t + h` (float32 drops the
    same part of an ulp of h at every step: 13 ulps in 200, all one way)."""
    def f(t, y):
        return -2.0 * t * y + torch.sin(t)

    t = torch.zeros((), dtype=y0.dtype)
    y = y0
    for _ in range(steps):
        k1 = f(t, y)
        k2 = f(t + h / 2, y + h / 2 * k1)
        k3 = f(t + h / 2, y + h / 2 * k2)
        k4 = f(t + h, y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        t = t + h
    return y


def test_a_value_the_replay_rounding_to_nearest_reproduces_is_biased_rounding_not_another_computation():
    """Random rounding walks the loop's time unbiased (about 4 ulps in 200 steps); the arm's
    round to nearest drifts 13 ulps one way, and its y lands beyond the random replays. The
    replay that rounds every op to nearest lands where the arm does; an error of 1e-5 in the
    arm's value is not there."""
    y0, h = torch.linspace(-1.0, 1.0, 8), torch.tensor(0.01)
    graph, wanted, dtypes, out = recorded(_rk4, y0, h)
    (name, reference), = wanted.items()
    sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29), dtypes, {name: out.double()})
    spread = RoundingSpread.of_simulation(sim.spreads[name], reference.numpy(), "float32")
    j = judge(out, spread)
    assert j.zone == "inside" or (j.zone, j.nearest) == ("envelope", True), (j.zone, j.p)
    # The replay rounding to nearest is the arm's arithmetic: nearer the arm than float64 is, by far.
    arm = out.double().numpy()
    assert np.abs(arm - spread.centre).max() < np.abs(arm - reference.numpy()).max() / 10
    assert judge(out.double() * (1 + 1e-5), spread).zone == "outside"


def test_a_number_the_script_passes_is_an_input_where_values_leave_the_range():
    """`masked_fill(mask, float("-inf"))` writes the script's own −inf: no op left the range
    (a twenty-fourth new user's fully masked attention row was said to overflow there). A
    product past float16's largest, from finite inputs, still is where the range is left."""
    from types import SimpleNamespace

    from triage.worker.rounding import _leaves_range

    node = SimpleNamespace(target=torch.ops.aten.masked_fill.Scalar, meta={"line": 7})
    x, mask = torch.zeros(3, dtype=torch.float64), torch.tensor([True, False, True])
    out = x.masked_fill(mask, float("-inf"))
    out._arm_dtype = torch.float32
    assert _leaves_range(node, (x, mask, float("-inf")), out, []) is None
    node = SimpleNamespace(target=torch.ops.aten.mul.Tensor, meta={"line": 9})
    big = torch.full((2,), 300.0, dtype=torch.float64)
    out = torch.full((2,), math.inf, dtype=torch.float64)
    out._arm_dtype = torch.float16
    left = _leaves_range(node, (big, big), out, [None, None])
    assert left is not None and (left["op"], left["kind"], left["dtype"]) == ("aten.mul", "overflow", "float16")


def test_an_inf_beside_zeros_is_from_zeros_only_where_it_sits_on_them():
    """`c ** 3` of centred float16 values with an exact 0 among them leaves the range at the
    large ones (the skewness test): not "its exact answer at 0"; `log` of a 0 is."""
    c = torch.tensor([0.0, 60.0, -2.0], dtype=torch.float64)
    from triage.worker import rounding

    assert not rounding._nonfinite_at_zeros((c, 3), torch.tensor([0.0, math.inf, -8.0]))
    assert rounding._nonfinite_at_zeros((torch.tensor([0.0, 2.0]),), torch.tensor([-math.inf, 0.69]))
    assert rounding._nonfinite_at_zeros((torch.tensor([[0.0], [1.0]]),), torch.tensor([[-math.inf, -math.inf], [0.0, 0.0]]))


@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist_if_necessary", "donot_use_mm_for_euclid_dist"])
def test_cdists_matmul_path_is_noted_where_near_points_cancel(mode):
    """32 rows take cdist's matmul path, ‖x‖² + ‖y‖² − 2x·y, which for points 1e-3 apart with
    norms near 40 keeps none of float32's digits: noted at the cdist call with the compute_mode
    that avoids it. Computed from the differences, nothing cancels and nothing is noted."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 16, generator=g) * 10
    y = x + 1e-3 * torch.randn(32, 16, generator=g)
    _, _, sim = simulated_spread(lambda a, b: torch.cdist(a, b, compute_mode=mode).diagonal(), x, y, samples=9)
    (spread,) = sim.spreads.values()
    sites = [s for s in spread.cancellations if s["op"].split(".")[1] in ("_cdist_forward", "_euclidean_dist")]
    if mode.startswith("donot"):
        assert not sites
    else:
        assert sites and sites[0]["digits_lost"] > 7 and "donot_use_mm_for_euclid_dist" in sites[0]["hint"], sites


def test_an_absorbing_site_notes_float64s_own_error_there():
    """`1 + e⁻⁴⁰` read by a logarithm absorbs every digit of e⁻⁴⁰ in float32 and in float64
    alike: the note carries float64's own error at that site, u64·|1 + x|, which bounds how
    exact the float64 replay of this side is (the ladder's different-functions test)."""
    x = torch.tensor([-18.0, -25.0, -40.0])
    _, _, sim = simulated_spread(lambda t: torch.log(1 + torch.exp(t)), x, samples=9)
    (spread,) = sim.spreads.values()
    (site,) = [s for s in spread.cancellations if s["kind"] == "absorbs"]
    assert site["reference_error"] == pytest.approx(2.0 ** -53 * (1 + math.exp(-18)), rel=1e-2)


@pytest.mark.parametrize("op, root", [(torch.ops.aten.silu_backward.default, -1.2784645),
                                      (torch.ops.aten.gelu_backward.default, -0.7517916)])
def test_a_backward_kernel_near_its_roots_is_inside(op, root):
    """SiLU's derivative σ(x)(1 + x(1 − σ(x))) and GELU's Φ(x) + xφ(x) cross zero: there a
    correct float32 kernel errs by u of its inputs, not of its result. Bounded by 16 u of the
    result alone (unmeasured, as the table then was), the correct kernel was 1e4σ outside and
    called a bug; an unmeasured op gets the conservative bound where its function is
    ill-conditioned too, and the measured one its measured error of its inputs there."""
    x = root + torch.linspace(-1e-3, 1e-3, 257)
    g = torch.randn(257, generator=torch.Generator().manual_seed(0))
    out, spread = spread_of(lambda a, b: op(a, b), g, x)
    assert judge(out, spread).zone == "inside"


def test_a_bfloat16_gradient_computed_in_float32_keeps_float32s_error_in_its_tail():
    """bfloat16 GELU's gradient is computed in float32, whose Φ(x) + xφ(x) cancels to exactly
    0 for x near −6 where the true value is −1e-8: float32's error of its inputs, which the
    bfloat16 entry (in its own units) measured as 0. The correct kernel was 42σ outside."""
    x = torch.linspace(-7.0, -5.0, 200).bfloat16()

    def gradient(t):
        t = t.detach().requires_grad_()
        (g,) = torch.autograd.grad(F.gelu(t).sum(), t)
        return g

    out, spread = spread_of(gradient, x)
    assert int((out == 0).sum()) > 0
    assert judge(out, spread).zone == "inside"


def test_a_softmax_gradient_errs_relative_to_each_probability():
    """The softmax gradient yᵢ·(gᵢ − Σ gⱼyⱼ) carries each probability's scale: its kernel's
    error added at the output's scale left the gradients of probabilities far below the
    largest with 1.6 digits in float32, and a float16 softmax gradient against float32's
    was called ill-conditioned."""
    g = torch.Generator().manual_seed(0)
    logits, upstream = torch.randn(8, 300, generator=g) * 4, torch.randn(8, 300, generator=g)
    out, spread = spread_of(
        lambda x: torch.ops.aten._softmax_backward_data(upstream, torch.softmax(x, -1), -1, torch.float32), logits)
    assert spread.digits() > 4.5
    assert judge(out, spread).zone == "inside"


def test_a_function_ill_conditioned_at_its_inputs_is_named_as_the_figure():
    """float16 tanh saturates: y rounds to within a few spacings of 1, and `tanh_backward`'s
    1 − y² keeps no digit. No subtraction of the script's cancels, yet that op is why the
    gradient keeps none: it is noted beside the cancellations, by the digits it loses."""
    x = torch.linspace(2.0, 6.0, 9).half()

    def gradient(a):
        a = a.detach().requires_grad_()
        torch.tanh(a).sum().backward()
        return a.grad

    _, _, sim = simulated_spread(gradient, x)
    (spread,) = sim.spreads.values()
    (site,) = [s for s in spread.cancellations if s["kind"] == "amplifies"]
    assert site["op"] == "aten.tanh_backward" and site["digits_lost"] >= 3
    _, _, calm = simulated_spread(gradient, torch.linspace(-0.5, 0.5, 9).half())
    assert not [s for s in next(iter(calm.spreads.values())).cancellations if s["kind"] == "amplifies"]


def test_a_library_kernels_result_below_the_smallest_normal_may_lose_every_digit():
    """float32 `sigmoid(−96.8)` is 1/(1 + exp(96.8)) = 1/inf = 0, where the exact 9.1e-43 is a
    subnormal: the table measures kernels on normal results only, and a subnormal result
    keeps no guaranteed digit (the accuracy note's extremal values). Its spread reaches 0;
    the eager kernel was called a bug."""
    x = torch.tensor([-96.8, -90.0, -3.0, 0.5])
    out, spread = spread_of(torch.sigmoid, x)
    assert float(out[0]) == 0.0
    assert judge(out, spread).zone == "inside"


def test_the_largest_finite_magnitude_skips_infinities_without_copying_finite_values():
    from triage.worker.rounding import _largest_finite

    assert _largest_finite(torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64)) == 3.0
    assert _largest_finite(torch.tensor([1.0, math.inf, math.nan, 2.0], dtype=torch.float64)) == 2.0
    assert _largest_finite(torch.tensor([], dtype=torch.float64)) == 0.0
    assert _largest_finite(2.5) == 2.5 and _largest_finite(math.inf) == 0.0


def test_a_selection_among_exactly_equal_values_is_flagged_as_a_tie():
    """`topk` over twelve equal 0.9s (nu27 t01): the replays round the equal values apart, so
    the indices switch from replay to replay; the flip says the op picked among a tie, whose
    order is the op's own choice. Distinct values that rounding brings close are no tie."""
    from triage.worker.rounding import _exact_ties

    tied = torch.tensor([0.5, 0.9, 0.1, 0.9, 0.3, 0.9, 0.7, 0.2] * 4)
    graph, wanted, dtypes, _ = recorded(lambda t: torch.topk(t * 3, 5).indices.double(), tied)
    flips = simulate_rounding(graph, wanted, SimulationOptions(samples=9), dtypes).spreads[next(iter(wanted))].flips
    assert flips and all(f.get("ties") for f in flips if f["op"] == "aten.topk")
    near = torch.tensor([0.5, 0.9, 0.1, 0.9 + 2e-7, 0.3, 0.9 - 3e-7, 0.7, 0.2])
    graph, wanted, dtypes, _ = recorded(lambda t: torch.topk(t * 3, 2).indices.double(), near)
    flips = simulate_rounding(graph, wanted, SimulationOptions(samples=29), dtypes).spreads[next(iter(wanted))].flips
    assert not any(f.get("ties") for f in flips)
    aten = torch.ops.aten
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 1.0, 0.0]], dtype=torch.float64)
    assert _exact_ties(aten.max.dim, (x, 1), {}, x.max(1)) and not _exact_ties(aten.max.dim, (x[1:], 1), {}, x[1:].max(1))
    assert _exact_ties(aten.sort.default, (x[0],), {}, torch.sort(x[0])) and not _exact_ties(
        aten.sort.default, (x[1],), {}, torch.sort(x[1]))
    assert not _exact_ties(aten.max.default, (x,), {}, x.max())  # a value, no index to choose
    w = torch.tensor([1.0, 2.0, 3.0, 3.0], dtype=torch.float64)
    assert _exact_ties(aten.topk.default, (w, 1), {}, torch.topk(w, 1))  # the k-th also left out
    assert not _exact_ties(aten.topk.default, (w, 2, -1, False), {}, torch.topk(w, 2, largest=False))


def test_the_output_dtypes_of_a_pooling_backward_are_found_on_whole_stand_ins():
    """The output dtypes of `adaptive_max_pool3d_backward` were found on broadcast stand-ins,
    which torch 2.13's kernel reads past: the process died (the gradients bench, and any
    script's gradient through `adaptive_max_pool3d`). An op with an integer (index) input
    gets whole stand-ins, indices 0."""
    from triage.worker.rounding import RoundingMode, _CallCache

    x = torch.randn(1, 4, 4, 3, 5, dtype=torch.float64)
    out, indices = F.adaptive_max_pool3d(x, (2, 2, 2), return_indices=True)
    grad = torch.ones_like(out)
    for t in (grad, x):
        t._arm_dtype = torch.float32
    func = torch.ops.aten.adaptive_max_pool3d_backward.default
    mode = RoundingMode(SimulationOptions(), _CallCache(), direction=0, generator=None)
    args = (grad, x, indices)
    assert mode._output_dtypes(func, args, {}, list(args)) == [torch.float32]


@pytest.mark.parametrize("layout", ["rows", "image"])
def test_batch_norm_statistics_of_rows_add_in_float32_row_after_row(layout):
    """An N×C (or channels-last) input's batch statistics are float32 sums, one row after
    another per thread (ATen's channels-last path), not lanes: on one thread a correct kernel's
    mean of 4096 rows erred 23 ulp where the lanes' model spread 2.7 ("outside"). An N×C×H×W
    input's sums are in double; both are inside."""
    x = torch.rand(4096, 3, generator=torch.Generator().manual_seed(0)) + 1
    x = x if layout == "rows" else x.t().reshape(1, 3, 64, 64).contiguous()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mean, spread = spread_of(
            lambda v: torch.ops.aten.native_batch_norm(v, None, None, None, None, True, 0.1, 1e-5)[1], x)
    finally:
        torch.set_num_threads(threads)
    assert judge(mean, spread).zone == "inside"
    assert judge(mean * (1 + 1e-4), spread).zone == "outside"


def test_an_op_the_replay_cannot_take_loses_only_the_values_downstream_of_it(monkeypatch):
    """A failure of the rounding replay at one op left every observed value unjudged, those
    that never read it too. A fault made on purpose (`cos` raises in the replay): the value
    computed from `cos` says why it is unjudged, the one from `sin` is judged as before."""
    from triage.worker.rounding import RoundingMode

    x = torch.linspace(0.1, 3.0, 64)
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        a = (x.sin() * 3).sum()
        b = (x.cos() * 3).sum()
    recording = recorder.finish()
    na, nb = recorder.lookup(a), recorder.lookup(b)
    references = replay_fp64(recording.graph, {na.name, nb.name}, 60).values
    wanted = {na.name: references[na.name], nb.name: references[nb.name]}
    dtypes = {na.name: torch.float32, nb.name: torch.float32}
    clean = simulate_rounding(recording.graph, wanted, SimulationOptions(samples=29), dtypes)

    round_op = RoundingMode.round_op

    def faulty(self, func, args, kwargs):
        if func is torch.ops.aten.cos.default:
            raise RuntimeError("a fault made on purpose")
        return round_op(self, func, args, kwargs)

    monkeypatch.setattr(RoundingMode, "round_op", faulty)
    sim = simulate_rounding(recording.graph, wanted, SimulationOptions(samples=29), dtypes)
    assert sim.spreads[nb.name].status == "not-judged"
    assert "cos could not be replayed" in sim.spreads[nb.name].reason
    assert sim.spreads[na.name].status == "judged"
    assert torch.equal(sim.spreads[na.name].sigma, clean.spreads[na.name].sigma)


def test_an_lstm_on_onednn_rounds_as_its_steps():
    """`aten.mkldnn_rnn_layer` (nn.LSTM on the CPU) is simulated step by step: the kernel's
    value is inside, one perturbed by 1e-4 outside (its replay raised, and no value downstream
    of an LSTM was judged)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 8)
    x = torch.randn(40, 2, 6)
    with torch.no_grad():
        out, spread = spread_of(lambda v: lstm(v)[0], x)
    assert judge(out, spread).zone == "inside"
    assert judge(out * (1 + 1e-4), spread).zone == "outside"


def test_a_python_float_operand_is_read_at_float32_as_aten_reads_it():
    """`randn(...) * 1e-3` multiplies by float32's 0.0010000000475: the kernel's product is
    a neighbour of that, up to 2 ulp from x·10⁻³, where no rounding of the float64 product
    reaches ("outside", a kernel bug called on a new user's input). A product 1e-4 off is
    still outside."""
    r = torch.randn(4, 16, 128, generator=torch.Generator().manual_seed(0))
    out, spread = spread_of(lambda v: v * 1e-3, r)
    assert judge(out, spread).zone == "inside"
    assert judge(out * (1 + 1e-4), spread).zone == "outside"


def test_an_infinite_statistic_is_ordered_by_its_unmoved_elements():
    """A float16 product whose exact value is representable (9/16384) rounds there in nearly
    every replay: a sample that alone rounds elsewhere scores inf at that element. A value 1 %
    off scores inf too, at every such element, and beside one such sample it was 'inside'
    (p = 2/30); counted by those elements it is outside, and the kernel's own value inside."""
    r = torch.randn(4, 16, 128, generator=torch.Generator().manual_seed(0)).half()
    out, spread = spread_of(lambda v: v * 1e-3, r)
    assert spread.sample_unmoved is not None
    assert judge(out, spread).zone == "inside"
    assert judge(out.double() * 1.01, spread).zone == "outside"


def test_one_representable_number_from_a_value_no_replay_moves_is_rounding():
    """A bilinear interpolation's output at a source point (weights 0 and 1) is exact in every
    replay, and the kernel, computing its weights another way, landed on the next float32: 'inf σ',
    a false alarm on OpInfo's own sample. PyTorch promises no correctly rounded kernel: one
    spacing of the stored dtype from such a value is rounding, two are not."""
    x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    out, spread = spread_of(lambda v: torch.nn.functional.interpolate(v, (5, 5), mode="bilinear",
                                                                       align_corners=True), x)
    exact = spread.sigma == 0
    assert exact.any()  # the corners: weights 1 and 0
    v = spread.reference.copy()  # every element on its float64 value, but one
    i = np.flatnonzero(exact.reshape(-1))[0]
    step = float(np.spacing(np.float32(abs(v.reshape(-1)[i]))))
    v.reshape(-1)[i] += step
    assert judge(v, spread).zone == "inside"
    v.reshape(-1)[i] += step
    assert judge(v, spread).zone == "outside"
