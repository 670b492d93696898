# nn.MultiheadAttention under CPU autocast(bfloat16) vs float32 - is this much error normal?
import torch
import torch.nn as nn

torch.manual_seed(0)
E, Hh, L, B = 64, 4, 32, 2
mha = nn.MultiheadAttention(E, Hh, batch_first=True).eval()
x = torch.randn(B, L, E)

with torch.no_grad():
    ref, _ = mha(x, x, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = mha(x, x, x)

print("fp32 :", ref[0, 0, :4])
print("bf16 :", out.float()[0, 0, :4])
print("max abs diff:", (out.float() - ref).abs().max().item())
torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=1.6e-2)
print("within bf16 tolerance")
