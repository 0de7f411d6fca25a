"""What every fix shares: a candidate setting, and the measured facts of a trial it reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainadvisor.model import Trial

NO_GPU = "the run used no GPU, and this fix only changes GPU work"


@dataclass
class Setting:
    """One candidate: what it is in words, and the overrides a run applies for it."""

    label: str
    overrides: dict[str, Any]


def overrides(
    loaders: dict[str, dict[str, Any]] | None = None, non_blocking_h2d: bool = False, **runtime: Any
) -> dict[str, Any]:
    """The overrides of a run: DataLoader arguments by call site, non-blocking copies of its
    batches, and in-process switches (see `_hooks._install_runtime_overrides`)."""
    return {"loaders": loaders or {}, "non_blocking_h2d": non_blocking_h2d, "runtime": runtime}


def cuda_memory(trial: Trial) -> dict[str, Any]:
    """The trial run's CUDA memory statistics ({} when not measured)."""
    return dict((trial.raw.runtime.get("cuda_memory") if trial.raw else None) or {})
