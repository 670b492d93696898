# channels_last conv gives different numbers than contiguous conv
import torch
import torch.nn as nn
torch.manual_seed(0)

conv = nn.Conv2d(16, 32, kernel_size=3, padding=1)
x = torch.randn(4, 16, 28, 28)

with torch.no_grad():
    y_cont = conv(x)
    conv_cl = conv.to(memory_format=torch.channels_last)
    y_cl = conv_cl(x.to(memory_format=torch.channels_last))

print("contiguous   :", y_cont[0, 0, 0, :4])
print("channels_last:", y_cl[0, 0, 0, :4])
print("max abs diff:", (y_cont - y_cl).abs().max().item())
print("equal:", torch.equal(y_cont, y_cl.contiguous()))
