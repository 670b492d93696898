# Bug report: SDPA returns zeros for a fully-masked query row, but my reference
# implementation returns NaN. Which one is right?
import torch
import torch.nn.functional as F

torch.manual_seed(0)
B, H, L, D = 2, 4, 6, 16
q = torch.randn(B, H, L, D)
k = torch.randn(B, H, L, D)
v = torch.randn(B, H, L, D)

# key padding: batch 1 has all keys padded for the first query row (bool mask, True = attend)
attn_mask = torch.ones(B, 1, L, L, dtype=torch.bool)
attn_mask[1, :, 0, :] = False

out_sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)

scores = q @ k.transpose(-2, -1) / D ** 0.5
scores = scores.masked_fill(~attn_mask, float("-inf"))
out_ref = torch.softmax(scores, dim=-1) @ v

print("sdpa row:", out_sdpa[1, 0, 0, :4])
print("ref  row:", out_ref[1, 0, 0, :4])
print("max abs diff:", (out_sdpa - out_ref).abs().max().item())
torch.testing.assert_close(out_sdpa, out_ref)
