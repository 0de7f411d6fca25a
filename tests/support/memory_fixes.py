"""What these tests share: e2e/test_memory_fixes.py, unit/fixes/test_memory_fixes.py,
unit/fixes/test_optimizer_foreach.py."""

from __future__ import annotations

from typing import Any

import torch
from conftest import ROOT

from trainadvisor.memory.step import StepMemory

EXAMPLE = ROOT / "examples" / "deep_blocks.py"


def train_counting_the_last(
    net: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, steps: int = 3
) -> tuple[dict[str, Any], list[float]]:
    """`steps` steps of MSE training, the last one's memory measured: its facts, and the losses."""
    losses, memory = [], StepMemory()
    for i in range(steps):
        memory = StepMemory()
        if i == steps - 1:
            memory.start(optimizer, None)
        loss = torch.nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        memory.stop()
        losses.append(loss.item())
    return memory.facts(), losses
