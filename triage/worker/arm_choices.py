"""The choices a decomposition is free to make, taken as the arm made them.

An eigenvector is unique only up to its sign, a pair of singular vectors up to one common
sign, a column of Q with its row of R likewise (PyTorch's documentation says so for
`linalg.eigh`, `linalg.svd` and `linalg.qr`). A general eigensolver (`linalg.eig`,
`linalg.eigvals`) returns its eigenvalues in no particular order and each eigenvector up to a
complex phase (its documentation says both). LAPACK in float32 and float64, or the same LAPACK
on two matrices a rounding apart, may choose differently: a float64 reference or a simulated
replay that keeps its own choice differs from the arm by a whole vector, or by eigenvalues in
other places, which is not rounding and not a bug (a random 4×4 matrix: float32's and
float64's eigenvectors differ by a phase more often than not). The recorder keeps the arm's
outputs (`keep`); the float64 replay and every simulated replay take the arm's order, signs
and phases (`align`), so everything downstream sees the arm's convention and only the actual
error remains.
"""
from __future__ import annotations

from typing import Any

import torch

# op (overload packet name) -> the outputs whose columns (or, for Vh, rows) share one sign
# per index, and whether each is read by rows
SIGNED = {"_linalg_eigh": ((1, False),), "linalg_eigh": ((1, False),),
          "_linalg_svd": ((0, False), (2, True)), "linalg_svd": ((0, False), (2, True)),
          "linalg_qr": ((0, False), (1, True))}
# Larger vector sets are not kept (their memory, and a copy per record).
MAX_ELEMENTS = 1 << 20


# General eigensolvers: (the eigenvalues' output, the eigenvectors' or None); eigvals has one output.
GENERAL = {"linalg_eig": (0, 1), "_linalg_eigvals": (0, None), "linalg_eigvals": (0, None)}


def keep(name: str, out: Any) -> tuple[torch.Tensor, ...] | None:
    """The arm's outputs that carry its choices (a `SIGNED` op's vectors, a `GENERAL` one's
    eigenvalues and eigenvectors), as float64 (complex128) CPU copies; None otherwise."""
    if name in GENERAL:
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        kept = [outputs[i] if i < len(outputs) else None for i in GENERAL[name] if i is not None]
        if any(not isinstance(t, torch.Tensor) or not t.is_complex() or t.numel() == 0 or t.numel() > MAX_ELEMENTS
               for t in kept):
            return None
        return tuple(t.detach().to("cpu", torch.complex128) for t in kept)
    layout = SIGNED.get(name)
    if layout is None or not isinstance(out, (tuple, list)):
        return None
    kept = []
    for index, _ in layout:
        t = out[index] if index < len(out) else None
        if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()) or t.numel() == 0 \
                or t.numel() > MAX_ELEMENTS:
            return None
        kept.append(t.detach().to("cpu", torch.complex128 if t.is_complex() else torch.float64))
    return tuple(kept)


def signs(name: str, outputs: Any, reference: tuple[torch.Tensor, ...]) -> dict[int, torch.Tensor] | None:
    """The ±1 factors (float64, CPU) that turn each vector, or pair, of a `SIGNED` op's
    `outputs` toward `reference`'s (its vector outputs in `SIGNED` order: the arm's, or an
    independent answer's), by output index and shaped to broadcast against that output: 1
    beyond the first min(m, n) vectors. Complex vectors are unique up to a phase c, |c| = 1,
    not a sign: their factors are the phases (complex128) that bring each nearest to the
    reference's (a row of Vh or of R turns by c̄ where its column of U or Q turns by c). A
    stack of replays along a new first dimension gets one factor per replay. None where the
    outputs do not have the reference's shapes."""
    layout = SIGNED.get(name)
    if layout is None or not isinstance(outputs, (tuple, list)) or len(reference) != len(layout):
        return None
    parts = [outputs[index] if index < len(outputs) else None for index, _ in layout]
    if any(not isinstance(p, torch.Tensor) or p.shape[-2:] != r.shape[-2:]
           for p, r in zip(parts, reference, strict=True)):
        return None
    complex_ = any(p.is_complex() or r.is_complex() for p, r in zip(parts, reference, strict=True))
    wide = torch.complex128 if complex_ else torch.float64
    parts = [p.detach().to("cpu", wide) for p in parts]
    reference = tuple(r.to(wide) for r in reference)
    # The first k = min(m, n) vectors pair up; a complete factorization's others span the
    # complement in a basis of the kernel's choosing, which no sign makes the reference's.
    k = min(min(t.shape[-2] if rows else t.shape[-1] for t, (_, rows) in zip(parts, layout, strict=True)),
            min(t.shape[-2] if rows else t.shape[-1] for t, (_, rows) in zip(reference, layout, strict=True)))

    def leading(t: torch.Tensor, rows: bool) -> torch.Tensor:
        return t[..., :k, :] if rows else t[..., :k]

    # R's rows follow Q's columns: for QR only Q decides.
    deciding = 1 if name == "linalg_qr" else len(layout)
    if complex_:
        # The phase c maximizing Re Σ c̄·z over the deciding outputs, z = vᴴ·v_ref for a column
        # and its conjugate for a row (which turns by c̄): c = Σz/|Σz|.
        dots = sum((leading(p, rows).conj() * leading(r, rows)).sum(-1 if rows else -2).conj() if rows
                   else (leading(p, rows).conj() * leading(r, rows)).sum(-2)
                   for p, r, (_, rows) in zip(parts[:deciding], reference[:deciding], layout[:deciding], strict=True))
        size = dots.abs()
        sign = torch.where(size > 0, dots / size.clamp_min(torch.finfo(torch.float64).tiny), torch.ones_like(dots))
    else:
        dots = sum((leading(p, rows) * leading(r, rows)).sum(-1 if rows else -2) for p, r, (_, rows) in
                   zip(parts[:deciding], reference[:deciding], layout[:deciding], strict=True))
        sign = torch.where(dots < 0, -1.0, 1.0).to(torch.float64)
    factors = {}
    for p, (index, rows) in zip(parts, layout, strict=True):
        count = p.shape[-2] if rows else p.shape[-1]
        turn = sign.conj() if rows and complex_ else sign
        padded = torch.cat([turn, turn.new_ones(turn.shape[:-1] + (count - k,))], -1) if count > k else turn
        factors[index] = padded.unsqueeze(-1) if rows else padded.unsqueeze(-2)
    return factors


