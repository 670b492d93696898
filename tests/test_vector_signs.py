"""Eigen-, singular and QR vectors are unique only up to sign: the float64 reference and the
simulated replays take the arm's signs (triage.worker.vector_signs), so a sign the arm's LAPACK
chose differently is neither rounding nor a bug, and a vector's real error still shows."""
import torch

from triage.worker import vector_signs
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64
from triage.worker.rounding import SimulationOptions, simulate_rounding


def test_align_takes_the_arms_signs_for_pairs_complete_factorizations_and_stacks():
    a = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    flip = torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64)
    for full in (True, False):
        u, s, vh = torch.linalg.svd(a, full_matrices=full)
        arm = vector_signs.keep("_linalg_svd", (u, s, vh))
        other_u, other_vh = u.clone(), vh.clone()
        other_u[:, :3] *= flip
        other_vh[:3] *= flip[:, None]
        stacked = (torch.stack([other_u, u]), s, torch.stack([other_vh, vh]))
        aligned = vector_signs.align("_linalg_svd", stacked, arm)
        assert torch.equal(aligned[0], torch.stack([u, u])) and torch.equal(aligned[2], torch.stack([vh, vh]))
    q, r = torch.linalg.qr(a, mode="complete")
    arm = vector_signs.keep("linalg_qr", (q, r))
    other_q, other_r = q.clone(), r.clone()
    other_q[:, :2] *= -1
    other_r[:2] *= -1
    aligned = vector_signs.align("linalg_qr", (other_q, other_r), arm)
    assert torch.equal(aligned[0], q) and torch.equal(aligned[1], r)
    # A wrong vector keeps its error: only its sign is taken.
    values, vectors = torch.linalg.eigh(a.T @ a)
    arm = vector_signs.keep("_linalg_eigh", (values, vectors))
    wrong = -vectors * 1.01
    assert torch.allclose(vector_signs.align("_linalg_eigh", (values, wrong), arm)[1], vectors * 1.01)


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
    eigh = next(n for n in recording.graph.nodes if "arm_vectors" in n.meta)
    honest = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    eigh.meta["arm_vectors"] = tuple(-t for t in eigh.meta["arm_vectors"])  # as if the arm chose the other signs
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
