"""What a workers trial's waits say: the hand-over of batches loaded ahead, the waits more workers
could hide (exact numbers), torch's iterators asked whether a batch was waiting and how many, and
a window's pace without the batches its workers had queued before it."""

from __future__ import annotations

import queue
from typing import Any

import pytest
from support.runs import raw, trial

from trainadvisor.analyze.run.summary import drained_batches, summarize
from trainadvisor.fixes.loader_waits import handover_ms, hideable_share, loaded_share, wait_share
from trainadvisor.fixes.worker_counts import first_count, hidden_by
from trainadvisor.records import Trial
from trainadvisor.training.loaders import Waiting, loaded_ahead, ready_batches, served_ahead, waiting


def _waited(steps: list[tuple[float, float, bool | None]]) -> Trial:
    """A 16-worker trial whose timed steps took (step ms, wait ms, loaded ahead) each."""
    done = trial(16, 100.0)
    done.raw = raw([s[0] for s in steps], [s[1] for s in steps], workers=16)
    for step, (_, _, loaded) in zip(done.raw.steps, steps):
        step.loaded_ahead = loaded
    return done


def test_the_waits_of_steps_whose_batch_was_loaded_ahead_are_a_hand_over_more_workers_cannot_hide() -> None:
    """Ten 8 ms steps found their batch loaded and waited 2 ms for it; two found none and waited
    12 ms of 18. The hand-over is 2 ms (their median), paid by the two as well: more workers could
    hide 2 x (12 - 2) = 20 ms of the 116."""
    mixed = _waited([(8.0, 2.0, True)] * 10 + [(18.0, 12.0, False)] * 2)
    assert wait_share(mixed) == pytest.approx(44 / 116)
    assert loaded_share(mixed) == pytest.approx(10 / 12)
    assert handover_ms(mixed) == 2.0
    assert hideable_share(mixed) == pytest.approx(20 / 116)


def test_a_loop_whose_every_batch_was_loaded_ahead_has_nothing_for_more_workers_to_hide() -> None:
    """The slow-input example at 16 workers on 2 cores: every step's batch was loaded ahead, and the
    loop still waited about a quarter of each step for their hand-over."""
    kept_up = _waited([(8.0, 2.0, True)] * 8 + [(9.0, 3.0, True)] * 4)
    assert wait_share(kept_up) == pytest.approx(28 / 100)
    assert (loaded_share(kept_up), handover_ms(kept_up), hideable_share(kept_up)) == (1.0, 2.0, 0.0)


def test_waits_that_could_not_be_told_all_count_as_waits_more_workers_could_hide() -> None:
    """No worker queue to ask (no workers, another iterator, macOS): every wait counts; fewer than
    five steps loaded ahead: no hand-over is known, and the other steps' waits count whole."""
    untold = _waited([(8.0, 2.0, None)] * 6)
    assert (loaded_share(untold), handover_ms(untold)) == (None, None)
    assert hideable_share(untold) == wait_share(untold) == pytest.approx(0.25)
    few = _waited([(8.0, 2.0, True)] * 4 + [(10.0, 4.0, False)] * 2)
    assert handover_ms(few) is None
    assert hideable_share(few) == pytest.approx(8 / 52)
    assert hideable_share(trial(16, 100.0)) is None and wait_share(trial(16, 100.0)) is None  # no run


class _Queue:
    """A worker result queue: `size` batches in it, or a platform's that cannot count them."""

    def __init__(self, size: int | None) -> None:
        self.size = size

    def qsize(self) -> int:
        if self.size is None:
            raise NotImplementedError  # macOS's multiprocessing queues
        return self.size


class _Iterator:
    """torch's multiprocessing iterator, as far as `loaded_ahead` reads it."""

    def __init__(self, queued: int | None, held: dict[int, tuple[Any, ...]] | None = None) -> None:
        self._rcvd_idx = 7
        self._task_info = held or {7: (3,)}  # batch 7 asked of worker 3, not back yet
        self._data_queue = _Queue(queued)


def test_a_batch_is_loaded_ahead_where_one_waits_in_the_queue_or_the_one_needed_came_early() -> None:
    assert loaded_ahead(_Iterator(queued=2)) is True
    assert loaded_ahead(_Iterator(queued=0)) is False
    assert loaded_ahead(_Iterator(queued=0, held={7: (3, "batch")})) is True  # out of order, held
    assert loaded_ahead(_Iterator(queued=None)) is None  # a queue that cannot count
    assert loaded_ahead(object()) is None  # no workers: loaded in the loop's own __next__
    assert loaded_ahead(_Iterator(queued=0, held={8: (2, "batch")})) is False  # a later one came early
    odd = _Iterator(queued=1)
    odd._task_info = {7: object()}  # another torch's bookkeeping: told from the queue
    assert loaded_ahead(odd) is True
    odd._data_queue = None  # type: ignore[assignment]
    assert loaded_ahead(odd) is None
    thread_queue: queue.Queue[int] = queue.Queue()  # a pin-memory thread's queue
    thread_queue.put(1)
    iterator = _Iterator(queued=0)
    iterator._data_queue = thread_queue  # type: ignore[assignment]
    assert loaded_ahead(iterator) is True


