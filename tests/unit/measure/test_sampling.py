"""When the sampler reads the DataLoader workers' own memory (`measure.sampling.OwnMemory`): one
worker at a time, in turn, at most once an interval; faked processes and a fake clock. What it
reads of a real forked worker: `tests/e2e/test_worker_memory.py`."""

from __future__ import annotations

import os
from collections import namedtuple
from typing import Any

import psutil

from trainadvisor.measure import sampling

_Full = namedtuple("_Full", "rss uss")


class _Worker:
    def __init__(self, uss: int | None, gone: bool = False) -> None:
        self.uss, self.gone = uss, gone

    def memory_full_info(self) -> Any:
        if self.gone:
            raise psutil.NoSuchProcess(os.getpid())
        return _Full(10 * self.uss, self.uss) if self.uss is not None else namedtuple("_Rss", "rss")(1)


def test_one_worker_is_read_at_a_time_in_turn_at_most_every_interval() -> None:
    """Reading a worker's own memory walks its mappings (8-10 ms): one worker a reading, the
    next one in turn, none until `every_s` has passed; a worker that ended, or a platform
    without the count, gives no reading."""
    memory = sampling.OwnMemory(every_s=0.5)
    workers: list[Any] = [_Worker(100), _Worker(200), _Worker(300)]
    readings = [memory.read(now_s, workers) for now_s in (10.0, 10.2, 10.5, 10.9, 11.0, 11.5, 12.0)]
    assert readings == [100, None, 200, None, 300, 100, 200]
    assert memory.read(13.0, []) is None  # no workers: nothing read, and no turn taken
    assert memory.read(13.0, workers) == 300
    assert sampling.OwnMemory().read(0.0, [_Worker(None, gone=True)]) is None
    assert sampling.OwnMemory().read(0.0, [_Worker(None)]) is None  # no `uss` here


def test_a_reading_that_takes_long_puts_off_the_next_one() -> None:
    """At most 2% of a core: a reading of 25 ms (a process with many mappings) makes the next
    one due 1.25 s later, not 0.5 s."""
    ticks = iter([0.0, 0.025, 2.0, 2.001])  # perf_counter before and after each reading
    memory = sampling.OwnMemory(every_s=0.5, timer=lambda: next(ticks))
    workers: list[Any] = [_Worker(100), _Worker(200)]
    assert [memory.read(now_s, workers) for now_s in (10.0, 10.5, 11.2, 11.25, 11.5)] == [
        100,
        None,
        None,
        200,
        None,
    ]
