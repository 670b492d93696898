"""Conditioning of linalg ops at the input the arm actually fed them (recorded at run time).

A 4x4 matrix whose rows are identical is exactly singular: its determinant is 0, its
logdet -inf, and any finite answer is rounding noise.  The accuracy note's linalg section
says results on such inputs may differ between devices; this module supplies the figure.
"""
from __future__ import annotations

from typing import Any

import torch

# aten overload-packet names of the ops whose accuracy depends on the input's conditioning,
# as they appear below autograd (torch.logdet dispatches as _linalg_slogdet, etc.).
LINALG_OPS = {
    "_linalg_det", "linalg_det", "det", "logdet", "slogdet", "_linalg_slogdet", "linalg_slogdet",
    "linalg_inv_ex", "linalg_inv", "inverse", "_linalg_solve_ex", "linalg_solve", "linalg_solve_ex",
    "linalg_lu_factor_ex", "linalg_lu", "cholesky", "linalg_cholesky_ex", "linalg_lstsq",
    "linalg_pinv", "triangular_solve", "linalg_solve_triangular", "cholesky_solve",
    "lu_solve", "linalg_lu_solve", "cholesky_inverse",
}
MAX_ORDER = 1024
MAX_BATCH = 256


def condition_of(op: str, a: torch.Tensor) -> dict[str, Any] | None:
    """Condition number and numerical rank of the matrix (worst over a batch)."""
    if a.dim() < 2 or not (a.is_floating_point() or a.is_complex()) or a.numel() == 0:
        return None
    m, n = a.shape[-2], a.shape[-1]
    batch = a.numel() // (m * n)
    if max(m, n) > MAX_ORDER or batch > MAX_BATCH:
        return None
    wide = a.detach().to("cpu", torch.complex128 if a.is_complex() else torch.float64)
    wide = wide.reshape(batch, m, n)
    if not torch.isfinite(wide).all():
        return {"op": op, "shape": list(a.shape), "dtype": str(a.dtype).replace("torch.", ""),
                "nonfinite_input": True, "cond": None, "rank": None, "order": min(m, n),
                "singular": False, "ill_conditioned": False}
    s = torch.linalg.svdvals(wide)  # (batch, k) in descending order
    smax = s[:, 0]
    smin = s[:, -1]
    eps = torch.finfo(a.dtype if a.is_floating_point() else torch.float32).eps
    k = s.shape[-1]
    ranks = (s > (smax * max(m, n) * eps).unsqueeze(-1)).sum(-1)
    with torch.no_grad():
        cond = torch.where(smin > 0, smax / smin, torch.full_like(smax, float("inf")))
    worst = int(torch.argmax(torch.nan_to_num(cond, posinf=float("1e308"))))
    c = float(cond[worst])
    rank = int(ranks.min())
    exact = exact_singular(a) if op in DET_OPS else None
    return {
        "op": op,
        "exact_singular": exact,
        "shape": list(a.shape),
        "dtype": str(a.dtype).replace("torch.", ""),
        "nonfinite_input": False,
        "cond": c,
        "rank": rank,
        "order": k,
        "singular": rank < k or bool(exact),
        # Past 1/eps, the matrix is singular to working precision.
        "ill_conditioned": c * eps > 1e-2 or rank < k or bool(exact),
        "eps": eps,
    }


EXACT_MAX_ORDER = 12
EXACT_MAX_BATCH = 64
DET_OPS = {"_linalg_det", "linalg_det", "det", "_linalg_slogdet", "linalg_slogdet", "slogdet", "logdet"}


def exact_singular(a: torch.Tensor) -> bool | None:
    """Whether some matrix of the batch has determinant exactly 0, in rational arithmetic.

    Every float is a rational number, so the determinant of the *recorded* matrix has an exact
    value; fraction-free elimination (Bareiss) finds it without rounding.  LAPACK in float64
    does not: on an exactly singular 4x4 it can return a pivot of 1e-103 (logdet -236).
    """
    if a.is_complex() or a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        return None
    n = a.shape[-1]
    batch = a.numel() // (n * n) if n else 0
    if n == 0 or n > EXACT_MAX_ORDER or batch > EXACT_MAX_BATCH:
        return None
    wide = a.detach().to("cpu", torch.float64).reshape(batch, n, n)
    if not torch.isfinite(wide).all():
        return None
    from fractions import Fraction

    for matrix in wide.tolist():
        if _bareiss_det([[Fraction(v) for v in row] for row in matrix]) == 0:
            return True
    return False


def _bareiss_det(m: list[list]) -> object:
    n = len(m)
    sign, previous = 1, 1
    for k in range(n - 1):
        if m[k][k] == 0:
            swap = next((i for i in range(k + 1, n) if m[i][k] != 0), None)
            if swap is None:
                return 0
            m[k], m[swap] = m[swap], m[k]
            sign = -sign
        for i in range(k + 1, n):
            for j in range(k + 1, n):
                m[i][j] = (m[i][j] * m[k][k] - m[i][k] * m[k][j]) / previous
        previous = m[k][k]
    return sign * m[n - 1][n - 1]
