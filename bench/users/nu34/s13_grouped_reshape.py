# grouped conv (groups=4) doesn't match running 4 separate convs
import torch
import torch.nn.functional as F
torch.manual_seed(0)

G, Cin, Cout = 4, 16, 8
x = torch.randn(2, Cin, 12, 12)
w = torch.randn(Cout, Cin // G, 3, 3)

ref = F.conv2d(x, w, padding=1, groups=G)

outs = []
for gi in range(G):
    xg = x[:, gi::G]                                  # channels of group gi
    wg = w[gi * (Cout // G):(gi + 1) * (Cout // G)]
    outs.append(F.conv2d(xg, wg, padding=1))
mine = torch.cat(outs, dim=1)

print("groups=4 :", ref[0, 0, 0, :4])
print("per-group:", mine[0, 0, 0, :4])
print("max abs diff:", (ref - mine).abs().max().item())
torch.testing.assert_close(mine, ref)
