"""The measuring window, driven by a fake clock: exact numbers, no sleeps."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace as dataclasses_replace
from pathlib import Path
from typing import Any

import pytest
import torch
from support.window import FakeClock, FakeProfiler, fake_async_compile

from trainadvisor.advising.advisor import Advisor
from trainadvisor.measure.config import ChildConfig
from trainadvisor.measure.settle import NOISE_TOLERANCE_MAX, Blocks, Settling, noise_tolerance, relative_se
from trainadvisor.training import hooks
from trainadvisor.training.window import Window
from trainadvisor.training.window_plan import WindowPlan


def _rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Clock arithmetic in float seconds: compare milliseconds to a nanosecond."""
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]


def _step(window: Window, clock: FakeClock, data_ms: float, compute_ms: float, loss: float) -> None:
    clock.advance(data_ms)
    window.add_data_wait(data_ms / 1e3)
    window.add_batch(4, f"batch{window.steps_done}")
    clock.advance(compute_ms / 2)
    window.mark_backward()
    window.set_loss(torch.tensor(loss))
    clock.advance(compute_ms / 2)
    window.boundary()


def test_warmup_then_timed_then_traced_steps_with_exact_times() -> None:
    clock = FakeClock()
    profilers: list[FakeProfiler] = []
    opened: list[int] = []
    window = Window(
        WindowPlan(warmup=2, steps=3, profile_steps=2),
        clock.clock(),
        on_open=lambda w: opened.append(w.steps_done) or {"cuda_used": False},
        profiler=lambda steps, stack: profilers.append(FakeProfiler(steps, stack)) or profilers[-1],
    )
    for i in range(2):
        _step(window, clock, 1.0, 4.0, loss=10.0 + i)
    assert window.phase == "timed" and opened == [2] and window.start_unix_s == 1_700_000_000.0 + 100.010
    for i in range(3):
        _step(window, clock, 2.0 * (i + 1), 6.0, loss=20.0 + i)
    assert window.phase == "traced" and profilers[0].steps == 2 and not profilers[0].with_stack
    for i in range(3):  # the profiler's warmup step, then the 2 it records
        _step(window, clock, 1.0, 1.0, loss=30.0 + i)
    assert window.phase == "done" and profilers[0].stepped == 2
    _step(window, clock, 1.0, 1.0, loss=99.0)  # after the window: nothing recorded
    rows = [(r.index, r.start_ms, r.step_ms, r.data_wait_ms, r.samples, r.profiled) for r in window.records]
    assert _rounded(rows) == (
        [
            (2, 0.0, 8.0, 2.0, 4, False),
            (3, 8.0, 10.0, 4.0, 4, False),
            (4, 18.0, 12.0, 6.0, 4, False),
            (5, 30.0, 2.0, 1.0, 4, True),
            (6, 32.0, 2.0, 1.0, 4, True),
            (7, 34.0, 2.0, 1.0, 4, True),
        ]
    )
    assert [round(r.pre_backward_ms or 0, 6) for r in window.records[:3]] == [5.0, 7.0, 9.0]
    assert window.stop_profiler() is profilers[0] and profilers[0].stopped
    assert window.read_back() == [10.0, 11.0, 20.0, 21.0, 22.0, 30.0, 31.0, 32.0]
    assert [r.loss for r in window.records] == [20.0, 21.0, 22.0, 30.0, 31.0, 32.0]
    assert window.batch_fingerprints[:3] == ["batch0", "batch1", "batch2"]
    assert window.facts.runtime == {
        "cuda_used": False,
        "optimizers": 0,
        "switched": {"autocast_outputs": 0, "non_blocking_copies": 0},
        # the profiler's warm-up step was counted: these steps did no torch work
        "flops_status": "not counted: the step dispatched no matmul, convolution or attention",
        "memory": {"status": "not measured: no optimizer stepped before the counted step"},
    }


