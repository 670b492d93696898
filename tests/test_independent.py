"""The independent answer for small linear algebra (triage.worker.independent): correct kernels
stay within their bounds on every kind of matrix, a wrong answer is caught, nothing is
concluded where no digit survives or the range is left, and the float64 reference continues
from the exact answer where the float64 kernel is the wrong one."""
import math
import random

import pytest
import torch
from lapack import lapack_gelsy
from torch.utils._python_dispatch import TorchDispatchMode

from triage.worker.independent import answers
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64

OPS = {
    "_linalg_det": lambda a, b: torch.ops.aten._linalg_det(a),
    "_linalg_slogdet": lambda a, b: torch.ops.aten._linalg_slogdet(a),
    "linalg_inv_ex": lambda a, b: torch.ops.aten.linalg_inv_ex(a),
    "_linalg_solve_ex": lambda a, b: torch.ops.aten._linalg_solve_ex(a, b),
    "_linalg_svd": lambda a, b: torch.ops.aten._linalg_svd(a),
    "_linalg_eigh": lambda a, b: torch.ops.aten._linalg_eigh(a),
    "linalg_lu_factor_ex": lambda a, b: torch.ops.aten.linalg_lu_factor_ex(a),
}


def _matrix(kind: str, n: int, rng: random.Random) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    if kind == "hilbert":
        a = 1 / (torch.arange(n)[:, None] + torch.arange(n)[None, :] + 1.0).double()
    elif kind == "near-singular":
        a[-1] = a[0] + 1e-5 * torch.randn(n, generator=g, dtype=torch.float64)
    elif kind == "scaled":
        a = a * 10 ** rng.uniform(-20, 20)
    elif kind == "integer":
        a = torch.randint(-3, 4, (n, n), generator=g).double()
    elif kind == "graded":
        a = a * torch.logspace(-6, 6, n, dtype=torch.float64)[:, None]
    elif kind == "low-rank":
        a = torch.randn(n, 2, generator=g, dtype=torch.float64) @ torch.randn(2, n, generator=g, dtype=torch.float64)
    return a


def _checks(name, a, b, out):
    args = (a, b) if name == "_linalg_solve_ex" else (a,)
    return [c for x in answers(name, args, {}) if (c := x.check(out)) is not None]


def test_correct_kernels_stay_within_their_bounds_on_every_kind_of_matrix():
    rng = random.Random(0)
    checked = 0
    for _ in range(150):
        n, dtype = rng.randint(1, 8), rng.choice([torch.float32, torch.float64])
        kind = rng.choice(["randn", "hilbert", "near-singular", "scaled", "integer", "graded", "low-rank"])
        a = _matrix(kind, n, rng).to(dtype)
        b = torch.randn(n, rng.randint(1, 3), dtype=dtype)
        for name, op in OPS.items():
            x = a + a.mT if name == "_linalg_eigh" else a
            try:
                out = op(x, b)
            except RuntimeError:
                continue  # a singular matrix LAPACK refuses
            for c in _checks(name, x, b, out):
                checked += 1
                assert not c.disagrees, (name, kind, n, dtype, c.error, c.bound)
    assert checked > 500


@pytest.mark.parametrize("name", sorted(OPS))
def test_a_wrong_answer_is_caught(name):
    a = torch.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, -1.0], [0.5, -1.0, 2.5]])
    b = torch.tensor([[1.0], [2.0], [3.0]])
    out = OPS[name](a, b)
    assert not any(c.disagrees for c in _checks(name, a, b, out))
    # One part in a thousand: far beyond float32 rounding of this well-conditioned matrix.
    wrong = tuple(t * 1.001 if t.is_floating_point() else t for t in out) if isinstance(out, tuple) else out * 1.001
    if name == "_linalg_slogdet":
        wrong = (out[0], out[1] + 1e-3) + tuple(out[2:])
    checks = _checks(name, a, b, wrong)
    assert checks and any(c.disagrees for c in checks), [(c.error, c.bound) for c in checks]


def test_rank_zero_for_a_rank_two_matrix_is_caught():
    """The shape of a real LAPACK bug: every singular value of an exact rank-2 matrix returned as 0."""
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.5], [3.0, 6.0, 9.5]], dtype=torch.float64)
    u, s, vh = torch.ops.aten._linalg_svd(a)
    [check] = [c for c in _checks("_linalg_svd", a, None, (u, torch.zeros_like(s), vh)) if c.answer.output == 1]
    assert check.disagrees and check.exact > 10 and check.got == 0


def test_nothing_is_concluded_where_no_digit_survives_or_the_range_is_left():
    hilbert = (1 / (torch.arange(8)[:, None] + torch.arange(8)[None, :] + 1.0)).float()
    assert _checks("linalg_inv_ex", hilbert, None, torch.ops.aten.linalg_inv_ex(hilbert)) == []  # κ·u ≫ 1
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    assert answers("_linalg_det", (singular,), {}) == []  # the exact rank covers it
    huge = torch.randn(8, 8, generator=torch.Generator().manual_seed(3)) * 1e20
    assert _checks("_linalg_det", huge, None, torch.ops.aten._linalg_det(huge)) == []  # det beyond float32


