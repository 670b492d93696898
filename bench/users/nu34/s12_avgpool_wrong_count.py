# avg_pool2d(3x3) disagrees with my manual box filter
import torch
import torch.nn.functional as F
torch.manual_seed(0)

x = torch.rand(2, 4, 18, 18)

ref = F.avg_pool2d(x, kernel_size=3, stride=3)

windows = x.unfold(2, 3, 3).unfold(3, 3, 3)     # (2, 4, 6, 6, 3, 3)
mine = windows.sum(dim=(-1, -2)) / 8             # average of the 3x3 window

print("avg_pool2d:", ref[0, 0, 0, :4])
print("manual    :", mine[0, 0, 0, :4])
print("max abs diff:", (ref - mine).abs().max().item())
torch.testing.assert_close(mine, ref)
