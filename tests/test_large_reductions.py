"""Large sums and means drawn whole (triage/worker/rounding.py `_Collapsed`): the rounding of
terms computed elementwise from leaves reaches the reduction as one normal error, measured
from a full replay, instead of every term being rounded in every replay. The spread it
gives must be the one the full replays give, correlations between reductions of the same
terms included, and an error in a large sum must still be found."""
import numpy as np
import pytest
import torch
from conftest import simulated_spread

from triage.judge import judge_value
from triage.worker import rounding

TERMS = 1 << 17  # above ANALYTIC_TERMS: drawn whole


def simulated(fn, *inputs, samples=59):
    """Record fn eagerly, simulate its rounding: (arm value, RoundingSpread, reductions drawn whole)."""
    out, spread, sim = simulated_spread(fn, *inputs, samples=samples)
    return out, spread, sim.drawn_whole


def replayed_in_full(monkeypatch, fn, *inputs):
    """The same simulation with every term rounded in every replay (nothing drawn whole)."""
    monkeypatch.setattr(rounding, "ANALYTIC_TERMS", 1 << 62)
    out, spread, drawn = simulated(fn, *inputs)
    monkeypatch.undo()
    assert drawn == []
    return out, spread


def judge(value, spread):
    v = value.detach().double().numpy() if isinstance(value, torch.Tensor) else np.asarray(value, dtype=np.float64)
    return judge_value(v, spread, "arm", 0, "value", None)


def terms(seed=0):
    return torch.randn(TERMS, generator=torch.Generator().manual_seed(seed))


def test_large_half_sum_is_drawn_whole_with_the_spread_of_full_replays(monkeypatch):
    # Terms rounded to bfloat16 (2^-9 relative), summed in float32: their rounding is most of
    # the sum's spread, so a model that lost or doubled it would show.
    fn = lambda x: (x * 1.1 + 0.5).bfloat16().float().sum()  # noqa: E731
    x = terms()
    out, whole, drawn = simulated(fn, x)
    assert drawn == ["sum_default"]
    _, full = replayed_in_full(monkeypatch, fn, x)
    ratio = float(whole.sigma) / float(full.sigma)
    assert 1 / 1.5 < ratio < 1.5, ratio
    assert judge(out, whole).zone == "inside"


def test_reductions_of_the_same_terms_are_drawn_together(monkeypatch):
    # Two means of the same bfloat16 terms (widened exactly): their difference keeps only the
    # float32 mean's own accumulation; drawn independently it would carry the terms' rounding
    # twice, a hundred times wider.
    fn = lambda x: (lambda y: y.float().mean().double() - y.double().mean())((x * 1.1).bfloat16())  # noqa: E731
    x = terms(1)
    out, whole, drawn = simulated(fn, x)
    assert sorted(drawn) == ["mean_default", "mean_default_1"]
    _, full = replayed_in_full(monkeypatch, fn, x)
    assert float(whole.sigma) < 3 * float(full.sigma), (float(whole.sigma), float(full.sigma))
    assert judge(out, whole).zone == "inside"


@pytest.mark.parametrize("eps", [1e-4, 1e-5])
def test_an_error_in_a_large_sum_is_still_found(eps):
    x = terms(2)
    out, spread, drawn = simulated(lambda t: (t * 1.1 + 3.0).sum(), x, samples=29)
    assert drawn == ["sum_default"]
    assert judge(out, spread).zone == "inside"
    assert judge(out.double() * (1 + eps), spread).zone == "outside"


def test_a_broadcast_computed_value_is_not_drawn_whole():
    # A rounded scalar shared by every term errs coherently, not independently: replayed.
    x = terms(3)
    scale = torch.tensor(3.0)
    _, _, drawn = simulated(lambda t, s: (t * (s / 7.0)).sum(), x, scale, samples=9)
    assert drawn == []


def test_terms_nonlinear_in_their_roundings_are_not_drawn_whole():
    # x² of rounded terms is biased by the roundings' variance, n times: the full replays keep
    # that bias, a zero-mean draw would not.
    x = terms(4)
    _, _, drawn = simulated(lambda t: (t * 1.1).bfloat16().float().square().sum(), x, samples=9)
    assert drawn == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rounding_on_the_bits_of_a_large_tensor_is_the_same_rounding(dtype):
    # Directed: identical to the general path. Stochastic: on the dtype, between the two
    # neighbours, unbiased.
    scale = 10.0 ** torch.randint(-3, 4, (4096,), generator=torch.Generator().manual_seed(5))
    x = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(6)) * scale
    x[:3] = torch.tensor([0.0, -1.0, 2.5])
    bits = {d: rounding.round_to(x, dtype, d, None) for d in (1, -1)}
    g = rounding.Draws(7)
    draws = torch.stack([rounding.round_to(x, dtype, 0, g) for _ in range(400)])
    for d, value in bits.items():
        assert torch.equal(value, rounding._round_by_spacing(x, *rounding.FORMATS[dtype], d, None))
    assert torch.equal(draws.to(dtype).double(), draws)
    assert bool(((draws >= bits[-1]) & (draws <= bits[1])).all())
    ulp = bits[1] - bits[-1]
    moved = ulp > 0
    bias = ((draws.mean(0) - x)[moved] / ulp[moved]).mean()
    assert abs(float(bias)) < 0.01


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 1023, 4097])
def test_directed_pairwise_sum_brackets_the_sum_within_its_bound_on_any_length(n):
    # Every partial sum rounded up (down) in float32: the result is at or above (below) the
    # exact float64 sum, by at most ⌈log2 n⌉ + 1 roundings of Σ|t| (the odd levels' last
    # terms join at the end); terms that are small integers add exactly either way.
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g, dtype=torch.float64).float().double()
    exact = float(x.sum())
    up = float(rounding._directed_pairwise_sum("sum", (x,), {}, torch.float32, 1))
    down = float(rounding._directed_pairwise_sum("sum", (x,), {}, torch.float32, -1))
    bound = (max(1, (n - 1).bit_length()) + 1) * 2.0 ** -24 * float(x.abs().sum())
    assert down <= exact <= up and up - exact <= bound and exact - down <= bound
    integers = torch.randint(-1000, 1000, (n,), generator=g).double()
    for direction in (1, -1):
        assert float(rounding._directed_pairwise_sum("sum", (integers,), {}, torch.float32, direction)) \
            == float(integers.sum())


