"""A DataLoader built anew at the start of every epoch (a common pattern when the dataset or
its sampler changes per epoch), with slow samples: trial windows in one process cannot switch
a loader that is rebuilt, so the workers' trials restart the script."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, index: int):
        time.sleep(0.001)
        return torch.full((8,), (index % 11) / 11.0), torch.tensor(float(index % 2))


model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _epoch in range(200):
    loader = DataLoader(Slow(), batch_size=16, shuffle=True)
    for x, y in loader:
        loss = (model(x).squeeze(1) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
