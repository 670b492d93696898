# Custom GRU cell (for a paper reimplementation) diverges from nn.GRUCell
import torch
import torch.nn as nn

torch.manual_seed(0)
I, H, B, T = 16, 32, 8, 20
cell = nn.GRUCell(I, H)

def my_gru(x, h, cell):
    gi = x @ cell.weight_ih.t() + cell.bias_ih
    gh = h @ cell.weight_hh.t() + cell.bias_hh
    i_r, i_z, i_n = gi.chunk(3, dim=1)
    h_r, h_z, h_n = gh.chunk(3, dim=1)
    r = torch.sigmoid(i_r + h_r)
    z = torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return z * n + (1 - z) * h

x = torch.randn(T, B, I)
with torch.no_grad():
    h1 = torch.zeros(B, H)
    h2 = torch.zeros(B, H)
    for t in range(T):
        h1 = cell(x[t], h1)
        h2 = my_gru(x[t], h2, cell)

print("nn.GRUCell:", h1[0, :4])
print("mine      :", h2[0, :4])
print("max abs diff:", (h1 - h2).abs().max().item())
torch.testing.assert_close(h2, h1)
