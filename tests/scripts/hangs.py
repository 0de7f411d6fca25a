"""Trains a few steps, then waits forever inside `wait_for_peer` (as a collective or a
deadlocked worker would): for the stall watchdog."""

import threading

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def wait_for_peer() -> None:
    threading.Event().wait()  # never set


for step in range(1000):
    if step == 8:
        wait_for_peer()
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
