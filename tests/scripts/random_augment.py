"""A slow dataset that augments each sample with random noise from torch's global generator.
With workers, each worker draws from its own generator, so the batches differ from the
single-process run's although the samples and their order are the same: the loss check cannot
compare single steps and must compare the mean loss. Each step's own work takes as long as
reading its batch (16 ms: a sleep, as a step waits on a GPU): two workers keep up, so the workers'
search stops at four."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class NoisySlow(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        time.sleep(0.0005)
        x = torch.full((16,), (index % 97) / 97) + 0.01 * torch.randn(16)
        return x, torch.tensor((index % 7) / 7)


model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
for x, y in DataLoader(NoisySlow(), batch_size=32, shuffle=True):
    loss = (model(x).squeeze(1) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.016)
