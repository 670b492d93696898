# nn.LSTM and a hand-written loop with nn.LSTMCell (same weights) drift apart over a long sequence
import torch
import torch.nn as nn

torch.manual_seed(0)
T, B, I, H = 500, 4, 32, 64
lstm = nn.LSTM(I, H)
cell = nn.LSTMCell(I, H)
with torch.no_grad():
    cell.weight_ih.copy_(lstm.weight_ih_l0)
    cell.weight_hh.copy_(lstm.weight_hh_l0)
    cell.bias_ih.copy_(lstm.bias_ih_l0)
    cell.bias_hh.copy_(lstm.bias_hh_l0)

x = torch.randn(T, B, I)
with torch.no_grad():
    out, (h_n, c_n) = lstm(x)
    h = torch.zeros(B, H)
    c = torch.zeros(B, H)
    for t in range(T):
        h, c = cell(x[t], (h, c))

print("nn.LSTM   h_T[0,:4]:", h_n[0, 0, :4])
print("LSTMCell  h_T[0,:4]:", h[0, :4])
print("max abs diff:", (h_n[0] - h).abs().max().item())
print("bitwise equal:", torch.equal(h_n[0], h))
