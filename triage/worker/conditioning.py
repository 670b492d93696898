"""Conditioning of linalg ops at the input the arm actually fed them (recorded at run time).

A 4x4 matrix whose rows are identical is exactly singular: its determinant is 0, its
logdet -inf, and any finite answer is rounding noise.  The accuracy note's linalg section
says results on such inputs may differ between devices; this module supplies the figure.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

# aten overload-packet names of the ops whose accuracy depends on the input's conditioning,
# as they appear below autograd (torch.logdet dispatches as _linalg_slogdet, etc.).
LINALG_OPS = {
    "_linalg_det", "linalg_det", "det", "logdet", "slogdet", "_linalg_slogdet", "linalg_slogdet",
    "linalg_inv_ex", "linalg_inv", "inverse", "_linalg_solve_ex", "linalg_solve", "linalg_solve_ex",
    "linalg_lu_factor_ex", "linalg_lu", "cholesky", "linalg_cholesky_ex", "linalg_lstsq",
    "linalg_pinv", "triangular_solve", "linalg_solve_triangular", "cholesky_solve",
    "lu_solve", "linalg_lu_solve", "cholesky_inverse", "_linalg_svd", "linalg_svd", "linalg_svdvals",
    "_linalg_eigh", "linalg_eigh", "linalg_eig", "linalg_qr",
}
# Eigen- and singular-vector problems: a vector's error is about u·‖A‖/gap, with gap the
# distance from its eigenvalue (singular value) to the nearest other one — however well
# conditioned the matrix is for solving (Golub & Van Loan §8.1.2, Stewart & Sun).
VECTOR_OPS = {"_linalg_eigh": "eigenvalue", "linalg_eigh": "eigenvalue", "linalg_eig": "eigenvalue",
              "_linalg_svd": "singular value", "linalg_svd": "singular value"}
# Past this error the vectors keep fewer than 3 correct digits: named as ill-conditioned.
VECTOR_SENSITIVITY_NOTED = 1e-3
# Past this move (relative to ‖A‖₂) a general matrix's eigenvalues keep fewer than 4 digits.
EIGENVALUE_MOVE_NOTED = 1e-4
MAX_ORDER = 1024
MAX_BATCH = 256


def condition_of(op: str, a: torch.Tensor, kwargs: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Condition number and numerical rank of the matrix (worst over a batch); for an eigen-
    or singular-vector op, the vectors' figure, carrying the matrix's own note for a script
    that reads the values alone (`VALUES_ONLY`: eigenvalues err by u·‖A‖₂ each, which the
    condition number says relative to the smallest). A pseudoinverse's rank is counted at
    the call's own cutoff (`kwargs`' atol and rtol), with how near a singular value lies to it
    (`_rank_cutoff`)."""
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
    eig = None
    if op == "linalg_eig" and m == n:
        try:
            eig = torch.linalg.eig(wide)
        except RuntimeError:  # LAPACK did not converge: no figure from it
            eig = None
        note = _eigenvalue_sensitivity(eig, a.dtype, s, list(a.shape))
        if note is not None:
            return note
    vector_note = None
    if op in VECTOR_OPS and m == n and (op != "linalg_eig" or eig is not None):
        vector_note = _vector_sensitivity(op, wide, a.dtype, s, list(a.shape), eig[0] if eig is not None else None)
    exact = exact_singular(a) if op in DET_OPS else None
    exact_rank_ = exact_rank(a) if op in SVD_OPS else None
    if exact_rank_ is not None:
        exact = exact_rank_ < k
    note = {
        "op": op,
        "exact_singular": exact,
        "shape": list(a.shape),
        "dtype": str(a.dtype).replace("torch.", ""),
        "nonfinite_input": False,
        "cond": c,
        "rank": rank,
        "order": k,
        "exact_rank": exact_rank_,
        "singular": rank < k or bool(exact),
        # Past 1/eps, the matrix is singular to working precision.
        "ill_conditioned": c * eps > 1e-2 or rank < k or bool(exact),
        "eps": eps,
    }
    if op in CUTOFF_OPS:
        note.update(_rank_cutoff(s, kwargs or {}, a.dtype, m, n))
        note["singular"] = note["rank"] < k or bool(exact)
        note["ill_conditioned"] = note["ill_conditioned"] or note["singular"] or note["cutoff_at_rounding"]
    if vector_note is not None:
        # What to say instead where the script reads only the values (the recorder decides,
        # once it knows whether the vectors are read: `values_only`).
        vector_note[VALUES_ONLY] = note
        return vector_note
    return note


