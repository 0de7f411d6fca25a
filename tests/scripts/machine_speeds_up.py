"""A machine that speeds up between runs: every read of a sample takes twice as long in the first
run of this script (counted in the file `--launches` names) as in any later one, as when another
job kept the machine busy while the baseline was measured and then stopped. Reads are serialised
by one lock shared with the DataLoader's workers (one disk head), so more workers cannot read in
parallel: no DataLoader setting makes this loop faster on a steady machine. trainadvisor must not
keep a fix whose fresh runs only met the faster machine (issue 36)."""

import argparse
import multiprocessing
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

DISK = multiprocessing.Lock()  # inherited by forked workers


class Reads(Dataset):
    def __init__(self, latency_ms: float) -> None:
        self.latency_s = latency_ms / 1e3

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int):
        with DISK:
            time.sleep(self.latency_s)
        return torch.full((8,), (index % 13) / 13.0), torch.tensor(float(index % 3))


parser = argparse.ArgumentParser()
parser.add_argument("--latency-ms", type=float, default=2.0)
parser.add_argument("--launches", required=True, help="a file that counts this script's runs")
args = parser.parse_args()
with open(args.launches, "a") as counter:
    counter.write(f"{os.getpid()}\n")
with open(args.launches) as counter:
    first = len(counter.read().split()) == 1
latency_ms = 2 * args.latency_ms if first else args.latency_ms
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Reads(latency_ms), batch_size=8, shuffle=True):
    loss = (model(x).squeeze(1) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
