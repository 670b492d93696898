"""Kernels with no float64 implementation, written as the aten ops they compute.

oneDNN's kernels take float32 and bfloat16 only, so a recorded call of one cannot be replayed
in float64 as it is: `nn.LSTM` on the CPU is `aten.mkldnn_rnn_layer`, once per layer and
direction. Here each is the computation its documentation defines, op by op, so that the
float64 reference replays the exact function and the rounding simulation rounds each step
(a 500-step LSTM was left unjudged, and a packed-against-padded comparison whose two sides
compute different things was `inconclusive` for want of a spread).
"""
from __future__ import annotations

from typing import Any

import torch

# oneDNN's RNN kinds (ideep::rnn_kind): PyTorch sends only LSTM through mkldnn_rnn_layer.
LSTM_MODE = 2


def mkldnn_lstm_layer(input: torch.Tensor, weight_ih: torch.Tensor, weight_hh: torch.Tensor,
                      bias_ih: torch.Tensor, bias_hh: torch.Tensor, hx: torch.Tensor, cx: torch.Tensor,
                      reverse: bool, batch_sizes: list[int], mode: int, hidden_size: int, num_layers: int,
                      has_biases: bool, bidirectional: bool, batch_first: bool, train: bool
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One direction of one LSTM layer (`aten.mkldnn_rnn_layer`, mode LSTM) as nn.LSTM
    defines it: gates i, f, g, o = x·W_ihᵀ + b_ih + h·W_hhᵀ + b_hh, c' = f·c + i·g,
    h' = o·tanh(c'). As the kernel, the input's product is taken for every step at once and the
    two biases are added once (oneDNN takes their sum); `reverse` walks the steps backwards
    and writes each output at its own step. The input is time-major whatever `batch_first`
    says (ATen's caller transposes it first, and the kernel reads it so: measured). Returns
    (output, h_T, c_T, an empty workspace)."""
    if mode != LSTM_MODE or batch_sizes:
        raise NotImplementedError(f"mkldnn_rnn_layer's mode {mode}{' with batch sizes' if batch_sizes else ''} "
                                  "has no replay (an LSTM without packed batch sizes has)")
    x = input  # (steps, batch, features)
    h, c = hx.reshape(x.shape[1], hidden_size), cx.reshape(x.shape[1], hidden_size)
    from_input = torch.matmul(x, weight_ih.t())
    bias = bias_ih + bias_hh if has_biases else None
    outputs: list[Any] = [None] * x.shape[0]
    for t in (reversed(range(x.shape[0])) if reverse else range(x.shape[0])):
        gates = from_input[t] + torch.mm(h, weight_hh.t())
        if bias is not None:
            gates = gates + bias
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs[t] = h
    output = torch.stack(outputs) if outputs else x.new_zeros((0, x.shape[1], hidden_size))
    return (output, h.reshape(hx.shape), c.reshape(cx.shape),
            torch.empty(0, dtype=torch.uint8, device=input.device))


# Aten ops replayed through the Python above: their kernels take no float64.
COMPOSITES = {torch.ops.aten.mkldnn_rnn_layer.default: mkldnn_lstm_layer}