def test_large_complex_or_nonfinite_inputs_get_no_answer():
    assert answers("_linalg_det", (torch.randn(9, 9),), {}) == []
    assert answers("_linalg_det", (torch.randn(3, 3, dtype=torch.complex64),), {}) == []
    assert answers("_linalg_det", (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]),), {}) == []
    assert answers("mm", (torch.randn(3, 3), torch.randn(3, 3)), {}) == []
    assert answers("exp", (torch.randn(9, 9),), {}) == []  # special functions: at most 64 elements


def test_batched_answers_line_up_with_the_batch():
    a = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    b = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    for name, args in (("_linalg_det", (a,)), ("_linalg_solve_ex", (a, b)), ("_linalg_svd", (a,))):
        out = getattr(torch.ops.aten, name)(*args)
        checks = [c for x in answers(name, args, {}) if (c := x.check(out)) is not None]
        assert checks and all(c.error < 1e-10 for c in checks), (name, [c.error for c in checks])


def _tall(kind: str, m: int, n: int, g: torch.Generator) -> torch.Tensor:
    a = torch.randn(m, n, generator=g, dtype=torch.float64)
    if kind == "graded":
        a = a * torch.logspace(-4, 4, n, dtype=torch.float64)[None, :]
    elif kind == "scaled":
        a = a * 10.0 ** float(torch.randint(-15, 16, (), generator=g))
    elif kind == "integer":
        a = torch.randint(-3, 4, (m, n), generator=g).double()
    elif kind == "near-dependent":
        a[:, -1] = a[:, 0] + 1e-4 * torch.randn(m, generator=g, dtype=torch.float64)
    elif kind == "vandermonde":
        a = torch.linspace(0, 1, m, dtype=torch.float64)[:, None] ** torch.arange(n, dtype=torch.float64)[None, :]
    return a


def _least_squares_checks(a, b, out, **kwargs):
    """The solution's checks (the rank's are `_rank_checks`)."""
    return [c for x in answers("linalg_lstsq", (a, b), kwargs) if x.output == 0 and (c := x.check(out)) is not None]


def _cholesky_checks(s, out, upper=False):
    return [c for x in answers("linalg_cholesky_ex", (s,), {"upper": upper}) if (c := x.check(out)) is not None]


def test_least_squares_pinv_qr_and_cholesky_stay_within_their_bounds():
    """Tall systems (consistent and not) with every LAPACK driver, their pseudoinverses and QR
    factors, and the Cholesky factor of their normal matrices, both triangles: a correct kernel
    is never called wrong."""
    rng = random.Random(1)
    checked = {"lstsq": 0, "cholesky": 0}
    for _ in range(60):
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        n = rng.randint(1, 8)
        m = rng.randint(n, 24)
        kind = rng.choice(["randn", "graded", "scaled", "integer", "near-dependent", "vandermonde"])
        dtype = rng.choice([torch.float32, torch.float64])
        a = _tall(kind, m, n, g)
        noise = rng.choice([0.0, 1e-6, 1e-2, 1.0]) * float(a.abs().max())
        b = a @ torch.randn(n, rng.randint(1, 3), generator=g, dtype=torch.float64)
        b = b + noise * torch.randn(b.shape, generator=g, dtype=torch.float64)
        for driver in (None, "gelsy", "gels", "gelsd", "gelss"):
            out = torch.ops.aten.linalg_lstsq(a.to(dtype), b.to(dtype), driver=driver)
            for c in _least_squares_checks(a.to(dtype), b.to(dtype), out, driver=driver):
                checked["lstsq"] += 1
                assert not c.disagrees, (kind, m, n, dtype, driver, c.error, c.bound)
        for op, call in (("linalg_pinv", torch.ops.aten.linalg_pinv), ("linalg_qr", torch.ops.aten.linalg_qr)):
            out = call(a.to(dtype))
            for c in [c for x in answers(op, (a.to(dtype),), {}) if (c := x.check(out)) is not None]:
                checked[op] = checked.get(op, 0) + 1
                assert not c.disagrees, (op, kind, m, n, dtype, c.error, c.bound)
        s = (a.mT @ a + torch.eye(n, dtype=torch.float64)).to(dtype)
        for upper in (False, True):
            for c in _cholesky_checks(s, torch.ops.aten.linalg_cholesky_ex(s, upper=upper), upper):
                checked["cholesky"] += 1
                assert not c.disagrees, (kind, n, dtype, upper, c.error, c.bound)
    assert checked["lstsq"] > 150 and checked["cholesky"] > 60, checked
    assert checked["linalg_pinv"] > 20 and checked["linalg_qr"] > 40, checked


def test_a_wrong_least_squares_solution_or_cholesky_factor_is_caught():
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0], [0.5, -1.0], [2.0, 2.0]])
    b = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    solution, *rest = torch.ops.aten.linalg_lstsq(a, b)
    assert [c.disagrees for c in _least_squares_checks(a, b, (solution, *rest))] == [False]
    assert [c.disagrees for c in _least_squares_checks(a, b, (solution * 1.001, *rest))] == [True]
    s = a.mT @ a
    factor, info = torch.ops.aten.linalg_cholesky_ex(s)
    assert [c.disagrees for c in _cholesky_checks(s, (factor, info))] == [False]
    wrong = factor.clone()
    wrong[1, 0] *= 1.001
    assert [c.disagrees for c in _cholesky_checks(s, (wrong, info))] == [True]
    # The upper factor is checked as the upper factor (the transposed lower one is wrong there).
    assert [c.disagrees for c in _cholesky_checks(s, (factor, info), upper=True)] == [True]


