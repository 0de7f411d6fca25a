"""Trains a tiny model, writing one line per step to a log file it never closes or flushes (held
by its globals, which its function refers to: a reference cycle), and registers an exit handler
of its own. Stopped after its window, the script must end as it would by itself: the handler
run, every line written."""

import argparse
import atexit
from pathlib import Path

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--out-dir", type=Path, required=True)
args = parser.parse_args()
log = open(args.out_dir / "steps.log", "w")  # noqa: SIM115 - left open on purpose
atexit.register(lambda: (args.out_dir / "exit_handler.txt").write_text("ran\n"))
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(step: int) -> None:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    log.write(f"step {step}\n")


for step in range(100_000):
    train_step(step)
