"""A loop whose step time changes by itself, as a GPU loop's does in its first seconds (the
caching allocator filling up, cuBLAS choosing its kernels, clocks ramping up): each step's work
(a sleep, so the timings do not depend on the machine's cores) takes `--slow-ms` until
`--slow-s` seconds after the first step, then `--fast-ms`. With `--swing-s` the step time never
settles: it swings between the two every `--swing-s` seconds."""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--slow-ms", type=float, default=20.0)
parser.add_argument("--fast-ms", type=float, default=1.0)
parser.add_argument("--slow-s", type=float, default=1.5)
parser.add_argument("--swing-s", type=float, default=0.0)
parser.add_argument("--steps", type=int, default=100_000)
args = parser.parse_args()

model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 8), torch.randn(16)
started = None
for _ in range(args.steps):
    now = time.monotonic()
    started = started or now
    elapsed = now - started
    if args.swing_s:
        slow = int(elapsed / args.swing_s) % 2 == 0
    else:
        slow = elapsed < args.slow_s
    time.sleep((args.slow_ms if slow else args.fast_ms) / 1e3)
    loss = (model(x).squeeze(1) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
