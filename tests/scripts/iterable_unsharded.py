"""An IterableDataset that ignores torch.utils.data.get_worker_info(): with N workers every
worker yields the same samples, so the batches repeat N times. Loading is slow (sleep per
sample), so trainadvisor finds a data stall, tries workers, sees the repeated batches and must
refuse the fix."""

import time

import torch
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    def __iter__(self):
        for index in range(100_000):
            time.sleep(0.0005)
            yield torch.full((16,), (index % 97) / 97), torch.tensor((index % 7) / 7)


model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Stream(), batch_size=32):
    loss = (model(x).squeeze(1) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
