"""Input that gets faster by itself: each batch's read takes `8 * latency * (1 - t / 2T)` for
the first T seconds since its first read (a cache warming up), then half that; reads are
serialised by one lock shared with the DataLoader's workers (one disk head), so more workers
cannot read in parallel, and a read takes far longer than the step's compute, so overlapping
the two gains little. A later window is faster whatever its setting: trainadvisor must not
credit that to a fix.

A batch is read whole under the lock (the dataset serves batches, `batch_size=None`): read a
sample at a time, 8 workers handed the lock on 8 times a step, and beside a busy core each
hand-on waited for the next worker to be scheduled; a test run under -n measured the 8 workers'
window 1.03x the first where the cache had warmed by more (15.9 against 15.4 steps/s)."""

import argparse
import multiprocessing
import time

import torch
from torch.utils.data import DataLoader, Dataset

DISK = multiprocessing.Lock()  # inherited by forked workers
# when the first batch was read, shared with forked workers: counted from the script's start, a
# run whose start-up took longer than T beside a busy core measured a cache already warm
FIRST_READ = multiprocessing.RawValue("d", 0.0)
BATCH = 8


class Warming(Dataset):
    def __init__(self, latency_ms: float, warm_s: float) -> None:
        self.latency_s, self.warm_s = latency_ms / 1e3, warm_s

    def __len__(self) -> int:
        return 125_000

    def __getitem__(self, index: int):
        with DISK:
            FIRST_READ.value = FIRST_READ.value or time.time()
            elapsed = time.time() - FIRST_READ.value
            time.sleep(BATCH * self.latency_s * (1.0 - 0.5 * min(1.0, elapsed / self.warm_s)))
        samples = torch.arange(index * BATCH, (index + 1) * BATCH)
        return (samples % 13 / 13.0).unsqueeze(1).expand(BATCH, 8).clone(), (samples % 3).float()


parser = argparse.ArgumentParser()
parser.add_argument("--latency-ms", type=float, default=8.0, help="a sample's read, cold")
parser.add_argument("--warm-s", type=float, default=10.0)
args = parser.parse_args()
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Warming(args.latency_ms, args.warm_s), batch_size=None, shuffle=True):
    loss = (model(x).squeeze(1) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
