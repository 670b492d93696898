# Passing my key padding mask to SDPA gives different results than my manual masked attention
import math
import torch
import torch.nn.functional as F

torch.manual_seed(0)
B, H, L, D = 2, 4, 10, 16
q = torch.randn(B, H, L, D)
k = torch.randn(B, H, L, D)
v = torch.randn(B, H, L, D)
lengths = torch.tensor([10, 7])
# True where the key is padding
pad = torch.arange(L)[None, :] >= lengths[:, None]          # (B, L)
mask = pad[:, None, None, :]                                 # (B, 1, 1, L)

# manual: fill padded keys with -inf
scores = q @ k.transpose(-2, -1) / math.sqrt(D)
scores = scores.masked_fill(mask, float("-inf"))
manual = torch.softmax(scores, dim=-1) @ v

# SDPA with the same mask
fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

print("manual:", manual[1, 0, 0, :4])
print("sdpa  :", fused[1, 0, 0, :4])
print("max abs diff:", (manual - fused).abs().max().item())
torch.testing.assert_close(fused, manual)
