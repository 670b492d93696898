# F.scaled_dot_product_attention(is_causal=True) vs manual causal attention: last bits differ
import math
import torch
import torch.nn.functional as F

torch.manual_seed(0)
B, H, L, D = 2, 8, 64, 32
q = torch.randn(B, H, L, D)
k = torch.randn(B, H, L, D)
v = torch.randn(B, H, L, D)

out_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)

scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)
causal = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)
scores = scores.masked_fill(causal, float("-inf"))
out_manual = torch.softmax(scores, dim=-1) @ v

print("sdpa  :", out_sdpa[0, 0, -1, :4])
print("manual:", out_manual[0, 0, -1, :4])
print("max abs diff:", (out_sdpa - out_manual).abs().max().item())
print("bitwise equal:", torch.equal(out_sdpa, out_manual))