def align(name: str, out: Any, arm: tuple[torch.Tensor, ...]) -> Any:
    """`out` (a replay's outputs of the op, on the CPU) in the arm's convention, in place: each
    vector, or pair, negated where it points away from the arm's (`signs`); a general
    eigensolver's eigenvalues in the arm's order and its eigenvectors in the arm's phases."""
    if name in GENERAL:
        return _align_general(name, out, arm)
    factors = signs(name, out, arm)
    if factors is None or any(out[index].device.type != "cpu" for index in factors):
        return out
    for index, factor in factors.items():
        out[index].mul_(factor)
    return out


def _align_general(name: str, out: Any, arm: tuple[torch.Tensor, ...]) -> Any:
    """A general eigensolver's outputs with the eigenvalues moved to the places of the arm's
    they match (`_matching`), the eigenvectors with them, each eigenvector turned by the phase
    c = z/|z|, z = vᴴ·v_arm, that brings it nearest to the arm's (for a real one: its sign)."""
    vectors_at = GENERAL[name][1]
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    parts = [outputs[i] if i is not None and i < len(outputs) else None for i in GENERAL[name]][:len(arm)]
    if len(parts) != len(arm) or any(not isinstance(p, torch.Tensor) or not p.is_complex() or p.device.type != "cpu"
                                     or p.shape[-a.dim():] != a.shape for p, a in zip(parts, arm, strict=True)):
        return out
    values = parts[0]
    order = _matching(values, arm[0])
    values.copy_(values.gather(-1, order))
    if vectors_at is not None:
        vectors = parts[1]
        vectors.copy_(vectors.gather(-1, order.unsqueeze(-2).expand_as(vectors)))
        z = (vectors.conj() * arm[1].to(vectors.dtype)).sum(-2, keepdim=True)
        size = z.abs()
        vectors.mul_(torch.where(size > 0, z / size.clamp_min(torch.finfo(size.dtype).tiny), torch.ones_like(z)))
    return out


def _matching(values: torch.Tensor, arm: torch.Tensor) -> torch.Tensor:
    """For each of the arm's eigenvalues (last dimension), the index of the replay's eigenvalue
    it pairs with: the closest pair first, then the closest of the rest (a permutation; a
    replay stacked along new first dimensions is matched sample by sample)."""
    distance = (values.unsqueeze(-1) - arm.to(values.dtype).unsqueeze(-2)).abs()  # (..., replay, arm)
    n = values.shape[-1]
    # A pair already taken is inf; a replay's inf or nan eigenvalue is farther than any other.
    largest = torch.finfo(distance.dtype).max
    flat = torch.nan_to_num(distance, nan=largest, posinf=largest).reshape(-1, n * n)
    order = torch.empty(flat.shape[0], n, dtype=torch.long)
    rows = torch.arange(flat.shape[0])
    for _ in range(n):
        best = flat.argmin(-1)
        mine, theirs = best // n, best % n
        order[rows, theirs] = mine
        grid = flat.view(-1, n, n)
        grid[rows, mine, :] = torch.inf
        grid[rows, :, theirs] = torch.inf
    return order.reshape(distance.shape[:-2] + (n,))
