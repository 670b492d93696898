"""An independent answer for small linear algebra: what the op should return on the recorded
input, computed without the kernel library the arm and the float64 replay share.

The float64 replay runs the same LAPACK (or the same special-function code) as the arm, one
precision up: where that library is wrong on an input (a driver that returns rank 0 for a
rank-2 matrix, a determinant's pivot lost), the reference shares the bug and the arm looks
right.  Every float is a rational number, so for a small matrix the determinant, inverse and
solution of the *recorded* input have exact values, found here in rational arithmetic
(`fractions.Fraction`, Gauss–Jordan without rounding), and so are LU's factors with partial
pivoting, the least-squares solution and the pseudoinverse of a matrix of full rank (the
normal equations of a tall one, the minimum-norm solution of a wide one, solved exactly); singular values and vectors, symmetric
eigenvalues and vectors, the Cholesky factor and QR's factors are algebraic, found with
mpmath at 50 significant digits (its own SVD, symmetric eigensolver and Cholesky — R is the
Cholesky factor of the exact AᵀA, Q = A·R⁻¹ —: no LAPACK). A least-squares driver's rank is
answered as the range of ranks a correct driver returns (`RankAnswer`).

Each answer knows how far a correct kernel may be from it at a unit roundoff u — the
textbook backward-stable bounds (Higham, *Accuracy and Stability of Numerical Algorithms*,
ch. 9, 14; Weyl's inequality for singular and symmetric eigenvalues), each times a generous
SAFETY factor:

* inverse and solve:  ‖X̂ − X‖ ≤ n·κ∞(A)·u·‖X‖ (normwise, κ∞ from the exact inverse);
* determinant:        |d̂ − d| ≤ n²·κ∞(A)·u·|d|, and log|d| within that error (absolute) times
                      max(1, |log|d||) for the log's own rounding;
* singular values and symmetric eigenvalues: |σ̂ᵢ − σᵢ| ≤ n·u·‖A‖₂;
* their vectors:      ‖v̂ᵢ − vᵢ‖ ≤ 4n·u·‖A‖₂/gapᵢ once the sign is the answer's (Davis–Kahan,
                      Wedin), not answered where that leaves no digit;
* LU factors:         n·u·‖L⁻¹‖‖|L||U|‖‖U⁻¹‖ relative to each factor, for the pivots partial
                      pivoting takes in exact arithmetic;
* Cholesky factor:    ‖L̂ − L‖ ≤ n²·κ∞(A)·u·‖L‖ (backward error n·u·‖A‖, amplified by κ);
* least squares:      ‖X̂ − X‖ ≤ m·n·u·(2κ₂ + κ₂(κ₂+1)·‖R‖/(‖A‖‖X‖))·‖X‖ per column (tall),
                      m·n·u·3κ₂·‖X‖ (wide: the minimum-norm solution), where a rank cutoff
                      (`rcond`) cannot drop a singular value;
* pseudoinverse, QR:  m·n·κ₂·u relative to A⁺, R (Wedin; Sun), Q's error absolute.

A kernel farther than that from the exact answer computed something else: a kernel bug,
whatever the float64 replay says.  Where the bound itself leaves no significant digit (an
ill-conditioned or singular matrix), nothing is concluded: conditioning explains any answer.

Scalar special functions (exp, erf, gelu, lgamma, digamma, …) of a few elements are answered
with mpmath too, for the float64 replay only: a float64 kernel evaluates its own formula,
which can cancel where the function does not (GELU's 1 + erf(x/√2) near x = −8 keeps one
digit), and a reference that cancels misjudges every arm downstream.  A correct library
function is within a few ulps of max(|f(x)|, |x·f′(x)|) (the second term: the function's own
sensitivity to its argument's last bit).
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from triage import policy
from triage.worker import arm_choices

# The largest matrix (order) and batch answered: rational elimination grows as n³ with
# numbers of growing length, mpmath's eigensolvers are pure Python.
MAX_ORDER = 8
MAX_BATCH = 8
# Per arm, at record time and again in the float64 replay: the answers stop when they have
# taken this long in all.
BUDGET_S = 0.25
SAFETY = policy.INDEPENDENT_SAFETY
# Past this relative bound the answer carries no significant digit at the arm's precision:
# nothing is concluded.
NO_DIGIT = 0.5
DIGITS = 50

UNIT_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24}


@dataclass
class Answer:
    """The exact (or 50-digit) value of one output of an op, and its error scale."""
    op: str
    method: str
    output: int             # which output of the op it answers (det: 0, S of an SVD: 1, …)
    value: torch.Tensor     # float64, the op's output shape
    scale: torch.Tensor     # per element: the magnitude the bound is relative to (broadcasts)
    factor: float           # the bound is SAFETY·factor·u·scale
    # The smallest nonzero and the largest magnitude the kernel meets (input, intermediates
    # as far as they are bounded, answer): where they leave the dtype's range, no conclusion.
    magnitudes: tuple[float, float]
    # The op's `info` output, where it has one: a kernel that reports it stopped (a matrix it
    # found not positive definite) returned a partial result, judged by its caller, not here.
    status_output: int | None = None
    # Where the op's answer is unique only up to signs (QR: a column of Q and the row of R it
    # multiplies may both be negated; an eigenvector): per output, the ±1 factors (broadcasting)
    # that bring the kernel's outputs to the answer's signs, and back.
    signs: Callable[[Any], dict[int, torch.Tensor] | None] | None = None
    # Where the answer holds only for some of the kernel's decisions (LU: the same pivots as
    # partial pivoting takes in exact arithmetic; a near-tie may go either way): whether the
    # kernel's outputs made them.
    precondition: Callable[[Any], bool] | None = None
    # Where the bound differs from element to element (a vector's error grows as its
    # eigenvalue's gap closes): the size of the answer itself, past which an element's bound
    # leaves it no digit and that element is not answered (a unit vector's: 1).
    reach: float | None = None

    def check(self, outputs: Any) -> Check | None:
        """How far the op's actual `outputs` lie from this answer, at the unit roundoff of the
        dtype they were computed in; None where nothing can be concluded."""
        if self.status_output is not None:
            status = outputs[self.status_output] if isinstance(outputs, (tuple, list)) else None
            if not isinstance(status, torch.Tensor) or bool(status.ne(0).any()):
                return None
        if self.precondition is not None and not self.precondition(outputs):
            return None
        got = outputs[self.output] if isinstance(outputs, (tuple, list)) else outputs
        if (not isinstance(got, torch.Tensor) or got.dtype not in UNIT_ROUNDOFF
                or tuple(got.shape) != tuple(self.value.shape)):
            return None
        sign = torch.ones((), dtype=torch.float64)
        if self.signs is not None:
            signs = self.signs(outputs)
            if signs is None:
                return None
            sign = signs.get(self.output, sign)
        bound = SAFETY * self.factor * UNIT_ROUNDOFF[got.dtype]
        if not math.isfinite(bound) or bound >= NO_DIGIT or _outside_range(self.magnitudes, got.dtype):
            return None
        got = got.detach().to("cpu", torch.float64) * sign
        exact = self.value
        answered = torch.isfinite(exact)  # a function's pole or a value past float64: not answered
        if self.reach is not None:
            answered = answered & (bound * self.scale < NO_DIGIT * self.reach).expand_as(exact)
        if not bool(answered.any()):
            return None
        # The answer where it has one, the kernel's value elsewhere, in the kernel's signs.
        replacement = torch.where(answered, exact, got) * sign
        if not bool(torch.isfinite(got)[answered].all()):
            worst = int(torch.argmax((answered & ~torch.isfinite(got)).to(torch.int8).reshape(-1)))
            return Check(self, math.inf, bound, float(got.reshape(-1)[worst]), float(exact.reshape(-1)[worst]),
                         replacement)
        scale = self.scale.expand_as(exact)
        error = torch.where(answered, (got - exact).abs() / scale.clamp_min(torch.finfo(torch.float64).tiny),
                            torch.zeros_like(exact)).reshape(-1)
        worst = int(torch.argmax(error))
        return Check(self, float(error[worst]), bound, float(got.reshape(-1)[worst]), float(exact.reshape(-1)[worst]),
                     replacement)


@dataclass
class Check:
    answer: Answer | RankAnswer | EigenvalueAnswer
    error: float   # the largest error, relative to the answer's scale
    bound: float   # what a correct kernel may reach at that precision
    got: float | complex     # the kernel's element at the worst position
    exact: float | complex   # the answer's
    # What the float64 reference continues from in place of the kernel's output, where the
    # kernel disagrees: the answer where it has one, in the kernel's own signs.
    replacement: torch.Tensor
    # Where the answer is a range of values a correct kernel may return (a driver's numerical
    # rank): that range at the worst position and the cutoff it was found at.
    allowed: tuple[int, int] | None = None
    cutoff: float | None = None

    @property
    def disagrees(self) -> bool:
        return self.error > self.bound


def answers(op: str, args: tuple, kwargs: dict[str, Any]) -> list[Answer | RankAnswer | EigenvalueAnswer]:
    """The independent answers for a call of aten `op` (its overload packet's name) on these
    arguments, [] where the op is not covered or the input is too large, complex or not finite."""
    if op in _FUNCTIONS:
        return _function_answers(op, args, kwargs)
    if op in _RECTANGULAR:
        return _RECTANGULAR[op](args, kwargs)
    solver = _SOLVERS.get(op)
    if solver is None or not args or not isinstance(args[0], torch.Tensor):
        return []
    a = args[0]
    if a.is_complex() or not a.is_floating_point() or a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        return []
    n = a.shape[-1]
    batch = a.numel() // (n * n) if n else 0
    if n == 0 or n > MAX_ORDER or batch == 0 or batch > MAX_BATCH:
        return []
    wide = a.detach().to("cpu", torch.float64).reshape(batch, n, n)
    if not bool(torch.isfinite(wide).all()):
        return []
    return solver(wide, tuple(a.shape), args, kwargs)


def _magnitudes(*tensors: torch.Tensor, largest: float = 0.0) -> tuple[float, float]:
    """The smallest nonzero and the largest magnitude among the input and the answer's scale
    (a normwise bound does not care how small one element of the answer is)."""
    values = torch.cat([t.detach().abs().reshape(-1) for t in tensors])
    nonzero = values[values > 0]
    return (float(nonzero.min()) if nonzero.numel() else math.inf, max(float(values.max()), largest))


def _outside_range(magnitudes: tuple[float, float], dtype: torch.dtype) -> bool:
    """The input or the answer (`_magnitudes`) reaches past `dtype`'s range or into its
    subnormals, where fewer digits are kept: there an infinite, zero or imprecise result is
    the range's doing, not the kernel's, and no answer is checked."""
    smallest, largest = magnitudes
    info = torch.finfo(dtype)
    return largest > info.max / 4 or smallest < info.tiny / UNIT_ROUNDOFF[dtype]


def _leading_products(wide: torch.Tensor) -> float:
    """An upper bound on every partial product of an LU's pivots, |det| of any leading block
    of the row-permuted matrix (Hadamard: at most the product of its rows' norms)."""
    norms = torch.linalg.vector_norm(wide, dim=-1).clamp_min(1.0)
    return float(norms.log().sum(-1).max().exp())


# -- rational arithmetic --------------------------------------------------------------------
def _gauss_jordan(matrix: list[list[float]]) -> tuple[Fraction, list[list[Fraction]] | None]:
    """The exact determinant and inverse (None when singular) of a float matrix."""
    return _gauss_jordan_exact([[Fraction(v) for v in row] for row in matrix])


def _gauss_jordan_exact(matrix: list[list[Fraction]]) -> tuple[Fraction, list[list[Fraction]] | None]:
    n = len(matrix)
    m = [list(row) + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(matrix)]
    det = Fraction(1)
    for col in range(n):
        pivot = next((r for r in range(col, n) if m[r][col] != 0), None)
        if pivot is None:
            return Fraction(0), None
        if pivot != col:
            m[col], m[pivot] = m[pivot], m[col]
            det = -det
        p = m[col][col]
        det *= p
        m[col] = [x / p for x in m[col]]
        for r in range(n):
            if r != col and m[r][col] != 0:
                f = m[r][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return det, [row[n:] for row in m]


def _norm_inf(rows: list[list[Any]]) -> float:
    return max(float(sum(abs(x) for x in row)) for row in rows)


def _exact(wide: torch.Tensor) -> list[tuple[Fraction, list[list[Fraction]] | None, float]]:
    """Per matrix of the batch: exact det, exact inverse and κ∞ (inf when singular)."""
    out = []
    for matrix in wide.tolist():
        det, inverse = _gauss_jordan(matrix)
        kappa = _norm_inf(matrix) * _norm_inf(inverse) if inverse is not None else math.inf
        out.append((det, inverse, kappa))
    return out


def _det(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[Answer]:
    exact = _exact(wide)
    n = wide.shape[-1]
    if any(e[1] is None for e in exact):
        return []  # an exactly singular matrix: the conditioning note's exact rank covers it
    dets = torch.tensor([float(e[0]) for e in exact], dtype=torch.float64).reshape(shape[:-2])
    kappa = max(e[2] for e in exact)
    return [Answer("det", "rational arithmetic", 0, dets, dets.abs(), n * n * kappa,
                   _magnitudes(wide, dets, largest=_leading_products(wide)))]


def _slogdet(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[Answer]:
    exact = _exact(wide)
    n = wide.shape[-1]
    if any(e[1] is None for e in exact):
        return []
    batch = shape[:-2]
    signs = torch.tensor([float((e[0] > 0) - (e[0] < 0)) for e in exact], dtype=torch.float64).reshape(batch)
    logs = torch.tensor([_log_abs(e[0]) for e in exact], dtype=torch.float64).reshape(batch)
    kappa = max(e[2] for e in exact)
    magnitudes = _magnitudes(wide)
    return [Answer("slogdet", "rational arithmetic", 0, signs, torch.ones_like(signs), n * n * kappa, magnitudes),
            # log|d| itself is then rounded, relative to its own size.
            Answer("slogdet", "rational arithmetic", 1, logs, logs.abs().clamp_min(1.0), n * n * kappa, magnitudes)]


def _log_abs(q: Fraction) -> float:
    # log of each integer separately: |det| may be far outside float64's range.
    return math.log(abs(q.numerator)) - math.log(q.denominator)


def _inverse(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[Answer]:
    exact = _exact(wide)
    if any(e[1] is None for e in exact):
        return []
    n = wide.shape[-1]
    inverses = torch.tensor([[[float(x) for x in row] for row in e[1]] for e in exact], dtype=torch.float64)
    scale = inverses.abs().amax(dim=(-2, -1), keepdim=True)
    kappa = max(e[2] for e in exact)
    return [Answer("inverse", "rational arithmetic", 0, inverses.reshape(shape), scale.reshape(
        shape[:-2] + (1, 1)), n * kappa, _magnitudes(wide, scale))]


def _solve(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[Answer]:
    left = kwargs.get("left", args[2] if len(args) > 2 else True)
    b = args[1] if len(args) > 1 else None
    if not left or not isinstance(b, torch.Tensor) or b.is_complex() or not b.is_floating_point():
        return []
    n = wide.shape[-1]
    batch = shape[:-2]
    vector = b.dim() == 1 or (b.dim() == len(shape) - 1 and tuple(b.shape) == batch + (n,))
    rhs = b.detach().to("cpu", torch.float64)
    rhs = rhs.unsqueeze(-1) if vector else rhs
    if rhs.shape[-2] != n or not bool(torch.isfinite(rhs).all()) or rhs.shape[-1] > 4 * MAX_ORDER:
        return []
    try:
        rhs = rhs.expand(batch + tuple(rhs.shape[-2:])).reshape(wide.shape[0], n, rhs.shape[-1])
    except RuntimeError:
        return []  # a broadcast batch of the right-hand side: not answered
    exact = _exact(wide)
    if any(e[1] is None for e in exact):
        return []
    solutions = []
    for (_, inverse, _), columns in zip(exact, rhs.tolist(), strict=True):
        bq = [[Fraction(v) for v in row] for row in columns]
        solutions.append([[float(sum(inverse[i][k] * bq[k][j] for k in range(n))) for j in range(len(bq[0]))]
                          for i in range(n)])
    x = torch.tensor(solutions, dtype=torch.float64)
    scale = x.abs().amax(dim=-2, keepdim=True)  # per column: ‖x‖∞
    out_shape = batch + tuple(x.shape[-2:])
    x, scale = x.reshape(out_shape), scale.reshape(batch + (1, x.shape[-1]))
    if vector:
        x, scale = x.squeeze(-1), scale.squeeze(-1)
    kappa = max(e[2] for e in exact)
    return [Answer("solve", "rational arithmetic", 0, x, scale, n * kappa, _magnitudes(wide, rhs, scale))]


def _partial_pivoting(matrix: list[list[float]]) -> tuple[list, list, list[int], float] | None:
    """The exact LU factors of a float matrix with partial pivoting (the first largest candidate
    as pivot, as LAPACK's getrf takes it), its pivots (1-based, as getrf's sequential swaps) and
    c = ‖L⁻¹‖∞·‖|L||U|‖∞·‖U⁻¹‖∞; None when singular."""
    n = len(matrix)
    a = [[Fraction(v) for v in row] for row in matrix]
    pivots = []
    for k in range(n):
        p = max(range(k, n), key=lambda i: abs(a[i][k]))
        if a[p][k] == 0:
            return None
        pivots.append(p + 1)
        a[k], a[p] = a[p], a[k]
        for i in range(k + 1, n):
            f = a[i][k] / a[k][k]
            a[i][k] = f
            a[i][k + 1:] = [x - f * y for x, y in zip(a[i][k + 1:], a[k][k + 1:], strict=True)]
    lower = [[a[i][j] if j < i else Fraction(int(i == j)) for j in range(n)] for i in range(n)]
    upper = [[a[i][j] if j >= i else Fraction(0) for j in range(n)] for i in range(n)]
    _, lower_inverse = _gauss_jordan_exact(lower)
    _, upper_inverse = _gauss_jordan_exact(upper)
    product = [[sum(abs(float(lower[i][k])) * abs(float(upper[k][j])) for k in range(n)) for j in range(n)]
               for i in range(n)]
    return lower, upper, pivots, _norm_inf(lower_inverse) * _norm_inf(product) * _norm_inf(upper_inverse)


def _exact_lu(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """LU with partial pivoting of a nonsingular matrix, exactly. A backward-stable LU factors
    PA + ΔA with |ΔA| ≤ n·u·|L||U|, and to first order ΔL = L·stril(L⁻¹ΔA·U⁻¹),
    ΔU = triu(L⁻¹ΔA·U⁻¹)·U: each factor's error is at most n·u·c·‖factor‖∞. The answer holds
    where the kernel took the same pivots (a near-tie may go either way under rounding)."""
    if not bool(kwargs.get("pivot", args[1] if len(args) > 1 else True)):
        return None  # without pivoting (CUDA only): not answered
    n = wide.shape[-1]
    per_matrix = [_partial_pivoting(matrix) for matrix in wide.tolist()]
    if any(e is None for e in per_matrix):
        return None  # singular: U has a zero pivot, and the bound needs U⁻¹
    lower = torch.tensor([[[float(x) for x in row] for row in e[0]] for e in per_matrix], dtype=torch.float64)
    upper = torch.tensor([[[float(x) for x in row] for row in e[1]] for e in per_matrix], dtype=torch.float64)
    pivots = torch.tensor([e[2] for e in per_matrix], dtype=torch.int64)
    rows = [list(range(n)) for _ in per_matrix]
    for order, swaps in zip(rows, pivots.tolist(), strict=True):
        for k, p in enumerate(swaps):
            order[k], order[p - 1] = order[p - 1], order[k]
    # A = P·L·U: P's transpose takes A's rows in the pivots' order.
    permutation = torch.eye(n, dtype=torch.float64)[torch.tensor(rows)].transpose(-2, -1)
    lower_norm = lower.abs().sum(-1).amax(-1)[:, None, None]
    upper_norm = upper.abs().sum(-1).amax(-1)[:, None, None]
    batch = shape[:-2]
    return {"lower": lower.reshape(shape), "upper": upper.reshape(shape), "pivots": pivots.reshape(batch + (n,)),
            "permutation": permutation.reshape(shape), "lower_norm": lower_norm.reshape(batch + (1, 1)),
            "upper_norm": upper_norm.reshape(batch + (1, 1)), "factor": n * max(e[3] for e in per_matrix),
            "magnitudes": _magnitudes(wide, upper_norm)}


def _same_output(index: int, expected: torch.Tensor) -> Callable[[Any], bool]:
    def same(outputs: Any) -> bool:
        got = outputs[index] if isinstance(outputs, (tuple, list)) and len(outputs) > index else None
        return (isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(expected.shape)
                and bool((got.detach().to("cpu", torch.float64) == expected.to(torch.float64)).all()))
    return same


def _lu_factor(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[Answer]:
    """`linalg_lu_factor_ex`: (LU packed, pivots, info)."""
    lu = _exact_lu(wide, shape, args, kwargs)
    if lu is None:
        return []
    n = wide.shape[-1]
    strictly_lower = torch.ones(n, n, dtype=torch.bool).tril(-1)
    packed = torch.where(strictly_lower, lu["lower"], lu["upper"])
    scale = torch.where(strictly_lower, lu["lower_norm"], lu["upper_norm"])
    return [Answer("lu_factor", "rational arithmetic", 0, packed, scale, lu["factor"], lu["magnitudes"],
                   status_output=2, precondition=_same_output(1, lu["pivots"]))]


def _lu(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[Answer]:
    """`linalg_lu`: (P, L, U) with A = P·L·U."""
    lu = _exact_lu(wide, shape, args, kwargs)
    if lu is None:
        return []
    same = _same_output(0, lu["permutation"])
    return [Answer("lu", "rational arithmetic", 1, lu["lower"], lu["lower_norm"], lu["factor"], lu["magnitudes"],
                   precondition=same),
            Answer("lu", "rational arithmetic", 2, lu["upper"], lu["upper_norm"], lu["factor"], lu["magnitudes"],
                   precondition=same)]


# -- mpmath at 50 digits --------------------------------------------------------------------
def _singular_values_any_shape(args: tuple, kwargs: dict[str, Any]) -> list[Answer]:
    """`_linalg_svd` and `linalg_svdvals` of a real matrix of any shape within the sizes
    answered (the square ones' limits on its shorter side, four times that on its longer)."""
    a = args[0] if args else None
    wide = _rectangular(a)
    return [] if wide is None else _singular_values(wide, tuple(a.shape), args, kwargs)


def _rectangular(a: Any) -> torch.Tensor | None:
    """A real matrix batch within the sizes answered (the square ones' limits on its shorter
    side, four times that on its longer), finite, as float64 (batch, m, n); None otherwise."""
    if not isinstance(a, torch.Tensor) or a.is_complex() or not a.is_floating_point() or a.dim() < 2:
        return None
    m, n = a.shape[-2], a.shape[-1]
    batch = a.numel() // (m * n) if m * n else 0
    if min(m, n) == 0 or max(m, n) > 4 * MAX_ORDER or min(m, n) > MAX_ORDER or batch == 0 or batch > MAX_BATCH:
        return None
    wide = a.detach().to("cpu", torch.float64).reshape(batch, m, n)
    return wide if bool(torch.isfinite(wide).all()) else None


def _driver(a: torch.Tensor, kwargs: dict[str, Any]) -> str:
    """The least-squares driver a call uses: its own, else the device's default."""
    return kwargs.get("driver") or ("gelsy" if a.device.type == "cpu" else "gels")


def _singular_values(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[Answer]:
    """The singular values and the reduced SVD's vectors (U m×k, Vh k×n, k = min(m, n); a
    complete U or Vh of a rectangular matrix has others, any basis of the complement, whose
    shape the answer does not have: not answered) of an m×n matrix, mpmath at 50 digits."""
    import mpmath

    compute_uv = bool(kwargs.get("compute_uv", args[2] if len(args) > 2 else True))
    m, n = wide.shape[-2], wide.shape[-1]
    values, lefts, rights, gaps = [], [], [], []
    with mpmath.workdps(DIGITS):
        for matrix in wide.tolist():
            if compute_uv:
                u, s, vh = mpmath.mp.svd_r(mpmath.matrix(matrix))
            else:
                u, s, vh = None, mpmath.mp.svd_r(mpmath.matrix(matrix), compute_uv=False), None
            order = sorted(range(len(s)), key=lambda i: -s[i])
            values.append([float(s[i]) for i in order])
            if u is not None:
                lefts.append([[float(u[r, i]) for i in order] for r in range(m)])
                rights.append([[float(vh[i, c]) for c in range(n)] for i in order])
                # As eigenvalues ±σ of [[0, A], [Aᵀ, 0]]: the distance to every other σⱼ and to
                # every −σⱼ, and for a rectangular A to its |m − n| zero eigenvalues (Wedin).
                ordered = [s[i] for i in order]
                gaps.append([float(min([abs(x - y) for j, y in enumerate(ordered) if j != i]
                                       + [x + ordered[-1]] + ([x] if m != n else [])))
                             for i, x in enumerate(ordered)])
    s = torch.tensor(values, dtype=torch.float64)
    k = s.shape[-1]
    batch = shape[:-2]
    scale = s[:, :1].clone()  # ‖A‖₂ per matrix
    order = max(m, n)
    magnitudes = _magnitudes(wide, scale)
    found = [Answer("svd", f"mpmath at {DIGITS} digits", 1, s.reshape(batch + (k,)), scale.reshape(batch + (1,)),
                    order, magnitudes)]
    if compute_uv:
        u = torch.tensor(lefts, dtype=torch.float64).reshape(batch + (m, k))
        vh = torch.tensor(rights, dtype=torch.float64).reshape(batch + (k, n))
        columns = _vector_scale(scale, gaps).reshape(batch + (1, k))
        signs = _vector_signs("linalg_svd", u, vh)
        found += [Answer("svd", f"mpmath at {DIGITS} digits", 0, u, columns, VECTOR_FACTOR * order, magnitudes,
                         signs=signs, reach=1.0),
                  Answer("svd", f"mpmath at {DIGITS} digits", 2, vh, columns.transpose(-2, -1), VECTOR_FACTOR * order,
                         magnitudes, signs=signs, reach=1.0)]
    return found


def _symmetric_eigenvalues(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[Answer]:
    import mpmath

    lower = str(kwargs.get("UPLO", args[1] if len(args) > 1 else "L")).upper() != "U"
    compute_v = bool(kwargs.get("compute_v", args[2] if len(args) > 2 else True))
    # The kernel reads one triangle only: the matrix it solves is that triangle, mirrored.
    half = wide.tril() if lower else wide.triu()
    symmetric = half + half.transpose(-2, -1) - torch.diag_embed(wide.diagonal(dim1=-2, dim2=-1))
    values, vectors, gaps = [], [], []
    with mpmath.workdps(DIGITS):
        for matrix in symmetric.tolist():
            if compute_v:
                e, q = mpmath.mp.eigsy(mpmath.matrix(matrix))
            else:
                e, q = mpmath.mp.eigsy(mpmath.matrix(matrix), eigvals_only=True), None
            order = sorted(range(len(e)), key=lambda i: e[i])
            values.append([float(e[i]) for i in order])
            if q is not None:
                vectors.append([[float(q[r, i]) for i in order] for r in range(len(order))])
                ordered = [e[i] for i in order]
                gaps.append([float(min((abs(x - y) for j, y in enumerate(ordered) if j != i), default=mpmath.inf))
                             for i, x in enumerate(ordered)])
    lam = torch.tensor(values, dtype=torch.float64)
    scale = lam.abs().amax(dim=-1, keepdim=True)  # ‖A‖₂ of a symmetric matrix
    n = wide.shape[-1]
    magnitudes = _magnitudes(symmetric, scale)
    found = [Answer("eigh", f"mpmath at {DIGITS} digits", 0, lam.reshape(shape[:-1]), scale.reshape(shape[:-2] + (1,)),
                    n, magnitudes)]
    if compute_v:
        q = torch.tensor(vectors, dtype=torch.float64).reshape(shape)
        found.append(Answer("eigh", f"mpmath at {DIGITS} digits", 1, q,
                            _vector_scale(scale, gaps).reshape(shape[:-2] + (1, n)), VECTOR_FACTOR * n, magnitudes,
                            signs=_vector_signs("linalg_eigh", q), reach=1.0))
    return found


# A backward-stable eigensolver or SVD solves A + E with ‖E‖ ≤ n·u·‖A‖₂ (times SAFETY); each
# unit vector then turns by sin θ ≤ ‖E‖/(gap − ‖E‖) ≤ 2‖E‖/gap while the bound keeps a digit
# (Davis–Kahan; Wedin for singular vectors), and moves by ‖v̂ − v‖ ≤ √2·sin θ once its sign is
# the answer's: this factor (2√2, rounded up) times n, relative to ‖A‖₂/gap.
VECTOR_FACTOR = 4.0


def _vector_scale(norm: torch.Tensor, gaps: list[list[float]]) -> torch.Tensor:
    """Per matrix and vector: ‖A‖₂/gap, infinite where the gap is 0 (a repeated value: its
    vectors are any basis of their space, not answered)."""
    gap = torch.tensor(gaps, dtype=torch.float64)
    return torch.where(gap > 0, norm / gap.clamp_min(torch.finfo(torch.float64).tiny), torch.inf)


def _vector_signs(name: str, *exact: torch.Tensor) -> Callable[[Any], dict[int, torch.Tensor] | None]:
    """The kernel's eigenvectors, or pairs of singular vectors, negated where they point away
    from the answer's `exact` ones: each is unique only up to its sign (one common sign for a
    pair uᵢ, vᵢ)."""
    return functools.partial(arm_choices.signs, name, reference=exact)


def _cholesky(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[Answer]:
    import mpmath

    upper = bool(kwargs.get("upper", args[1] if len(args) > 1 else False))
    # The kernel reads one triangle only: the matrix it factors is that triangle, mirrored.
    half = wide.triu() if upper else wide.tril()
    symmetric = half + half.transpose(-2, -1) - torch.diag_embed(wide.diagonal(dim1=-2, dim2=-1))
    exact = _exact(symmetric)
    if any(e[1] is None for e in exact):
        return []
    factors = []
    with mpmath.workdps(DIGITS):
        for matrix in symmetric.tolist():
            try:
                lower = mpmath.cholesky(mpmath.matrix(matrix))
            except (ValueError, ZeroDivisionError):
                return []  # not positive definite: the kernel's info says so, no answer to compare
            factors.append([[float(lower[i, j]) for j in range(len(matrix))] for i in range(len(matrix))])
    factor = torch.tensor(factors, dtype=torch.float64)
    if upper:
        factor = factor.transpose(-2, -1)
    scale = factor.abs().amax(dim=(-2, -1), keepdim=True)
    n = wide.shape[-1]
    kappa = max(e[2] for e in exact)
    # Backward error γ(n+1)·|Lᵀ||L| ≤ n·u·‖A‖, amplified at most κ(A) in L (Higham ch. 10): n²·κ.
    return [Answer("cholesky", f"mpmath at {DIGITS} digits", 0, factor.reshape(shape),
                   scale.reshape(shape[:-2] + (1, 1)), n * n * kappa, _magnitudes(symmetric, scale),
                   status_output=1)]


# A rank cutoff (`rcond`) this far below 1/κ₂(A) cannot drop a singular value of A at any
# precision the answer concludes at.
RCOND_MARGIN = 100.0


def _least_squares(args: tuple, kwargs: dict[str, Any]) -> list[Answer]:
    """`linalg_lstsq(A, B)` with A (m×n) of full rank, in rational arithmetic.

    * Tall (m ≥ n), full column rank: the exact solution of the normal equations
      AᵀA·X = AᵀB. Householder QR (LAPACK's gelsy and gels) is backward stable, so
      ‖X̂ − X‖/‖X‖ ≤ m·n·u·(2κ₂ + κ₂(κ₂+1)·‖R‖/(‖A‖‖X‖)), R = B − AX (Higham, Thm 20.3): the
      residual's term is the one square-conditioning leaves.
    * Wide (m < n), full row rank: every driver returns the minimum-norm solution
      X = Aᵀ(AAᵀ)⁻¹B (gels by LQ, gelsy by a complete orthogonal factorization, gelsd and
      gelss by the SVD), backward stable, and X moves by at most 3κ₂ times a relative change
      of A and B (Demmel & Higham's perturbation bound for underdetermined systems): m·n·3κ₂."""
    if len(args) < 2 or not isinstance(args[0], torch.Tensor) or not isinstance(args[1], torch.Tensor):
        return []
    a, b = args[0], args[1]
    if (b.is_complex() or not b.is_floating_point() or b.dim() != a.dim()
            or tuple(b.shape[:-1]) != tuple(a.shape[:-1]) or b.shape[-1] > 4 * MAX_ORDER):
        return []
    exact = _full_rank(a, wide_too=True)
    if exact is None:
        return _rank_deficient_least_squares(a, b, kwargs)
    wide, per_matrix = exact
    m, n = wide.shape[-2], wide.shape[-1]
    rhs = b.detach().to("cpu", torch.float64).reshape(wide.shape[0], m, b.shape[-1])
    if not bool(torch.isfinite(rhs).all()):
        return []
    solutions, factors = [], []
    for (aq, _, inverse, kappa), columns in zip(per_matrix, rhs.tolist(), strict=True):
        bq = [[Fraction(v) for v in row] for row in columns]
        if m < n:  # X = Aᵀ·((AAᵀ)⁻¹·B)
            y = [[sum(inverse[i][k] * bq[k][j] for k in range(m)) for j in range(len(bq[0]))] for i in range(m)]
            x = [[sum(aq[k][i] * y[k][j] for k in range(m)) for j in range(len(y[0]))] for i in range(n)]
            factors.append(m * n * 3 * kappa)
            solutions.append([[float(v) for v in row] for row in x])
            continue
        atb = [[sum(aq[k][i] * bq[k][j] for k in range(m)) for j in range(len(bq[0]))] for i in range(n)]
        x = [[sum(inverse[i][k] * atb[k][j] for k in range(n)) for j in range(len(atb[0]))] for i in range(n)]
        residual = [[bq[i][j] - sum(aq[i][k] * x[k][j] for k in range(n)) for j in range(len(x[0]))] for i in range(m)]
        norm_a = math.sqrt(sum(float(v) ** 2 for row in aq for v in row) / n)  # ‖A‖₂ ≥ ‖A‖_F/√n
        # Per column of B: each column's error is relative to its own solution (its scale).
        ratio = 0.0
        for j in range(len(x[0])):
            norm_x = math.sqrt(sum(float(row[j]) ** 2 for row in x))
            norm_r = math.sqrt(sum(float(row[j]) ** 2 for row in residual))
            ratio = max(ratio, norm_r / (norm_a * norm_x) if norm_a > 0 and norm_x > 0 else math.inf)
        factors.append(m * n * (2 * kappa + kappa * (kappa + 1) * ratio))
        solutions.append([[float(v) for v in row] for row in x])
    rcond = kwargs.get("rcond", args[2] if len(args) > 2 else None)
    if rcond is not None and float(rcond) * max(k for *_, k in per_matrix) * RCOND_MARGIN >= 1:
        return []  # the caller's cutoff may drop a singular value the exact answer keeps
    x = torch.tensor(solutions, dtype=torch.float64)
    scale = x.abs().amax(dim=-2, keepdim=True)  # per column: ‖x‖∞
    out = tuple(a.shape[:-2]) + (n, b.shape[-1])
    method = "rational arithmetic (normal equations)" if m >= n else "rational arithmetic (minimum norm)"
    return [Answer("lstsq", method, 0, x.reshape(out),
                   scale.reshape(tuple(a.shape[:-2]) + (1, b.shape[-1])), max(factors),
                   _magnitudes(wide, rhs, scale))]


def _rank_deficient_least_squares(a: torch.Tensor, b: torch.Tensor, kwargs: dict[str, Any]) -> list[Answer]:
    """`linalg_lstsq(A, B)` of an exactly rank-deficient A (rank r < min(m, n)) from a driver
    that decides a rank and returns the minimum-norm solution of what it kept (gelsy, gelsd,
    gelss), answered where it returned rank r: then it solved A + E of rank r, ‖E‖ of the order
    of its backward error (the singular values it dropped are that close to zero), so its
    solution is A⁺B's within m·n·u·(3κᵣ + κᵣ(κᵣ+1)·‖R‖/(‖A‖‖X‖)), κᵣ = σ₁/σᵣ (Wedin, the rank
    kept; the 3 counts the solution's turn within A's null space). A⁺ is exact: A = C·F with F
    the nonzero rows of A's reduced row echelon form and C A's pivot columns, so
    A⁺ = Fᵀ(FFᵀ)⁻¹(CᵀC)⁻¹Cᵀ. κᵣ is bounded by ‖A‖_F·‖A⁺‖_F. gels assumes full rank (its
    answer on such a matrix is the documented garbage): not answered."""
    wide = _rectangular(a)
    if _driver(a, kwargs) not in ("gelsy", "gelsd", "gelss") or wide is None:
        return []
    batch, m, n = wide.shape
    rhs = b.detach().to("cpu", torch.float64).reshape(batch, m, b.shape[-1])
    if not bool(torch.isfinite(rhs).all()):
        return []
    solutions, factors, ranks = [], [], []
    for matrix, columns in zip(wide.tolist(), rhs.tolist(), strict=True):
        aq = [[Fraction(v) for v in row] for row in matrix]
        rows, pivots = _row_echelon(aq)
        r = len(pivots)
        if r == 0:
            return []  # the zero matrix: its solution is zero, and the rank's answer covers it
        c = [[row[j] for j in pivots] for row in aq]
        _, inverse_ff = _gauss_jordan_exact([[sum(x * y for x, y in zip(f, g, strict=True)) for g in rows]
                                             for f in rows])
        _, inverse_cc = _gauss_jordan_exact([[sum(c[k][i] * c[k][j] for k in range(m)) for j in range(r)]
                                             for i in range(r)])
        if inverse_ff is None or inverse_cc is None:
            return []
        # A⁺ = Fᵀ·(FFᵀ)⁻¹·(CᵀC)⁻¹·Cᵀ, an n×m matrix.
        middle = [[sum(inverse_ff[i][k] * inverse_cc[k][j] for k in range(r)) for j in range(r)] for i in range(r)]
        left = [[sum(rows[k][i] * middle[k][j] for k in range(r)) for j in range(r)] for i in range(n)]
        pinv = [[sum(left[i][k] * c[j][k] for k in range(r)) for j in range(m)] for i in range(n)]
        bq = [[Fraction(v) for v in row] for row in columns]
        x = [[sum(pinv[i][k] * bq[k][j] for k in range(m)) for j in range(len(bq[0]))] for i in range(n)]
        residual = [[bq[i][j] - sum(aq[i][k] * x[k][j] for k in range(n)) for j in range(len(x[0]))]
                    for i in range(m)]
        norm_a = math.sqrt(sum(float(v) ** 2 for row in aq for v in row))
        kappa = norm_a * math.sqrt(sum(float(v) ** 2 for row in pinv for v in row))
        ratio = 0.0
        for j in range(len(x[0])):
            norm_x = math.sqrt(sum(float(row[j]) ** 2 for row in x))
            norm_r = math.sqrt(sum(float(row[j]) ** 2 for row in residual))
            # ‖A‖₂ ≥ ‖A‖_F/√r; a zero solution (B orthogonal to A's range) has no relative error
            ratio = max(ratio, norm_r * math.sqrt(r) / (norm_a * norm_x) if norm_x > 0 else math.inf)
        factors.append(m * n * (3 * kappa + kappa * (kappa + 1) * ratio))
        solutions.append([[float(v) for v in row] for row in x])
        ranks.append(r)
    shape = tuple(a.shape[:-2])
    x = torch.tensor(solutions, dtype=torch.float64)
    scale = x.abs().amax(dim=-2, keepdim=True)
    expected = torch.tensor(ranks).reshape(shape)

    def kept_the_rank(outputs: Any) -> bool:
        rank = outputs[2] if isinstance(outputs, (tuple, list)) and len(outputs) > 2 else None
        return (isinstance(rank, torch.Tensor) and tuple(rank.shape) == shape
                and bool((rank.detach().to("cpu", torch.int64) == expected).all()))

    return [Answer("lstsq", "rational arithmetic (minimum norm, full-rank factorization)", 0,
                   x.reshape(shape + (n, b.shape[-1])), scale.reshape(shape + (1, b.shape[-1])), max(factors),
                   _magnitudes(wide, rhs, scale), precondition=kept_the_rank)]


def _row_echelon(matrix: list[list[Fraction]]) -> tuple[list[list[Fraction]], list[int]]:
    """The nonzero rows of `matrix`'s reduced row echelon form, exactly, and its pivot columns."""
    rows = [list(row) for row in matrix]
    pivots: list[int] = []
    for col in range(len(rows[0]) if rows else 0):
        at = len(pivots)
        pivot = next((i for i in range(at, len(rows)) if rows[i][col] != 0), None)
        if pivot is None:
            continue
        rows[at], rows[pivot] = rows[pivot], rows[at]
        p = rows[at][col]
        rows[at] = [v / p for v in rows[at]]
        for i in range(len(rows)):
            if i != at and rows[i][col] != 0:
                f = rows[i][col]
                rows[i] = [v - f * w for v, w in zip(rows[i], rows[at], strict=True)]
        pivots.append(col)
    return rows[:len(pivots)], pivots


def _full_rank(a: torch.Tensor, wide_too: bool = False) -> tuple[torch.Tensor, list[tuple]] | None:
    """A real matrix batch of full rank within the sizes answered, tall (m ≥ n, full column
    rank) or, `wide_too`, wide (full row rank): the float64 batch and, per matrix, its exact
    entries, Gram matrix G of the shorter side (AᵀA tall, AAᵀ wide), G⁻¹ and κ₂(A)'s upper
    bound √(k·κ∞(G)) (κ₂(A)² = κ₂(G) ≤ k·κ∞(G), G of order k); None otherwise."""
    wide = _rectangular(a)
    if wide is None or (wide.shape[1] < wide.shape[2] and not wide_too):
        return None
    m, n = wide.shape[1], wide.shape[2]
    out = []
    for matrix in wide.tolist():
        aq = [[Fraction(v) for v in row] for row in matrix]
        if m >= n:
            gram = [[sum(aq[k][i] * aq[k][j] for k in range(m)) for j in range(n)] for i in range(n)]
        else:
            gram = [[sum(aq[i][k] * aq[j][k] for k in range(n)) for j in range(m)] for i in range(m)]
        _, inverse = _gauss_jordan_exact(gram)
        if inverse is None:
            return None  # rank-deficient: the answer depends on the kernel's rank decision
        out.append((aq, gram, inverse, math.sqrt(len(gram) * _norm_inf(gram) * _norm_inf(inverse))))
    return wide, out


def _pseudoinverse(args: tuple, kwargs: dict[str, Any]) -> list[Answer]:
    """`linalg_pinv(A)` of a matrix of full rank: (AᵀA)⁻¹Aᵀ (tall) or Aᵀ(AAᵀ)⁻¹ (wide),
    exactly. The SVD is backward stable and, the rank kept, ‖ΔA⁺‖ ≤ √2·‖A⁺‖²·‖ΔA‖ (Wedin):
    m·n·κ₂ relative to A⁺."""
    a = args[0] if len(args) == 1 else None  # a positional `rcond` (the old overload): not answered
    if not isinstance(a, torch.Tensor) or kwargs.get("hermitian"):
        return []  # hermitian=True reads one triangle through eigh: not answered
    exact = _full_rank(a, wide_too=True)
    if exact is None:
        return []
    wide, per_matrix = exact
    m, n = wide.shape[-2], wide.shape[-1]
    pinvs, smallest = [], math.inf
    for aq, _, inverse, _ in per_matrix:
        if m >= n:
            p = [[sum(inverse[i][k] * aq[j][k] for k in range(n)) for j in range(m)] for i in range(n)]
        else:
            p = [[sum(aq[k][i] * inverse[k][j] for k in range(m)) for j in range(m)] for i in range(n)]
        pinvs.append([[float(v) for v in row] for row in p])
        # σ_min(A) = 1/‖A⁺‖₂ ≥ 1/‖A⁺‖_F
        smallest = min(smallest, 1 / math.sqrt(sum(float(v) ** 2 for row in p for v in row)))
    kappa = max(k for *_, k in per_matrix)
    atol, rtol = kwargs.get("atol"), kwargs.get("rtol")
    cutoffs = [float(t.abs().max()) if isinstance(t, torch.Tensor) else float(t) for t in (atol, rtol)
               if t is not None]
    if atol is not None and cutoffs[0] * RCOND_MARGIN >= smallest:
        return []  # the caller's absolute cutoff may drop a singular value the exact answer keeps
    if rtol is not None and cutoffs[-1] * kappa * RCOND_MARGIN >= 1:
        return []
    x = torch.tensor(pinvs, dtype=torch.float64)
    scale = x.abs().amax(dim=(-2, -1), keepdim=True)
    batch = tuple(a.shape[:-2])
    method = "rational arithmetic (normal equations)" if m >= n else "rational arithmetic (minimum norm)"
    return [Answer("pinv", method, 0, x.reshape(batch + (n, m)),
                   scale.reshape(batch + (1, 1)), m * n * kappa, _magnitudes(wide, scale))]


def _qr(args: tuple, kwargs: dict[str, Any]) -> list[Answer]:
    """`linalg_qr(A)` (reduced) of a tall matrix of full column rank: R is the upper Cholesky
    factor of AᵀA and Q = A·R⁻¹ (mpmath at 50 digits from the exact AᵀA), unique once R's
    diagonal is positive; the kernel's signs are brought to that convention first. Householder
    QR is backward stable and ‖ΔQ‖, ‖ΔR‖/‖R‖ ≤ c·κ₂·‖ΔA‖/‖A‖ (Sun): m·n·κ₂."""
    import mpmath

    a = args[0] if args else None
    mode = kwargs.get("mode", args[1] if len(args) > 1 else "reduced")
    if not isinstance(a, torch.Tensor) or mode != "reduced":
        return []  # "complete": the trailing columns of Q are not unique; "r": no Q
    exact = _full_rank(a)
    if exact is None:
        return []
    wide, per_matrix = exact
    m, n = wide.shape[-2], wide.shape[-1]
    qs, rs = [], []
    with mpmath.workdps(DIGITS):
        for aq, gram, _, _ in per_matrix:
            g = mpmath.matrix([[mpmath.mpf(v.numerator) / v.denominator for v in row] for row in gram])
            try:
                r = mpmath.cholesky(g).T
            except (ValueError, ZeroDivisionError):
                return []
            q = mpmath.matrix([[mpmath.mpf(v.numerator) / v.denominator for v in row] for row in aq]) * r ** -1
            qs.append([[float(q[i, j]) for j in range(n)] for i in range(m)])
            rs.append([[float(r[i, j]) for j in range(n)] for i in range(n)])
    batch = tuple(a.shape[:-2])
    q, r = torch.tensor(qs, dtype=torch.float64), torch.tensor(rs, dtype=torch.float64)
    scale_r = r.abs().amax(dim=(-2, -1), keepdim=True)
    kappa = max(k for *_, k in per_matrix)
    magnitudes = _magnitudes(wide, scale_r)
    return [Answer("qr", f"mpmath at {DIGITS} digits", 0, q.reshape(batch + (m, n)), torch.ones(batch + (1, 1),
                   dtype=torch.float64), m * n * kappa, magnitudes, signs=_diagonal_signs),
            Answer("qr", f"mpmath at {DIGITS} digits", 1, r.reshape(batch + (n, n)), scale_r.reshape(batch + (1, 1)),
                   m * n * kappa, magnitudes, signs=_diagonal_signs)]


def _diagonal_signs(outputs: Any) -> dict[int, torch.Tensor] | None:
    """Each column of Q and row of R negated where R's diagonal is negative."""
    if not isinstance(outputs, (tuple, list)) or len(outputs) != 2 or not isinstance(outputs[1], torch.Tensor):
        return None
    sign = torch.where(outputs[1].detach().to("cpu").diagonal(dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(torch.float64)
    return {0: sign.unsqueeze(-2), 1: sign.unsqueeze(-1)}


# -- a least-squares driver's numerical rank: a range, not a value -------------------------
# How far the pivots QR with column pivoting picks (from downdated column norms) may fall
# short of the largest column, as a factor on its rank-revealing bounds below.
PIVOT_SLACK = 2.0


@dataclass
class RankAnswer:
    """The rank `linalg_lstsq` returns with a rank-revealing driver, answered from the singular
    values of the recorded input (mpmath at 50 digits, no LAPACK) as the range of ranks a
    correct driver may return at the arm's precision and cutoff `rcond`.

    The driver factors A + E with ‖E‖ ≤ δ = SAFETY·m·n·u·‖A‖₂ (backward stable), so each
    singular value it sees is within δ of the exact one (Weyl).

    * gelsd, gelss count the singular values above rcond·σ₁.
    * gelsy (QR with column pivoting, then incremental condition estimation) keeps the k-th
      column while its estimates of R_k's extreme singular values keep smin ≥ rcond·smax. The
      estimates satisfy σ_min(R_k) ≤ smin ≤ |r_kk| and σ₁/√n ≤ |r₁₁| ≤ smax ≤ σ₁. The pivoted R
      is diagonally dominant by columns, so σ_min(R_k) ≥ |r_kk|/2ᵏ (Faddeev, Kublanovskaya &
      Faddeeva), and σ_k ≤ ‖R₂₂‖ ≤ √n·|r_kk| (interlacing). Hence it keeps column k whenever
      σ_k ≥ √n·2ᵏ·rcond·σ₁, and drops it whenever 2ᵏ·σ_k·√n < rcond·σ₁; the rank lies between.

    A rank outside that range is not a rounding or a cutoff's doing: the driver computed
    something else (gelsy left with stale column pivots: pytorch/pytorch#187411)."""
    op: str
    method: str
    output: int
    singular: torch.Tensor        # (batch, min(m, n)) float64, descending
    driver: str
    rcond: float | None           # the caller's cutoff; None: the dtype's eps·max(m, n)
    order: tuple[int, int]        # (m, n)
    batch: tuple[int, ...]
    magnitudes: tuple[float, float]

    def allowed(self, u: float, rcond: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per matrix: the smallest and largest rank a correct driver may return, and the
        numerical rank of the exact singular values at this cutoff."""
        m, n = self.order
        s = self.singular
        top = s[:, :1]
        delta = SAFETY * m * n * u * top
        exact = (s > rcond * top).sum(-1)
        if self.driver == "gelsy":
            growth = PIVOT_SLACK * math.sqrt(n) * 2.0 ** torch.arange(1, s.shape[-1] + 1, dtype=torch.float64)
            kept = (s - delta) > growth * rcond * (top + delta)
            dropped = growth * (s + delta) < rcond * (top - delta).clamp_min(0)
            # Its first column is kept whatever the cutoff, unless the whole matrix is zero.
            kept[:, 0], dropped[:, 0] = top[:, 0] > 0, top[:, 0] == 0
        else:
            kept = (s - delta) > rcond * (top + delta)
            dropped = ~((s + delta) > rcond * (top - delta).clamp_min(0))
        # The leading run of kept columns, and everything before the first column surely dropped.
        low = kept.to(torch.int64).cumprod(-1).sum(-1)
        high = (~dropped).to(torch.int64).cumprod(-1).sum(-1)
        return low, high, exact

    def check(self, outputs: Any) -> Check | None:
        if not isinstance(outputs, (tuple, list)) or len(outputs) <= self.output:
            return None
        solution, got = outputs[0], outputs[self.output]
        if (not isinstance(solution, torch.Tensor) or solution.dtype not in UNIT_ROUNDOFF
                or not isinstance(got, torch.Tensor) or tuple(got.shape) != self.batch):
            return None
        if _outside_range(self.magnitudes, solution.dtype):
            return None
        u, info = UNIT_ROUNDOFF[solution.dtype], torch.finfo(solution.dtype)
        rcond = self.rcond if self.rcond is not None else info.eps * max(self.order)
        if self.driver == "gelsd" and rcond >= 1:
            rcond = u  # gelsd (its dlalsd) reads a cutoff of 1 or more as the machine precision
        low, high, exact = self.allowed(u, rcond)
        rank = got.detach().to("cpu", torch.int64).reshape(-1)
        outside = torch.maximum(low - rank, rank - high).clamp_min(0)
        worst = int(torch.argmax(outside))
        return Check(self, float(outside[worst]), 0.5, float(rank[worst]), float(exact[worst]),
                     exact.reshape(self.batch).to(got.dtype),
                     allowed=(int(low[worst]), int(high[worst])), cutoff=rcond)


def _least_squares_rank(args: tuple, kwargs: dict[str, Any]) -> list[RankAnswer]:
    """The rank (and, from gelsd and gelss, the singular values) `linalg_lstsq` reports."""
    import mpmath

    a = args[0] if args else None
    wide = _rectangular(a)
    if wide is None:
        return []
    driver = _driver(a, kwargs)
    rcond = kwargs.get("rcond", args[2] if len(args) > 2 else None)
    if driver not in ("gelsy", "gelsd", "gelss") or (rcond is not None and not float(rcond) > 0):
        return []  # gels reports no rank; a cutoff ≤ 0 means something else to each driver
    m, n = wide.shape[1], wide.shape[2]
    values = []
    with mpmath.workdps(DIGITS):
        for matrix in wide.tolist():
            s = mpmath.mp.svd_r(mpmath.matrix(matrix), compute_uv=False)
            values.append(sorted((float(x) for x in s), reverse=True))
    s = torch.tensor(values, dtype=torch.float64)
    shape = tuple(a.shape[:-2])
    magnitudes = _magnitudes(wide, s[:, :1])
    found: list[Any] = [RankAnswer("lstsq", f"mpmath singular values at {DIGITS} digits, {driver}'s rank bounds", 2, s,
                                   driver, None if rcond is None else float(rcond), (m, n), shape, magnitudes)]
    if driver != "gelsy":
        found.append(Answer("lstsq", f"mpmath at {DIGITS} digits", 3, s.reshape(shape + (s.shape[-1],)),
                            s[:, :1].reshape(shape + (1,)), min(m, n), magnitudes))
    return found


def _least_squares_answers(args: tuple, kwargs: dict[str, Any]) -> list[Any]:
    return _least_squares(args, kwargs) + _least_squares_rank(args, kwargs)


# -- the eigenvalues of a general matrix: a set, matched to the kernel's in any order --------
@dataclass
class EigenvalueAnswer:
    """`linalg_eig`'s eigenvalues of a real matrix (mpmath at 50 digits, with left and right
    eigenvectors for each one's condition number κᵢ = ‖xᵢ‖‖yᵢ‖/|yᵢᴴxᵢ|). A backward-stable
    eigensolver solves A + E with ‖E‖ ≤ n·u·‖A‖, which moves λᵢ by at most κᵢ·‖E‖ to first order
    (Wilkinson): each within a disk of radius n·u·κᵢ·‖A‖_F (times SAFETY). The kernel returns
    them in an order of its own, so each of its values is compared with the nearest exact one
    and each exact one with the nearest of the kernel's: a value missed or invented shows. Not
    answered where a disk leaves no digit or two disks meet (which is which is then undecided)."""
    op: str
    method: str
    output: int
    value: torch.Tensor          # (batch, n) complex128
    condition: torch.Tensor      # (batch, n) κᵢ
    norm: torch.Tensor           # (batch, 1) ‖A‖_F
    batch: tuple[int, ...]
    magnitudes: tuple[float, float]

    def check(self, outputs: Any) -> Check | None:
        got = outputs[self.output] if isinstance(outputs, (tuple, list)) else None
        if not isinstance(got, torch.Tensor) or got.dtype not in (torch.complex64, torch.complex128):
            return None
        n = self.value.shape[-1]
        if tuple(got.shape) != self.batch + (n,):
            return None
        real = torch.float32 if got.dtype == torch.complex64 else torch.float64
        bound = SAFETY * n * UNIT_ROUNDOFF[real]
        if bound * float(self.condition.max()) >= NO_DIGIT or _outside_range(self.magnitudes, real):
            return None
        radius = bound * self.condition * self.norm
        exact = self.value
        apart = (exact[:, :, None] - exact[:, None, :]).abs() > 2 * (radius[:, :, None] + radius[:, None, :])
        if not bool((apart | torch.eye(n, dtype=torch.bool)).all()):
            return None
        got = got.detach().to("cpu", torch.complex128).reshape(-1, n)
        if not bool(torch.isfinite(got).all()):
            return Check(self, math.inf, bound, math.nan, math.nan, got.reshape(self.batch + (n,)))
        distance = (got[:, :, None] - exact[:, None, :]).abs()           # (batch, kernel's, exact)
        scale = (self.condition * self.norm)[:, None, :]
        nearest = distance.argmin(-1)                                     # each kernel value's exact one
        kernel_side = (distance / scale).amin(-1)
        exact_side = (distance / scale).amin(-2)
        error = torch.cat([kernel_side, exact_side], dim=-1)
        worst = int(torch.argmax(error.reshape(-1)))
        matrix, index = divmod(worst, 2 * n)
        if index < n:
            shown, answer = got[matrix, index], exact[matrix, nearest[matrix, index]]
        else:
            answer = exact[matrix, index - n]
            shown = got[matrix, distance[matrix, :, index - n].argmin()]
        replacement = torch.gather(exact, 1, nearest).reshape(self.batch + (n,))
        return Check(self, float(error.reshape(-1)[worst]), bound, _complex_value(shown), _complex_value(answer),
                     replacement)


def _complex_value(z: torch.Tensor) -> float | complex:
    """A real eigenvalue as a float, a complex one as a complex."""
    return float(z.real) if float(z.imag) == 0 else complex(z)


def _general_eigenvalues(wide: torch.Tensor, shape: tuple, args: tuple, kwargs: dict) -> list[EigenvalueAnswer]:
    import mpmath

    values, conditions = [], []
    with mpmath.workdps(DIGITS):
        for matrix in wide.tolist():
            try:
                e, left, right = mpmath.mp.eig(mpmath.matrix(matrix), left=True, right=True)
            except (ValueError, ZeroDivisionError):
                return []
            n = len(e)
            kappa = []
            for i in range(n):
                x = [right[r, i] for r in range(n)]
                y = [left[i, c] for c in range(n)]
                dot = abs(mpmath.fsum(a * b for a, b in zip(y, x, strict=True)))
                size = mpmath.sqrt(mpmath.fsum(abs(a) ** 2 for a in x)) * mpmath.sqrt(mpmath.fsum(abs(b) ** 2 for b in y))
                kappa.append(float(size / dot) if dot != 0 else math.inf)
            values.append([complex(v) for v in e])
            conditions.append(kappa)
    value = torch.tensor(values, dtype=torch.complex128)
    norm = torch.linalg.matrix_norm(wide).reshape(-1, 1)
    return [EigenvalueAnswer("eig", f"mpmath at {DIGITS} digits", 0, value, torch.tensor(conditions, dtype=torch.float64),
                             norm, shape[:-2], _magnitudes(wide, norm))]


_RECTANGULAR = {"linalg_lstsq": _least_squares_answers, "linalg_pinv": _pseudoinverse,
                "linalg_qr": _qr, "_linalg_svd": _singular_values_any_shape,
                "linalg_svdvals": _singular_values_any_shape}


_SOLVERS = {
    "_linalg_det": _det, "linalg_det": _det, "det": _det,
    "_linalg_slogdet": _slogdet, "linalg_slogdet": _slogdet, "slogdet": _slogdet,
    "linalg_inv_ex": _inverse, "linalg_inv": _inverse, "inverse": _inverse,
    "_linalg_solve_ex": _solve, "linalg_solve": _solve, "linalg_solve_ex": _solve,
    "_linalg_eigh": _symmetric_eigenvalues, "linalg_eigvalsh": _symmetric_eigenvalues,
    "linalg_cholesky_ex": _cholesky, "linalg_lu_factor_ex": _lu_factor, "linalg_lu": _lu,
    "linalg_eig": _general_eigenvalues,
}


# -- scalar special functions ---------------------------------------------------------------
MAX_ELEMENTS = 64


def _gelu(mp: Any, x: Any) -> Any:
    return x / 2 * mp.erfc(-x / mp.sqrt(2))


def _sigmoid(mp: Any, x: Any) -> Any:
    return 1 / (1 + mp.exp(-x))


_FUNCTIONS: dict[str, Any] = {
    "exp": lambda mp, x: mp.exp(x), "expm1": lambda mp, x: mp.expm1(x), "log": lambda mp, x: mp.log(x),
    "log1p": lambda mp, x: mp.log1p(x), "log2": lambda mp, x: mp.log(x, 2), "log10": lambda mp, x: mp.log10(x),
    "sin": lambda mp, x: mp.sin(x), "cos": lambda mp, x: mp.cos(x), "tan": lambda mp, x: mp.tan(x),
    "tanh": lambda mp, x: mp.tanh(x), "sinh": lambda mp, x: mp.sinh(x), "cosh": lambda mp, x: mp.cosh(x),
    "asin": lambda mp, x: mp.asin(x), "acos": lambda mp, x: mp.acos(x), "atan": lambda mp, x: mp.atan(x),
    "asinh": lambda mp, x: mp.asinh(x), "acosh": lambda mp, x: mp.acosh(x), "atanh": lambda mp, x: mp.atanh(x),
    "erf": lambda mp, x: mp.erf(x), "erfc": lambda mp, x: mp.erfc(x), "erfinv": lambda mp, x: mp.erfinv(x),
    "lgamma": lambda mp, x: mp.log(abs(mp.gamma(x))), "digamma": lambda mp, x: mp.digamma(x),
    "sigmoid": _sigmoid, "gelu": _gelu, "silu": lambda mp, x: x * _sigmoid(mp, x),
    "special_i0e": lambda mp, x: mp.besseli(0, x) * mp.exp(-abs(x)), "i0": lambda mp, x: mp.besseli(0, x),
    "special_ndtr": lambda mp, x: mp.ncdf(x), "special_erfcx": lambda mp, x: mp.exp(x * x) * mp.erfc(x),
}


def _function_answers(op: str, args: tuple, kwargs: dict[str, Any]) -> list[Answer]:
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if (x is None or not x.is_floating_point() or x.numel() == 0 or x.numel() > MAX_ELEMENTS
            or len(args) > 1 or (op == "gelu" and kwargs.get("approximate", "none") != "none")):
        return []
    import mpmath

    f = _FUNCTIONS[op]
    values, scales = [], []
    with mpmath.workdps(DIGITS):
        for v in x.detach().to("cpu", torch.float64).reshape(-1).tolist():
            y, sensitivity = _evaluate(mpmath.mp, f, v)
            values.append(y)
            scales.append(max(abs(y), sensitivity) if math.isfinite(y) else math.nan)
    value = torch.tensor(values, dtype=torch.float64).reshape(x.shape)
    scale = torch.tensor(scales, dtype=torch.float64).reshape(x.shape)
    answered = torch.isfinite(value)
    if not bool(answered.any()):
        return []
    wide = x.detach().to("cpu", torch.float64)
    return [Answer(op, f"mpmath at {DIGITS} digits", 0, value, torch.where(answered, scale, torch.ones_like(scale)),
                   1.0, _magnitudes(wide[answered], scale[answered]))]


def _evaluate(mp: Any, f: Any, v: float) -> tuple[float, float]:
    """f(v) and |v·f′(v)| (from a central difference at 50 digits); nan where f has no real
    finite value there."""
    if not math.isfinite(v):
        return math.nan, math.nan
    try:
        x = mp.mpf(v)
        y = f(mp, x)
        h = abs(x) * mp.mpf(10) ** -20 if v != 0 else mp.mpf(10) ** -40
        slope = (f(mp, x + h) - f(mp, x - h)) / (2 * h)
    except (ValueError, ZeroDivisionError, OverflowError):
        return math.nan, math.nan
    if not (isinstance(y, mp.mpf) and isinstance(slope, mp.mpf)):
        return math.nan, math.nan  # complex: outside the real domain
    out, sensitivity = float(y), float(abs(x * slope))
    return (out, sensitivity) if math.isfinite(out) and math.isfinite(sensitivity) else (math.nan, math.nan)


COVERED_OPS = frozenset(_SOLVERS) | frozenset(_FUNCTIONS) | frozenset(_RECTANGULAR)


class Budget:
    """The answers an arm may still compute: BUDGET_S of wall time in all."""

    def __init__(self, seconds: float = BUDGET_S) -> None:
        self.left = seconds

    def answers(self, op: str, args: tuple, kwargs: dict[str, Any]) -> list[Answer | RankAnswer | EigenvalueAnswer]:
        if self.left <= 0 or op not in COVERED_OPS:
            return []
        start = time.monotonic()
        try:
            return answers(op, args, kwargs)
        finally:
            self.left -= time.monotonic() - start


def note_fields(check: Check, side: str) -> dict[str, Any]:
    """The conditioning note's flat fields for one check: `side` is "kernel" (the arm's own
    output) or "float64" (the replay's)."""
    fields = {"independent": check.answer.method, f"{side}_error": _finite(check.error),
              f"{side}_bound": check.bound, f"{side}_value": _finite(check.got), f"{side}_exact": _finite(check.exact),
              f"{side}_disagrees": check.disagrees}
    if check.allowed is not None:
        fields.update({f"{side}_allowed": list(check.allowed), f"{side}_cutoff": check.cutoff})
    return fields


def _finite(x: float | complex) -> float | str:
    """A note's number as JSON holds it: a non-finite or complex one as text."""
    if isinstance(x, complex):
        return f"{x.real:.9g}{x.imag:+.9g}j"
    return x if math.isfinite(x) else str(x)
