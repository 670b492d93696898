# conv_transpose2d vs "zero-insertion upsample + conv2d with flipped kernel" differ
import torch
import torch.nn.functional as F
torch.manual_seed(0)

x = torch.randn(2, 6, 8, 8)
w = torch.randn(6, 4, 3, 3)          # (in, out, kH, kW) for conv_transpose2d

ref = F.conv_transpose2d(x, w, stride=2)            # (2, 4, 17, 17)

# zero insertion: stride-2 upsample
up = torch.zeros(2, 6, 15, 15)
up[:, :, ::2, ::2] = x
# conv with spatially flipped, in/out swapped kernel, full padding
wk = w.flip(-1, -2).transpose(0, 1)                 # (4, 6, 3, 3)
mine = F.conv2d(up, wk, padding=2)                  # (2, 4, 17, 17)

print("conv_transpose2d:", ref[0, 0, 4, :4])
print("zero-insert conv:", mine[0, 0, 4, :4])
print("max abs diff:", (ref - mine).abs().max().item())
print("equal:", torch.equal(ref, mine))
