# my im2col "same" convolution disagrees with F.conv2d(padding=1)
import torch
import torch.nn.functional as F
torch.manual_seed(0)

x = torch.randn(1, 3, 20, 20)
w = torch.randn(8, 3, 3, 3)

ref = F.conv2d(x, w, padding=1)

# pad so that output has the same size as input
xp = F.pad(x, (0, 2, 0, 2))                     # left, right, top, bottom
cols = F.unfold(xp, kernel_size=3)              # (1, 27, 400)
mine = (w.view(8, -1) @ cols).view(1, 8, 20, 20)

print("conv2d:", ref[0, 0, 5, :4])
print("im2col:", mine[0, 0, 5, :4])
print("max abs diff:", (ref - mine).abs().max().item())
torch.testing.assert_close(mine, ref)
