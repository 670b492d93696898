# depthwise conv (groups=C) differs from my shifted-sum implementation
import torch
import torch.nn.functional as F
torch.manual_seed(0)

C, K = 24, 5
x = torch.randn(2, C, 32, 32)
w = torch.randn(C, 1, K, K)

dw = F.conv2d(x, w, padding=2, groups=C)

xp = F.pad(x, (2, 2, 2, 2))
mine = torch.zeros_like(dw)
for i in range(K):
    for j in range(K):
        mine += xp[:, :, i:i + 32, j:j + 32] * w[:, 0, i, j].view(1, C, 1, 1)

print("depthwise  :", dw[0, 3, 5, :4])
print("shifted-sum:", mine[0, 3, 5, :4])
print("max abs diff:", (dw - mine).abs().max().item())
print("equal:", torch.equal(dw, mine))
