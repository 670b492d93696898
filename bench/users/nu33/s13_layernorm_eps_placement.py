# My LayerNorm (used in a custom transformer block) disagrees with nn.LayerNorm for small activations
import torch
import torch.nn as nn

torch.manual_seed(0)
E = 128
x = torch.randn(4, 16, E) * 1e-3        # small residual-stream activations
ln = nn.LayerNorm(E, eps=1e-5)

def my_layer_norm(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / (torch.sqrt(var) + eps) * weight + bias

with torch.no_grad():
    ref = ln(x)
    mine = my_layer_norm(x, ln.weight, ln.bias)
print("nn.LayerNorm:", ref[0, 0, :4])
print("mine        :", mine[0, 0, :4])
print("max abs diff:", (ref - mine).abs().max().item())
torch.testing.assert_close(mine, ref)
