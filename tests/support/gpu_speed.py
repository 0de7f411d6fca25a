"""What e2e/test_gpu_speed.py and unit/profile/test_gpu_speed.py share."""

from __future__ import annotations

from trainadvisor.analyze.run.summary import summarize
from trainadvisor.records import (
    FixOutcome,
    Overrides,
    RawRun,
    Run,
    StepRecord,
)


def _run(steps_per_s: float, label: str = "w") -> Run:
    """A measured window of 20 steps at an exact, even pace."""
    step_ms = 1e3 / steps_per_s
    steps = [StepRecord(i, i * step_ms, step_ms, 0.0) for i in range(20)]
    return summarize(RawRun(label, "window_complete", None, None, 5, 20, 0, 25, steps, [], None))


def _chosen(fix: str, gain: float, settings: Overrides) -> FixOutcome:
    outcome = FixOutcome(fix, "no-mixed-precision", "unconfirmed", "", settings, [], fix)
    outcome.gain = gain
    return outcome