def test_a_wrong_pseudoinverse_or_qr_factor_is_caught_but_not_a_change_of_signs():
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0], [0.5, -1.0], [2.0, 2.0]])
    p = torch.ops.aten.linalg_pinv(a)
    assert [c.disagrees for x in answers("linalg_pinv", (a,), {}) if (c := x.check(p))] == [False]
    assert [c.disagrees for x in answers("linalg_pinv", (a,), {}) if (c := x.check(p * 1.001))] == [True]
    q, r = torch.ops.aten.linalg_qr(a)
    flip = torch.tensor([-1.0, 1.0])
    for outputs, wrong in (((q, r), [False, False]), ((q * flip, r * flip[:, None]), [False, False]),
                           ((q, r * 1.001), [False, True]), ((q * 1.001, r), [True, False])):
        assert [c.disagrees for x in answers("linalg_qr", (a,), {}) if (c := x.check(outputs))] == wrong


def test_wide_systems_get_the_minimum_norm_answer_every_driver_stays_within():
    """A wide matrix of full row rank: every driver returns X = Aᵀ(AAᵀ)⁻¹B, and the
    pseudoinverse is Aᵀ(AAᵀ)⁻¹; a correct kernel is never called wrong, a scaled one is."""
    rng = random.Random(7)
    checked = {"lstsq": 0, "pinv": 0}
    for _ in range(40):
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        m = rng.randint(1, 7)
        n = rng.randint(m + 1, 20)
        kind = rng.choice(["randn", "graded", "scaled", "integer", "near-dependent", "vandermonde"])
        dtype = rng.choice([torch.float32, torch.float64])
        a = _tall(kind, n, m, g).mT.contiguous()
        b = torch.randn(m, rng.randint(1, 3), generator=g, dtype=torch.float64)
        for driver in (None, "gelsy", "gels", "gelsd", "gelss"):
            out = torch.ops.aten.linalg_lstsq(a.to(dtype), b.to(dtype), driver=driver)
            # torch's gelsy call passes stale column pivots (pytorch/pytorch#187411): on a
            # wide matrix it may return a rank below the exact one, and then another solution.
            # That is a kernel bug, which the rank's answer names too.
            wrong_rank = any(c.disagrees for c in _rank_checks(a.to(dtype), b.to(dtype), out, driver=driver))
            for c in _least_squares_checks(a.to(dtype), b.to(dtype), out, driver=driver):
                checked["lstsq"] += 1
                assert not c.disagrees or wrong_rank, (kind, m, n, dtype, driver, c.error, c.bound)
        p = torch.ops.aten.linalg_pinv(a.to(dtype))
        for c in [c for x in answers("linalg_pinv", (a.to(dtype),), {}) if (c := x.check(p)) is not None]:
            checked["pinv"] += 1
            assert not c.disagrees, (kind, m, n, dtype, c.error, c.bound)
    assert checked["lstsq"] > 100 and checked["pinv"] > 20, checked
    a = torch.tensor([[4.0, 1.0, 0.5, 2.0], [1.0, 3.0, -1.0, 2.0]])
    b = torch.tensor([[1.0], [2.0]])
    for driver in ("gels", "gelsd", "gelss"):  # not gelsy: its rank here depends on stale pivots
        solution, *rest = torch.ops.aten.linalg_lstsq(a, b, driver=driver)
        assert [c.disagrees for c in _least_squares_checks(a, b, (solution, *rest), driver=driver)] == [False]
        assert [c.disagrees for c in _least_squares_checks(a, b, (solution * 1.001, *rest), driver=driver)] == [True]
    # Another solution of A·X = B, not the one of least norm: a kernel that returned it is wrong.
    other = solution + torch.tensor([[1.0], [0.0], [0.0], [0.0]]) - torch.linalg.pinv(a) @ (a[:, :1])
    assert torch.allclose(a @ other, b, atol=1e-5)
    assert [c.disagrees for c in _least_squares_checks(a, b, (other, *rest))] == [True]
    p = torch.ops.aten.linalg_pinv(a)
    assert [c.disagrees for x in answers("linalg_pinv", (a,), {}) if (c := x.check(p))] == [False]
    assert [c.disagrees for x in answers("linalg_pinv", (a,), {}) if (c := x.check(p * 1.001))] == [True]


