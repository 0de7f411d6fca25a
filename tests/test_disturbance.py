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

from trainadvisor.analyze.disturbance import (
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
    assert disturbance_note({"the baseline window": cores}, 2, {"stress (pid 4242)": 1.5}) == (
        "Other processes used 1.6 cores (of the machine's 2) during the baseline window (busiest: "
        "stress (pid 4242) 1.5 cores): its timings may be disturbed; measure again on a quiet machine."
    )


def test_several_disturbed_windows_share_one_note() -> None:
    disturbed = {"the baseline window": 1.25, "dataloader-workers's trial num_workers=2": 0.5}
    assert disturbance_note(disturbed, None) == (
        "Other processes used CPU during the baseline window (1.2 cores) and dataloader-workers's "
        "trial num_workers=2 (0.5 cores) (none of them visible from here: another container's, or "
        "the host's): their timings may be disturbed; measure again on a quiet machine."
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
# Process.cpu_times(): a process's own CPU seconds, and its waited-for children's
_PTimes = namedtuple("_PTimes", "user system children_user children_system")

_TREE, _OWN, _PRESTARTED, _BRIEF, _STRANGER = 1001, os.getpid(), 1003, 1004, 4242
# each process's cpu_percent(None) after its first reading, which only starts its interval
_CPU_PCT = {_TREE: 80.0, 1002: 30.0, _OWN: 5.0, _PRESTARTED: 10.0, _BRIEF: 20.0}


class _World:
    """Three ticks, a second apart, of a machine where trainadvisor (this process) runs the
    script (1001, its worker 1002), a confirmation run started beside it (1003), and a worker
    1004 that starts after the first tick and is gone, waited for by the script, before the
    third; and a stranger (4242). CPU seconds (user) per process and tick:"""

    tick = 0
    own = {
        _OWN: [0.5, 0.55, 0.6],
        _TREE: [2.0, 2.8, 3.5],
        1002: [1.0, 1.3, 1.6],
        _PRESTARTED: [0.3, 0.4, 0.5],
    }
    brief = [None, 0.2, None]  # 0.35 s in all: 0.15 s of it after the second tick
    reaped = [0.0, 0.0, 0.35]  # the script's children_user: the brief worker's total, once waited for
    stranger = [5.0, 5.0, 5.7]
    busy_s = [10.0, 12.5, 14.5]  # the machine's busy CPU seconds

    @classmethod
    def alive(cls) -> list[int]:
        return [*cls.own, *([_BRIEF] if cls.brief[cls.tick] is not None else [])]


class _FakeProcess:
    def __init__(self, pid: int | None = None) -> None:
        self.pid = _OWN if pid is None else pid
        self._read = False
        self.info = {"name": "stress" if self.pid == _STRANGER else "python", "cpu_times": self.cpu_times()}

    def cpu_percent(self, interval: Any = None) -> float:
        first, self._read = not self._read, True
        return 0.0 if first else _CPU_PCT[self.pid]

    def cpu_times(self) -> Any:
        tick = _World.tick
        if self.pid == _STRANGER:
            return _PTimes(_World.stranger[tick], 0.0, 0.0, 0.0)
        if self.pid == _BRIEF:
            return _PTimes(_World.brief[tick] or 0.0, 0.0, 0.0, 0.0)
        reaped = _World.reaped[tick] if self.pid == _TREE else 0.0
        return _PTimes(_World.own[self.pid][tick], 0.0, reaped, 0.0)

    def memory_info(self) -> Any:
        return namedtuple("mem", "rss")(1000)

    def oneshot(self) -> Any:
        return nullcontext()

    def children(self, recursive: bool = False) -> list[_FakeProcess]:
        kids = {
            _TREE: [1002, *([_BRIEF] if _BRIEF in _World.alive() else [])],
            _OWN: [p for p in _World.alive() if p != _OWN],
        }.get(self.pid, [])
        return [_FakeProcess(pid) for pid in kids]


def test_the_sampler_counts_only_other_processes_cpu_and_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """trainadvisor's tree is this process and everything it started, counted in CPU seconds
    from tick to tick: a worker that starts and ends between ticks is counted (through the CPU
    seconds its parent records once it has waited for it), not passed off as another's."""
    monkeypatch.setattr(sampling.psutil, "Process", _FakeProcess)
    monkeypatch.setattr(
        sampling.psutil,
        "cpu_times",
        lambda: _Times(_World.busy_s[_World.tick], 0, 0, 50.0, 2.0, 0, 0, 0, 3.0, 0),
    )
    monkeypatch.setattr(
        sampling.psutil,
        "process_iter",
        lambda _fields: [_FakeProcess(p) for p in [*_World.alive(), _STRANGER]],
    )
    sampler = sampling.Sampler(_TREE, clock=lambda: 100.0 + _World.tick)
    ticks = []
    for tick in range(3):
        _World.tick = tick
        ticks.append(sampler._host_tick())
    first, second, third = (t[1] for t in ticks if t is not None)
    assert first.other_cpu_pct == 0.0  # the first tick only starts the interval
    assert (second.main_cpu_pct, second.workers_cpu_pct) == (80.0, 50.0)
    # 2.5 busy s in 1 s, less ours: this process 0.05, the script 0.8, its worker 0.3, the
    # confirmation run 0.1, the new worker 0.2 -> 1.05 cores elsewhere
    assert second.other_cpu_pct == pytest.approx(105.0)
    assert second.other_processes == {}  # the first reading of every process only starts its interval
    # 2.0 busy s, less ours: 0.05 + the script 0.7 and the brief worker's last 0.15 + 0.3 + 0.1
    assert third.other_cpu_pct == pytest.approx(70.0)
    assert third.other_processes == {"stress (pid 4242)": 0.7}


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
    [note] = [n for n in notes if n.startswith("Other processes used")]
    assert "during the baseline window" in note and f"(pid {busy.pid})" in note, notes
