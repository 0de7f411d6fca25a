"""A loop pinned to the first core, as a launcher that binds a process to a core (taskset,
numactl) leaves it, with its DataLoader workers bound to the other cores (`worker_init_fn`).
Each sample costs 1 ms of CPU, under one lock shared with the workers (one decoder), so more
workers cannot read in parallel: on a quiet machine no DataLoader setting makes this loop
faster. Beside a process busy on the first core, the loop's own reads share that core and the
workers' do not: the workers then gain, from the load alone. trainadvisor must not keep a fix a
quiet machine would not keep (issue 36)."""

import multiprocessing
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

FIRST_CORE = min(os.sched_getaffinity(0))
OTHER_CORES = (os.sched_getaffinity(0) - {FIRST_CORE}) or {FIRST_CORE}
os.sched_setaffinity(0, {FIRST_CORE})
DECODER = multiprocessing.Lock()  # inherited by forked workers


class Decoded(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int):
        with DECODER:
            end = time.thread_time() + 0.001  # 1 ms of this thread's CPU
            while time.thread_time() < end:
                pass
        return torch.full((8,), (index % 13) / 13.0), torch.tensor(float(index % 3))


def unpinned(worker_id: int) -> None:
    os.sched_setaffinity(0, OTHER_CORES)


model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Decoded(), batch_size=8, shuffle=True, worker_init_fn=unpinned):
    loss = (model(x).squeeze(1) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