# Ops that drop the singular values below a cutoff max(atol, rtol·σmax) (torch's default:
# rtol = max(m, n)·eps where no atol is given).
CUTOFF_OPS = {"linalg_pinv"}
# A singular value within this many u·σmax of the cutoff falls on either side of it under the
# arm's rounding: a backward-stable SVD moves each σ by up to about √max(m, n)·u·‖A‖₂.
CUTOFF_ROUNDINGS = 4.0


def _rank_cutoff(s: torch.Tensor, kwargs: dict[str, Any], dtype: torch.dtype, m: int, n: int) -> dict[str, Any]:
    """The rank at a pseudoinverse's own cutoff (worst over a batch: the fewest kept), the
    cutoff relative to σmax, and the singular value nearest it, in units of the arm's u·σmax
    (`cutoff_margin`): within CUTOFF_ROUNDINGS·√max(m, n) of them, the rank is rounding's
    choice (`cutoff_at_rounding`), and the pseudoinverse with it."""
    def number(x: Any) -> float | None:
        if isinstance(x, torch.Tensor):
            return float(x.reshape(-1)[0]) if x.numel() == 1 else None
        return float(x) if isinstance(x, (int, float)) else None

    eps = torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps
    atol, rtol = number(kwargs.get("atol")), number(kwargs.get("rtol"))
    if rtol is None:
        rtol = 0.0 if atol is not None and atol > 0 else max(m, n) * eps
    atol = atol or 0.0
    smax = s[:, :1]
    threshold = torch.clamp(rtol * smax, min=atol)
    ranks = (s > threshold).sum(-1)
    unit = torch.where(smax > 0, eps / 2 * smax, torch.ones_like(smax))
    margins = ((s - threshold).abs() / unit).min(-1).values
    worst = int(torch.argmin(margins))
    nearest = int(torch.argmin((s[worst] - threshold[worst]).abs()))
    margin = float(margins[worst])
    return {"rank": int(ranks.min()), "cutoff": float(threshold[worst, 0] / smax[worst, 0]) if smax[worst, 0] > 0
            else None, "cutoff_nearest": float(s[worst, nearest] / smax[worst, 0]) if smax[worst, 0] > 0 else None,
            "cutoff_margin": margin, "cutoff_at_rounding": margin <= CUTOFF_ROUNDINGS * math.sqrt(max(m, n))}


# The key under which a vector note carries the note for the values alone (never reported),
# and the vector note's own figures, which that note replaces.
VALUES_ONLY = "values_only"
VECTOR_NOTE_KEYS = {"kind", "gap", "sensitivity", "figure"}


def _eigenvalue_sensitivity(eig: tuple[torch.Tensor, torch.Tensor] | None, dtype: torch.dtype, s: torch.Tensor,
                            shape: list[int]) -> dict[str, Any] | None:
    """A general matrix's eigenvalues are as sensitive as its eigenvectors are far from
    orthogonal: eigenvalue i moves by about u·‖A‖₂·κᵢ, κᵢ = ‖xᵢ‖‖yᵢ‖/|yᵢᴴxᵢ| (x right, y left
    eigenvectors; 1 for a normal matrix), and a defective (Jordan) block of size k by
    (u·‖A‖₂)^(1/k), which first-order κ only bounds from below (Golub & Van Loan §7.2.2)."""
    kappa = None
    if eig is not None:
        vectors = eig[1]
        with contextlib.suppress(RuntimeError):  # an eigenvector matrix singular in float64
            left = torch.linalg.inv(vectors)
            kappa = (torch.linalg.vector_norm(vectors, dim=-2) * torch.linalg.vector_norm(left, dim=-1)).amax(dim=-1)
    if kappa is None:  # no eigenvectors, or dependent ones: as defective as it gets
        kappa = torch.full(s[:, 0].shape, math.inf, dtype=torch.float64)
    u = torch.finfo(dtype).eps / 2
    moved = u * kappa  # relative to ‖A‖₂
    worst = int(torch.argmax(torch.nan_to_num(moved, nan=math.inf, posinf=1e308)))
    relative = float(moved[worst])
    if not relative > EIGENVALUE_MOVE_NOTED:
        return None
    shown = "∞" if math.isinf(float(kappa[worst])) else f"{float(kappa[worst]):.2g}"
    name = str(dtype).replace("torch.", "")
    return {"op": "linalg_eig", "kind": "nonnormal-eigenvalues", "shape": shape, "dtype": name,
            "singular": False, "ill_conditioned": True, "cond": None, "rank": None, "order": shape[-1],
            "eps": torch.finfo(dtype).eps, "sensitivity": relative,
            "figure": f"its eigenvalues' condition numbers reach {shown} (eigenvectors far from orthogonal: a nearly "
                      f"defective matrix), so an eigenvalue moves by about u·‖A‖₂·κ ≈ {relative:.2g}·‖A‖₂ at {name}, "
                      "and one of a defective (Jordan) block of size k by (u·‖A‖₂)^(1/k)"}


