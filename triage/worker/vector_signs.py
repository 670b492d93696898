"""The signs of eigen-, singular and QR vectors: arbitrary, so taken as the arm chose them.

An eigenvector is unique only up to its sign, a pair of singular vectors up to one common
sign, a column of Q with its row of R likewise (PyTorch's documentation says so for
`linalg.eigh`, `linalg.svd` and `linalg.qr`). LAPACK in float32 and float64, or the same
LAPACK on two matrices a rounding apart, may choose differently: a float64 reference or a
simulated replay that keeps its own choice differs from the arm by a whole vector, which is
not rounding and not a bug. The recorder keeps the arm's vectors (`keep`); the float64
replay and every simulated replay negate theirs where they point away from the arm's
(`align`), so everything downstream sees the arm's convention and only the vectors' actual
error remains. General eigenvectors (complex, unique up to a phase) are left as they are.
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


def keep(name: str, out: Any) -> tuple[torch.Tensor, ...] | None:
    """The arm's vector outputs of a `SIGNED` op, as float64 CPU copies; None otherwise."""
    layout = SIGNED.get(name)
    if layout is None or not isinstance(out, (tuple, list)):
        return None
    kept = []
    for index, _ in layout:
        t = out[index] if index < len(out) else None
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0 or t.numel() > MAX_ELEMENTS:
            return None
        kept.append(t.detach().to("cpu", torch.float64))
    return tuple(kept)


def align(name: str, out: Any, arm: tuple[torch.Tensor, ...]) -> Any:
    """`out` (a replay's outputs of the op) with each vector, or pair, negated in place where it
    points away from the arm's; a replay stacked along a new first dimension broadcasts."""
    layout = SIGNED.get(name)
    if layout is None or not isinstance(out, (tuple, list)) or len(arm) != len(layout):
        return out
    parts = [out[index] if index < len(out) else None for index, _ in layout]
    if any(not isinstance(p, torch.Tensor) or p.shape[-2:] != a.shape[-2:] or p.device.type != "cpu"
           for p, a in zip(parts, arm, strict=True)):
        return out
    # The first k = min(m, n) vectors pair up; a complete factorization's others span the
    # complement in a basis of the kernel's choosing, which no sign makes the arm's.
    k = min(min(p.shape[-1] if not rows else p.shape[-2] for p, (_, rows) in zip(parts, layout, strict=True)),
            min(a.shape[-1] if not rows else a.shape[-2] for a, (_, rows) in zip(arm, layout, strict=True)))

    def leading(t: torch.Tensor, rows: bool) -> torch.Tensor:
        return t[..., :k, :] if rows else t[..., :k]

    # R's rows follow Q's columns: for QR only Q decides.
    deciding = 1 if name == "linalg_qr" else len(layout)
    dots = sum((leading(p, rows) * leading(a, rows)).sum(-1 if rows else -2) for p, a, (_, rows) in
               zip(parts[:deciding], arm[:deciding], layout[:deciding], strict=True))
    signs = torch.where(dots < 0, -1.0, 1.0).to(parts[0].dtype)
    for p, (_, rows) in zip(parts, layout, strict=True):
        leading(p, rows).mul_(signs.unsqueeze(-1) if rows else signs.unsqueeze(-2))
    return out
