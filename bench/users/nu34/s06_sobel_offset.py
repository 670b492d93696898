# Sobel edges on a bright image: float32 result is way off from float64
import torch
import torch.nn.functional as F
torch.manual_seed(0)

# a very bright, almost flat image (e.g. raw sensor counts)
img = 4000.0 + 1e-3 * torch.randn(1, 1, 64, 64)

sobel_x = torch.tensor([[-1., 0., 1.],
                        [-2., 0., 2.],
                        [-1., 0., 1.]]).view(1, 1, 3, 3)

gx32 = F.conv2d(img, sobel_x, padding=0)
gx64 = F.conv2d(img.double(), sobel_x.double(), padding=0)

print("float32:", gx32[0, 0, 0, :4])
print("float64:", gx64[0, 0, 0, :4])
rel = ((gx32.double() - gx64).abs().max() / gx64.abs().max()).item()
print("max rel diff:", rel)
