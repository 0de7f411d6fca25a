"""Trains --step-s long steps, then ends abruptly inside step --after: `os._exit(--code)`
(no `finally`, no atexit, no Python exit), or with --kill SIGKILL to itself, as the kernel's
out-of-memory killer would."""

import argparse
import os
import signal
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--after", type=int, required=True)
parser.add_argument("--code", type=int, default=0)
parser.add_argument("--kill", action="store_true")
parser.add_argument("--step-s", type=float, default=0.3)
args = parser.parse_args()
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100_000):
    time.sleep(args.step_s)  # the step's work (in which an out-of-memory kill would land)
    if step == args.after:
        if args.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(args.code)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
