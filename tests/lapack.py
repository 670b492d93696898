"""LAPACK called directly, as a correct caller calls it: the reference a torch call is measured
against where torch's own call is known to be wrong (tests/test_independent.py,
bench/independent_calibration.py)."""
import ctypes
import os

import torch


def lapack_gelsy(a: torch.Tensor, rcond: float, fixed: bool = False,
                 b: torch.Tensor | None = None) -> int | tuple[int, torch.Tensor] | None:
    """LAPACK's ?gelsy called directly on `a` with every column free (JPVT zeroed, as a correct
    caller passes it) or, with `fixed`, every column fixed in place (as stale pivots leave it):
    its rank, and with a right-hand side `b` (m×1) the solution too. None where this torch
    build does not export the symbol."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        names = ("DGELSY", "dgelsy_") if a.dtype == torch.float64 else ("SGELSY", "sgelsy_")
        fn = next(getattr(lib, name) for name in names if hasattr(lib, name))
    except (OSError, StopIteration):
        return None
    real = ctypes.c_double if a.dtype == torch.float64 else ctypes.c_float
    m, n = a.shape
    lda, ldb = max(1, m), max(1, m, n)
    matrix = (real * (lda * n))(*a.T.reshape(-1).tolist())
    rhs = (real * ldb)(*([] if b is None else b.reshape(-1).tolist()))
    pivots = (ctypes.c_int * n)(*([1] * n if fixed else [0] * n))
    rank, info, query = ctypes.c_int(), ctypes.c_int(), (real * 1)()

    def call(work, size):
        fn(*(ctypes.byref(ctypes.c_int(v)) for v in (m, n, 1)), matrix, ctypes.byref(ctypes.c_int(lda)), rhs,
           ctypes.byref(ctypes.c_int(ldb)), pivots, ctypes.byref(real(rcond)), ctypes.byref(rank), work,
           ctypes.byref(ctypes.c_int(size)), ctypes.byref(info))

    call(query, -1)
    size = max(1, int(query[0]))
    call((real * size)(), size)
    assert info.value == 0
    if b is None:
        return rank.value
    return rank.value, torch.tensor(list(rhs)[:n], dtype=a.dtype).reshape(n, 1)
