"""A training loop that times its own steps (used by benchmarks/overhead.py).

Writes, as JSON to --out when it ends, the wall time and the main thread's CPU time of every
step, in seconds. It runs torch on
one thread: on a 2-core machine two intra-op threads make step times swing by +-20% from run to
run whenever anything else wakes up, which would drown the overhead being measured."""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--out", required=True)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
durations, cpu_times, step = [], [], 0
last, last_cpu = time.perf_counter(), time.thread_time()
while step < args.steps:
    for x, y in DataLoader(data, batch_size=64, shuffle=True):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        now, now_cpu = time.perf_counter(), time.thread_time()
        durations.append(now - last)
        cpu_times.append(now_cpu - last_cpu)
        last, last_cpu = now, now_cpu
        step += 1
        if step == args.steps:
            break
with open(args.out, "w") as f:
    json.dump({"wall_s": durations, "cpu_s": cpu_times}, f)
