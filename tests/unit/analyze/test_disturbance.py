"""Other processes' CPU during a window (issue 16, "a busy machine"): sampled beside the profiled
tree, and a note in the report when a window was disturbed."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import msgspec
import pytest

from trainadvisor.analyze.run.disturbance import (
    DISTURBED_MIN_CORES,
    disturbance_note,
    disturbed_cores,
    other_cores,
    threads_note,
)
from trainadvisor.measure import proctable, sampling
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


def test_torchs_threads_beyond_the_cores_other_processes_left_get_a_note() -> None:
    """Two intra-op threads on 2 cores, one of which another process kept busy: a note with the
    one thread the cores left, not measured; none where the threads fit in what was left, on one
    thread, or with no window disturbed."""
    disturbed = {"the baseline window": 1.0, "the confirmation run's window": 0.6}
    assert threads_note(2, disturbed, 2) == (
        "The training process ran 2 of torch's intra-op threads on the machine's 2 cores while other "
        "processes used up to 1.0 of them: a parallel op waits for its slowest thread, and a thread "
        "that shares a core with a busy process waits for its turn. Not measured here: where this "
        "machine stays shared, torch.set_num_threads(1) at the start of the script may make each step "
        "faster (on a quiet machine, keep torch's default)."
    )
    assert "torch.set_num_threads(6)" in (threads_note(8, {"the baseline window": 1.5}, 8) or "")
    assert [threads_note(4, disturbed, 8), threads_note(1, disturbed, 2), threads_note(2, {}, 2)] == [
        None
    ] * 3
    assert threads_note(None, disturbed, 2) is None  # a run recorded before the threads were read


def test_a_quiet_window_is_not_disturbed() -> None:
    assert DISTURBED_MIN_CORES == 0.5
    assert disturbed_cores(_samples(40.0, 59.0)) is None  # 0.495 cores
    assert disturbed_cores(_samples(50.0, 50.0)) == 0.5
    assert disturbed_cores([]) is None


def test_a_saved_sample_without_the_fields_loads() -> None:
    saved = {"t_ms": 0.0, "main_cpu_pct": 1.0, "workers_cpu_pct": 2.0, "main_rss_bytes": 3}
    sample = msgspec.convert({**saved, "workers_rss_bytes": 4, "workers": 5}, HostSample)
    assert (sample.other_cpu_pct, sample.other_processes, sample.main_queued_pct) == (0.0, {}, None)


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


# each process's parent: trainadvisor (this process) started the script and the confirmation run
_PARENT = {_OWN: 1, _TREE: _OWN, 1002: _TREE, _PRESTARTED: _OWN, _BRIEF: _TREE, _STRANGER: 1}


class _FakeProcess:
    def __init__(self, pid: int | None = None) -> None:
        self.pid = _OWN if pid is None else pid
        self._read = False

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

    def memory_full_info(self) -> Any:
        return namedtuple("full", "rss uss")(1000, 400 + self.pid)

    def oneshot(self) -> Any:
        return nullcontext()


def _proc_table(proc: Path, children_lists: bool) -> None:
    """The world at its tick as Linux shows it: /proc/<pid>/stat, one line a process (its name in
    parentheses, CPU in clock ticks: utime, stime, cutime, cstime); where the kernel keeps them,
    the children each thread started (/proc/<pid>/task/<tid>/children: here a second thread of
    trainadvisor's started the confirmation run)."""
    shutil.rmtree(proc, ignore_errors=True)
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    alive = [*_World.alive(), _STRANGER]
    for pid in alive:
        times = [round(value * ticks_per_s) for value in _FakeProcess(pid).cpu_times()]
        name = "a (busy) job" if pid == _STRANGER else "python"  # a name may hold ") "
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(
            f"{pid} ({name}) S {_PARENT[pid]} {pid} {pid} 0 -1 4194304 0 0 0 0 "
            f"{' '.join(map(str, times))} 20 0 1 0 100 0 0\n"
        )
        if children_lists:
            children = [child for child in alive if _PARENT[child] == pid]
            by_thread = {
                pid: [child for child in children if child != _PRESTARTED],
                pid + 50_000: [child for child in children if child == _PRESTARTED],
            }
            for tid, started in by_thread.items():
                (proc / str(pid) / "task" / str(tid)).mkdir(parents=True)
                (proc / str(pid) / "task" / str(tid) / "children").write_text(
                    "".join(f"{c} " for c in started)
                )
    (proc / "self").mkdir()  # not a process: skipped


@pytest.mark.parametrize("children_lists", [True, False])
def test_the_sampler_counts_only_other_processes_cpu_and_names_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, children_lists: bool
) -> None:
    """trainadvisor's tree is this process and everything it started, counted in CPU seconds
    from tick to tick: a worker that starts and ends between ticks is counted (through the CPU
    seconds its parent records once it has waited for it), not passed off as another's. The
    same figures whether the tree is read alone (the kernel lists each thread's children) or
    found in the whole table; the whole table is read only to name the others, once a second."""
    monkeypatch.setattr(sampling.psutil, "Process", _FakeProcess)
    monkeypatch.setattr(
        sampling.psutil,
        "cpu_times",
        lambda: _Times(_World.busy_s[_World.tick], 0, 0, 50.0, 2.0, 0, 0, 0, 3.0, 0),
    )
    proc = tmp_path / "proc"
    whole_reads = []
    read_table = sampling.read_table
    monkeypatch.setattr(sampling, "read_table", lambda at: whole_reads.append(at) or read_table(at))
    sampler = sampling.Sampler(_TREE, clock=lambda: 100.0 + _World.tick, proc=proc)
    ticks = []
    for tick in range(3):
        _World.tick = tick
        _proc_table(proc, children_lists)
        schedstat = proc / str(_TREE) / "task" / str(_TREE) / "schedstat"
        schedstat.parent.mkdir(parents=True, exist_ok=True)
        schedstat.write_text(f"{tick * 700_000_000} {tick * 250_000_000} {tick * 40}\n")
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
    assert third.other_processes == {"a (busy) job (pid 4242)": 0.7}
    assert (second.workers, third.workers) == (2, 1)  # the script's worker, and the brief one
    # one worker's own memory a tick (a second apart), in turn: 1002, the brief one, 1002
    assert [t.worker_uss_bytes for t in (first, second, third)] == [1402, 400 + _BRIEF, 1402]
    # the script's main thread waited 0.25 s for a CPU in each 1 s between ticks
    assert (first.main_queued_pct, second.main_queued_pct, third.main_queued_pct) == (None, 25.0, 25.0)
    # to name the others at the second and third ticks; and, without the lists, every tick
    assert len(whole_reads) == (2 if children_lists else 5)


