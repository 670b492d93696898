"""Calibration of the independent least-squares, pseudoinverse, QR and Cholesky answers
(triage/worker/independent.py): correct LAPACK kernels (every lstsq driver, both Cholesky
triangles) on random tall matrices of
several kinds, float32 and float64, consistent and inconsistent systems. Prints how many checks
concluded, the largest error as a fraction of its bound, and every check a correct kernel
failed (there must be none).

    python bench/independent_calibration.py SEED ITERATIONS    # about 60 s for 500 on 2 cores
    python bench/independent_calibration.py --opinfo           # every answered op on OpInfo's samples
"""
import random
import sys
import time

import torch

from triage.worker.independent import answers

KINDS = ("randn", "graded", "rowgraded", "scaled", "integer", "near-dependent", "vandermonde")
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
    return a


def main(seed: int, iterations: int) -> int:
    rng = random.Random(seed)
    worst = {"lstsq": 0.0, "cholesky": 0.0, "pinv": 0.0, "qr": 0.0}
    count = {"lstsq": 0, "cholesky": 0, "pinv": 0, "qr": 0}
    wrong = []
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
        b = a @ torch.randn(n, rng.randint(1, 3), generator=g, dtype=torch.float64)
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
            for answer in answers("linalg_lstsq", (a_low, b_low), {"driver": driver}):
                if (check := answer.check(out)) is not None:
                    record("lstsq", check, kind, m, n, dtype, driver)
        for op, call in (("pinv", torch.ops.aten.linalg_pinv), ("qr", torch.ops.aten.linalg_qr)):
            out = call(a_low)
            for answer in answers(f"linalg_{op}", (a_low,), {}):
                if (check := answer.check(out)) is not None:
                    record(op, check, kind, m, n, dtype, answer.output)
        s = (a.T @ a + (torch.eye(n, dtype=torch.float64) if kind == "integer" else 0)).to(dtype)
        for upper in (False, True):
            out = torch.ops.aten.linalg_cholesky_ex(s, upper=upper)
            for answer in answers("linalg_cholesky_ex", (s,), {"upper": upper}):
                if (check := answer.check(out)) is not None:
                    record("cholesky", check, kind, n, dtype, upper)
    print(f"checks {count}, largest error / bound {worst}, wrong {len(wrong)} {wrong[:5]}, "
          f"{time.time() - start:.1f} s")
    return 1 if wrong else 0


# OpInfo entries whose calls reach an answered aten op (the op is seen at dispatch, as the
# recorder sees it: linalg.cholesky is linalg_cholesky_ex, linalg.svdvals is _linalg_svd).
OPINFO_NAMES = ("linalg.lstsq", "linalg.pinv", "linalg.qr", "linalg.cholesky", "linalg.det", "linalg.inv",
                "linalg.solve", "linalg.svdvals", "linalg.eigvalsh", "linalg.slogdet")


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
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0, int(sys.argv[2]) if len(sys.argv) > 2 else 500))
