"""The judge where rounding alone decides little: eigenvectors of close eigenvalues (the
gap, not cond(A)), a spread as wide as the value (a computational zero is never "outside"),
and an "outside" at the Monte Carlo floor sampled further before it is believed."""

import numpy as np
import pytest
import torch

from triage.judge import RoundingSpread, judge_value
from triage.judge.decide import deviation_stat
from triage.worker.conditioning import condition_of
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64
from triage.worker.rounding import SimulationOptions, simulate_rounding


def _close_pair(gap=1e-6, seed=3):
    torch.manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64))
    lam = torch.tensor([0.5, 1.0, 1.0 + gap, 2.0, 4.0], dtype=torch.float64)
    s = ((q * lam) @ q.T).float()
    return (s + s.T) / 2


def test_close_eigenvalues_are_named_with_the_gap_not_the_condition_number():
    note = condition_of("_linalg_eigh", _close_pair())
    assert note["kind"] == "close-eigenvalues" and note["ill_conditioned"]
    assert 0.05 < note["sensitivity"] < 1.0  # u·‖A‖/gap ≈ 0.24
    assert "gap" in note["figure"] or "apart" in note["figure"]
    well_separated = condition_of("_linalg_eigh", _close_pair(gap=0.5))
    assert well_separated.get("kind") != "close-eigenvalues"


def test_eigenvalues_alone_are_not_named_by_their_vectors_gap():
    """`eigvalsh` returns no vectors (under a dispatch mode its `_linalg_eigh` computes them
    anyway): a close pair's figure would be about values the script never reads. Where an
    observed value reads the vectors, the figure stays."""
    from triage.worker.session import _ancestry, _values_only_notes

    a = _close_pair()
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        values = torch.linalg.eigvalsh(a)
        vectors = torch.linalg.eigh(a).eigenvectors
    recording = recorder.finish()
    assert [n.get("kind") for n in recording.conditioning] == ["close-eigenvalues"] * 2
    notes = {c["node"]: i for i, c in enumerate(recording.conditioning)}
    read: set[str] = set()
    for observed in (values, vectors):
        _ancestry(recorder.lookup(observed), {}, notes, read)
    _values_only_notes(recording, read)
    kinds = [n.get("kind") for n in recording.conditioning]
    assert kinds == [None, "close-eigenvalues"], kinds
    assert recording.conditioning[0]["cond"] > 1 and "figure" not in recording.conditioning[0]


def test_a_complex_conjugate_pair_is_not_a_close_pair():
    """A real matrix's complex eigenvalues λ and λ̄ share their real part and lie 2·|Im λ| apart:
    a general eigensolver's vectors are then as well determined as any."""
    rotation = torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 3.0]])  # eigenvalues ±i and 3
    note = condition_of("linalg_eig", rotation)
    assert note.get("kind") != "close-eigenvalues", note
    close = torch.diag(torch.tensor([1.0, 1.0 + 1e-6, 3.0]))  # 1 and 1 + 1e-6, orthogonal eigenvectors
    assert condition_of("linalg_eig", close)["kind"] == "close-eigenvalues"


def test_eigenvalues_of_a_nearly_defective_matrix_are_named_by_their_condition_numbers():
    """A unitary similarity of a 7×7 Jordan block (a new user's complex64 `eigvals`, off by 0.11
    from complex128's): the matrix is well conditioned for solving (cond 37), and its
    eigenvalues keep under two digits at complex64. A normal matrix's eigenvalues are as well
    determined as its norm: nothing noted."""
    torch.manual_seed(18)
    n = 7
    jordan = torch.diag(torch.ones(n - 1), 1).to(torch.complex128) + (0.5 + 0.5j) * torch.eye(n, dtype=torch.complex128)
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.complex128))
    note = condition_of("linalg_eig", (q @ jordan @ q.mH).to(torch.complex64))
    assert note["kind"] == "nonnormal-eigenvalues" and note["ill_conditioned"], note
    assert 0.01 < note["sensitivity"] < 1 and "condition numbers reach" in note["figure"]
    normal = q @ torch.diag(torch.linspace(1, 7, n).to(torch.complex128)) @ q.mH
    assert condition_of("linalg_eig", normal.to(torch.complex64)).get("kind") != "nonnormal-eigenvalues"