def _vector_sensitivity(op: str, wide: torch.Tensor, dtype: torch.dtype, s: torch.Tensor,
                        shape: list[int], eigenvalues: torch.Tensor | None = None) -> dict[str, Any] | None:
    """The smallest gap between two of the matrix's eigenvalues (singular values), worst
    over a batch, and the vectors' error it allows, u·‖A‖₂/gap."""
    what = VECTOR_OPS[op]
    if op == "linalg_eig":
        # A real matrix's eigenvalues may be complex: the gap is the distance in the plane (a
        # conjugate pair shares its real part, and is apart by twice its imaginary one).
        values = eigenvalues
        if values.shape[-1] < 2:
            return None
        apart = (values[:, :, None] - values[:, None, :]).abs()
        gaps = apart.masked_fill(torch.eye(values.shape[-1], dtype=torch.bool), math.inf).amin(dim=(-2, -1))
    else:
        values = (torch.linalg.eigvalsh(wide) if what == "eigenvalue" else s).sort(dim=-1).values
        if values.shape[-1] < 2:
            return None
        gaps = values.diff(dim=-1).abs().amin(dim=-1)
    norm = s[:, 0]
    u = torch.finfo(dtype).eps / 2
    sensitivity = torch.where(gaps > 0, u * norm / gaps, torch.full_like(gaps, math.inf))
    worst = int(torch.argmax(torch.nan_to_num(sensitivity, posinf=1e308)))
    figure, gap = float(sensitivity[worst]), float(gaps[worst])
    if figure <= VECTOR_SENSITIVITY_NOTED:
        return None
    shown = "∞" if math.isinf(figure) else f"{figure:.2g}"
    return {"op": op, "kind": "close-" + what.replace(" ", "-") + "s", "shape": shape, "dtype": str(dtype).replace("torch.", ""),
            "singular": False, "ill_conditioned": True, "cond": None, "rank": None, "order": int(values.shape[-1]),
            "eps": torch.finfo(dtype).eps, "gap": gap, "sensitivity": figure,
            "figure": f"two {what}s lie {gap:.3g} apart (‖A‖₂ = {float(norm[worst]):.3g}), so their vectors are "
                      f"determined only to u·‖A‖₂/gap ≈ {shown} at {str(dtype).replace('torch.', '')}, whatever "
                      f"cond(A) is"}


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


SVD_OPS = {"_linalg_svd", "linalg_svd", "linalg_svdvals"}


def exact_rank(a: torch.Tensor) -> int | None:
    """The rank of the recorded matrix in rational arithmetic (a single small real matrix):
    its trailing singular values are exactly 0, whatever LAPACK's rounding returns for them."""
    if a.is_complex() or a.dim() != 2 or max(a.shape) > EXACT_MAX_ORDER or a.numel() == 0:
        return None
    wide = a.detach().to("cpu", torch.float64)
    if not torch.isfinite(wide).all():
        return None
    from fractions import Fraction

    rows = [[Fraction(v) for v in row] for row in wide.tolist()]
    rank, columns = 0, len(rows[0])
    for col in range(columns):
        pivot = next((i for i in range(rank, len(rows)) if rows[i][col] != 0), None)
        if pivot is None:
            continue
        rows[rank], rows[pivot] = rows[pivot], rows[rank]
        for i in range(rank + 1, len(rows)):
            factor = rows[i][col] / rows[rank][col]
            rows[i] = [x - factor * y for x, y in zip(rows[i], rows[rank], strict=False)]
        rank += 1
    return rank


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


# --- Beyond linalg: cancellation, intermediate overflow, domain edges -------------------
# Notes share the linalg notes' shape (op, shape, dtype, ill_conditioned, …) plus `kind` and
# a ready `figure`, so the classifier and the report treat every conditioning note alike.
# Each check reads the op's recorded inputs once, in float64, and only small enough tensors.

