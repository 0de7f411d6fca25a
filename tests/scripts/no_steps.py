"""Runs a model but never steps an optimizer nor calls trainadvisor.step()."""

import torch

model = torch.nn.Linear(8, 1)
with torch.no_grad():
    for _ in range(10):
        model(torch.randn(4, 8))
print("evaluated 10 batches")