def _eigenvectors_spread(s, samples=29, seed=0):
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        _, v = torch.linalg.eigh(s)
        v = v * torch.sign(v[0:1, :])  # fix the signs as a script would
    recording = recorder.finish()
    node = recorder.lookup(v)
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    sim = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=samples, seed=seed),
                            {node.name: torch.float32}, {node.name: v.detach()})
    return v, RoundingSpread.of_simulation(sim.spreads[node.name], reference.numpy(), "float32"), sim


def test_eigenvectors_of_a_close_pair_are_inside_a_spread_that_reaches_lapacks_own_error():
    """LAPACK's backward error is normwise (‖E‖ ≤ p(n)·u·‖A‖): a perturbation relative to each
    element alone leaves the close pair's vectors far too still, and the real kernel outside."""
    v, spread, _ = _eigenvectors_spread(_close_pair())
    j = judge_value(v.double().numpy(), spread, "cpu", 0, "v", None)
    assert j.zone == "inside", (j.statistic, j.max_sample_stat)
    assert j.poorly_determined >= 2  # the pair's vector elements keep almost no digits


def test_a_computational_zero_is_never_outside():
    ref = np.array([1.0, 1e-9])
    sigma = np.array([1e-7, 1e-7])
    noise = np.array([False, True])  # the second element's spread is wider than its value
    t, at = deviation_stat(np.array([1.0 + 1e-7, 5e-7]), ref, sigma, noise)
    assert at == 0 and t < 2
    t_all, at_all = deviation_stat(np.array([1.0 + 1e-7, 5e-7]), ref, sigma)
    assert at_all == 1 and t_all > t


def test_an_element_some_roundings_make_non_finite_keeps_no_digit():
    # A singular matrix's logdet (exact: -inf) whose finite replays cluster tightly: the
    # cluster's width is no precision. Two finite results far apart are both noise.
    def spread(bits):
        one = np.array([-114.585])
        return RoundingSpread(dtype="float32", samples=29, sample_stats=np.zeros(29), reference=np.array([-np.inf]),
                              sigma=np.array([1e-5]), up=one, down=one, mean=one, sd=np.array([1e-5]),
                              nonfinite=np.array([bits], np.uint8))
    unstable = spread(1 | 4)  # finite in some replays, -inf in others
    assert unstable.unstable_nonfinite() == 1 and unstable.digits() is None and unstable.wide()
    j = judge_value(np.array([-108.34]), unstable, "cuda", 0, "`gpu_log.item()`", 29)
    assert j.computational_zero and j.zone != "outside"
    steady = spread(1)  # finite in every replay: 7 digits, and -108.34 is far outside
    assert steady.unstable_nonfinite() == 0 and not steady.wide() and steady.digits() > 5


def test_a_decision_at_the_monte_carlo_floor_gets_more_samples():
    """A value as far out as the largest of 29 samples, past the directed envelope: p ≈ 1/30,
    which one more sample flips; the simulation keeps sampling (up to 199) before the call is
    made. (Within the envelope more samples could not make it "outside", and none are drawn.)"""
    x = torch.randn(257, generator=torch.Generator().manual_seed(1))
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        out = torch.exp(x).sum()
    recording = recorder.finish()
    node = recorder.lookup(out)
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    first = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=29),
                              {node.name: torch.float32})
    spread = first.spreads[node.name]
    # The arm's value: at the largest sample's deviation, a hair farther out, and past the
    # rounded-up replay by a float32 ulp (the envelope's own margin is half of one).
    sigma = float(spread.sigma)
    t_max = max(spread.sample_stats)
    past_envelope = float(spread.up) + float(np.spacing(np.float32(float(spread.up))))
    arm = torch.tensor(max(float(reference) + 1.01 * t_max * sigma, past_envelope), dtype=torch.float64)
    assert float(arm) - float(reference) < 2 * t_max * sigma  # still at the samples' reach: near the floor
    again = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=29),
                              {node.name: torch.float32}, {node.name: arm})
    assert again.samples > 29
    far = torch.tensor(float(reference) + 100 * t_max * sigma, dtype=torch.float64)
    clear = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=29),
                              {node.name: torch.float32}, {node.name: far})
    assert clear.samples == 29  # far beyond every sample: more would not change the call