REDUCTIONS = {"sum", "mean", "cumsum", "var", "std", "var_mean", "std_mean", "nansum"}
MATMULS = {"mm", "mv", "addmm", "addmv", "bmm", "dot", "matmul"}
SQUARING = {"linalg_vector_norm", "norm", "var", "std", "var_mean", "std_mean"}
NORMS = {"linalg_vector_norm", "norm"}  # the SQUARING ops that square their input itself
DOMAINS = {"log": (0.0, None), "log2": (0.0, None), "log10": (0.0, None), "log1p": (-1.0, None),
           "sqrt": (0.0, None), "rsqrt": (0.0, None), "acosh": (1.0, None), "atanh": (-1.0, 1.0),
           "asin": (-1.0, 1.0), "acos": (-1.0, 1.0)}
# The functions whose relative condition number grows without bound at their domain's edge
# (acosh at 1, atanh at ±1, asin and acos at ±1, log1p at -1): an input within a rounding or a
# thousand of it loses digits in the op itself. log at 0 is not one (its condition number,
# 1/|ln x|, goes to 0 there), nor is sqrt (1/2): a tiny input they read is only as good as
# what computed it, which a cancellation note upstream (`1 - p` of a p near 1) names.
UNBOUNDED_AT_EDGE = {"acosh", "atanh", "asin", "acos", "log1p"}
SIGNED_ZERO_OPS = {"reciprocal", "div", "atan2", "log", "rsqrt", "pow", "copysign"}
# What the sign of a zero input decides, where it is not ±inf or ±0 (atan2(±0, -1) = ±π).
SIGN_OF_ZERO_DECIDES = {"atan2": "±π or ±0", "copysign": "the result's sign"}
# Losses that take the log of a probability and of its complement: a probability within a
# few roundings of 1 (a float32 `sigmoid(z)` for z ≳ 17 is exactly 1) leaves 1 − p no digit,
# and PyTorch clamps the log at −100 (and a probability that underflows to 0, log p).
PROBABILITY_LOGS = {"binary_cross_entropy"}
PROBABILITY_ROUNDINGS = 4
# Periodic functions: an argument held in a narrow dtype is off by up to half its spacing there,
# in absolute terms, and so is the result (|f′| ≤ 1 for sin and cos): an angle of 2047 in
# float16 (spacing 1) leaves sin and cos no digit. Noted where that half-spacing reaches
# PERIODIC_ERROR_NOTED: fewer than 3 correct digits of a result of unit size.
PERIODIC = {"sin", "cos", "tan"}
PERIODIC_ERROR_NOTED = 1e-3
SENSITIVE_OPS = (REDUCTIONS | MATMULS | SQUARING | set(DOMAINS) | SIGNED_ZERO_OPS | PROBABILITY_LOGS | PERIODIC
                 | {"exp", "expm1"})
MAX_ELEMENTS = 1 << 22
MAX_MATMUL_FLOPS = 1 << 27


def _reduced_total(op: str, wide: torch.Tensor, args: tuple) -> float | None:
    """The largest |exact sum| a reduction's accumulator holds at its end, per output element."""
    if op not in REDUCTIONS or wide.dim() == 0:
        return None
    try:
        dims, _ = reduced_dims(op, args, {}, wide)
    except (KeyError, TypeError):  # a dim passed by keyword, which this check is not given
        return None
    totals = torch.cumsum(wide, dims[0]) if op == "cumsum" else wide.sum(dim=dims)
    return float(totals.abs().max())


def reduced_dims(name: str, args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[list[int], bool]:
    """The dimensions a reduction's call reduces (a cumsum's one, kept) and its keepdim."""
    if name == "cumsum":
        dim = args[1] if len(args) > 1 else kwargs["dim"]
        return [dim % max(1, x.dim())], True
    dims = args[1] if len(args) > 1 and not isinstance(args[1], torch.dtype) else kwargs.get("dim")
    keepdim = bool(args[2]) if len(args) > 2 and isinstance(args[2], bool) else bool(kwargs.get("keepdim", False))
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.dim())), False
    if isinstance(dims, int):
        dims = [dims]
    return [d % max(1, x.dim()) for d in dims], keepdim


