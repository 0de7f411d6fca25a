"""What e2e/test_race.py and unit/profile/test_race.py share."""

from __future__ import annotations

from trainadvisor.analyze.run.summary import summarize
from trainadvisor.records import RawRun, Run, StepRecord


def _run(step_ms: list[float]) -> Run:
    steps = [StepRecord(i, sum(step_ms[:i]), ms, 0.0) for i, ms in enumerate(step_ms)]
    return summarize(RawRun("w", "window_complete", None, None, 5, len(steps), 0, 25, steps, [], None))


def _windows_at(steps_per_s: float, n: int = 60) -> Run:
    return _run([1e3 / steps_per_s] * n)
