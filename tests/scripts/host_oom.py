"""Trains three steps, then dies of host out-of-memory: one tensor larger than any address space,
which torch's CPU allocator refuses whatever the machine's overcommit setting."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(256, 256)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(100):
    loss = model(torch.randn(32, 256)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 2:
        buffer = torch.empty(2**62, dtype=torch.uint8)
