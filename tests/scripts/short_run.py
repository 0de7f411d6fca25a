"""A slow-input loop that stops after --max-steps optimizer steps, whatever its data: a script
that can end before trainadvisor's trial windows do. Each step's own work takes as long as reading
its batch (16 ms: a sleep, as a step waits on a GPU): two workers keep up, so the workers' search
stops there, not at the dozens of workers that reads alone would ask for. --read-ms sets each
sample's read (0.5 ms): at 20 ms a batch takes 640 ms, and 8 workers do not keep up."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int):
        time.sleep(args.read_ms / 1e3)
        return torch.full((8,), (index % 11) / 11.0), torch.tensor(float(index % 2))


parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=30)
parser.add_argument("--read-ms", type=float, default=0.5)
args = parser.parse_args()
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=32)):
    if step == args.max_steps:
        break
    loss = (model(x).squeeze(1) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.016)
