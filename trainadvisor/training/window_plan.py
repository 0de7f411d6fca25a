"""What a measuring window (`training.window`) is asked to do, and where it reads time: its plan
(warm-up, timed and traced steps, the settling test, the steps the script has left, a race), the
facts its owner sets as the loop runs, and the profiler it starts for its traced steps."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainadvisor.measure.config import PROFILER_WARMUP_STEPS
from trainadvisor.measure.settle import Settling
from trainadvisor.training import gpu


@dataclass(frozen=True)
class Clock:
    """Where a window reads time: a monotonic clock for durations, the wall clock for the
    moment it starts (host and GPU samples are placed against it)."""

    perf_s: Callable[[], float] = time.perf_counter
    unix_s: Callable[[], float] = time.time


@dataclass(frozen=True)
class WindowPlan:
    warmup: int  # steps before the timed ones at least, from the window's opening
    steps: int  # timed with clocks alone, at least
    profile_steps: int = 0  # then traced (after PROFILER_WARMUP_STEPS more); 0: no profiler
    with_stack: bool = False  # the trace records Python stacks
    min_time_s: float = 0.0  # the timed steps last at least this long
    settle: Settling | None = None  # the warm-up lasts until step time settles; None: `warmup` steps
    max_steps: int | None = None  # warm-up and timed steps end here (the steps the script has left)
    memory_step: bool = (
        False  # without a profiler: one untimed step after the timed ones, its memory measured
    )
    # a trial's race (`measure.race`): steps/s the window must be able to reach, or it stops
    race_below: float | None = None
    race_warmup: bool = True  # False: in the timed steps only

    @property
    def traced_steps(self) -> int:
        """Steps after the timed ones: the profiler's warmup step, then those it records (or,
        without a profiler, the step whose memory is measured)."""
        if self.profile_steps:
            return PROFILER_WARMUP_STEPS + self.profile_steps
        return 1 if self.memory_step else 0

    @property
    def warmup_cap(self) -> int | None:
        """The most warm-up steps where the script has only `max_steps` to spare: a third of
        them (at least `warmup`, at most what leaves `steps` timed); the rest are timed."""
        if self.max_steps is None:
            return None
        return max(self.warmup, min(self.max_steps - self.steps, self.max_steps // 3))


@dataclass
class WindowFacts:
    """What a window learnt besides its steps, set by its owner as the loop runs."""

    runtime: dict[str, Any] = field(default_factory=dict)  # torch's state when the timed steps began
    optimizer: torch.optim.Optimizer | None = None  # the one whose steps are counted
    optimizer_ids: set[int] = field(default_factory=set)


def start_profiler(profile_steps: int, with_stack: bool = False) -> torch.profiler.profile:
    """torch.profiler for `profile_steps` steps after one warmup step (CUPTI's start-up stays
    out of the recorded steps), CUDA activity included when the script uses a GPU."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if gpu.cuda_in_use():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(
            wait=0, warmup=PROFILER_WARMUP_STEPS, active=profile_steps, repeat=1
        ),
        with_stack=with_stack,
    )
    profiler.start()
    return profiler
