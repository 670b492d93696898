# BatchNorm2d: eval output != train output on the same batch even with momentum=1
import torch
import torch.nn as nn
torch.manual_seed(0)

bn = nn.BatchNorm2d(8, momentum=1.0, affine=False)
x = torch.randn(4, 8, 6, 6) * 3 + 1

bn.train()
y_train = bn(x)          # momentum=1 => running stats become exactly this batch's stats

bn.eval()
y_eval = bn(x)

print("train:", y_train[0, 0, 0, :4])
print("eval :", y_eval[0, 0, 0, :4])
print("max abs diff:", (y_train - y_eval).abs().max().item())
torch.testing.assert_close(y_eval, y_train)
