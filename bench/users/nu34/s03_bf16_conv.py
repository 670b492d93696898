# bf16 conv2d is far from fp32 conv2d, is the bf16 kernel broken?
import torch
import torch.nn.functional as F
torch.manual_seed(0)

x = torch.randn(1, 32, 20, 20)
w = torch.randn(32, 32, 3, 3) * 0.1

y32 = F.conv2d(x, w, padding=1)
y16 = F.conv2d(x.bfloat16(), w.bfloat16(), padding=1).float()

print("fp32:", y32[0, 0, 0, :4])
print("bf16:", y16[0, 0, 0, :4])
print("max abs diff:", (y32 - y16).abs().max().item())
torch.testing.assert_close(y16, y32, rtol=1.6e-2, atol=1e-1)
print("within bf16 tolerance")
