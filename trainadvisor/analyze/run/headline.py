"""A run's headline figures by stable name: what `compare` gates on and what the experiment
trackers log (`trackers.figures` prefixes them with `trainadvisor/`). A figure is present only
where the run measured it."""

from __future__ import annotations

from trainadvisor.analyze.run.summary import named_measurements
from trainadvisor.records import Run

# name -> the measurement it is
MEASURED = {
    "step_time_ms": "step_time_ms_median",
    "steps_per_s": "steps_per_s",
    "samples_per_s": "samples_per_s",
    "data_wait_pct": "data_wait_pct",
    "mfu_pct": "mfu_pct",
}


def headline_figures(run: Run) -> dict[str, float]:
    """The run's figures, by name: those of MEASURED, the step's peak memory (reserved GPU
    memory, else the counted step's) and the energy per sample."""
    values = named_measurements(run)
    found = {name: values.get(measurement) for name, measurement in MEASURED.items()}
    found["peak_memory_bytes"] = values.get("peak_reserved_bytes") or values.get("step_peak_bytes")
    found["energy_j_per_sample"] = run.energy.j_per_sample if run.energy is not None else None
    return {k: float(v) for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
