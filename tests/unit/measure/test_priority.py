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
    """`os` as `priority` sees it: each thread's nice value; raising one is refused unless
    `raise_allowed` (CAP_SYS_NICE, or an RLIMIT_NICE that allows it)."""

    PRIO_PROCESS = os.PRIO_PROCESS

    def __init__(self, nices: dict[int, int], raise_allowed: bool) -> None:
        self.nices, self.raise_allowed = nices, raise_allowed
        self.calls: list[tuple[int, int]] = []

    def getpriority(self, which: int, who: int) -> int:
        if who not in self.nices:  # the probe's own thread starts at its creator's value
            self.nices[who] = self.nices[0]
        return self.nices[who]

    def setpriority(self, which: int, who: int, nice: int) -> None:
        self.calls.append((who, nice))
        if nice < self.getpriority(which, who) and not self.raise_allowed:
            raise PermissionError(13, "Permission denied")
        self.nices[who] = nice

    def listdir(self, path: Path) -> list[str]:
        return [str(tid) for tid in self.nices if tid]

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def _faked(monkeypatch: pytest.MonkeyPatch, nices: dict[int, int], raise_allowed: bool = True) -> _Threads:
    threads = _Threads(nices, raise_allowed)
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
    assert threads.calls == [(probe, nice + 1), (probe, nice)]


def test_at_the_lowest_already_nothing_needs_raising_and_nothing_is_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = _faked(monkeypatch, {0: 19}, raise_allowed=False)
    assert priority.restorable() is True and threads.calls == []


def test_where_threads_have_no_priority_of_their_own_no_run_is_restorable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(priority, "TASKS", tmp_path / "no-proc")
    assert priority.restorable() is False


def test_restore_raises_what_stands_at_the_lowest_and_leaves_what_the_script_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = _faked(monkeypatch, {0: 19, 10: 19, 11: 19, 12: 10, 13: 2})
    assert priority.restore(5) == 0
    assert threads.nices == {0: 19, 10: 5, 11: 5, 12: 10, 13: 2}  # 0: the calling thread's alias
    assert threads.calls == [(10, 5), (11, 5)]


def test_restore_counts_the_threads_it_could_not_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    threads = _faked(monkeypatch, {0: 19, 10: 19, 11: 19}, raise_allowed=False)
    assert priority.restore(0) == 2
    assert threads.calls == [(10, 0), (11, 0)] * 3  # three passes
    assert priority.restore(19) == 0  # nothing was lowered
