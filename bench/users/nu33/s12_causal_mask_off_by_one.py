# is_causal=True in SDPA gives different outputs from my causal mask
import math
import torch
import torch.nn.functional as F

torch.manual_seed(0)
B, H, L, D = 1, 4, 32, 16
q = torch.randn(B, H, L, D)
k = torch.randn(B, H, L, D)
v = torch.randn(B, H, L, D)

out_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)

scores = q @ k.transpose(-2, -1) / math.sqrt(D)
future = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=2)   # block future tokens
scores = scores.masked_fill(future, float("-inf"))
out_manual = torch.softmax(scores, dim=-1) @ v

print("sdpa  :", out_sdpa[0, 0, 3, :4])
print("manual:", out_manual[0, 0, 3, :4])
print("max abs diff:", (out_sdpa - out_manual).abs().max().item())
torch.testing.assert_close(out_manual, out_sdpa)