def test_a_sequence_of_windows_numbers_steps_on_and_pads_the_losses() -> None:
    clock = FakeClock()
    first = Window(WindowPlan(warmup=1, steps=2), clock.clock())
    for _ in range(3):
        _step(first, clock, 0.0, 5.0, loss=1.0)
    assert first.phase == "done"
    second = Window(WindowPlan(warmup=2, steps=2), clock.clock(), first_index=3)
    for _ in range(4):
        _step(second, clock, 3.0, 5.0, loss=2.0)
    assert _rounded([(r.index, r.step_ms, r.data_wait_ms) for r in second.records]) == (
        [(5, 8.0, 3.0), (6, 8.0, 3.0)]
    )
    assert second.read_back() == [None, None, None, 2.0, 2.0, 2.0, 2.0]


def test_a_failed_step_is_dropped_and_no_warmup_opens_at_once() -> None:
    clock = FakeClock()
    window = Window(WindowPlan(warmup=0, steps=2), clock.clock())
    assert window.phase == "timed"
    clock.advance(50.0)
    window.add_data_wait(0.050)
    window.restart_step()  # the step raised: its 50 ms are not a step's
    clock.advance(4.0)
    window.boundary()
    assert _rounded([(r.step_ms, r.data_wait_ms) for r in window.records]) == ([(4.0, 0.0)])