def _large_angle(wide: torch.Tensor, dtype: torch.dtype, base: dict[str, Any]) -> dict[str, Any] | None:
    """A periodic function's note where its largest argument is held to worse than
    PERIODIC_ERROR_NOTED (`PERIODIC`): the argument, its dtype's spacing there, the error that
    leaves in the result."""
    largest = float(wide.abs().max())
    if largest == 0:
        return None
    spacing = torch.finfo(dtype).eps * 2.0 ** (math.frexp(largest)[1] - 1)
    if spacing / 2 < PERIODIC_ERROR_NOTED:
        return None
    digits = max(0.0, -math.log10(spacing / 2))
    kept = "no correct digit" if digits < 0.5 else f"about {digits:.0f} correct digit{'s' if round(digits) != 1 else ''}"
    wider = "float64" if dtype in (torch.float32, torch.float64) else "float32"
    return dict(base, kind="large-argument", ill_conditioned=True,
                figure=f"its arguments reach {largest:.6g}, which {base['dtype']} holds only to ±{spacing / 2:.2g} "
                       f"(its spacing there is {spacing:.2g}): the result is off by as much, so a result of unit size "
                       f"keeps {kept}; computing the argument and the function in {wider} keeps them")

def _norm_order(args: tuple) -> Any:
    """A norm op's order (`linalg_vector_norm`'s `ord`, `norm`'s `p`): 2 where not given."""
    order = args[1] if len(args) > 1 else 2
    return 2 if order is None else order


def _squares_below_normal(wide: torch.Tensor, accumulated: torch.dtype, base: dict[str, Any]
                          ) -> dict[str, Any] | None:
    """A 2-norm's note where even its largest element's square lies below the smallest normal
    value of the dtype its kernel squares in (float32 for fp16/bf16): the kernel adds the
    squares as they are, without scaling (LAPACK's nrm2 scales), so they are subnormal, keep
    fewer digits the smaller they are, and the smallest round to 0 (a norm of 16 elements near
    1e-22 came out 0.8 % low in float32, of 16 near 1e-24 exactly 0)."""
    biggest = float(wide.abs().max())
    info = torch.finfo(accumulated)
    if not 0 < biggest * biggest < info.tiny:
        return None
    spacing = info.tiny * info.eps  # the subnormals' spacing
    digits = max(0.0, math.log10(biggest * biggest / spacing))
    name = str(accumulated).replace("torch.", "")
    return dict(base, kind="intermediate-underflow", ill_conditioned=True,
                figure=f"max |x| = {biggest:.3g}, so every square x² (at most {biggest * biggest:.3g}) lies below the "
                       f"smallest normal {name} ({info.tiny:.3g}), where {name} is spaced by {spacing:.2g}: the squares "
                       f"keep at most {digits:.1f} significant digits and the smaller ones round to 0, so the norm keeps "
                       "no more (the kernel does not scale its input); dividing x by its largest element first, or "
                       "computing in float64, keeps them")


