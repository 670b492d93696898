# Manual self-attention vs nn.MultiheadAttention (same in_proj/out_proj weights) disagree
import math
import torch
import torch.nn as nn

torch.manual_seed(0)
E, nh, L, B = 32, 4, 12, 2
mha = nn.MultiheadAttention(E, nh, batch_first=True, bias=True).eval()
x = torch.randn(B, L, E)

def manual_mha(x):
    W, b = mha.in_proj_weight, mha.in_proj_bias
    q, k, v = (x @ W.t() + b).chunk(3, dim=-1)
    hd = E // nh
    q = q.view(B, L, nh, hd).transpose(1, 2)
    k = k.view(B, L, nh, hd).transpose(1, 2)
    v = v.view(B, L, nh, hd).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    attn = torch.softmax(scores, dim=-2)
    o = (attn @ v).transpose(1, 2).reshape(B, L, E)
    return mha.out_proj(o)

with torch.no_grad():
    ref, _ = mha(x, x, x)
    mine = manual_mha(x)
print("nn.MHA:", ref[0, 0, :4])
print("manual:", mine[0, 0, :4])
print("max abs diff:", (ref - mine).abs().max().item())
torch.testing.assert_close(mine, ref)
