"""A loop without torch.optim that marks its steps with trainadvisor.step()."""

import sys

import torch

import trainadvisor

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
weight = torch.zeros(8, requires_grad=True)
target = torch.arange(8.0)
for _ in range(steps):
    loss = (weight - target).pow(2).sum()
    loss.backward()
    with torch.no_grad():
        weight -= 0.05 * weight.grad
        weight.grad.zero_()
    trainadvisor.step()
print(f"final loss {loss.item():.4f}")
