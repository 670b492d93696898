# My attention doesn't match F.scaled_dot_product_attention - is SDPA broken?
import torch
import torch.nn.functional as F

torch.manual_seed(0)
B, H, L, D = 2, 4, 16, 64
q = torch.randn(B, H, L, D)
k = torch.randn(B, H, L, D)
v = torch.randn(B, H, L, D)

def my_attention(q, k, v):
    scores = q @ k.transpose(-2, -1)
    attn = torch.softmax(scores, dim=-1)
    return attn @ v

ref = F.scaled_dot_product_attention(q, k, v)
mine = my_attention(q, k, v)
print("sdpa:", ref[0, 0, 0, :4])
print("mine:", mine[0, 0, 0, :4])
print("max abs diff:", (ref - mine).abs().max().item())
torch.testing.assert_close(mine, ref)
