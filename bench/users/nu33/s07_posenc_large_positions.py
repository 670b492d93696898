# Sinusoidal positional encodings: float32 and float64 disagree a lot at long positions
import math
import torch

torch.manual_seed(0)
d_model = 64
positions = torch.arange(100000, 100064)

def sinusoidal(pos, d, dtype):
    pos = pos.to(dtype).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2, dtype=dtype) * (-math.log(10000.0) / d))
    pe = torch.zeros(pos.shape[0], d, dtype=dtype)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe

pe32 = sinusoidal(positions, d_model, torch.float32)
pe64 = sinusoidal(positions, d_model, torch.float64)
print("fp32:", pe32[0, :4])
print("fp64:", pe64[0, :4])
print("max abs diff:", (pe32.double() - pe64).abs().max().item())