def test_a_rank_deficient_system_is_answered_where_the_driver_kept_its_exact_rank():
    """A⁺B of an exactly rank-deficient A (tall, wide, square), exact, for each rank-revealing
    driver that returned the exact rank: a correct kernel stays within, a scaled solution or
    one turned within A's null space does not, and a wrong rank leaves it to the rank's answer."""
    rng = random.Random(3)
    checked = 0
    for _ in range(60):
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        m, n = rng.randint(2, 8), rng.randint(2, 8)
        r = rng.randint(1, min(m, n) - 1)
        a = (torch.randint(-3, 4, (m, r), generator=g) @ torch.randint(-3, 4, (r, n), generator=g)).double()
        b = torch.randn(m, rng.randint(1, 2), generator=g, dtype=torch.float64)
        for dtype in (torch.float32, torch.float64):
            for driver in ("gelsy", "gelsd", "gelss"):
                out = torch.ops.aten.linalg_lstsq(a.to(dtype), b.to(dtype), driver=driver)
                for c in _least_squares_checks(a.to(dtype), b.to(dtype), out, driver=driver):
                    checked += 1
                    assert not c.disagrees, (m, n, r, dtype, driver, c.error, c.bound)
    assert checked > 250, checked
    a = torch.tensor([[1.0, 2.0, 0.0], [2.0, 4.0, 1.0], [3.0, 6.0, -1.0], [1.0, 2.0, 2.0]])  # rank 2
    b = torch.tensor([[1.0], [0.0], [2.0], [1.0]])
    for driver in ("gelsd", "gelss"):
        solution, residuals, rank, values = torch.ops.aten.linalg_lstsq(a.double(), b.double(), driver=driver)
        assert int(rank) == 2
        outputs = (solution, residuals, rank, values)
        assert [c.disagrees for c in _least_squares_checks(a.double(), b.double(), outputs, driver=driver)] == [False]
        scaled = (solution * 1.001, residuals, rank, values)
        assert [c.disagrees for c in _least_squares_checks(a.double(), b.double(), scaled, driver=driver)] == [True]
        # Another least-squares solution, not of least norm: (2, -1, 0) spans A's null space.
        turned = (solution + 1e-3 * torch.tensor([[2.0], [-1.0], [0.0]], dtype=torch.float64), residuals, rank, values)
        assert [c.disagrees for c in _least_squares_checks(a.double(), b.double(), turned, driver=driver)] == [True]
        # A driver that kept another rank solved another problem: not answered here.
        wrong_rank = (solution * 2, residuals, rank + 1, values)
        assert _least_squares_checks(a.double(), b.double(), wrong_rank, driver=driver) == []
    assert _least_squares_checks(a, b, torch.ops.aten.linalg_lstsq(a, b, driver="gels"), driver="gels") == []


def test_rectangular_answers_and_cholesky_conclude_nothing_where_the_kernel_may_decide_otherwise():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])  # rank 1: the driver's rank decision
    b = torch.ones(3, 1)
    assert [x.output for x in answers("linalg_lstsq", (a, b), {"driver": "gels"})] == []  # gels assumes full rank
    well = torch.tensor([[1.0, 0.0], [0.0, 1e-3], [1.0, 1.0]])
    assert answers("linalg_lstsq", (well, b), {})  # full rank, no cutoff: answered
    # A cutoff near 1/κ: the solution is not answered, the rank's range is.
    assert [x.output for x in answers("linalg_lstsq", (well, b), {"rcond": 1e-2})] == [2]
    assert answers("linalg_pinv", (well,), {"rtol": 1e-2}) == [] and answers("linalg_pinv", (well,), {"atol": 1e-2}) == []
    assert answers("linalg_pinv", (well,), {"atol": 1e-6, "rtol": 1e-9})  # far below σ_min and 1/κ: answered
    assert answers("linalg_pinv", (well, 1e-15), {}) == []  # the old overload's positional rcond
    assert answers("linalg_pinv", (well,), {"hermitian": True}) == []
    assert answers("linalg_qr", (well, "complete"), {}) == [] and answers("linalg_qr", (a,), {}) == []
    indefinite = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    assert answers("linalg_cholesky_ex", (indefinite,), {}) == []
    s = torch.tensor([[4.0, 1.0], [1.0, 3.0]])
    factor, _ = torch.ops.aten.linalg_cholesky_ex(s)
    # A kernel that reports it stopped returned a partial factor: its caller judges that.
    assert _cholesky_checks(s, (factor * 2, torch.tensor(1, dtype=torch.int32))) == []