def sensitivity_of(op: str, args: tuple, out: Any) -> dict[str, Any] | None:
    """The worst numerical hazard of this op at this input, or None where there is none."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None or not x.is_floating_point() or x.numel() == 0 or x.numel() > MAX_ELEMENTS:
        return None
    finfo = torch.finfo(x.dtype)
    wide = x.detach().to("cpu", torch.float64)
    base = {"op": op, "shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""), "eps": finfo.eps,
            "singular": False, "ill_conditioned": False, "cond": None, "rank": None, "order": None}
    if not torch.isfinite(wide).all():
        return None
    total = _reduced_total(op, wide, args)
    accumulated = torch.promote_types(x.dtype, torch.float32)  # fp16/bf16 sums at float32
    if total is not None and total > torch.finfo(accumulated).max:
        return dict(base, kind="intermediate-overflow", ill_conditioned=True, overflow=True,
                    figure=f"the sum of its terms reaches {total:.3g}, beyond the largest "
                           f"{str(accumulated).replace('torch.', '')} ({torch.finfo(accumulated).max:.3g}), so a "
                           "kernel that accumulates it overflows although the result may not")
    if op in SQUARING:
        biggest = float(wide.abs().max())
        if biggest * biggest > finfo.max:
            return dict(base, kind="intermediate-overflow", ill_conditioned=True, overflow=True,
                        figure=f"max |x| = {biggest:.3g}, so x² = {biggest * biggest:.3g} exceeds the largest "
                               f"{base['dtype']} ({finfo.max:.3g}) although the result may not")
    if op in NORMS and _norm_order(args) == 2:
        note = _squares_below_normal(wide, accumulated, base)
        if note:
            return note
    if op in ("exp", "expm1"):
        limit = math.log(finfo.max)
        over = int((wide > limit).sum())
        if over:
            return dict(base, kind="overflow", ill_conditioned=True, overflow=True,
                        figure=f"{over} input(s) above log(max {base['dtype']}) = {limit:.4g}: exp overflows to inf")
    if op in DOMAINS:
        note = _domain(op, wide, base)
        if note:
            return note
    if op in PROBABILITY_LOGS:
        return _probability_edge(wide, args, base)
    if op in SIGNED_ZERO_OPS:
        negative_zero = int(((wide == 0) & torch.signbit(wide)).sum())
        if negative_zero:
            return dict(base, kind="signed-zero", figure=f"{negative_zero} input(s) are -0.0: the sign of zero "
                                                          f"decides {SIGN_OF_ZERO_DECIDES.get(op, '±inf or ±0')} here")
    if op in PERIODIC:
        return _large_angle(wide, x.dtype, base)
    if op in REDUCTIONS and wide.numel() > 1:
        return _cancellation(base, wide.abs().sum(), wide.sum(), finfo.eps, "Σ|x| / |Σx|")
    if op in MATMULS and len(args) >= 2 and isinstance(args[-1], torch.Tensor):
        a, b = (args[1], args[2]) if op in ("addmm", "addmv") and len(args) >= 3 else (args[0], args[1])
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() < 1 or b.dim() < 1:
            return None
        flops = a.numel() * (b.shape[-1] if b.dim() > 1 else 1)
        if flops > MAX_MATMUL_FLOPS or not (a.is_floating_point() and b.is_floating_point()):
            return None
        wa = wide if a is x else a.detach().to("cpu", torch.float64)
        wb = b.detach().to("cpu", torch.float64)
        magnitude, value = torch.matmul(wa.abs(), wb.abs()), torch.matmul(wa, wb).abs()
        ratio = magnitude / torch.clamp(value, min=torch.finfo(torch.float64).tiny)
        worst = int(torch.argmax(ratio))
        return _cancellation(base, magnitude.flatten()[worst], value.flatten()[worst], finfo.eps,
                             "Σ|aᵢbᵢ| / |Σaᵢbᵢ| (worst output element)")
    return None


def _probability_edge(p: torch.Tensor, args: tuple, base: dict[str, Any]) -> dict[str, Any] | None:
    """A probability loss (`PROBABILITY_LOGS`) reading probabilities within a few roundings
    of 1 where its target weighs log(1 − p), or of 0 where it weighs log p: there the log
    reads a difference or a value that rounding has left no digit of."""
    target = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
    if target is None or target.shape != p.shape:
        return None
    y = target.detach().to("cpu", torch.float64)
    eps = base["eps"]
    near_one = int(((1 - p <= PROBABILITY_ROUNDINGS * eps) & (y < 1)).sum())
    near_zero = int(((p <= PROBABILITY_ROUNDINGS * torch.finfo(getattr(torch, base["dtype"])).tiny) & (y > 0)).sum())
    if not near_one and not near_zero:
        return None
    parts = []
    if near_one:
        parts.append(f"{near_one} of its probabilities {'lies' if near_one == 1 else 'lie'} within {PROBABILITY_ROUNDINGS} roundings of 1 and it "
                     f"reads log(1 − p) of them: {base['dtype']} keeps less than one digit of 1 − p there (a sigmoid of "
                     "z ≳ 17 is exactly 1 in float32)")
    if near_zero:
        parts.append(f"{near_zero} of its probabilities {'lies' if near_zero == 1 else 'lie'} within {PROBABILITY_ROUNDINGS} roundings of 0 and it "
                     f"reads log p of them: {base['dtype']} keeps less than one digit of p there")
    return dict(base, kind="probability-edge", ill_conditioned=True,
                figure="; ".join(parts) + ", and PyTorch clamps the log at −100; "
                "`F.binary_cross_entropy_with_logits` computes the loss from the logits, without the probability")


def domain_counts(op: str, wide: torch.Tensor) -> tuple[int, int]:
    """(inputs outside `op`'s domain, inputs exactly on its edge)."""
    low, high = DOMAINS[op]
    outside = int((wide < low).sum()) + (int((wide > high).sum()) if high is not None else 0)
    at_edge = int((wide == low).sum()) + (int((wide == high).sum()) if high is not None else 0)
    return outside, at_edge


def exact_at_edge(outside: int, at_edge: int, float64: tuple[int, int] | None) -> bool:
    """Whether the float64 replay puts as many inputs outside the domain or on its edge (or
    there is none): the nan/inf there are the exact answers, not rounding's doing."""
    return float64 is None or sum(float64) >= outside + at_edge


def domain_figure(op: str, outside: int, at_edge: int, float64: tuple[int, int] | None = None) -> str:
    """The domain note's figure; with the float64 replay's counts (`float64`) where they are
    fewer: rounding upstream put the rest there (`1 - sigmoid(30)` is 0 in float32, 9.4e-14 in
    float64), and the exact answer is not nan/inf."""
    low, high = DOMAINS[op]
    counts = (f"{outside} input(s) outside {op}'s domain and {at_edge} exactly on its edge "
              f"({low}{', ' + str(high) if high is not None else ''})")
    if exact_at_edge(outside, at_edge, float64):
        return f"{counts}: nan/inf are the exact answers there"
    return (f"{counts}, where the float64 replay of the same computation has {float64[0]} outside and {float64[1]} "
            "on the edge: rounding "
            "upstream put the others there (an underflow, or a difference that rounds to 0), and the nan/inf follow "
            "from that rounding, not from the exact answer")


def _domain(op: str, wide: torch.Tensor, base: dict[str, Any]) -> dict[str, Any] | None:
    low, high = DOMAINS[op]
    outside, at_edge = domain_counts(op, wide)
    if outside or at_edge:
        return dict(base, kind="domain", ill_conditioned=True, outside=outside, at_edge=at_edge,
                    figure=domain_figure(op, outside, at_edge))
    if op == "acosh":
        big = float(wide.max())
        if big * big > torch.finfo(getattr(torch, base["dtype"])).max:
            return dict(base, kind="intermediate-overflow", ill_conditioned=False,
                        figure=f"max x = {big:.3g}: x² overflows {base['dtype']}, so the textbook formula "
                               "log(x + sqrt(x² - 1)) gives inf where acosh(x) is finite")
    eps = base["eps"]
    distance = float((wide - low).abs().min()) if high is None else float(
        torch.minimum((wide - low).abs(), (high - wide).abs()).min())
    if op in UNBOUNDED_AT_EDGE and distance < 1e3 * eps * max(1.0, abs(low)):
        return dict(base, kind="domain-edge", ill_conditioned=True,
                    figure=f"an input lies {distance:.3g} from {op}'s domain edge, within 1000 ulp: the result's "
                           "relative condition number is unbounded there")
    return None


CANCELLING_RATIO = 10.0


def _cancellation(base: dict[str, Any], magnitude: torch.Tensor, value: torch.Tensor, eps: float,
                  formula: str) -> dict[str, Any] | None:
    magnitude, value = float(magnitude), abs(float(value))
    if magnitude == 0:
        return None
    ratio = magnitude / value if value > 0 else math.inf
    # The result's relative error is about eps·Σ|x|/|Σx| (times a slowly growing factor of the
    # length): noted once fewer than 3 of the dtype's digits survive. The worst output element
    # of a random matmul routinely reaches a ratio of 1e3, which costs float32 only 3-4 digits.
    # And only where terms do cancel, a digit's worth at least: bfloat16 keeps fewer than 3
    # digits of any sum, a sum of positive terms (ratio 1) included, which cancels nothing.
    if ratio < CANCELLING_RATIO or ratio * eps <= 1e-3:
        return None
    return dict(base, kind="cancellation", ill_conditioned=True, cond=ratio,
                figure=f"{formula} = {ratio:.3g}: the terms cancel, so {base['dtype']}'s "
                       f"{-math.log10(eps):.0f} digits leave about {max(0.0, -math.log10(ratio * eps)):.0f} correct")


# How many roundings of the quotient's size (end − start)/step may carry: the subtraction's
# (relative to |start| + |end|, more where the two cancel) and the division's, with room.
LENGTH_ROUNDINGS = 4


def range_length(op: str, start: float, end: float, step: float, length: int, dtype: torch.dtype
                 ) -> dict[str, Any] | None:
    """The note where rounding decided a range's length: `torch.arange(0.1, 0.4, 0.1)` has
    ⌈(end − start)/step⌉ elements, the quotient computed in double (ATen's
    `compute_arange_size`), and (0.4 − 0.1)/0.1 is 3.0000000000000004 there, a rounding above
    the whole number 3, so the element ≈ end that the exclusive end leaves out is in: 4 elements
    where exact arithmetic gives 3. None where the quotient is no rounding away from a whole
    number below it (the length is the arguments' own), or the arguments are whole numbers."""
    if all(float(x).is_integer() for x in (start, end, step)) or step == 0 or not all(
            math.isfinite(x) for x in (start, end, step)):
        return None
    quotient = (end - start) / step
    whole = math.floor(quotient)
    if quotient == whole or length != whole + 1:
        return None
    u = 2.0 ** -53
    reach = LENGTH_ROUNDINGS * quotient * u * (1 + (abs(start) + abs(end)) / max(abs(end - start), math.ulp(0.0)))
    if quotient - whole > reach:
        return None
    last = start + whole * step
    return {"op": op, "kind": "range-length", "shape": [length], "dtype": str(dtype).replace("torch.", ""),
            "singular": False, "ill_conditioned": False, "length": length, "exact_length": whole,
            "quotient": quotient, "last": last, "start": start, "step": step,
            "figure": (f"its length is ⌈(end − start)/step⌉, the quotient computed in double precision, and "
                       f"({end!r} − {start!r})/{step!r} is {quotient!r} there — a rounding above {whole} — so the "
                       f"element {last:.6g}, which equals the excluded end in exact arithmetic, is included: {length} "
                       f"elements where exact arithmetic gives {whole}")}


# Integer ops whose exact result may leave their dtype's range. torch's integer arithmetic
# wraps around there (two's complement, as NumPy's does) and says nothing: a uint8
# 200 + 100 is 44, an int64 cumprod of 1..21 goes negative.
WRAPPING_OPS = {"add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "neg", "neg_", "abs", "abs_", "pow", "pow_",
                "square", "sum", "prod", "cumsum", "cumsum_", "cumprod", "cumprod_", "mm", "bmm", "matmul", "dot",
                "mv", "addmm", "_to_copy"}
INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def integer_wraparound(func: Any, name: str, args: tuple, kwargs: dict, out: Any) -> dict[str, Any] | None:
    """The note where an integer op's exact result (the op on the same values in float64, or
    a cast's input) leaves its output dtype's range, which the arm's integer arithmetic wrapped
    around; None where every element fits, or the op is no integer arithmetic."""
    if not isinstance(out, torch.Tensor) or out.dtype not in INTEGER_DTYPES or not 0 < out.numel() <= MAX_ELEMENTS:
        return None
    if name == "_to_copy":
        exact = args[0].detach().to("cpu", torch.float64) if isinstance(args[0], torch.Tensor) else None
    else:
        def wide(a: Any) -> Any:
            if isinstance(a, torch.Tensor) and not a.is_floating_point() and not a.is_complex():
                return a.detach().to("cpu", torch.float64)
            return a.detach().cpu() if isinstance(a, torch.Tensor) else a

        if not any(isinstance(a, torch.Tensor) and a.dtype in INTEGER_DTYPES for a in args):
            return None
        with torch.no_grad():
            exact = func(*[wide(a) for a in args], **{k: torch.float64 if k == "dtype" else wide(v)
                                                       for k, v in kwargs.items() if k != "out"})
    if not isinstance(exact, torch.Tensor) or exact.shape != out.shape or not exact.is_floating_point():
        return None
    info = torch.iinfo(out.dtype)
    wrapped = torch.isfinite(exact) & ((exact < info.min) | (exact > info.max))
    count = int(wrapped.sum())
    if not count:
        return None
    i = int(wrapped.reshape(-1).nonzero()[0])
    was, got = float(exact.reshape(-1)[i]), int(out.detach().reshape(-1)[i].cpu())
    dtype = str(out.dtype).replace("torch.", "")
    was_text = f"{was:.0f}" if abs(was) < 2 ** 53 else f"{was:.4g}"
    span = f"{info.min} to {info.max}" if info.bits <= 16 else f"−2^{info.bits - 1} to 2^{info.bits - 1} − 1"
    return {"op": name, "kind": "integer-wraparound", "shape": list(out.shape), "dtype": dtype, "singular": False,
            "ill_conditioned": False, "exact": was, "got": got, "wrapped": count, "numel": out.numel(),
            "figure": (f"its exact result {was_text} does not fit {dtype} ({span}): integer arithmetic is modular "
                       f"(modulo 2^{info.bits}, as NumPy's, with no warning) and gives {got}"
                       + (f", at {count} of {out.numel()} elements" if out.numel() > 1 else ""))}
