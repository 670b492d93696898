# LSTM final hidden state differs between packed and padded batches
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence

torch.manual_seed(0)
B, T, I, H = 3, 12, 8, 16
lstm = nn.LSTM(I, H, batch_first=True)
lengths = torch.tensor([12, 9, 5])
x = torch.randn(B, T, I)
for b, n in enumerate(lengths):
    x[b, n:] = 0.0                       # zero padding

with torch.no_grad():
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=True)
    _, (h_packed, _) = lstm(packed)
    out_padded, _ = lstm(x)
    h_padded = out_padded[:, -1, :]          # last time step of each sequence

print("packed h_n:", h_packed[0, 1, :4])
print("padded    :", h_padded[1, :4])
print("max abs diff:", (h_packed[0] - h_padded).abs().max().item())
torch.testing.assert_close(h_padded, h_packed[0])
