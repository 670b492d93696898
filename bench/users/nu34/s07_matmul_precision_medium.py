# After set_float32_matmul_precision("medium") my im2col conv no longer matches conv2d
import torch
import torch.nn.functional as F
torch.manual_seed(0)

torch.set_float32_matmul_precision("medium")

x = torch.randn(4, 64, 16, 16)
w = torch.randn(128, 64, 3, 3) / 24.0

ref = F.conv2d(x, w, padding=1)
cols = F.unfold(x, kernel_size=3, padding=1)          # (4, 576, 256)
mine = torch.matmul(w.view(128, -1), cols).view(4, 128, 16, 16)

print("conv2d :", ref[0, 0, 0, :4])
print("im2col :", mine[0, 0, 0, :4])
print("max abs diff:", (ref - mine).abs().max().item())
torch.testing.assert_close(mine, ref)
