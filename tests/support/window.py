"""What unit/compute/test_compute.py, unit/compute/test_compilepool.py, unit/measure/test_window.py
and unit/profile/test_race.py share."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from trainadvisor.training.window_plan import Clock


def fake_async_compile(monkeypatch: pytest.MonkeyPatch, ready: Any) -> None:
    """torch's `torch._inductor.async_compile` as torch 2.11-2.13 keep it, for `compute.compilepool`:
    `AsyncCompile._ready_future` None until a compile asks for the pool, then the future of its
    first job (a real Future, which the test completes when the pool is "up")."""
    compiler = type("AsyncCompile", (), {"_ready_future": ready})
    monkeypatch.setitem(
        sys.modules, "torch._inductor.async_compile", types.SimpleNamespace(AsyncCompile=compiler)
    )


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
