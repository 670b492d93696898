# A pre-LN transformer block run in float16 on CPU vs float32: how big a difference is OK?
import torch
import torch.nn as nn

torch.manual_seed(0)
E, L, B = 64, 16, 2

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(E)
        self.attn = nn.MultiheadAttention(E, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(E)
        self.ff = nn.Sequential(nn.Linear(E, 4 * E), nn.GELU(), nn.Linear(4 * E, E))
    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.ff(self.ln2(x))

blk = Block().eval()
x = torch.randn(B, L, E)
with torch.no_grad():
    y32 = blk(x)
    y16 = blk.half()(x.half())

print("fp32:", y32[0, 0, :4])
print("fp16:", y16.float()[0, 0, :4])
print("max abs diff:", (y16.float() - y32).abs().max().item())
torch.testing.assert_close(y16.float(), y32, atol=1e-2, rtol=1e-2)
