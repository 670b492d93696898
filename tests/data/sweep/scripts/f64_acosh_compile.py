# fixtures/compile_acosh.py in float64: inductor lowers acosh as log(x + sqrt(x*x - 1)) in
# float64 too, so x*x overflows for x > 1.3e154 and the compiled value is inf where eager is
# finite. Same op and verdict as the float32 case, another dtype: the sweep report shows the
# two as near matches, never as one bucket.
import torch


def fn(x):
    return torch.acosh(x)


x = torch.tensor([5e200, 9e250, 7e170, 2.0], dtype=torch.float64)
print(fn(x), torch.compile(fn)(x))
