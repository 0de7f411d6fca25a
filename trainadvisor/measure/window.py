"""What every measuring window does when it ends, in profile's child and in `@advise` alike (the
seed of the one window issue 12 asks for): the losses read back, the GPU's step times put on the
records, the optimizer and CUDA memory facts added to the runtime facts."""

from __future__ import annotations

from typing import Any

import torch

from trainadvisor.measure import gpu
from trainadvisor.records import StepRecord


def close_window(
    records: list[StepRecord],
    losses: list[torch.Tensor | None],
    gpu_window: gpu.GpuWindow,
    runtime: dict[str, Any],
    optimizer: torch.optim.Optimizer | None,
    optimizers: int,
) -> list[float | None]:
    """The losses as numbers (one host sync for all steps, after the window: the loop itself
    never waited for them); `records` gain their CUDA-event times and `runtime` the optimizer's
    facts, the number of optimizers that stepped and the window's CUDA memory statistics."""
    values = [float(loss.float().item()) if loss is not None else None for loss in losses]
    for record, gpu_ms in zip(records, gpu_window.step_ms()):
        record.gpu_ms = gpu_ms
    runtime.update(gpu.optimizer_facts(optimizer))
    runtime["optimizers"] = optimizers
    if runtime.get("cuda_used"):
        runtime["cuda_memory"] = gpu_window.memory()
    return values