def test_a_batch_served_was_loaded_ahead_only_where_the_reads_to_reach_it_were_queued() -> None:
    """torch serves batches in order: the loop reads the queue until the one it needs comes, and
    holds those that came before it; a batch queued that was not the one needed leaves the loop
    waiting for its worker."""
    asked = _Iterator(queued=1)  # one batch queued; batch 7 asked of worker 3, not back yet
    before = waiting(asked)
    assert before == Waiting(True, 1, 1, 0)
    asked._task_info = {8: (2, "batch")}  # batch 7 served; the queued one was batch 8: now held
    assert served_ahead(before, asked) is False  # read 2 to reach it, 1 was queued
    asked._task_info = {}  # the queued one was batch 7 itself
    assert served_ahead(before, asked) is True
    three = _Iterator(queued=3)
    before = waiting(three)
    three._task_info = {8: (2, "batch"), 9: (1, "batch")}  # read 3 to reach it, all queued
    assert served_ahead(before, three) is True
    held = _Iterator(queued=0, held={7: (3, "batch"), 9: (1, "batch")})  # the one needed came early
    before = waiting(held)
    held._task_info = {9: (1, "batch")}  # served from those held: nothing read
    assert before.loaded_ahead is True and served_ahead(before, held) is True
    assert served_ahead(waiting(_Iterator(queued=0)), _Iterator(queued=0)) is False  # none loaded
    assert served_ahead(waiting(object()), object()) is None  # no workers
    uncounted = waiting(_Iterator(queued=None, held={7: (3, "batch")}))  # a queue that cannot count
    assert uncounted.loaded_ahead is True and served_ahead(uncounted, object()) is True
    odd = _Iterator(queued=1)
    before = waiting(odd)
    odd._task_info = None  # type: ignore[assignment]  # gone after the draw: as told before it
    assert served_ahead(before, odd) is True


def test_the_batches_waiting_are_those_queued_and_those_held_out_of_order() -> None:
    assert ready_batches(_Iterator(queued=3)) == 3
    assert ready_batches(_Iterator(queued=2, held={7: (3,), 8: (2, "batch"), 9: (1, "batch")})) == 4
    assert ready_batches(_Iterator(queued=None)) is None  # a queue that cannot count
    assert ready_batches(object()) is None  # no workers


def _queued(step_ms: list[float], ready: list[int | None]) -> Trial:
    """An 8-worker window whose timed steps took `step_ms` and found `ready` batches waiting."""
    done = trial(8, 0.0)
    done.raw = raw(step_ms, [1.0] * len(step_ms), workers=8)
    for step, count in zip(done.raw.steps, ready):
        step.ready_batches = count
    return done


def test_a_window_that_ran_on_batches_queued_before_it_counts_only_what_its_workers_kept_up_with() -> None:
    """Beside a busy core: 20 steps of 25 ms (0.5 s, 40 steps/s) began with 12 batches waiting
    and ended with 2; 10 of its steps ran on batches loaded before it, and its workers kept up
    with 10 in 0.5 s: 20 steps/s, in each of its windows too, and per sample."""
    drained = _queued([25.0] * 20, [12, *[5] * 18, 2])
    assert drained_batches(drained.raw.steps) == 10
    run = summarize(drained.raw)
    assert run.steps_per_s == pytest.approx(20.0)
    assert run.samples_per_s == pytest.approx(20.0 * 32)
    assert run.window_steps_per_s and all(rate == pytest.approx(20.0) for rate in run.window_steps_per_s)


@pytest.mark.parametrize(
    ("ready", "drained"),
    [
        ([2, *[5] * 18, 12], 0),  # the queue grew: the loop set the pace, which counts whole
        ([4, *[0] * 18, 4], 0),  # as many waiting at the end as at the start
        ([None, *[5] * 18, 2], 0),  # not told at the first step
        ([30, *[5] * 18, 0], 19),  # at most all but one step: a pace is left to measure
    ],
)
def test_a_window_whose_queue_held_or_grew_or_was_not_told_counts_every_step(
    ready: list[int | None], drained: int
) -> None:
    window = _queued([25.0] * 20, ready)
    assert drained_batches(window.raw.steps) == drained
    assert summarize(window.raw).steps_per_s == pytest.approx(40.0 * (20 - drained) / 20)


def test_the_count_that_would_hide_a_wait_doubles_up_to_it_within_its_bounds() -> None:
    """2 loaders that left the loop waiting 75% of each step: 2 / 0.25 = 8 would hide it; the
    doubling from 4 reaches 8, or stops at its most. A script without workers whose training
    process mostly waited (30% of a core busy, 87% of each step waiting) starts at 8, not 2."""
    assert hidden_by(2, 0.75, 4, 32) == 8 and hidden_by(2, 0.75, 4, 4) == 4
    values = {"num_workers": 0, "cpu_count": 2, "main_process_cpu_pct": 30.0, "data_wait_pct": 87.0}
    assert first_count(values, 0) == 8
    assert first_count({**values, "main_process_cpu_pct": 190.0}, 0) == 2  # its loading computed
