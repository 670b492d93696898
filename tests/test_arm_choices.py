"""Eigen-, singular and QR vectors are unique only up to sign, a general eigensolver's
eigenvalues come in no particular order and its eigenvectors up to a complex phase: the float64
reference and the simulated replays take the arm's choices (triage.worker.arm_choices), so a
choice the arm's LAPACK made differently is neither rounding nor a bug, and a real error still
shows."""
import torch

from triage.worker import arm_choices
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64
from triage.worker.rounding import SimulationOptions, simulate_rounding


def test_align_takes_the_arms_signs_for_pairs_complete_factorizations_and_stacks():
    a = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    flip = torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64)
    for full in (True, False):
        u, s, vh = torch.linalg.svd(a, full_matrices=full)
        arm = arm_choices.keep("_linalg_svd", (u, s, vh))
        other_u, other_vh = u.clone(), vh.clone()
        other_u[:, :3] *= flip
        other_vh[:3] *= flip[:, None]
        stacked = (torch.stack([other_u, u]), s, torch.stack([other_vh, vh]))
        aligned = arm_choices.align("_linalg_svd", stacked, arm)
        assert torch.equal(aligned[0], torch.stack([u, u])) and torch.equal(aligned[2], torch.stack([vh, vh]))
    q, r = torch.linalg.qr(a, mode="complete")
    arm = arm_choices.keep("linalg_qr", (q, r))
    other_q, other_r = q.clone(), r.clone()
    other_q[:, :2] *= -1
    other_r[:2] *= -1
    aligned = arm_choices.align("linalg_qr", (other_q, other_r), arm)
    assert torch.equal(aligned[0], q) and torch.equal(aligned[1], r)
    # A wrong vector keeps its error: only its sign is taken.
    values, vectors = torch.linalg.eigh(a.T @ a)
    arm = arm_choices.keep("_linalg_eigh", (values, vectors))
    wrong = -vectors * 1.01
    assert torch.allclose(arm_choices.align("_linalg_eigh", (values, wrong), arm)[1], vectors * 1.01)


def test_the_reference_and_the_simulation_follow_the_arms_eigenvector_signs():
    """The arm's eigh chose the other sign for every vector: its float64 reference and its
    simulated spread follow, and the arm is inside its spread."""
    g = torch.Generator().manual_seed(1)
    b = torch.randn(5, 5, generator=g)
    s = b @ b.T
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        vectors = torch.linalg.eigh(s).eigenvectors
    recording = recorder.finish()
    node = recorder.lookup(vectors)
    eigh = next(n for n in recording.graph.nodes if "arm_choices" in n.meta)
    honest = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    eigh.meta["arm_choices"] = tuple(-t for t in eigh.meta["arm_choices"])  # as if the arm chose the other signs
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    assert torch.allclose(reference, -honest, rtol=0, atol=1e-12)
    sim = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=29, seed=0),
                            {node.name: torch.float32}, {node.name: -vectors})
    spread = sim.spreads[node.name]
    assert spread.status == "judged", spread.reason
    # The samples share the reference's (the arm's) signs: their spread is rounding-sized, and
    # the arm lies within a few of it.
    assert float(spread.sigma.max()) < 1e-5
    assert bool(((-vectors.double() - reference).abs() <= 8 * spread.sigma + 1e-7).all())


def _shuffled(values: torch.Tensor, vectors: torch.Tensor, order: list[int], phases: torch.Tensor) -> tuple:
    """The same eigen-decomposition in another order, each eigenvector turned by a phase."""
    return values[..., order].clone(), (vectors[..., order] * phases).clone()


def test_align_takes_a_general_eigensolvers_order_and_phases_and_keeps_a_real_error():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 5, generator=g, dtype=torch.float64)  # two complex pairs and a real eigenvalue, or so
    values, vectors = torch.linalg.eig(a)
    phases = torch.polar(torch.ones(5, dtype=torch.float64), torch.tensor([0.3, -2.0, 3.0, 1.0, -0.5],
                                                                           dtype=torch.float64))
    arm = arm_choices.keep("linalg_eig", _shuffled(values, vectors, [3, 0, 4, 2, 1], phases))
    aligned = arm_choices.align("linalg_eig", (values.clone(), vectors.clone()), arm)
    assert torch.allclose(aligned[0], arm[0], rtol=0, atol=1e-12) and torch.allclose(aligned[1], arm[1], rtol=0,
                                                                                      atol=1e-12)
    # A stack of replays, each in its own order and phases; and eigvals, which has no vectors.
    other = _shuffled(values, vectors, [1, 2, 3, 4, 0], phases.conj())
    stacked = (torch.stack([values, other[0]]), torch.stack([vectors, other[1]]))
    arm_choices.align("linalg_eig", stacked, arm)
    assert torch.allclose(stacked[0], arm[0].expand(2, 5), rtol=0, atol=1e-12)
    assert torch.allclose(stacked[1], arm[1].expand(2, 5, 5), rtol=0, atol=1e-12)
    only = arm_choices.align("_linalg_eigvals", values.clone(), arm_choices.keep("_linalg_eigvals", arm[0]))
    assert torch.allclose(only, arm[0], rtol=0, atol=1e-12)
    # Eigenvalues 1 % off stay 1 % off, in the arm's places: only the order and the phases are taken.
    wrong = arm_choices.align("linalg_eig", (values * 1.01, vectors.clone()), arm)
    assert torch.allclose(wrong[0], arm[0] * 1.01, rtol=0, atol=1e-12)


