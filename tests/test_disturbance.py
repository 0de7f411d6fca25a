"""Other processes' CPU during a window (issue 16, "a busy machine"): sampled beside the profiled
tree, and a note in the report when a window was disturbed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import namedtuple
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, load_report, run_cli

from trainadvisor.analysis.disturbance import (
    DISTURBED_MIN_CORES,
    disturbance_note,
    disturbed_cores,
    other_cores,
)
from trainadvisor.measure import sampling
from trainadvisor.records import HostSample


def _samples(*other_cpu_pct: float) -> list[HostSample]:
    return [HostSample(100.0 * i, 90.0, 0.0, 1, 0, 0, pct) for i, pct in enumerate(other_cpu_pct)]


def test_other_cores_is_the_mean_in_cores() -> None:
    assert other_cores(_samples(100.0, 200.0, 180.0)) == pytest.approx(1.6)
    assert other_cores([]) is None


def test_a_disturbed_window_gets_a_note() -> None:
    cores = disturbed_cores(_samples(100.0, 200.0, 180.0))
    assert cores == pytest.approx(1.6)
    assert disturbance_note({"the baseline window": cores}, 2) == (
        "Other processes used 1.6 cores (of the machine's 2) during the baseline window: its "
        "timings may be disturbed; measure again on a quiet machine."
    )


def test_several_disturbed_windows_share_one_note() -> None:
    disturbed = {"the baseline window": 1.25, "dataloader-workers's trial num_workers=2": 0.5}
    assert disturbance_note(disturbed, None) == (
        "Other processes used CPU during the baseline window (1.2 cores) and dataloader-workers's "
        "trial num_workers=2 (0.5 cores): their timings may be disturbed; measure again on a "
        "quiet machine."
    )
    assert disturbance_note({}, 2) is None


def test_a_quiet_window_is_not_disturbed() -> None:
    assert DISTURBED_MIN_CORES == 0.5
    assert disturbed_cores(_samples(40.0, 59.0)) is None  # 0.495 cores
    assert disturbed_cores(_samples(50.0, 50.0)) == 0.5
    assert disturbed_cores([]) is None


def test_a_saved_sample_without_the_field_loads() -> None:
    assert HostSample(0.0, 1.0, 2.0, 3, 4, 5).other_cpu_pct == 0.0


# psutil.cpu_times() as Linux gives it (guest time is counted in user time already)
_Times = namedtuple("_Times", "user nice system idle iowait irq softirq steal guest guest_nice")

_TREE, _OWN, _PRESTARTED = 1001, os.getpid(), 1003
# each process's cpu_percent(None) after its first reading, which only starts its interval
_CPU_PCT = {_TREE: 80.0, 1002: 30.0, _OWN: 5.0, _PRESTARTED: 10.0}


class _FakeProcess:
    def __init__(self, pid: int | None = None) -> None:
        self.pid = _OWN if pid is None else pid
        self._read = False

    def cpu_percent(self, interval: Any = None) -> float:
        first, self._read = not self._read, True
        return 0.0 if first else _CPU_PCT[self.pid]

    def memory_info(self) -> Any:
        return namedtuple("mem", "rss")(1000)

    def oneshot(self) -> Any:
        return nullcontext()

    def children(self, recursive: bool = False) -> list[_FakeProcess]:
        kids = {_TREE: [1002], _OWN: [_TREE, 1002, _PRESTARTED]}.get(self.pid, [])
        return [_FakeProcess(pid) for pid in kids]


def test_the_sampler_counts_other_processes_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # busy (total - idle - iowait) CPU seconds of the whole machine at each tick
    busy_s = iter([10.0, 10.0 + 0.25])
    monkeypatch.setattr(sampling.psutil, "Process", _FakeProcess)
    monkeypatch.setattr(
        sampling.psutil, "cpu_times", lambda: _Times(next(busy_s), 0, 0, 50.0, 2.0, 0, 0, 0, 3.0, 0)
    )
    clock_s = iter([100.0, 100.1])
    sampler = sampling.Sampler(_TREE, clock=lambda: next(clock_s))
    first = sampler._host_tick()
    second = sampler._host_tick()
    assert first is not None and second is not None
    assert first[1].other_cpu_pct == 0.0  # the first tick only starts the interval
    sample = second[1]
    assert (sample.main_cpu_pct, sample.workers_cpu_pct) == (80.0, 30.0)
    # 0.25 busy s over 0.1 s: 250% of a core, less the tree (110%), this process (5%) and
    # its child outside the tree (a confirmation run started beside the baseline, 10%)
    assert sample.other_cpu_pct == pytest.approx(125.0)


def test_a_busy_loop_beside_the_baseline_is_noted(tmp_path: Path) -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        out = tmp_path / "out"
        result = run_cli(
            "profile", "--no-fix", "--warmup", "3", "--steps", "10", "--out", out,
            EXAMPLES / "slow_input_mnist.py", "--samples", "20000",
            cwd=tmp_path,
        )  # fmt: skip
    finally:
        busy.kill()
        busy.wait()
    assert result.returncode == 0, result.stderr
    notes = load_report(out)["notes"]
    assert any(n.startswith("Other processes used") and "during the baseline window" in n for n in notes), (
        notes
    )
