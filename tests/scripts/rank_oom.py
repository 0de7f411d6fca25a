"""Under torchrun: DDP on gloo trains a few steps, then rank 1 alone dies of host out-of-memory
(a tensor larger than any address space, which torch's CPU allocator refuses)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(64, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(100):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 4 and dist.get_rank() == 1:
        buffer = torch.empty(2**62, dtype=torch.uint8)
dist.destroy_process_group()
