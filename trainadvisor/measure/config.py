"""What the parent tells the child process to measure (kept free of torch, so the parent
process never imports it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trainadvisor import _serial
from trainadvisor.measure.settle import Settling
from trainadvisor.records import Overrides, StepRecord

# Steps the profiler runs before recording: the first traced step carries CUPTI's start-up.
PROFILER_WARMUP_STEPS = 1


def traced_whole(steps: list[StepRecord], profile_steps: int) -> int:
    """Steps a window's profiler recorded whole, of its `steps`: those traced but the profiler's
    warm-up one (fewer than `profile_steps` where the script ended inside them; none where the
    window ran no profiler: its one untimed step is then the memory step)."""
    if not profile_steps:
        return 0
    return max(0, sum(1 for step in steps if step.profiled) - PROFILER_WARMUP_STEPS)


@dataclass(frozen=True)
class WindowSize:
    """Beyond its minimum step counts, how long a window runs (`training.window_plan.WindowPlan`): its
    timed steps last at least `min_time_s`, its warm-up until step time settles (`settle`;
    None: the warm-up is a count of steps), and warm-up and timed steps end at `max_steps`
    where the script has only so many left (None: not known to be short)."""

    min_time_s: float = 0.0
    settle: Settling | None = None
    max_steps: int | None = None
    # a trial's race: the window stops once its steps/s, raised by the settling tolerance, is
    # still below this (the slow windows of the best setting measured so far); None: no race
    race_below: float | None = None
    race_warmup: bool = True  # False: the race is run in the timed steps only (`fixes.Setting`)


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
    # what the run changes to try a fix: DataLoader arguments, non-blocking copies, switches
    overrides: Overrides = field(default_factory=Overrides)
    with_stack: bool = False  # record Python stacks in the trace (the call-sites run)
    # where the child names the GPU it trains on, for the parent's NVML sampler ({rank} in it)
    device_file: str | None = None
    # where the parent sends trial windows after the baseline's (`training.session`); None: none
    session_dir: str | None = None
    # where the parent sends the settings of a run started ahead of them (`training.gate`)
    gate_file: str | None = None
    # the stall watchdog's: the step count, kept in place ({rank} in it), and where the Python
    # stacks go when the parent asks (`measure.watchdog`)
    heartbeat_file: str | None = None
    stacks_file: str | None = None
    size: WindowSize = field(default_factory=WindowSize)
    # without a profiler: one untimed step after the timed ones measures memory (`memory.step`)
    memory_step: bool = False
    # where the runs of one profile keep the CPU's matmul peak the first of them measured
    # (`compute.flops.share_cpu_peak`); None: the run measures its own
    cpu_peak_file: str | None = None


@dataclass
class WindowCommand:
    """The parent's next request to a run kept alive for trial windows: a window with these
    overrides (`warmup` steps to settle, then `steps` timed), or stop."""

    index: int
    label: str = ""
    overrides: Overrides = field(default_factory=Overrides)
    warmup: int = 0
    steps: int = 0
    profile_steps: int = 0  # a run started ahead of its settings: steps it traces
    stop: bool = False
    size: WindowSize = field(default_factory=WindowSize)


def command_file(session_dir: Path, index: int) -> Path:
    """Where the parent asks for a run's window number `index` (or tells it to stop)."""
    return session_dir / f"command-{index}.json"


def window_file(session_dir: Path, index: int) -> Path:
    """Where the child writes what window number `index` measured."""
    return session_dir / f"window-{index}.result.json"


# A run started ahead stopped at its gate, because the script set these variables after the run
# had imported what reads them (`training.gate.READ_AT_IMPORT`): the parent measures a fresh run.
AHEAD_ENV_CHANGED = "ahead_env_changed"


def standing_file(gate_file: Path) -> Path:
    """Where a run started ahead says it has imported what it runs with (torch, trainadvisor's
    hooks) and is setting up the script at the lowest priority (`training.gate.hold`)."""
    return gate_file.with_name(f"{gate_file.name}.standing")


def at_gate_file(gate_file: Path) -> Path:
    """Where a run started ahead says its set-up is done: it waits at the script's first
    DataLoader, backward() or step for its settings (`training.gate.hold`)."""
    return gate_file.with_name(f"{gate_file.name}.at-gate")


def released_file(gate_file: Path) -> Path:
    """Where the parent lets a run started ahead into the script (`training.gate.released`): the
    baseline has taken its first step, so its own set-up is done."""
    return gate_file.with_name(f"{gate_file.name}.released")


def failed_write_file(result_file: str | Path) -> Path:
    """Where the child says why it could not save its result (beside the result file)."""
    return Path(f"{result_file}.error")


def save_config(config: ChildConfig, path: Path) -> None:
    path.write_text(json.dumps(_serial.to_plain(config)))


def load_config(path: str | Path) -> ChildConfig:
    return _serial.from_plain(ChildConfig, json.loads(Path(path).read_text()))  # type: ignore[no-any-return]
