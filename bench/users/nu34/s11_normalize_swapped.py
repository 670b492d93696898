# my fused preprocessing (conv 1x1) does not match ImageNet normalization
import torch
import torch.nn.functional as F
torch.manual_seed(0)

MEAN = torch.tensor([0.485, 0.456, 0.406])
STD = torch.tensor([0.229, 0.224, 0.225])

img = torch.rand(2, 3, 32, 32)

# reference: the usual (x - mean) / std
ref = (img - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)

# folded into a 1x1 depthwise conv: y = x * (1/std) + (-mean/std)
scale = 1.0 / MEAN
bias = -STD / MEAN
mine = F.conv2d(img, scale.view(3, 1, 1, 1), bias, groups=3)

print("reference:", ref[0, :, 0, 0])
print("folded   :", mine[0, :, 0, 0])
print("max abs diff:", (ref - mine).abs().max().item())
torch.testing.assert_close(mine, ref)