def test_a_step_is_loaded_ahead_where_every_batch_it_drew_was_waiting_for_it() -> None:
    """Each draw says whether its batch was loaded ahead (None: it could not tell): a step whose
        draws all were is loaded ahead, one with a draw that was not is not, one told of none is None;
    and how many batches were waiting, summed over its draws."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=0, steps=4), clock.clock())
    for draws in ([(True, 3)], [(True, 1), (False, 0)], [(None, None)], [(True, 2), (None, None), (True, 4)]):
        for ready, count in draws:
            window.add_data_wait(0.002, ready, count)
        clock.advance(8.0)
        window.boundary()
    assert [r.loaded_ahead for r in window.records] == [True, False, None, True]
    assert [r.ready_batches for r in window.records] == [3, 1, None, 6]  # summed over the loaders told
    assert _rounded([(r.step_ms, r.data_wait_ms) for r in window.records][:2]) == [(8.0, 2.0), (8.0, 4.0)]


def _config(tmp_path: Path, warmup: int, steps: int) -> ChildConfig:
    return ChildConfig("t", str(tmp_path / "r.json"), None, warmup, steps, 0, False, None)


def test_backward_ends_steps_until_an_optimizer_is_built(tmp_path: Path) -> None:
    """A loop that updates by hand: each backward() of a scalar ends a step. Once an optimizer
    exists its steps count instead, from zero again (no step counted twice)."""
    clock = FakeClock()
    recorder = hooks.Recorder(_config(tmp_path, warmup=5, steps=2), clock.clock())
    weight = torch.ones(3, requires_grad=True)
    for _ in range(3):
        clock.advance(2.0)
        recorder.loss_candidate((weight * 2).sum())
        recorder.backward_done()
    assert (recorder.step_source, recorder.steps_seen, recorder.window.steps_done) == ("backward", 3, 3)
    recorder.optimizer_built()
    assert (recorder.step_source, recorder.steps_seen, recorder.window.steps_done) == ("optimizer", 0, 0)
    assert recorder.window.loss is not None  # the step that ends now keeps its backward()'s loss


def test_the_recorder_writes_the_windows_run(tmp_path: Path) -> None:
    clock = FakeClock()
    recorder = hooks.Recorder(_config(tmp_path, warmup=1, steps=2), clock.clock())
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    for _ in range(3):
        clock.advance(5.0)
        recorder.data_wait(0.002, (torch.zeros(8, 2), torch.zeros(8)))
        recorder.loss_candidate(torch.tensor(0.5))
        recorder.optimizer_step(optimizer)
    raw = recorder.result
    assert raw is not None and raw.status == "window_complete" and raw.steps_seen == 3
    assert _rounded([(s.index, s.step_ms, s.data_wait_ms, s.samples) for s in raw.steps]) == (
        [(1, 5.0, 2.0, 8), (2, 5.0, 2.0, 8)]
    )
    assert raw.losses == [0.5, 0.5, 0.5] and raw.runtime["optimizer"] == "SGD"
    assert raw.window_start_unix_s == 1_700_000_000.0 + 100.005
    assert all(f and f.startswith("(8, 2):float32") for f in raw.batch_fingerprints)


def _quiet(_: str) -> None:
    pass


def test_advise_times_the_gap_between_calls_outside_the_function_not_as_data_wait(tmp_path: Path) -> None:
    clock = FakeClock()
    advisor = Advisor(
        warmup=2, steps=3, out=tmp_path / "r", echo=_quiet, clock=clock.clock(), min_time=0.0, max_warmup=None
    )
    advisor._start_profiler = lambda: None  # type: ignore[method-assign]

    def step(batch: torch.Tensor) -> dict[str, Any]:
        clock.advance(4.0)  # the step's compute
        return {"loss": torch.tensor(float(batch.shape[0]))}

    advised = advisor(step)
    for i in range(5):
        clock.advance(10.0 * (i + 1))  # the loop fetching the next batch
        advised(torch.zeros(16, 3))
    advisor.outside_calls(advisor.window)
    records = advisor.window.records
    rows = [(r.index, r.step_ms, r.data_wait_ms, r.outside_call_ms, r.samples) for r in records]
    # no DataLoader fetched anything: no data wait; the gap is the loop's, outside the function
    assert _rounded(rows) == ([(2, 34.0, 0.0, 30.0, 16), (3, 44.0, 0.0, 40.0, 16), (4, 54.0, 0.0, 50.0, 16)])
    advisor.close()


# ---- the window at GPU speed: warm-up until steady, a time floor, the steps the script has ----

SETTLE = Settling(block_s=0.010, block_steps=5, blocks=3, tolerance=0.10, max_s=1.0)


def _steps(window: Window, clock: FakeClock, step_ms: list[float]) -> None:
    for ms in step_ms:
        clock.advance(ms)
        window.set_loss(torch.tensor(ms))
        window.boundary()


def test_the_warmup_lasts_until_three_blocks_agree_then_steps_are_timed_for_the_time_floor() -> None:
    """A loop that starts slow and settles: 2 minimum warm-up steps (left out of the blocks),
    then blocks of 5 steps and 10 ms. At 4 ms/step the first blocks take 4, 3, 2 ms per step;
    once three blocks agree within 10% (1.0, 1.0, 1.0 ms) the timed steps begin, and they go on
    past their 4 steps until 20 ms have passed."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=2, steps=4, min_time_s=0.020, settle=SETTLE), clock.clock())
    _steps(window, clock, [50.0, 50.0])  # the minimum warm-up: compilation, say
    _steps(window, clock, [4.0] * 5 + [3.0] * 5 + [2.0] * 5)
    assert window.phase == "warmup" and window.blocks is not None
    assert [round(ms, 6) for ms in window.blocks.block_ms] == [4.0, 3.0, 2.0]
    _steps(window, clock, [1.0] * 30)  # 10 steps per 10 ms block from here
    assert window.phase == "timed"
    shape = window.shape
    assert (shape.warmup_steps, shape.warmup_end) == (47, "settled")
    assert [round(ms, 6) for ms in shape.block_ms] == [4.0, 3.0, 2.0, 1.0, 1.0, 1.0]
    assert round(shape.warmup_s, 6) == 0.175
    _steps(window, clock, [1.0] * 19)
    assert window.phase == "timed" and len(window.records) == 19  # 4 steps, but only 19 ms
    _steps(window, clock, [1.0])
    assert window.phase == "done" and len(window.records) == 20
    assert (round(window.shape.timed_s, 6), window.shape.timed_end) == (0.020, "plan")


def test_a_warmup_that_never_settles_ends_at_its_cap_and_says_so() -> None:
    clock = FakeClock()
    window = Window(WindowPlan(warmup=1, steps=2, settle=SETTLE), clock.clock())
    pace = [10.0 * 1.05**i for i in range(200)]  # slower by 5% each step: each block 28% slower
    for ms in pace:
        if window.phase != "warmup":
            break
        _steps(window, clock, [ms])
    assert window.phase == "timed"
    assert window.shape.warmup_end == "time cap" and window.shape.warmup_s >= 1.0