def test_the_reference_and_the_simulation_follow_a_general_eigensolvers_choices():
    """As if the arm's eig had returned its eigenvalues in another order and its eigenvectors in
    other phases (float32 and float64 LAPACK often do): the float64 reference and the simulated
    spread follow it, and the arm lies inside its spread."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(4, 4, generator=g)
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        values, vectors = torch.linalg.eig(a)
        first = vectors[:, 0].real.sum()
    recording = recorder.finish()
    eig = next(n for n in recording.graph.nodes if "arm_choices" in n.meta)
    phases = torch.polar(torch.ones(4, dtype=torch.float64), torch.tensor([2.5, -1.0, 0.7, 3.0], dtype=torch.float64))
    order = [2, 3, 0, 1]
    eig.meta["arm_choices"] = _shuffled(*eig.meta["arm_choices"], order, phases)
    arm_first = (vectors[:, order] * phases)[:, 0].real.sum()
    nodes = {recorder.lookup(values).name: values[order], recorder.lookup(first).name: arm_first}
    references = replay_fp64(recording.graph, set(nodes), 60).values
    sim = simulate_rounding(recording.graph, references, SimulationOptions(samples=29, seed=0),
                            {name: v.dtype for name, v in nodes.items()}, {})
    for name, arm in nodes.items():
        reference, spread = references[name], sim.spreads[name]
        assert spread.status == "judged", spread.reason
        assert torch.allclose(reference, arm.to(reference.dtype), rtol=0, atol=1e-5), name
        # The samples share the arm's choices: a rounding-sized spread, the arm within a few of it.
        assert float(spread.sigma.max()) < 1e-5, name
        off = arm.to(reference.dtype) - reference
        off = torch.view_as_real(off) if off.is_complex() else off  # a complex value's spread: its real pairs
        assert bool((off.abs() <= 8 * spread.sigma + 1e-6).all()), name


def _phases(n: int, shift: float) -> torch.Tensor:
    return torch.polar(torch.ones(n, dtype=torch.float64), torch.linspace(-3, 3, n, dtype=torch.float64) + shift)


def test_complex_vectors_take_the_arms_phases():
    """A complex eigenvector (or pair of singular vectors, or column of Q with its row of R) is
    unique up to a phase: each is turned to the arm's, a row of Vh or R by the conjugate."""
    a = torch.randn(5, 3, dtype=torch.complex128, generator=torch.Generator().manual_seed(0))
    values, vectors = torch.linalg.eigh(a.conj().T @ a)
    arm = arm_choices.keep("_linalg_eigh", (values, vectors * _phases(3, 0.1)))
    out = arm_choices.align("_linalg_eigh", (values.clone(), vectors.clone()), arm)
    assert torch.allclose(out[1], arm[0], rtol=0, atol=1e-12)
    for full in (False, True):
        u, s, vh = torch.linalg.svd(a, full_matrices=full)
        c = _phases(3, 0.4)
        arm_u, arm_vh = u.clone(), vh.clone()
        arm_u[:, :3] *= c
        arm_vh[:3] *= c.conj()[:, None]
        out = arm_choices.align("_linalg_svd", (u.clone(), s, vh.clone()), arm_choices.keep("_linalg_svd", (arm_u, s, arm_vh)))
        assert torch.allclose(out[0][:, :3], arm_u[:, :3], rtol=0, atol=1e-12)
        assert torch.allclose(out[2][:3], arm_vh[:3], rtol=0, atol=1e-12)
    q, r = torch.linalg.qr(a)
    c = _phases(3, -0.7)
    arm = arm_choices.keep("linalg_qr", (q * c, r * c.conj()[:, None]))
    out = arm_choices.align("linalg_qr", (q.clone(), r.clone()), arm)
    assert torch.allclose(out[0], arm[0], rtol=0, atol=1e-12) and torch.allclose(out[1], arm[1], rtol=0, atol=1e-12)


def test_a_complex_decompositions_input_is_perturbed_in_both_parts():
    """Backward stability for complex linear algebra: the replay's input moves in its real and
    imaginary parts at the arm's precision (float32 for complex64), as a real one does."""
    from triage.worker.rounding import Draws, RoundingMode, _CallCache

    mode = RoundingMode(SimulationOptions(), _CallCache(), direction=0, generator=Draws(1))
    a = torch.randn(6, 6, dtype=torch.complex128, generator=torch.Generator().manual_seed(2))
    a._arm_dtype = torch.complex64
    (moved,) = mode._perturb_matrices((a,), 1.0)
    relative = ((moved - a).abs() / a.abs().amax()).amax()
    assert 2.0 ** -24 / 8 < float(relative) < 4 * 6 ** 0.5 * 2.0 ** -24
    assert float((moved - a).real.abs().amax()) > 0 and float((moved - a).imag.abs().amax()) > 0
