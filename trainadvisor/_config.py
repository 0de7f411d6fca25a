"""What the parent tells the child process to measure (kept free of torch, so the parent
process never imports it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ChildConfig:
    label: str
    result_file: str
    trace_file: str | None  # absolute; None: do not run torch.profiler
    warmup: int
    steps: int  # timed with clocks alone
    profile_steps: int  # then traced with torch.profiler (its overhead would bias the timing)
    stop_after_window: bool
    seed: int | None
    loader_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # by call site
    non_blocking_h2d: bool = False
    # Switches a fix sets inside the process: tf32, cudnn_benchmark, amp ("bf16"|"fp16"),
    # fused_optimizer, grad_accumulation (see `measure.switches`).
    runtime_overrides: dict[str, Any] = field(default_factory=dict)
    with_stack: bool = False  # record Python stacks in the trace (the call-sites run)
    # where the child names the GPU it trains on, for the parent's NVML sampler ({rank} in it)
    device_file: str | None = None


def failed_write_file(result_file: str | Path) -> Path:
    """Where the child says why it could not save its result (beside the result file)."""
    return Path(f"{result_file}.error")
