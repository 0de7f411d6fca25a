"""What a run's GPUs drew, as saved (plain data; imports nothing of the package): filled by
`analyze.run.energy` from the NVML samples, carried by `Run.energy` into report.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# NVML's energy counter (millijoules since the driver loaded: Volta and later), its power
# readings integrated over time where the counter is missing, or neither.
EnergyMethod = Literal["energy counter", "sampled power", "not measured"]


@dataclass
class Energy:
    """The energy the GPUs the run trained on drew over its timed steps, per step and per sample.
    A measurement or nothing: where it could not be measured, `reason` says why."""

    method: EnergyMethod
    reason: str = ""  # why it was not measured ("" when it was)
    energy_j: float | None = None  # over the timed steps, every GPU counted
    j_per_step: float | None = None
    j_per_sample: float | None = None  # None where a timed step's batch size was not seen
    devices: list[str] = field(default_factory=list)  # the GPUs counted (GpuSample.device)
    timed_s: float = 0.0  # the timed steps' time the energy is over
    # the first and last readings used, in ms from the window's start (a reading outside the
    # timed steps' time only places the value at their edges, by linear interpolation)
    readings_ms: list[float] = field(default_factory=list)
