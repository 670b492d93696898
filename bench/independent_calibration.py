"""Calibration of the independent least-squares, pseudoinverse, QR, rectangular SVD and Cholesky answers
(triage/worker/independent.py): correct LAPACK kernels (every lstsq driver, both Cholesky
triangles) on random tall matrices of several kinds (exactly rank-deficient ones among them)
and, for lstsq, pinv and SVD, wide ones (a third of the cases), float32 and float64, consistent and inconsistent systems. Prints how many
checks concluded, the largest error as a fraction of its bound, and every check a correct
kernel failed (there must be none). torch's own gelsy call may return a wrong rank
(pytorch/pytorch#187411), and then another solution: its rank's checks, and a solution's
check where that rank is wrong, are counted apart, as a kernel bug found.

    python bench/independent_calibration.py SEED ITERATIONS    # about 60 s for 500 on 2 cores
    python bench/independent_calibration.py --opinfo           # every answered op on OpInfo's samples
    python bench/independent_calibration.py --square SEED ITERATIONS   # vectors, LU, eig, ranks

`--square` covers the answers whose correct kernels meet their bounds only under a condition:
eigen- and singular vectors (the gap), LU (the pivots), general eigenvalues (each one's κ) and a
least-squares driver's rank (a range, at cutoffs at, near and around the singular values).
gelsy is called through LAPACK directly with its column pivots zeroed, as torch 2.13's own call
does not always pass them (pytorch/pytorch#187411); how often torch's own call falls outside the
range is counted apart.
"""
import random
import sys
import time
from pathlib import Path

import torch

from triage.worker.independent import answers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lapack import lapack_gelsy  # noqa: E402 - the tests' direct LAPACK call

KINDS = ("randn", "graded", "rowgraded", "scaled", "integer", "near-dependent", "vandermonde", "low-rank")
DRIVERS = (None, "gelsy", "gels", "gelsd", "gelss")


def tall(kind: str, m: int, n: int, g: torch.Generator, rng: random.Random) -> torch.Tensor:
    a = torch.randn(m, n, generator=g, dtype=torch.float64)
    if kind == "graded":
        a = a * torch.logspace(-4, 4, n, dtype=torch.float64)[None, :]
    elif kind == "rowgraded":
        a = a * torch.logspace(-4, 4, m, dtype=torch.float64)[:, None]
    elif kind == "scaled":
        a = a * 10 ** rng.uniform(-15, 15)
    elif kind == "integer":
        a = torch.randint(-3, 4, (m, n), generator=g).double()
    elif kind == "near-dependent":
        a[:, -1] = a[:, 0] + 1e-4 * torch.randn(m, generator=g, dtype=torch.float64)
    elif kind == "vandermonde":
        a = torch.linspace(0, 1, m, dtype=torch.float64)[:, None] ** torch.arange(n, dtype=torch.float64)[None, :]
    elif kind == "low-rank":  # exactly, in rational arithmetic: rank n - 1 (a least-squares driver's rank decision)
        r = max(1, n - 1)
        a = (torch.randint(-3, 4, (m, r), generator=g) @ torch.randint(-3, 4, (r, n), generator=g)).double()
    return a