def _fake_proc(proc: Path, parents: dict[int, int], listed: dict[int, list[int]]) -> None:
    """A /proc of `parents` (pid -> parent), each process's main thread listing `listed[pid]`."""
    for pid, parent in parents.items():
        (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(
            f"{pid} (p) S {parent} 0 0 0 -1 0 0 0 0 0 {pid} 0 0 0 20 0 1 0\n"
        )
        (proc / str(pid) / "task" / str(pid) / "children").write_text(
            "".join(f"{c} " for c in listed.get(pid, []))
        )


def test_a_live_child_the_kernels_list_skipped_is_read_directly(tmp_path: Path) -> None:
    """proc(5): a children list may skip a live child while a sibling is reaped. Of the last
    reading's members, 12 (and its child 13, listed by 12) is still there under our root: read
    directly. 14 has ended; 15 was reparented to init: neither is ours any more."""
    me = os.getpid()
    parents = {me: 1, 10: me, 11: 10, 12: 10, 13: 12, 15: 1}
    _fake_proc(tmp_path, parents, {me: [10], 10: [11], 12: [13]})  # 12 skipped in 10's list
    assert set(proctable.read_tree([10], tmp_path).parent) == {10, 11}  # nothing known: as listed
    table = proctable.read_tree([10], tmp_path, known=[10, 11, 12, 13, 14, 15])
    assert table is not None and table.tree(10) == [10, 11, 12, 13]
    assert table.own_s[13] == 13 / os.sysconf("SC_CLK_TCK")


def test_a_stat_line_is_read_after_the_last_parenthesis() -> None:
    line = b"77 (x) (y) z) R 12 77 77 0 -1 0 0 0 0 0 150 50 7 3 20 0 1 0 5 0 0\n"
    assert proctable._parse_stat(line) == ("x) (y) z", 12, 200, 10)
    assert proctable._parse_stat(b"77 (cut short) R 12 77") is None


def test_a_threads_wait_for_a_cpu_is_its_run_queue_time_between_readings(tmp_path: Path) -> None:
    """`/proc/<pid>/task/<tid>/schedstat`: CPU ns, run-queue ns, timeslices. The share of the
    wall time between two readings spent runnable and not running, in percent; None at the first
    reading, where the file cannot be read (the next reading starts again), and for a clock that
    did not move."""
    path = tmp_path / "7" / "task" / "7" / "schedstat"
    path.parent.mkdir(parents=True)
    queue = sampling.QueueWait(7, tmp_path)
    readings = [(10.0, "5 1000000000 3"), (10.5, "9 1200000000 8"), (11.0, "9 1200000000 9")]
    shares = []
    for now_s, line in readings:
        path.write_text(line + "\n")
        shares.append(queue.pct(now_s))
    assert shares == [None, 40.0, 0.0]  # 0.2 s of 0.5 s, then none
    assert queue.pct(11.0) is None  # the clock did not move
    path.write_text("garbled\n")
    assert queue.pct(12.0) is None
    path.write_text("9 1300000000 9\n")
    assert queue.pct(12.5) is None  # the count starts again after a reading that failed
    path.write_text("9 2300000000 9\n")
    assert queue.pct(13.0) == 100.0  # never more than all the time (a tick late: 1 s in 0.5 s)
    assert sampling.QueueWait(8, tmp_path).pct(1.0) is None  # no such thread
    (tmp_path / "7" / "task" / "9").mkdir(parents=True)
    (tmp_path / "7" / "task" / "9" / "schedstat").write_text("9 4500000000 9\n")  # another thread's
    assert sampling.queued_ns_of(7, tmp_path, tid=9) == 4_500_000_000
