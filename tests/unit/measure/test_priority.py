"""The priority of a run started ahead (`measure.priority`), its process's threads faked: whether
a lowered priority may be raised back (tried on a thread of its own, lowered by one and raised
back: the kernel decides), and `restore`, which raises what stands at the lowest and leaves what
the script set. A real process, and one in a user namespace: `tests/e2e/test_priority.py`."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from trainadvisor.measure import priority


class _Threads:
    """`os` as `priority` sees it: each thread's nice value and scheduling class (SCHED_OTHER
    unless `idle` names it); raising a nice value, or leaving the idle class, is refused unless
    `raise_allowed` (CAP_SYS_NICE, or an RLIMIT_NICE that allows it). `calls`: (thread, nice) for
    each nice value set, (thread, "idle" or "other") for each class."""

    PRIO_PROCESS = os.PRIO_PROCESS
    SCHED_IDLE, SCHED_OTHER = os.SCHED_IDLE, os.SCHED_OTHER

    def __init__(self, nices: dict[int, int], raise_allowed: bool, idle: tuple[int, ...] = ()) -> None:
        self.nices, self.raise_allowed = nices, raise_allowed
        self.classes = {tid: os.SCHED_IDLE if tid in idle else os.SCHED_OTHER for tid in nices}
        self.calls: list[tuple[int, int | str]] = []

    def getpriority(self, which: int, who: int) -> int:
        if who not in self.nices:  # the probe's own thread starts at its creator's value
            self.nices[who] = self.nices[0]
        return self.nices[who]

    def setpriority(self, which: int, who: int, nice: int) -> None:
        self.calls.append((who, nice))
        if nice < self.getpriority(which, who) and not self.raise_allowed:
            raise PermissionError(13, "Permission denied")
        self.nices[who] = nice

    def sched_getscheduler(self, who: int) -> int:
        return self.classes.setdefault(who, self.classes[0])

    def sched_setscheduler(self, who: int, policy: int, param: os.sched_param) -> None:
        self.calls.append((who, "idle" if policy == os.SCHED_IDLE else "other"))
        leaving = self.sched_getscheduler(who) == os.SCHED_IDLE and policy != os.SCHED_IDLE
        if leaving and not self.raise_allowed:
            raise PermissionError(1, "Operation not permitted")
        self.classes[who] = policy

    def listdir(self, path: Path) -> list[str]:
        return [str(tid) for tid in self.nices if tid]

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def _faked(
    monkeypatch: pytest.MonkeyPatch,
    nices: dict[int, int],
    raise_allowed: bool = True,
    idle: tuple[int, ...] = (),
) -> _Threads:
    threads = _Threads(nices, raise_allowed, idle)
    monkeypatch.setattr(priority, "os", threads)
    return threads


@pytest.mark.parametrize(("nice", "allowed"), [(0, True), (0, False), (5, True), (5, False)])
def test_restorable_lowers_a_thread_of_its_own_by_one_and_tries_to_raise_it_back(
    monkeypatch: pytest.MonkeyPatch, nice: int, allowed: bool
) -> None:
    threads = _faked(monkeypatch, {0: nice}, allowed)
    assert priority.restorable() is allowed
    [probe] = [tid for tid in threads.nices if tid]
    assert probe != threading.get_native_id()  # never the calling thread
    tried = [(probe, nice + 1), (probe, nice), (probe, "idle"), (probe, "other")]
    assert threads.calls == (tried if allowed else tried[:2])  # refused at the first raise


@pytest.mark.parametrize("allowed", [True, False])
def test_at_the_lowest_nice_already_the_idle_class_is_tried_alone(
    monkeypatch: pytest.MonkeyPatch, allowed: bool
) -> None:
    threads = _faked(monkeypatch, {0: 19}, raise_allowed=allowed)
    assert priority.restorable() is allowed
    [probe] = [tid for tid in threads.classes if tid]
    assert threads.calls == [(probe, "idle"), (probe, "other")]


def test_where_the_kernel_has_no_idle_class_at_the_lowest_nice_nothing_is_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = _faked(monkeypatch, {0: 19}, raise_allowed=False)
    monkeypatch.setattr(priority, "IDLE", None)
    assert priority.restorable() is True and threads.calls == []


def test_lower_takes_the_calling_thread_to_the_lowest_nice_and_the_idle_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = _faked(monkeypatch, {0: 3})
    monkeypatch.setattr(
        threads, "nice", lambda increment: threads.nices.update({0: 3 + increment}), raising=False
    )
    assert priority.lower() == 3
    assert threads.nices[0] == 19 and threads.classes[0] == os.SCHED_IDLE


def test_where_threads_have_no_priority_of_their_own_no_run_is_restorable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(priority, "TASKS", tmp_path / "no-proc")
    assert priority.restorable() is False


def test_restore_raises_what_stands_at_the_lowest_and_leaves_what_the_script_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thread 12's nice value the script set (10): it leaves the idle class and keeps its value."""
    threads = _faked(monkeypatch, {0: 19, 10: 19, 11: 19, 12: 10, 13: 2}, idle=(0, 10, 11, 12))
    assert priority.restore(5) == 0
    assert threads.nices == {0: 19, 10: 5, 11: 5, 12: 10, 13: 2}  # 0: the calling thread's alias
    assert threads.calls == [(10, "other"), (10, 5), (11, "other"), (11, 5), (12, "other")]
    assert {tid: c == os.SCHED_OTHER for tid, c in threads.classes.items() if tid} == dict.fromkeys(
        [10, 11, 12, 13], True
    )


def test_restore_counts_the_threads_it_could_not_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    threads = _faked(monkeypatch, {0: 19, 10: 19, 11: 19}, raise_allowed=False, idle=(0, 10, 11))
    assert priority.restore(0) == 2
    assert threads.calls == [(10, "other"), (11, "other")] * 3  # three passes, refused at the class
    threads.calls.clear()
    assert priority.restore(19) == 2  # at nice 19 already, still in the idle class
    assert threads.calls == [(10, "other"), (11, "other")] * 3


def test_restore_reads_another_processs_threads_where_given_its_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's side: a run started ahead whose settings came while it still set up."""
    threads = _faked(monkeypatch, {0: 0, 20: 19, 21: 19}, idle=(20, 21))
    listed: list[Path] = []
    real_listdir = threads.listdir

    def listdir(path: Path) -> list[str]:
        listed.append(path)
        if path == Path("/proc/99/task"):
            raise FileNotFoundError(path)  # that process has ended
        return real_listdir(path)

    monkeypatch.setattr(threads, "listdir", listdir)
    assert priority.restore(0, pid=77) == 0
    assert listed[0] == Path("/proc/77/task")
    assert threads.calls == [(20, "other"), (20, 0), (21, "other"), (21, 0)]
    threads.calls.clear()
    assert priority.restore(0, pid=99) == 0 and threads.calls == []
