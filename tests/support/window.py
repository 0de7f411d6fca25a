"""What unit/compute/test_compute.py, unit/measure/test_window.py and unit/profile/test_race.py share."""

from __future__ import annotations

from trainadvisor.training.window import Clock


class FakeClock:
    """perf_s and unix_s advance only when the test says so."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def advance(self, ms: float) -> None:
        self.now_s += ms / 1e3

    def clock(self) -> Clock:
        return Clock(perf_s=lambda: self.now_s, unix_s=lambda: 1_700_000_000.0 + self.now_s)


class FakeProfiler:
    def __init__(self, steps: int, with_stack: bool) -> None:
        self.steps, self.with_stack, self.stepped, self.stopped = steps, with_stack, 0, False

    def step(self) -> None:
        self.stepped += 1

    def stop(self) -> None:
        self.stopped = True
