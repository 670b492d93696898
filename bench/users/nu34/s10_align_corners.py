# grid_sample with identity affine_grid does not reproduce F.interpolate bilinear resize
import torch
import torch.nn.functional as F
torch.manual_seed(0)

x = torch.rand(1, 3, 12, 12)
out_size = (1, 3, 25, 25)

resized = F.interpolate(x, size=(25, 25), mode="bilinear", align_corners=True)

theta = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
grid = F.affine_grid(theta, out_size, align_corners=False)
sampled = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)

print("interpolate:", resized[0, 0, 0, :4])
print("grid_sample:", sampled[0, 0, 0, :4])
print("max abs diff:", (resized - sampled).abs().max().item())
torch.testing.assert_close(sampled, resized)
