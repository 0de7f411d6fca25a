"""What one run of the script is asked to do (`RunSpec`): its script and arguments, the window
it measures, what it changes to try a fix, how it is launched and how long it may take. Read by
`runner` to launch it and by `results` to read back what it saved."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainadvisor.measure.config import WindowSize
from trainadvisor.records import Overrides

# Steps traced by torch.profiler after the timed window (fewer when the window is shorter).
PROFILE_STEPS = 10


@dataclass
class RunSpec:
    label: str
    script: Path
    args: list[str]
    out_dir: Path  # the report folder: traces/ and logs/ go there
    warmup: int
    steps: int
    seed: int | None = 0
    stop_after_window: bool = True
    profile: bool = True
    show_output: bool = True
    overrides: Overrides = field(default_factory=Overrides)  # what the run changes to try a fix
    with_stack: bool = False  # trace Python stacks (for call sites; slows the host)
    # torch.distributed.run options (--nproc-per-node 2 ...): launch every rank through torchrun
    torchrun: list[str] = field(default_factory=list)
    timeout_s: float | None = None  # None: no limit
    stall_s: float | None = None  # no step for this long: stuck (None: `watchdog`'s own limit)
    session_dir: Path | None = None  # keep the run alive for trial windows (`measure.kept_alive`)
    gate_file: Path | None = None  # start ahead of its settings, which arrive here (`training.gate`)
    size: WindowSize = field(default_factory=WindowSize)  # time floor, settling, the steps it may use
    profile_steps: int = PROFILE_STEPS  # traced after the timed steps (at most as many as those)
    memory_budget_bytes: int | None = None  # what the run may use (--memory-budget), for its report
