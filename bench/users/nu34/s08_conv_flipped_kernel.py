# F.conv2d gives wrong result vs textbook 2D convolution (Gaussian-derivative filter)
import torch
import torch.nn.functional as F
torch.manual_seed(0)

img = torch.rand(1, 1, 32, 32)
# asymmetric kernel: horizontal derivative of a Gaussian
g = torch.exp(-torch.arange(-2, 3, dtype=torch.float32) ** 2 / 2)
k = (g.view(5, 1) * (torch.arange(-2, 3, dtype=torch.float32) * g).view(1, 5))
k = (k / k.abs().sum()).view(1, 1, 5, 5)

ref = F.conv2d(img, k, padding=2)

# textbook convolution: out[i,j] = sum_{u,v} img[i-u, j-v] * k[u, v]
xp = F.pad(img, (2, 2, 2, 2))
mine = torch.zeros_like(ref)
for u in range(5):
    for v in range(5):
        mine += xp[:, :, u:u + 32, v:v + 32] * k[0, 0, 4 - u, 4 - v]

print("F.conv2d :", ref[0, 0, 10, :4])
print("textbook :", mine[0, 0, 10, :4])
print("max abs diff:", (ref - mine).abs().max().item())
torch.testing.assert_close(ref, mine)
