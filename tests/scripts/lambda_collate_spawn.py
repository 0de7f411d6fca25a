"""A slow map-style dataset whose DataLoader uses a lambda collate_fn, in a program that uses the
'spawn' start method (as on macOS and Windows, or for CUDA in workers): worker processes would
need the lambda pickled, which is impossible, so trainadvisor must refuse the dataloader-workers
fix and say why."""

import multiprocessing
import time

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import default_collate


class Slow(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        time.sleep(0.0005)
        return torch.full((16,), (index % 97) / 97), torch.tensor((index % 7) / 7)


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    loader = DataLoader(Slow(), batch_size=32, collate_fn=lambda batch: default_collate(batch))
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        loss = (model(x).squeeze(1) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
