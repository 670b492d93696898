# Bug report: F.conv2d does not match my im2col (unfold + matmul) implementation
import torch
import torch.nn.functional as F
torch.manual_seed(0)

x = torch.randn(2, 8, 16, 16)
w = torch.randn(12, 8, 3, 3)
b = torch.randn(12)

ref = F.conv2d(x, w, b, padding=1)

cols = F.unfold(x, kernel_size=3, padding=1)            # (N, C*9, L)
out = (w.view(12, -1) @ cols) + b.view(1, -1, 1)         # (N, 12, L)
mine = out.view(2, 12, 16, 16)

print("conv2d[0,0,0,:4]:", ref[0, 0, 0, :4])
print("im2col[0,0,0,:4]:", mine[0, 0, 0, :4])
print("max abs diff:", (ref - mine).abs().max().item())
print("bitwise equal:", torch.equal(ref, mine))
