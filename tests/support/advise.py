"""What the `@advise` tests share: a small model from one seed, its batches, a dataset that
reads slowly, and the process state an advisor must leave as it found it."""

from __future__ import annotations

import threading
import time
import typing

import torch
from torch import nn
from torch.optim.optimizer import _global_optimizer_post_hooks
from torch.utils.data import Dataset, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

# Windows of exactly `warmup` and `steps` steps (no steadiness test, no time floor): these tests
# are about what the advisor records, step by step; tests/e2e/test_gpu_speed.py times windows
EXACT: dict[str, typing.Any] = {"min_time": 0.0, "max_warmup": None}


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator))
        for _ in range(n)
    ]


def _state() -> tuple[list[str], object, bool, int]:
    """What must be as it was after the window: threads, DataLoader timing, profiler, hooks."""
    names = sorted(t.name for t in threading.enumerate())
    return (
        names,
        _BaseDataLoaderIter.__next__,
        torch.autograd.profiler._is_profiler_enabled,
        len(_global_optimizer_post_hooks),
    )


class _Slow(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, sample_s: float = 0.002) -> None:
        self.data = TensorDataset(*_batches(1)[0])
        self.sample_s = sample_s

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sample_s)
        return self.data[index]  # type: ignore[no-any-return]