class WrongSingularValues(TorchDispatchMode):
    """A float64 LAPACK that returns rank 0: the replay's own kernel shares the bug."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "_linalg_svd":
            return (out[0], torch.zeros_like(out[1]), out[2])
        return out


def test_the_reference_continues_from_the_exact_answer_where_the_float64_kernel_is_wrong():
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.5], [3.0, 6.0, 9.5]])
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        s = torch.linalg.svdvals(a)
    recording = recorder.finish()
    node = recorder.lookup(s)
    note = next(c for c in recording.conditioning if c["op"] == "_linalg_svd")
    assert note["kernel_disagrees"] is False and note["independent"].startswith("mpmath")
    honest = replay_fp64(recording.graph, {node.name}, 60)
    assert not honest.checked[note["node"]].disagrees
    with WrongSingularValues():
        replay = replay_fp64(recording.graph, {node.name}, 60)
    check = replay.checked[note["node"]]
    assert check.disagrees and check.got == 0
    # The exact singular values, not the kernel's zeros: rank 2 (the third is 0 to float64).
    assert torch.allclose(replay.values[node.name], honest.values[node.name], rtol=1e-12, atol=1e-12)
    assert (replay.values[node.name] > 1e-6).sum() == 2


SVD_SCRIPT = """\
import torch
a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.5, 6.0], [0.5, -1.0, 2.0]])
s = torch.linalg.svdvals(a)
print(s)
"""


def _two_arms_sharing_a_fault(tmp_path, triage, source: str, op: str) -> tuple:
    """`source` run on two CPU arms whose `op` kernel is scaled by the same fault (they agree
    with each other bitwise): (script, fault arm, report)."""
    script = tmp_path / "script.py"
    script.write_text(source)
    fault = f"fault=aten.{op}:scale"
    code, report, _, out = triage(script, f"cpu/{fault},cpu/threads=1/{fault}", "--no-minimize", "--no-ablate")
    assert code == 0, out
    return script, f"cpu/{fault}", report


def test_arms_sharing_a_wrong_kernel_are_a_kernel_bug_not_agreement(tmp_path, triage):
    """Two arms that call one faulty kernel agree bitwise: only the exact answer shows the bug."""
    script, _, report = _two_arms_sharing_a_fault(tmp_path, triage, SVD_SCRIPT, "_linalg_svd")
    v = report["verdict"]
    assert v["kind"] == "likely-bug" and v["expected"] is False, v["summary"]
    assert "exact answer" in v["summary"] and "mpmath" in v["summary"] and "share the kernel" in v["summary"]
    assert "module: linear algebra" in v["labels"]
    # The same script without the fault: the kernel agrees with the exact answer, nothing is called a bug.
    code, report, _, out = triage(script, "cpu,cpu/threads=1", "--no-minimize", "--no-ablate")
    assert report["verdict"]["kind"] != "likely-bug", report["verdict"]["summary"]
    notes = [c for a in report["arms"] for c in a["conditioning"] if c["op"] == "_linalg_svd"]
    assert notes and all(c["kernel_disagrees"] is False and c["float64_disagrees"] is False for c in notes)


EIG_SCRIPT = """\
import torch
a = torch.tensor([[1.0, 2.0, 0.0], [-1.0, 3.0, 1.0], [2.0, 1.0, 5.0]])
w = torch.linalg.eigvals(a)
print(w.abs().max())
"""


def test_a_wrong_complex_eigenvalue_is_named_as_a_kernel_bug(tmp_path, triage):
    """A general eigensolver that returns its eigenvalues (a complex pair and a real one) 1 % off,
    on two arms that agree: the exact eigenvalues show it, in the complex plane."""
    _, arm, report = _two_arms_sharing_a_fault(tmp_path, triage, EIG_SCRIPT, "linalg_eig")
    v = report["verdict"]
    assert v["kind"] == "likely-bug" and "exact answer" in v["summary"] and "share the kernel" in v["summary"], v
    [note] = [c for c in report["arms"][0]["conditioning"] if c["op"] == "linalg_eig"]
    assert note["kernel_disagrees"] is True and note.get("kind") != "close-eigenvalues"
    assert f"arm {arm}" in v["evidence"][0], v["evidence"]


FUNCTIONS = {"exp": torch.exp, "expm1": torch.expm1, "log1p": torch.log1p, "sin": torch.sin, "tanh": torch.tanh,
             "asinh": torch.asinh, "erf": torch.erf, "erfc": torch.erfc, "lgamma": torch.lgamma,
             "digamma": torch.digamma, "sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu,
             "special_i0e": torch.special.i0e}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_correct_float64_special_functions_agree_with_mpmath(name):
    g = torch.Generator().manual_seed(11)
    for scale in (1e-6, 0.5, 3.0, 30.0):
        x = (torch.rand(64, generator=g, dtype=torch.float64) * 2 - 1) * scale
        [answer] = answers(name, (x,), {})
        check = answer.check(FUNCTIONS[name](x))
        assert check is not None and not check.disagrees, (scale, check.error, check.bound)


def test_a_cancelling_float64_formula_is_replaced_by_mpmath():
    """float64 GELU computes x/2·(1 + erf(x/√2)): near x = −8 the sum keeps one digit."""
    x = torch.tensor([-8.0, 0.5])
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        y = torch.nn.functional.gelu(x)
    recording = recorder.finish()
    node = recorder.lookup(y)
    replay = replay_fp64(recording.graph, {node.name}, 60)
    check = replay.checked[node.name]
    assert check.disagrees and check.answer.method.startswith("mpmath")
    exact = -4.9767684594174271e-15  # -8/2·erfc(8/√2), mpmath at 50 digits
    reference = replay.values[node.name]
    assert abs(reference[0].item() - exact) < 1e-12 * abs(exact)
    assert reference[1].item() == torch.nn.functional.gelu(torch.tensor(0.5, dtype=torch.float64)).item()


def _rank_checks(a, b, out, **kwargs):
    return [c for x in answers("linalg_lstsq", (a, b), kwargs) if x.output == 2 and (c := x.check(out)) is not None]


def test_correct_least_squares_ranks_stay_within_their_range():
    """Every rank-revealing driver on every kind of matrix, with cutoffs at, near and around its
    singular values: a correct driver's rank is never called wrong. gelsy is called through LAPACK
    directly with its pivots zeroed, as torch 2.13's own call does not always do
    (pytorch/pytorch#187411); its solution too, since the stale pivots move it as well (a wide
    Vandermonde's minimum-norm solution was missed by torch's call in one run of the suite)."""
    rng = random.Random(3)
    checked = {"gelsy": 0, "gelsd": 0, "gelss": 0}
    for _ in range(150):
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        m, n = rng.randint(1, 32), rng.randint(1, 8)
        kind = rng.choice(["randn", "graded", "scaled", "integer", "near-dependent", "vandermonde", "low-rank"])
        a = _tall(kind, m, n, g) if kind != "low-rank" else (
            torch.randn(m, 2, generator=g, dtype=torch.float64) @ torch.randn(2, n, generator=g, dtype=torch.float64))
        dtype = rng.choice([torch.float32, torch.float64])
        a = a.to(dtype)
        b = torch.randn(m, 1, generator=g, dtype=torch.float64).to(dtype)
        s = torch.linalg.svdvals(a.double())
        ratio = float(s[rng.randrange(len(s))] / s[0]) if s[0] > 0 else 1e-3
        rcond = rng.choice([None, ratio, ratio * (1 + 1e-4), ratio * 2, ratio / 2, ratio * 50, 3.0])
        rcond = rcond if rcond is None or rcond > 0 else None
        for driver in checked:
            kwargs = {"driver": driver} | ({} if rcond is None else {"rcond": rcond})
            out = torch.ops.aten.linalg_lstsq(a, b, **kwargs)
            if driver == "gelsy":
                cutoff = rcond if rcond is not None else torch.finfo(dtype).eps * max(m, n)
                direct = lapack_gelsy(a, cutoff, b=b)
                if direct is None:
                    continue
                rank, solution = direct
                out = (solution, out[1], torch.tensor(rank), out[3])
            for c in [c for x in answers("linalg_lstsq", (a, b), kwargs) if (c := x.check(out)) is not None]:
                checked[driver] += 1
                assert not c.disagrees, (driver, kind, m, n, dtype, rcond, c.answer.output, c.got, c.allowed, c.error)
    assert checked["gelsd"] > 250 and checked["gelss"] > 250, checked
    assert checked["gelsy"] > 100 or lapack_gelsy(torch.eye(2), 1e-6) is None, checked


def test_a_driver_without_column_pivoting_is_caught():
    """gelsy with its columns fixed in place (the stale pivots of pytorch/pytorch#187411) reads the
    rank off an unpivoted R: 1 for a rank-2 matrix whose second column is twice its first."""
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.5], [3.0, 6.0, 9.5]], dtype=torch.float64)
    b = torch.ones(3, 1, dtype=torch.float64)
    out = torch.ops.aten.linalg_lstsq(a, b, driver="gelsy")
    eps = torch.finfo(torch.float64).eps * 3
    right, wrong = lapack_gelsy(a, eps), lapack_gelsy(a, eps, fixed=True)
    if right is None:
        pytest.skip("this torch build does not export LAPACK's gelsy")
    assert (right, wrong) == (2, 1)
    [check] = _rank_checks(a, b, (out[0], out[1], torch.tensor(right), out[3]), driver="gelsy")
    assert not check.disagrees and check.allowed == (2, 3) and check.exact == 2
    [check] = _rank_checks(a, b, (out[0], out[1], torch.tensor(wrong), out[3]), driver="gelsy")
    assert check.disagrees and check.got == 1 and check.allowed == (2, 3)


def test_rank_ranges_follow_each_drivers_reading_of_the_cutoff():
    a = torch.tensor([[3.0, 0.0], [0.0, 1e-3], [0.0, 0.0]])
    b = torch.ones(3, 1)

    def allowed(rank, **kwargs):
        solution, residuals, _, values = torch.ops.aten.linalg_lstsq(a, b, **kwargs)
        [check] = _rank_checks(a, b, (solution, residuals, torch.tensor(rank), values), **kwargs)
        return check.allowed, check.disagrees

    assert allowed(2, driver="gelsd") == ((2, 2), False)
    assert allowed(1, driver="gelsd", rcond=1e-2) == ((1, 1), False)
    assert allowed(2, driver="gelsd", rcond=5.0) == ((2, 2), False)  # gelsd: a cutoff ≥ 1 is the machine precision
    assert allowed(0, driver="gelss", rcond=5.0) == ((0, 0), False)  # gelss: nothing is above 5·σ₁
    assert allowed(1, driver="gelsy", rcond=5.0) == ((1, 1), False)  # gelsy keeps its first column
    assert allowed(0, driver="gelsy", rcond=5.0)[1] is True
    assert allowed(0, driver="gelsy", rcond=1e-2)[1] is True
    assert _rank_checks(a, b, torch.ops.aten.linalg_lstsq(a, b, driver="gels")) == []  # gels reports no rank
    assert [x for x in answers("linalg_lstsq", (a, b), {"driver": "gelsy", "rcond": -1.0}) if x.output == 2] == []
    zero = torch.zeros(3, 2)
    for driver in ("gelsy", "gelsd", "gelss"):
        solution, residuals, rank, values = torch.ops.aten.linalg_lstsq(zero, b, driver=driver)
        [check] = _rank_checks(zero, b, (solution, residuals, rank, values), driver=driver)
        assert not check.disagrees and check.got == 0, driver


def test_the_reference_continues_from_the_exact_rank_where_the_float64_driver_is_wrong():
    class StalePivots(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ == "linalg_lstsq":
                return (out[0], out[1], torch.zeros_like(out[2]), out[3])
            return out

    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.5], [3.0, 6.0, 9.5], [1.0, 0.0, 1.0]])
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        rank = torch.linalg.lstsq(a, torch.ones(4, 1), driver="gelsd").rank
    recording = recorder.finish()
    node = recorder.lookup(rank)
    note = next(c for c in recording.conditioning if c["op"] == "linalg_lstsq")
    assert note["kernel_disagrees"] is False
    with StalePivots():
        replay = replay_fp64(recording.graph, {node.name}, 60)
    [check] = [c for c in replay.checked.values()]
    assert check.disagrees and check.got == 0 and check.allowed == (3, 3)
    assert int(replay.values[node.name]) == 3


def _symmetric_with(values, seed):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(len(values), len(values), generator=g, dtype=torch.float64))
    return q @ torch.diag(torch.tensor(values, dtype=torch.float64)) @ q.T


def test_eigenvectors_and_singular_vectors_stay_within_their_bounds_as_gaps_close():
    """Eigen- and singular vectors of matrices whose values are far apart, close (gaps down to
    1e-12), clustered, graded or repeated: a correct kernel is never called wrong; a vector whose
    gap leaves it no digit is not answered."""
    rng = random.Random(4)
    checked = 0
    for _ in range(120):
        n = rng.randint(2, 8)
        values = [rng.gauss(0, 1) for _ in range(n)]
        kind = rng.choice(["apart", "close", "cluster", "repeated"])
        if kind == "close":
            values[1] = values[0] + 10 ** rng.uniform(-12, -1)
        elif kind == "cluster":
            values = [1 + v * 10 ** rng.uniform(-9, -2) for v in values]
        elif kind == "repeated":
            values[1] = values[0]
        sym = _symmetric_with(values, rng.randrange(1 << 30))
        general = sym @ torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))[0]
        for dtype in (torch.float32, torch.float64):
            for name, x in (("_linalg_eigh", sym.to(dtype)), ("_linalg_svd", general.to(dtype))):
                out = getattr(torch.ops.aten, name)(x)
                for c in _checks(name, x, None, out):
                    checked += c.answer.output != (0 if name == "_linalg_eigh" else 1)
                    assert not c.disagrees, (name, kind, n, dtype, c.answer.output, c.error, c.bound)
    assert checked > 200, checked


def test_a_turned_vector_is_caught_but_not_a_change_of_signs():
    sym = _symmetric_with([1.0, 2.0, 4.0], 7).float()
    values, vectors = torch.ops.aten._linalg_eigh(sym)
    flipped = vectors * torch.tensor([-1.0, 1.0, -1.0])
    c, s = math.cos(1e-3), math.sin(1e-3)
    turned = vectors @ torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])  # within a plane of two
    for vecs, wrong in ((vectors, False), (flipped, False), (turned, True)):
        [check] = [c for c in _checks("_linalg_eigh", sym, None, (values, vecs)) if c.answer.output == 1]
        assert check.disagrees is wrong, (check.error, check.bound)
    # The same turn between two vectors 1e-7 apart in value: no digit of either survives float32.
    close = _symmetric_with([1.0, 1.0 + 1e-7, 4.0], 7).float()
    values, vectors = torch.ops.aten._linalg_eigh(close)
    turned = vectors @ torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    assert not any(c.disagrees for c in _checks("_linalg_eigh", close, None, (values, turned)))
    u, s_, vh = torch.ops.aten._linalg_svd(sym)
    sign = torch.tensor([1.0, -1.0, -1.0])
    assert not any(c.disagrees for c in _checks("_linalg_svd", sym, None, (u * sign, s_, vh * sign[:, None])))
    # A left vector negated without its right one is another factorization: U·S·Vh ≠ A.
    assert any(c.disagrees for c in _checks("_linalg_svd", sym, None, (u * sign, s_, vh)))


def test_a_rectangular_svd_is_answered_and_a_wrong_factor_caught():
    """Tall and wide, float32 and float64: a correct SVD's values and reduced vectors stay
    within their bounds, in the kernel's signs; a turned pair of vectors or a scaled value does
    not; a complete SVD's vectors (a basis of the complement among them) are not answered."""
    rng = random.Random(11)
    checked = 0
    for _ in range(40):
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        k, longer = rng.randint(1, 6), rng.randint(2, 24)
        m, n = (longer + k, k) if rng.random() < 0.5 else (k, longer + k)
        a = torch.randn(m, n, generator=g, dtype=torch.float64)
        if rng.random() < 0.3:
            a = a * torch.logspace(-3, 3, n, dtype=torch.float64)[None, :]
        for dtype in (torch.float32, torch.float64):
            out = torch.ops.aten._linalg_svd(a.to(dtype))
            for c in _checks("_linalg_svd", a.to(dtype), None, out):
                checked += 1
                assert not c.disagrees, (m, n, dtype, c.answer.output, c.error, c.bound)
    assert checked > 150, checked
    a = torch.tensor([[3.0, 1.0], [1.0, 2.0], [0.0, 1.0], [1.0, -1.0], [2.0, 0.5]])
    u, s, vh = torch.ops.aten._linalg_svd(a)
    assert [c.disagrees for c in _checks("_linalg_svd", a, None, (u, s, vh))] == [False, False, False]
    c_, s_ = math.cos(1e-3), math.sin(1e-3)
    turn = torch.tensor([[c_, -s_], [s_, c_]])
    for wrong, output in (((u @ turn, s, turn.T @ vh), 0), ((u, s * 1.001, vh), 1)):
        assert [c.answer.output for c in _checks("_linalg_svd", a, None, wrong) if c.disagrees] == \
            ([0, 2] if output == 0 else [1])
    complete = torch.ops.aten._linalg_svd(a, full_matrices=True)
    answered = [x.output for x in answers("_linalg_svd", (a, True), {}) if x.check(complete) is not None]
    # U is 5×5: its last three columns are any basis of the complement, and the pair's signs
    # are read from U and Vh together: the values only.
    assert answered == [1]


def test_the_reference_continues_from_the_exact_eigenvectors_in_the_arms_signs():
    class TurnedVectors(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ == "_linalg_eigh":
                return out[0], out[1] * torch.tensor([-1.01, 1.01, 1.01], dtype=out[1].dtype)
            return out

    sym = _symmetric_with([1.0, 2.0, 4.0], 9).float()  # mpmath's signs differ from LAPACK's here
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        vectors = torch.linalg.eigh(sym).eigenvectors
    recording = recorder.finish()
    node = recorder.lookup(vectors)
    honest = replay_fp64(recording.graph, {node.name}, 60)
    with TurnedVectors():
        replay = replay_fp64(recording.graph, {node.name}, 60)
    [check] = [c for c in replay.checked.values()]
    assert check.disagrees and check.answer.output == 1
    # The exact vectors, each with the sign the arm's kernel gave it (the faulty float64
    # kernel's other sign for the first is taken back, as any sign the reference chose).
    assert torch.allclose(replay.values[node.name], honest.values[node.name], rtol=0, atol=1e-12)
    assert bool(((replay.values[node.name] * vectors.double()).sum(0) > 0).all())


def test_lu_factors_are_answered_for_the_pivots_partial_pivoting_takes():
    a = torch.tensor([[1.0, 2.0, 0.0], [-1.0, 3.0, 1.0], [2.0, 1.0, 5.0]])
    p, lower, upper = torch.ops.aten.linalg_lu(a)

    def lu_checks(outputs):
        return [(c.answer.output, c.disagrees) for x in answers("linalg_lu", (a,), {}) if (c := x.check(outputs))]

    assert lu_checks((p, lower, upper)) == [(1, False), (2, False)]
    wrong = lower.clone()
    wrong[2, 1] *= 1.01
    assert lu_checks((p, wrong, upper)) == [(1, True), (2, False)]
    assert lu_checks((p, lower, upper * 1.001)) == [(1, False), (2, True)]
    # Another permutation is another factorization, not answered: the pivots decide it.
    assert lu_checks((torch.eye(3), lower, upper)) == []
    # A tie (|1| = |−1|): partial pivoting keeps the first row, as getrf does; a kernel that
    # swapped made a legitimate other choice, which the answer does not judge.
    tie = torch.tensor([[1.0, 2.0], [-1.0, 3.0]])
    packed, pivots, info = torch.ops.aten.linalg_lu_factor_ex(tie)
    assert pivots.tolist() == [1, 2]
    [answer] = answers("linalg_lu_factor_ex", (tie,), {})
    assert answer.check((packed, pivots, info)).disagrees is False
    swapped = torch.tensor([[-1.0, 3.0], [-1.0, 5.0]])  # LU of the rows swapped
    assert answer.check((swapped, torch.tensor([2, 2], dtype=torch.int32), info)) is None
    assert answers("linalg_lu_factor_ex", (torch.tensor([[1.0, 2.0], [2.0, 4.0]]),), {}) == []  # singular
    assert answers("linalg_lu", (a,), {"pivot": False}) == []


def test_general_eigenvalues_are_matched_in_any_order_and_checked_both_ways():
    rng = random.Random(6)
    checked = 0
    for _ in range(60):
        n = rng.randint(1, 8)
        kind = rng.choice(["randn", "near-singular", "scaled", "integer", "graded", "low-rank"])
        dtype = rng.choice([torch.float32, torch.float64])
        a = _matrix(kind, n, rng).to(dtype)
        out = torch.ops.aten.linalg_eig(a)
        for c in [c for x in answers("linalg_eig", (a,), {}) if (c := x.check(out)) is not None]:
            checked += 1
            assert not c.disagrees, (kind, n, dtype, c.error, c.bound)
    assert checked > 40, checked
    a = torch.tensor([[1.0, 2.0, 0.0], [-1.0, 3.0, 1.0], [2.0, 1.0, 5.0]])  # a complex pair and a real one
    values, vectors = torch.ops.aten.linalg_eig(a)
    [answer] = answers("linalg_eig", (a,), {})

    def disagrees(v):
        return answer.check((v, vectors)).disagrees

    assert not disagrees(values) and not disagrees(values[[2, 1, 0]])  # any order
    assert disagrees(values * torch.tensor([1.0, 1.0, 1.001]))
    assert disagrees(values[[0, 0, 2]])  # one of the pair returned twice, its conjugate missed
    assert disagrees(values.conj() * torch.tensor([1.0, 1.0, 0.0]))
    # A perturbed Jordan block: its eigenvalues move by the square root of the perturbation,
    # no digit survives at float32: nothing is concluded.
    jordan = torch.tensor([[2.0, 1.0], [1e-10, 2.0]])
    assert [c for x in answers("linalg_eig", (jordan,), {}) if (c := x.check(torch.ops.aten.linalg_eig(jordan)))] == []
