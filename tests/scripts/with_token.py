"""A slow-input loop that takes credentials on its command line, as training scripts do
(`--hf-token`, `--wandb-key`); it never prints them."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int):
        time.sleep(0.0005)
        return torch.full((8,), (index % 11) / 11.0), torch.tensor(float(index % 2))


parser = argparse.ArgumentParser()
parser.add_argument("--hf-token", required=True)
parser.add_argument("--wandb-key", default="")
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
for x, y in DataLoader(Slow(), batch_size=32):
    loss = (model(x).squeeze(1) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