def test_a_stack_adds_its_directed_rows_alone_and_each_as_on_its_own():
    # The random samples of a stack take their walk, not the directed sum: only the ±1 rows are
    # added, each exactly as a replay of its own direction adds it.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3001, 2, generator=g, dtype=torch.float64)
    directions = torch.tensor([1.0, 0.0, -1.0, 0.0, 1.0], dtype=torch.float64)
    seen = []
    original = rounding.round_to

    def round_to(t, dtype, direction, generator):
        seen.append(t.shape[0])
        return original(t, dtype, direction, generator)

    rounding.round_to = round_to
    try:
        stacked = rounding._directed_pairwise_sum("mean", (x, [0]), {}, torch.float32, directions, True)
    finally:
        rounding.round_to = original
    assert set(seen) == {3}  # rows 0, 2 and 4 only
    for k in (0, 2, 4):
        alone = rounding._directed_pairwise_sum("mean", (x[k], [0]), {}, torch.float32, int(directions[k]))
        assert torch.equal(stacked[k], alone)


def test_replays_of_large_values_run_on_the_arms_threads_and_small_ones_on_one(monkeypatch):
    seen = []
    original = rounding._replay

    def replay(plan, wanted, mode, *args):
        seen.append(torch.get_num_threads())
        return original(plan, wanted, mode, *args)

    monkeypatch.setattr(rounding, "_replay", replay)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        simulated(lambda t: (t * 3).sum(), torch.randn(rounding.PARALLEL_ELEMENTS, generator=torch.Generator().manual_seed(4)),
                  samples=9)
        large, seen[:] = list(seen), []
        simulated(lambda t: (t * 3).sum(), terms(4)[:1000], samples=9)
        assert set(large) == {2} and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_an_accumulator_past_the_dtypes_range_may_overflow_where_the_result_fits():
    # gh-44350: the float32 mean of three 3e38 is 3e38, but a kernel that accumulates the
    # sum in float32 passes the range on the way (the CPU's gives inf): extremal values, which
    # the accuracy note allows. Some replays overflow, so inf and a finite mean are both inside.
    x = torch.tensor([3e38, 3e38, 3e38])
    for fn, finite in ((torch.mean, 3e38), (torch.var, 0.0)):  # var: its kernel sums the terms too
        _, spread, _ = simulated_spread(fn, x)
        assert spread.unstable_nonfinite() == 1  # finite in some replays, +inf in others
        for value in (np.inf, finite):
            j = judge_value(np.array(value, dtype=np.float32), spread, "cpu", 0, fn.__name__, 3)
            assert j.zone != "outside" and not (j.nonfinite or "").startswith("outside"), (fn, value, j)
    # Far inside the range, no replay overflows.
    _, small, _ = simulated_spread(torch.mean, x / 1e10)
    assert small.unstable_nonfinite() == 0 and int(small.nonfinite) == 1


def test_side_by_side_arms_share_the_cores_in_their_simulations(monkeypatch):
    """Two arms ran side by side, each simulating a million-element value on all of a
    2-core machine's threads: OpenMP's waiting threads made the simulation three times as
    long (6.5 s against 1.9 s). The parent gives each arm its share of the cores, and the
    simulation of a large value uses no more (nor more than the script ran on)."""
    import triage.arms.run as arm_run
    from triage.arms.spec import parse_arms
    from triage.model import Repro
    from triage.settings import RunSettings

    given = []
    monkeypatch.setattr(arm_run, "run_arm", lambda repro, arm, options, memory, reporter, how, threads:
                        given.append(threads) or arm_run.ArmRun(spec=arm.spec, device="cpu", mode="eager",
                                                                 status="ok"))
    monkeypatch.setattr(arm_run, "EnvironmentCache", lambda *a: type("Hit", (), {"get": lambda self: "env"})())
    monkeypatch.setattr(arm_run.os, "cpu_count", lambda: 8)
    repro = Repro(path="x.py", name="x.py", source="")
    arm_run.run_arms(repro, parse_arms("cpu,cpu/compile"), RunSettings(isolation="process"))
    arm_run.run_arms(repro, parse_arms("cpu"), RunSettings(isolation="process"))
    assert given == [4, 4, 8]

    used = []
    monkeypatch.setattr(rounding, "_parallel", lambda threads, largest: used.append(threads))
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        x = torch.linspace(1, 2, 1 << 17)
        simulated_spread(lambda a: a * 3 + 1, x, samples=9, threads=1)
        assert used and set(used) == {1}
        assert torch.get_num_threads() == 4  # the script's own count, given back
        used.clear()
        simulated_spread(lambda a: a * 3 + 1, x, samples=9, threads=16)
        assert set(used) == {4}
    finally:
        torch.set_num_threads(before)
