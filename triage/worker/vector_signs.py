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


def signs(name: str, outputs: Any, reference: tuple[torch.Tensor, ...]) -> dict[int, torch.Tensor] | None:
    """The ±1 factors (float64, CPU) that turn each vector, or pair, of a `SIGNED` op's
    `outputs` toward `reference`'s (its vector outputs in `SIGNED` order: the arm's, or an
    independent answer's), by output index and shaped to broadcast against that output: 1
    beyond the first min(m, n) vectors. A stack of replays along a new first dimension gets
    one factor per replay. None where the outputs do not have the reference's shapes."""
    layout = SIGNED.get(name)
    if layout is None or not isinstance(outputs, (tuple, list)) or len(reference) != len(layout):
        return None
    parts = [outputs[index] if index < len(outputs) else None for index, _ in layout]
    if any(not isinstance(p, torch.Tensor) or p.shape[-2:] != r.shape[-2:]
           for p, r in zip(parts, reference, strict=True)):
        return None
    parts = [p.detach().to("cpu", torch.float64) for p in parts]
    # The first k = min(m, n) vectors pair up; a complete factorization's others span the
    # complement in a basis of the kernel's choosing, which no sign makes the reference's.
    k = min(min(t.shape[-2] if rows else t.shape[-1] for t, (_, rows) in zip(parts, layout, strict=True)),
            min(t.shape[-2] if rows else t.shape[-1] for t, (_, rows) in zip(reference, layout, strict=True)))

    def leading(t: torch.Tensor, rows: bool) -> torch.Tensor:
        return t[..., :k, :] if rows else t[..., :k]

    # R's rows follow Q's columns: for QR only Q decides.
    deciding = 1 if name == "linalg_qr" else len(layout)
    dots = sum((leading(p, rows) * leading(r, rows)).sum(-1 if rows else -2) for p, r, (_, rows) in
               zip(parts[:deciding], reference[:deciding], layout[:deciding], strict=True))
    sign = torch.where(dots < 0, -1.0, 1.0).to(torch.float64)
    factors = {}
    for p, (index, rows) in zip(parts, layout, strict=True):
        count = p.shape[-2] if rows else p.shape[-1]
        padded = torch.cat([sign, sign.new_ones(sign.shape[:-1] + (count - k,))], -1) if count > k else sign
        factors[index] = padded.unsqueeze(-1) if rows else padded.unsqueeze(-2)
    return factors


def align(name: str, out: Any, arm: tuple[torch.Tensor, ...]) -> Any:
    """`out` (a replay's outputs of the op, on the CPU) with each vector, or pair, negated in
    place where it points away from the arm's (`signs`)."""
    factors = signs(name, out, arm)
    if factors is None or any(out[index].device.type != "cpu" for index in factors):
        return out
    for index, factor in factors.items():
        out[index].mul_(factor)
    return out
