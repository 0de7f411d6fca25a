"""Trains a few steps, then fails inside the profiled window (trainadvisor's tests use
--warmup 2 --steps 10, so 3 window steps are measured before the error)."""

import torch

model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    if step == 5:
        raise RuntimeError(f"boom at step {step}")
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
