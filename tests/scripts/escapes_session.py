"""Starts a process in a session of its own (setsid: out of the script's process group, as a
daemonising helper does) that writes its pid to the file the first argument names and sleeps
ten minutes; then trains --steps steps (0: sleeps instead, as a slow start-up would)."""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

ESCAPEE = (
    "import os, sys, time; from pathlib import Path; written = Path(sys.argv[1]); "
    "partial = written.with_name(written.name + '.tmp'); partial.write_text(str(os.getpid())); "
    "partial.replace(written); time.sleep(600)"
)

parser = argparse.ArgumentParser()
parser.add_argument("pid_file", type=Path)
parser.add_argument("--steps", type=int, default=0)
args = parser.parse_args()
subprocess.Popen([sys.executable, "-c", ESCAPEE, str(args.pid_file)], start_new_session=True)
while not args.pid_file.exists():
    time.sleep(0.01)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if not args.steps:
    time.sleep(600)