def main(seed: int, iterations: int) -> int:
    rng = random.Random(seed)
    worst = {"lstsq": 0.0, "cholesky": 0.0, "pinv": 0.0, "qr": 0.0, "svd": 0.0}
    count = {"lstsq": 0, "cholesky": 0, "pinv": 0, "qr": 0, "svd": 0}
    wrong = []
    stale, torch_gelsy = 0, [0, 0]
    start = time.time()

    def record(op: str, check, *case) -> None:
        count[op] += 1
        worst[op] = max(worst[op], check.error / check.bound)
        if check.disagrees:
            wrong.append((op, *case, check.error, check.bound))

    for _ in range(iterations):
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        n = rng.randint(1, 8)
        m = rng.randint(n, 24)
        kind, dtype = rng.choice(KINDS), rng.choice([torch.float32, torch.float64])
        a = tall(kind, m, n, g, rng)
        wide = m > n and rng.random() < 1 / 3
        if wide:  # full row rank where the tall one had full column rank
            a, m, n = a.T.contiguous(), n, m
        b = (a @ torch.randn(n, rng.randint(1, 3), generator=g, dtype=torch.float64) if not wide
             else torch.randn(m, rng.randint(1, 3), generator=g, dtype=torch.float64))
        b = b + rng.choice([0.0, 1e-6, 1e-2, 1.0]) * float(a.abs().max()) * torch.randn(b.shape, generator=g,
                                                                                         dtype=torch.float64)
        a_low, b_low = a.to(dtype), b.to(dtype)
        if rng.random() < 0.2:
            a_low, b_low = torch.stack([a_low, a_low * 2]), torch.stack([b_low, b_low])
        for driver in DRIVERS:
            try:
                out = torch.ops.aten.linalg_lstsq(a_low, b_low, driver=driver)
            except RuntimeError:
                continue
            checks = [(answer, check) for answer in answers("linalg_lstsq", (a_low, b_low), {"driver": driver})
                      if (check := answer.check(out)) is not None]
            # torch's own gelsy call: its rank (`--square` measures the range against LAPACK
            # called directly) and, where that rank is wrong, the solution, counted apart.
            ranks = [check for answer, check in checks if answer.output == 2]
            rank_wrong = any(check.disagrees for check in ranks)
            if driver in (None, "gelsy"):
                torch_gelsy[0] += len(ranks)
                torch_gelsy[1] += rank_wrong
            for answer, check in checks:
                if driver in (None, "gelsy") and answer.output == 2:
                    continue
                if rank_wrong and answer.output == 0 and check.disagrees:
                    stale += 1
                    continue
                record("lstsq", check, kind, m, n, dtype, driver)
        full = rng.random() < 0.3  # a complete SVD: a rectangular one's vectors are not answered
        for op, call in (("pinv", torch.ops.aten.linalg_pinv), ("qr", torch.ops.aten.linalg_qr),
                         ("svd", lambda x: torch.ops.aten._linalg_svd(x, full_matrices=full))):
            if wide and op == "qr":
                continue
            out = call(a_low)
            name = "_linalg_svd" if op == "svd" else f"linalg_{op}"
            for answer in answers(name, (a_low, full) if op == "svd" else (a_low,), {}):
                if (check := answer.check(out)) is not None:
                    record(op, check, kind, m, n, dtype, answer.output)
        if wide:
            continue
        s = (a.T @ a + (torch.eye(n, dtype=torch.float64) if kind == "integer" else 0)).to(dtype)
        for upper in (False, True):
            out = torch.ops.aten.linalg_cholesky_ex(s, upper=upper)
            for answer in answers("linalg_cholesky_ex", (s,), {"upper": upper}):
                if (check := answer.check(out)) is not None:
                    record("cholesky", check, kind, n, dtype, upper)
    print(f"checks {count}, largest error / bound {worst}, wrong {len(wrong)} {wrong[:5]}, "
          f"torch's own gelsy call: a rank outside the range {torch_gelsy[1]} of {torch_gelsy[0]}, and then a "
          f"solution off {stale}, {time.time() - start:.1f} s")
    return 1 if wrong else 0


def square(kind: str, n: int, g: torch.Generator, rng: random.Random) -> torch.Tensor:
    """A square matrix of a kind whose vectors, pivots or eigenvalues are hard to get right."""
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    values = torch.randn(n, generator=g, dtype=torch.float64)
    if kind == "close" and n > 1:
        values[1] = values[0] + 10 ** rng.uniform(-12, -1)
    elif kind == "cluster":
        values = 1 + values * 10 ** rng.uniform(-9, -2)
    elif kind == "repeated" and n > 1:
        values[1] = values[0]
    elif kind == "graded":
        values = values * torch.logspace(-8, 0, n, dtype=torch.float64)
    a = q @ torch.diag(values) @ q.T
    if kind == "integer":
        a = torch.randint(-3, 4, (n, n), generator=g).double()
    elif kind == "nonnormal":
        a = torch.randn(n, n, generator=g, dtype=torch.float64).triu() * 10 ** rng.uniform(0, 3)
    elif kind == "jordan":
        a = 2 * torch.eye(n, dtype=torch.float64) + torch.diag(torch.ones(n - 1, dtype=torch.float64), 1)
        a = a + 10 ** rng.uniform(-12, -2) * torch.randn(n, n, generator=g, dtype=torch.float64)
    elif kind == "scaled":
        a = a * 10 ** rng.uniform(-15, 15)
    return a


SQUARE_KINDS = ("randn", "close", "cluster", "repeated", "graded", "integer", "nonnormal", "jordan", "scaled")