def test_equality_checks_are_read_off_the_failing_line():
    from triage.classify.facts import equality_checks

    source = "import torch\nx = 1\nassert x.item() == 1.0, 'no'\nassert -2 != y.sum().item()\nassert a == b\n"
    assert equality_checks(source, 3) == [("x.item()", 1.0, True)]
    assert equality_checks(source, 4) == [("y.sum().item()", -2.0, False)]
    assert equality_checks(source, 5) == []
    assert equality_checks("def (:\n", 1) == []


def test_threshold_checks_are_read_off_the_failing_line_as_the_sense_that_passes():
    from triage.classify.facts import threshold_checks

    source = ("import torch\ntol = 1e-6\nassert diff < 1e-3, 'x'\nif err > tol:\n    raise SystemExit('no')\n"
              "assert 0.999 < cos and n == 3\nassert a < b\nif -1e-5 >= gap:\n    sys.exit(1)\n")
    assert threshold_checks(source, 3) == [("diff", 1e-3, "<")]
    assert threshold_checks(source, 5) == [("err", 1e-6, "<=")]  # the `if` names the failure
    assert threshold_checks(source, 6) == [("cos", 0.999, ">")]
    assert threshold_checks(source, 7) == []  # no number to bound by
    assert threshold_checks(source, 9) == [("gap", -1e-5, ">")]
    assert threshold_checks("def (:\n", 1) == []


def _judged(fn, *inputs, dtype=torch.float32):
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with torch.no_grad(), recorder:
        out = fn(*inputs)
    recording = recorder.finish()
    node = recorder.lookup(out)
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    sim = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=29),
                            {node.name: dtype}, {node.name: out.detach().double()})
    spread = RoundingSpread.of_simulation(sim.spreads[node.name], reference.numpy(), str(dtype)[6:])
    return judge_value(out.detach().double().numpy(), spread, "cpu", 0, "out", None)


def test_a_dtype_lattice_op_is_computed_on_the_arms_lattice():
    """nextafter steps to the next float32, which a float64 replay would not."""
    x = torch.linspace(-2, 2, 33)
    j = _judged(lambda t: torch.nextafter(t, t + 1), x)
    assert j.zone == "inside"  # was 5e8 σ out when replayed in float64


def test_a_fourier_transform_errs_in_norm_not_per_element():
    """irfft's outputs near zero carry the transform's absolute error, u·log2 n of its scale."""
    x = torch.randn(2, 33, generator=torch.Generator().manual_seed(4))
    assert _judged(lambda t: torch.fft.irfft(torch.fft.rfft(t) * 0.5), x).zone == "inside"


def test_an_average_pool_of_cancelling_terms_keeps_its_neighbours_error():
    x = torch.randn(1, 2, 6, 6, 6, generator=torch.Generator().manual_seed(5))
    assert _judged(lambda t: torch.nn.functional.avg_pool3d(t, 3, stride=1), x).zone == "inside"