def test_a_loop_whose_steps_vary_by_chance_settles_on_blocks_that_agree_as_closely_as_chance_allows() -> None:
    """Steps of 5, 10 and 20 ms in turn (DataLoader workers' bursts): blocks of 5 steps take 12, 11
    and 13 ms per step, their level unchanged. Within 10% they never agree; the first block's mean
    has a relative standard error of 0.25 (three of them: past the cap of 0.30), so they agree
    within 30%: settled after three blocks, as a regular loop would be."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=1, steps=2, settle=SETTLE), clock.clock())
    _steps(window, clock, [10.0])  # the counted warm-up step
    _steps(
        window,
        clock,
        [5.0, 20.0, 10.0, 5.0, 20.0] + [10.0, 5.0, 20.0, 10.0, 10.0] + [20.0, 10.0, 5.0, 20.0, 10.0],
    )
    assert window.blocks is not None
    assert [round(ms, 6) for ms in window.blocks.block_ms] == [12.0, 11.0, 13.0]
    assert window.phase == "timed" and window.shape.warmup_end == "settled"
    assert window.blocks.tolerance() == NOISE_TOLERANCE_MAX
    # blocks of regular steps keep the tolerance as it is: 12, 11, 13 ms of alike steps never settle
    regular = Blocks(SETTLE)
    for ms in [12.0] * 5 + [11.0] * 5 + [13.0] * 5:
        regular.add(ms / 1e3)
    assert regular.block_rse == [0.0, 0.0, 0.0] and not regular.settled and regular.tolerance() == 0.10


def test_the_relative_standard_error_of_a_blocks_mean() -> None:
    # steps 5, 20, 10, 5, 20: mean 12, variance (49 + 64 + 4 + 49 + 64) / 5 = 46, sqrt(46 / 5) / 12
    assert relative_se([5.0, 20.0, 10.0, 5.0, 20.0]) == pytest.approx(math.sqrt(46 / 5) / 12)
    assert relative_se([7.0]) == 0.0 and relative_se([]) == 0.0
    assert noise_tolerance(SETTLE, 0.02) == 0.10  # 3 x 0.02 is less than the tolerance
    assert noise_tolerance(SETTLE, 0.05) == pytest.approx(0.15)
    assert noise_tolerance(SETTLE, 0.5) == NOISE_TOLERANCE_MAX


def test_a_cold_compile_in_the_counted_warmup_leaves_the_loop_its_whole_time_to_settle() -> None:
    """The first warm-up step compiles for 90 s (a real model's cold compile), far past the
    1 s cap: the cap counts from the end of the counted steps, so the loop's steady 2 ms steps
    settle in three blocks of 5 (a warm-up of 90.032 s) instead of being timed at once."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=2, steps=2, settle=SETTLE), clock.clock())
    _steps(window, clock, [90_000.0, 2.0])
    assert window.phase == "warmup"
    while window.phase == "warmup":
        _steps(window, clock, [2.0])
    assert window.shape.warmup_end == "settled" and round(window.shape.warmup_s, 6) == 90.032


def _starting_pool(monkeypatch: pytest.MonkeyPatch) -> Future[str]:
    """torch's AsyncCompile as inductor leaves it at a first compile: its pool's first job pending."""
    first: Future[str] = Future()
    fake_async_compile(monkeypatch, first)
    return first


def test_steps_beside_inductors_starting_compile_pool_stay_out_of_the_warmup_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compiled loop runs 12 ms steps while torch's compile pool starts beside it (its sidecar
    forking workers on a core the loop's threads need), 2 ms once the pool is up: three blocks of
    12 ms would have settled; the warm-up leaves them out and settles on the 2 ms steps, its
    settling counted from the pool's end."""
    first = _starting_pool(monkeypatch)
    clock = FakeClock()
    window = Window(WindowPlan(warmup=2, steps=2, settle=SETTLE), clock.clock())
    _steps(window, clock, [500.0, 2.0])  # the compile, in the counted steps
    _steps(window, clock, [12.0] * 20)
    assert window.phase == "warmup" and window.blocks is not None and window.blocks.block_ms == []
    first.set_result("ready")
    _steps(window, clock, [2.0] * 15)
    assert window.phase == "timed" and window.shape.warmup_end == "settled"
    assert [round(ms, 6) for ms in window.shape.block_ms] == [2.0, 2.0, 2.0]
    assert (window.shape.warmup_steps, round(window.shape.settle_s or 0, 6)) == (37, 0.030)
    assert window.pool.facts() == {"pool_start_wait_s": 0.24, "pool_start_steps": 20}


def test_a_compile_pool_that_never_starts_holds_the_warmup_within_its_time_cap_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool's first job never answers: the warm-up's cap (1 s here) still counts from the end
    of the counted steps, so timing begins there, and the facts say the pool was still starting."""
    _starting_pool(monkeypatch)
    clock = FakeClock()
    window = Window(WindowPlan(warmup=2, steps=2, settle=SETTLE), clock.clock())
    _steps(window, clock, [500.0, 2.0])
    while window.phase == "warmup":
        _steps(window, clock, [12.0])
    assert (window.shape.warmup_end, window.shape.warmup_steps) == ("time cap", 2 + 84)  # 84 x 12 ms
    assert window.pool.facts() == {
        "pool_start_wait_s": 0.996,  # 83 steps: the 84th ends past the cap
        "pool_start_steps": 83,
        "pool_starting_when_timed": True,
    }


def test_the_settle_cap_counts_from_the_pools_start_up_and_the_step_cap_from_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trial's settle cap (50 ms of blocks) begins once the pool is up: 240 ms of start-up do
    not use it. The step cap of a script with 90 steps to spare (a third: 30 warm-up steps) counts
    every step, the left-out ones too, and may open the timed steps mid-start-up: the facts say so."""
    first = _starting_pool(monkeypatch)
    clock = FakeClock()
    capped = dataclasses_replace(SETTLE, blocks_max_s=0.050)
    window = Window(WindowPlan(warmup=2, steps=2, settle=capped), clock.clock())
    _steps(window, clock, [500.0, 2.0])
    _steps(window, clock, [12.0] * 20)
    first.set_result("ready")
    while window.phase == "warmup":
        _steps(window, clock, [2.0, 6.0])  # never three blocks alike within 10%
    assert window.shape.warmup_end == "settle cap" and round(window.shape.settle_s or 0, 6) == 0.056
    _starting_pool(monkeypatch)
    short = Window(WindowPlan(warmup=2, steps=2, settle=SETTLE, max_steps=90), clock.clock())
    _steps(short, clock, [500.0, 2.0])
    while short.phase == "warmup":
        _steps(short, clock, [12.0])
    assert (short.shape.warmup_end, short.shape.warmup_steps) == ("step cap", 30)
    assert short.pool.facts()["pool_starting_when_timed"] is True


def test_a_window_without_counted_steps_leaves_the_pools_start_up_out_from_its_opening(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = _starting_pool(monkeypatch)
    clock = FakeClock()
    window = Window(WindowPlan(warmup=0, steps=2, settle=SETTLE), clock.clock())
    _steps(window, clock, [12.0] * 10)
    first.set_result("ready")
    _steps(window, clock, [2.0] * 15)
    assert window.shape.warmup_end == "settled" and window.pool.facts()["pool_start_steps"] == 10


def test_where_the_script_has_few_steps_left_the_window_ends_with_them() -> None:
    """max_steps 30: the warm-up may take a third of them (10), the timed ones end at step 30
    even though their time floor (1 s) is not reached."""
    clock = FakeClock()
    window = Window(
        WindowPlan(warmup=2, steps=10, min_time_s=1.0, settle=SETTLE, max_steps=30), clock.clock()
    )
    _steps(window, clock, [4.0, 8.0] * 5)  # never settles
    assert window.phase == "timed" and window.shape.warmup_end == "step cap"
    assert window.shape.warmup_steps == 10
    _steps(window, clock, [1.0] * 20)
    assert window.phase == "done" and len(window.records) == 20
    assert window.shape.timed_end == "step cap"


def test_a_window_the_scripts_end_cuts_short_keeps_what_it_timed() -> None:
    clock = FakeClock()
    window = Window(WindowPlan(warmup=1, steps=100, min_time_s=10.0), clock.clock())
    _steps(window, clock, [3.0] * 13)
    window.cut_short()
    assert (len(window.records), window.shape.timed_end) == (12, "script ended")
    assert round(window.shape.timed_s, 6) == 0.036


def test_a_memory_step_the_scripts_end_cuts_short_is_not_taken_for_a_step() -> None:
    """The script ended inside the untimed step after the timed ones: what its memory counter
    saw is part of a step, so the run records that nothing was measured (a trial whose peak was
    a part step's once read 3.3 MB for a 24 MB step, and a batch size passed for fitting)."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=1, steps=3, memory_step=True), clock.clock())
    _steps(window, clock, [3.0] * 4)
    assert window.phase == "traced" and window.memory is not None
    assert window.stop_profiler() is None  # the script ended here
    assert window.facts.runtime["memory"] == {
        "status": "not measured: the script ended inside the counted step"
    }
    assert window.memory is None


def test_the_loss_is_copied_at_backward_so_a_buffer_overwritten_later_is_read_as_it_was() -> None:
    """Under CUDA graphs (torch.compile's reduce-overhead mode) the loss is a static buffer the
    next replay overwrites; a view of it would read the last value for every step."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=0, steps=3), clock.clock())
    buffer = torch.zeros(())
    for value in (1.0, 2.0, 3.0):
        buffer.fill_(value)  # the replay writes its output into the same memory
        window.set_loss(buffer)
        clock.advance(1.0)
        window.boundary()
    assert window.read_back() == [1.0, 2.0, 3.0]


class _Unreadable(torch.Tensor):
    """A loss whose read-back raises, as reading an overwritten CUDA-graph output does."""

    def item(self) -> float:  # type: ignore[override]
        raise RuntimeError("Error: accessing tensor output of CUDAGraphs that has been overwritten")


def test_a_loss_that_cannot_be_read_is_left_out_and_the_window_kept() -> None:
    clock = FakeClock()
    window = Window(WindowPlan(warmup=0, steps=2), clock.clock())
    for _ in range(2):
        clock.advance(1.0)
        window.boundary()
    window.losses = [torch.tensor(1.0).as_subclass(_Unreadable), torch.tensor(2.0)]
    assert window.read_back() == [None, 2.0]
    assert [r.loss for r in window.records] == [None, 2.0]


def test_a_plateau_the_warmup_settled_on_is_left_out_when_the_loop_speeds_up_while_timed() -> None:
    """Three 10 ms blocks of 5 ms steps look settled; then the loop speeds up to 1 ms per step.
    The timed steps' halves differ beyond 10%: the first half becomes warm-up and timing goes
    on until both halves agree."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=1, steps=10, min_time_s=0.030, settle=SETTLE), clock.clock())
    _steps(window, clock, [5.0] * 16)  # 1 + three blocks of 5 steps (25 ms each)
    assert window.phase == "timed" and window.shape.warmup_end == "settled"
    _steps(window, clock, [5.0] * 2 + [1.0] * 200)
    assert window.phase == "done"
    # 22 timed steps reach 30 ms (5, 5, then 1 ms each): halves of 1.73 and 1.0 ms per step
    assert (window.shape.slid_steps, window.shape.warmup_steps) == (11, 27)
    assert len(window.records) == 30 and {round(r.step_ms, 6) for r in window.records} == {1.0}
    assert round(window.records[0].start_ms, 6) == 0.0 and round(window.shape.timed_s, 6) == 0.030


def test_timed_halves_that_differ_by_chance_do_not_start_the_timing_over() -> None:
    """Timed halves of 3.5 and 4.0 ms per step (14% apart): of bursty steps (a 11 or 14 ms stall
    among 2 ms steps) that is chance, and the window ends as planned; of alike steps it is a
    change, and the first half becomes warm-up."""
    for timed, slides in (([2.0] * 5 + [11.0] + [2.0] * 5 + [14.0], 0), ([3.5] * 6 + [4.0] * 6, 1)):
        clock = FakeClock()
        window = Window(WindowPlan(warmup=1, steps=12, settle=SETTLE), clock.clock())
        _steps(window, clock, [5.0] * 16)
        assert window.phase == "timed"
        _steps(window, clock, timed)
        assert window.slides == slides, timed
        assert (window.phase == "done") is (slides == 0)


def test_a_loop_with_a_period_longer_than_a_block_settles_on_longer_blocks() -> None:
    """Every 12th step takes 30 ms (a DataLoader rebuilt every short epoch forks its workers
    anew): blocks of the first size never agree, so after six of them the blocks double, and
    blocks spanning the period agree."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=1, steps=2, settle=SETTLE), clock.clock())
    steps = 0
    while window.phase == "warmup" and steps < 1000:
        _steps(window, clock, [30.0 if steps % 12 == 11 else 1.0])
        steps += 1
    assert (steps, window.shape.warmup_end, window.blocks and window.blocks.scale) == (84, "settled", 2)
    assert [round(ms, 3) for ms in window.shape.block_ms[-3:]] == [3.417, 3.417, 3.417]


def _fed(window: Window, clock: FakeClock, steps: list[tuple[float, bool, int]]) -> None:
    """Steps of (ms, whether its batch was loaded ahead, the batches waiting when it was drawn)."""
    for ms, ready, count in steps:
        window.add_data_wait(0.0, ready, count)
        clock.advance(ms)
        window.set_loss(torch.tensor(ms))
        window.boundary()


def test_blocks_of_a_loop_its_workers_keep_ahead_of_end_at_the_settlings_own_size() -> None:
    """8 workers: blocks of 16 steps (two rounds), or of 5 steps and 10 ms where every step found
    its batch loaded ahead and the batches waiting at the block's last step are fewer than at its
    first by at most 10% (the tolerance) of a batch a step. Steps of 2 ms among 30, 29, 30, 31, 30
    waiting batches: blocks of 5 steps, settled after 15; where one batch of each 5 was not loaded
    ahead, blocks of 16; where the batches waiting dipped by one at the 5th step (more than 0.5)
    and came back at the 6th, blocks of 6; where, at 1 ms a step, they dip by one every 10 steps
    from the 6th on (one fewer at a block's 10th step is within 1.0), blocks of 10 steps, the
    least that last 10 ms."""
    settle = SETTLE.for_workers(8)
    assert (settle.block_steps, settle.fed_steps) == (16, 5)
    cases = {
        "fed": [30, 29, 30, 31, 30],
        "one waited on": [30, 29, 30, None, 30],
        "dipped": [30, 29, 30, 31, 29, 30],
        "slowly draining": [],
    }
    shapes = {}
    for name, counts in cases.items():
        clock = FakeClock()
        window = Window(WindowPlan(warmup=1, steps=2, settle=settle), clock.clock())
        _fed(window, clock, [(2.0, True, 30)])  # the counted warm-up step
        steps = [(2.0, count is not None, count or 0) for count in counts * 20]
        if not counts:
            steps = [(1.0, True, 50 - (i + 5) // 10) for i in range(100)]
        while window.phase == "warmup":
            _fed(window, clock, [steps.pop(0)])
        blocks_ms = [round(ms, 6) for ms in window.shape.block_ms]
        shapes[name] = (window.shape.warmup_steps, window.shape.warmup_end, blocks_ms)
    assert shapes == {
        "fed": (16, "settled", [2.0, 2.0, 2.0]),
        "one waited on": (49, "settled", [2.0, 2.0, 2.0]),
        "dipped": (19, "settled", [2.0, 2.0, 2.0]),
        "slowly draining": (31, "settled", [1.0, 1.0, 1.0]),
    }


def test_a_buffer_the_loop_drains_is_waited_out_in_blocks_of_two_rounds() -> None:
    """A fresh run's first steps take the batches its 8 workers loaded ahead (2 ms steps, 40
    waiting, one fewer each step) until the buffer is empty; then each step waits on the workers
    (4 ms). Blocks of 5 steps would agree on the draining (2, 2, 2 ms) and time it: the batches
    waiting shrink over each block, so the blocks are two rounds long, and the warm-up settles on
    the loop's own 4 ms."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=1, steps=2, settle=SETTLE.for_workers(8)), clock.clock())
    _fed(window, clock, [(2.0, True, 41)])
    _fed(window, clock, [(2.0, True, 40 - i) for i in range(40)])
    while window.phase == "warmup":
        _fed(window, clock, [(4.0, False, 0)])
    assert [round(ms, 6) for ms in window.shape.block_ms] == [2.0, 2.0, 3.0, 4.0, 4.0, 4.0]
    assert (window.shape.warmup_steps, window.shape.warmup_end) == (97, "settled")
    _fed(window, clock, [(4.0, False, 0)] * 2)
    assert [round(r.step_ms, 6) for r in window.records] == [4.0, 4.0]


def test_the_timed_steps_start_over_at_most_twice() -> None:
    """A loop that keeps slowing down (each step 2% slower than the last) never has timed halves
    that agree: the timed steps start over twice, then are timed as they are."""
    clock = FakeClock()
    window = Window(WindowPlan(warmup=1, steps=10, settle=SETTLE), clock.clock())
    _steps(window, clock, [5.0] * 16)
    assert window.phase == "timed" and window.shape.warmup_end == "settled"
    step_ms = 5.0
    while window.phase != "done":
        step_ms *= 1.02
        _steps(window, clock, [step_ms])
    assert (window.slides, window.shape.slid_steps, len(window.records)) == (2, 10, 10)


@pytest.mark.parametrize("steps_after_timed, kept", [(1, False), (2, True)])
def test_a_trace_the_scripts_end_left_without_a_whole_step_is_dropped(
    steps_after_timed: int, kept: bool
) -> None:
    """The script ended inside the profiler's warm-up step or right after it: the trace would
    hold only its last moments under a step marker (a training loop read as inference once, its
    training rules silenced), so there is none; one recorded step later, there is one."""
    clock, profiler = FakeClock(), FakeProfiler(5, False)
    plan = WindowPlan(warmup=1, steps=2, profile_steps=5)
    window = Window(plan, clock.clock(), profiler=lambda *_: profiler)
    _steps(window, clock, [3.0] * (1 + 2 + steps_after_timed))
    assert window.phase == "traced" and window.traced_whole() == steps_after_timed - 1
    assert (window.stop_profiler() is profiler, profiler.stopped) == (kept, True)


def test_the_memory_step_of_a_compiled_loop_leaves_dynamo_free_to_compile_a_new_shape() -> None:
    """The counted step's memory is measured under a dispatch mode, inside which dynamo skips any
    frame it must compile, and the skip sticks: a compiled model meeting a new shape on that step
    ran eager from then on. A loop that runs compiled code is not measured for memory, and says
    why; the new shape compiles (dynamo's own count of graphs grows)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = torch.nn.Linear(8, 4)
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    clock = FakeClock()
    window = Window(WindowPlan(warmup=1, steps=2, memory_step=True), clock.clock())

    def step(batch: int) -> None:
        loss = compiled(torch.randn(batch, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        window.optimizer_stepped(optimizer, counted=True)
        clock.advance(1.0)
        window.boundary()

    for _ in range(3):
        step(16)
    assert window.phase == "traced" and counters["stats"]["unique_graphs"] == 1
    step(12)  # the counted step meets a new shape
    assert window.phase == "done"
    assert window.facts.runtime["memory"]["status"].startswith(
        "not measured: the step runs code torch.compile"
    )
    step(12)
    assert counters["stats"]["unique_graphs"] == 2  # compiled, not skipped


@pytest.fixture(autouse=True)
def _dynamo_left_as_found() -> Iterator[None]:
    """dynamo's counters outlive `torch._dynamo.reset()`: a test that compiles clears them, or a
    later test in the same worker reads its step as compiled code (no FLOPs counted)."""
    yield
    if "torch._dynamo.utils" in sys.modules:
        torch._dynamo.reset()
        sys.modules["torch._dynamo.utils"].counters.clear()