def square_main(seed: int, iterations: int) -> int:
    rng = random.Random(seed)
    count: dict[str, int] = {}
    worst: dict[str, float] = {}
    wrong, torch_gelsy = [], [0, 0]
    start = time.time()

    def record(op: str, check, *case) -> None:
        count[op] = count.get(op, 0) + 1
        worst[op] = max(worst.get(op, 0.0), check.error / check.bound)
        if check.disagrees:
            wrong.append((op, *case, check.error, check.bound))

    for _ in range(iterations):
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        n, kind, dtype = rng.randint(1, 8), rng.choice(SQUARE_KINDS), rng.choice([torch.float32, torch.float64])
        a = square(kind, n, g, rng)
        symmetric = ((a + a.T) / 2).to(dtype)
        general = a.to(dtype)
        for name, x, label in (("_linalg_eigh", symmetric, "eigenvectors"), ("_linalg_svd", general, "singular vectors"),
                               ("linalg_lu_factor_ex", general, "LU (packed)"), ("linalg_lu", general, "LU (P, L, U)"),
                               ("linalg_eig", general, "eigenvalues (general)")):
            out = getattr(torch.ops.aten, name)(x)
            for answer in answers(name, (x,), {}):
                if name in ("_linalg_eigh", "_linalg_svd") and answer.output == (0 if name == "_linalg_eigh" else 1):
                    continue  # the values: measured by main()'s seeds and --opinfo
                if (check := answer.check(out)) is not None:
                    record(label, check, kind, n, dtype, answer.output)
        # The rank of a least-squares driver, at cutoffs at, near and around a singular value.
        m = rng.randint(1, 32)
        tall = torch.cat([general, torch.randn(max(m - n, 0), n, generator=g, dtype=torch.float64).to(dtype)])[:m]
        b = torch.randn(m, 1, generator=g, dtype=torch.float64).to(dtype)
        s = torch.linalg.svdvals(tall.double())
        ratio = float(s[rng.randrange(len(s))] / s[0]) if len(s) and s[0] > 0 else 1e-3
        rcond = rng.choice([None, ratio, ratio * (1 + 1e-4), ratio * 2, ratio / 2, ratio * 50, 3.0])
        rcond = rcond if rcond is None or rcond > 0 else None
        for driver in ("gelsy", "gelsd", "gelss"):
            kwargs = {"driver": driver} | ({} if rcond is None else {"rcond": rcond})
            out = torch.ops.aten.linalg_lstsq(tall, b, **kwargs)
            rank_answers = [x for x in answers("linalg_lstsq", (tall, b), kwargs) if x.output == 2]
            if driver == "gelsy":
                for answer in rank_answers:  # torch's own call, counted apart
                    if (check := answer.check(out)) is not None:
                        torch_gelsy[0] += 1
                        torch_gelsy[1] += check.disagrees
                cutoff = rcond if rcond is not None else torch.finfo(dtype).eps * max(m, n)
                rank = lapack_gelsy(tall, cutoff)
                if rank is None:
                    continue
                out = (out[0], out[1], torch.tensor(rank), out[3])
            for answer in rank_answers:
                if (check := answer.check(out)) is not None:
                    record(f"rank ({driver})", check, kind, m, n, dtype, rcond)
    print(f"checks {count}, largest error / bound {worst}, wrong {len(wrong)} {wrong[:5]}, "
          f"torch's own gelsy call outside the range {torch_gelsy[1]} of {torch_gelsy[0]}, {time.time() - start:.1f} s")
    return 1 if wrong else 0


# OpInfo entries whose calls reach an answered aten op (the op is seen at dispatch, as the
# recorder sees it: linalg.cholesky is linalg_cholesky_ex, linalg.svdvals is _linalg_svd).
OPINFO_NAMES = ("linalg.lstsq", "linalg.pinv", "linalg.qr", "linalg.cholesky", "linalg.det", "linalg.inv",
                "linalg.solve", "linalg.svdvals", "linalg.eigvalsh", "linalg.slogdet", "linalg.eigh", "linalg.svd",
                "linalg.lu_factor", "linalg.lu", "linalg.eig", "linalg.eigvals")


def opinfo(samples_per_op: int = 40) -> int:
    """Correct kernels on the sample inputs PyTorch tests each op with, float32 and float64."""
    import warnings

    from torch.testing._internal.common_methods_invocations import op_db
    from torch.utils._python_dispatch import TorchDispatchMode

    from triage.worker.independent import COVERED_OPS

    class Answered(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.checks: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in COVERED_OPS:
                self.checks += [(name, c) for a in answers(name, args, kwargs or {}) if (c := a.check(out)) is not None]
            return out

    warnings.filterwarnings("ignore")
    count: dict[str, int] = {}
    worst: dict[str, float] = {}
    wrong = []
    for op in (o for o in op_db if o.name in OPINFO_NAMES):
        for dtype in (torch.float32, torch.float64):
            for sample in list(op.sample_inputs("cpu", dtype, requires_grad=False))[:samples_per_op]:
                mode = Answered()
                try:
                    with mode:
                        op(sample.input, *sample.args, **sample.kwargs)
                except RuntimeError:
                    continue  # a sample the op refuses (a singular matrix for cholesky)
                for name, check in mode.checks:
                    count[name] = count.get(name, 0) + 1
                    worst[name] = max(worst.get(name, 0.0), check.error / check.bound)
                    if check.disagrees:
                        wrong.append((op.name, dtype, name, check.error, check.bound))
    print(f"OpInfo checks {count}, largest error / bound {worst}, wrong {len(wrong)} {wrong[:5]}")
    return 1 if wrong else 0


if __name__ == "__main__":
    if "--opinfo" in sys.argv:
        sys.exit(opinfo())
    if "--square" in sys.argv:
        rest = [a for a in sys.argv[1:] if a != "--square"]
        sys.exit(square_main(int(rest[0]) if rest else 0, int(rest[1]) if len(rest) > 1 else 300))
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0, int(sys.argv[2]) if len(sys.argv) > 2 else 500))