def _lane_softmax_sum(logits: torch.Tensor, lanes: int) -> float:
    """Σ softmax(logits) as the CPU kernels compute it, emulated in NumPy float32 (so the same on
    any host): correctly rounded exponentials, their sum in `lanes` lanes each added in order
    (`vec::reduce_all`), the reciprocal, the products; their sum in double, rounded to float32
    (float32 `cumsum`'s last entry)."""
    x = logits.double().numpy()
    e = np.exp(x - x.max()).astype(np.float32)
    acc = np.add.reduce(e[: len(e) // lanes * lanes].reshape(-1, lanes), axis=0, dtype=np.float32)
    for j, t in enumerate(e[len(e) // lanes * lanes:]):
        acc[j] += t
    while len(acc) > 1:
        acc = acc[0::2] + acc[1::2]
    p = e * (np.float32(1) / acc[0])
    return float(np.float32(p.astype(np.float64).sum()))


def test_a_fused_sum_that_drops_its_small_terms_is_rounding(monkeypatch):
    # A softmax over 50,000 logits of standard deviation 3: the kernel's 8-lane float32 sum of
    # the exponentials drops each small term a lane has outgrown and lands ~27 u low, so the
    # probabilities' cumulative sum ends at ~1 + 27 u — rounding of this computation, which the
    # zero-mean walk alone (σ ≈ 10 u) put outside its spread (a new user's CDF, a correct kernel
    # as `likely-bug`).
    from triage.worker import rounding

    logits = torch.randn(50_000, generator=torch.Generator().manual_seed(0)) * 3
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with torch.no_grad(), recorder:
        out = torch.cumsum(torch.softmax(logits, 0), 0)[-1]  # a CDF's last entry: the cumsum adds in double
    recording = recorder.finish()
    node = recorder.lookup(out)
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]

    def judged(value: float):
        sim = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=29),
                                {node.name: torch.float32}, {node.name: torch.tensor(value, dtype=torch.float64)})
        spread = RoundingSpread.of_simulation(sim.spreads[node.name], reference.numpy(), "float32")
        return judge_value(np.float64(value), spread, "cpu", 0, "out", None)

    u = 2.0 ** -24
    eight, sixteen = _lane_softmax_sum(logits, 8), _lane_softmax_sum(logits, 16)
    assert (eight - 1) / u > 20 and (sixteen - 1) / u > 5  # the lanes' bias, more with fewer lanes
    assert judged(eight).zone == "inside" and judged(sixteen).zone == "inside"
    assert judged(1 + 120 * u).zone == "outside"  # not any distance: past the bias and the walk
    monkeypatch.setattr(rounding, "lane_stagnation", lambda *a: None)
    assert judged(eight).zone != "inside"


def test_a_pseudoinverses_rank_is_counted_at_its_own_cutoff_with_its_margin():
    """`torch.linalg.pinv(A32, rtol=1e-6)` of a matrix whose smallest singular value is 1.01e-6
    of its largest (a twenty-ninth new user's): whether float32's rounding keeps it is the
    cutoff's choice. The note said "rank 6 of 6, cond = 9.8e5" from the default cutoff; it
    counts at the call's rtol, and says the nearest singular value lies within rounding of it."""
    from triage.classify.wording import cond_text

    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))

    def matrix(smallest):
        return (u @ torch.diag(torch.tensor([1.0, 0.5, 0.2, 0.1, 0.05, smallest], dtype=torch.float64)) @ v.T).float()

    rtol = {"atol": torch.tensor(0.0, dtype=torch.float64), "rtol": torch.tensor(1e-6, dtype=torch.float64)}
    near = condition_of("linalg_pinv", matrix(1.01e-6), rtol)
    assert near["cutoff"] == pytest.approx(1e-6) and near["cutoff_at_rounding"] is True
    text = cond_text(near)
    assert "at its cutoff, 1e-06 of the largest singular value" in text and "lies within float32's rounding" in text
    # Far from the cutoff: counted there, no margin said; below it: a rank the cutoff drops.
    far = condition_of("linalg_pinv", matrix(1e-3), rtol)
    assert far["cutoff_at_rounding"] is False and far["rank"] == 6 and "rounding of it" not in cond_text(far)
    dropped = condition_of("linalg_pinv", matrix(1e-9), rtol)
    assert dropped["rank"] == 5 and dropped["singular"] and dropped["cutoff_at_rounding"] is False
    # No cutoff given: torch's default, max(m, n)·eps of float32.
    assert condition_of("linalg_pinv", matrix(1e-3), {})["cutoff"] == pytest.approx(6 * 2.0 ** -23)
