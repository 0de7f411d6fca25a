"""Trials that race and warm-ups capped from the baseline's settling (issue 36), driven by a fake
clock and exact step times: which window stops where, and why."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from support.race import _run, _windows_at
from support.window import FakeClock

from trainadvisor import _serial
from trainadvisor.measure.config import WindowCommand
from trainadvisor.measure.settle import Settling
from trainadvisor.profile import pace
from trainadvisor.profile.runs import ProfileOptions, size_for
from trainadvisor.records import Overrides, RawRun, StepRecord, Trial, WindowShape
from trainadvisor.training.hooks import window_plan
from trainadvisor.training.window import Window
from trainadvisor.training.window_plan import WindowPlan

# blocks of 5 steps and 10 ms, three alike within 10% settle, at most 1 s of warm-up
SETTLE = Settling(block_s=0.010, block_steps=5, blocks=3, tolerance=0.10, max_s=1.0)


def _steps(window: Window, clock: FakeClock, step_ms: list[float]) -> None:
    for ms in step_ms:
        if window.phase == "done":
            return
        clock.advance(ms)
        window.set_loss(torch.tensor(ms))
        window.boundary()


def test_a_window_that_cannot_reach_the_best_so_far_stops_in_its_warmup() -> None:
    """Unsettled blocks of 2.0, 2.4 and 2.0 ms a step (500, 417, 500 steps/s) against a best of
    1,000: even 25% faster they lose, and the loop is not speeding up; after the third block
    the window times one block's worth (5 steps, 10 ms) and ends there, its time floor of 1 s
    and its 20 steps unmet."""
    clock = FakeClock()
    window = Window(
        WindowPlan(warmup=2, steps=20, min_time_s=1.0, settle=SETTLE, race_below=1000.0), clock.clock()
    )
    _steps(window, clock, [50.0, 50.0])  # the counted warm-up: not in the blocks
    _steps(window, clock, [2.0] * 5 + [2.4] * 5 + [2.0] * 5)
    assert window.phase == "timed" and window.shape.warmup_end == "raced"
    _steps(window, clock, [2.0] * 10)
    assert window.phase == "done" and len(window.records) == 5
    assert (window.shape.timed_end, round(window.shape.timed_s, 6)) == ("raced", 0.010)


def test_a_window_that_races_in_its_timed_steps_only_warms_up_to_its_cap_first() -> None:
    """A loop slowing down by 6% a block never settles, and loses to 1,000 steps/s from its third
    block (raced in its warm-up, it would stop there); raced in its timed steps only (a pair's
    window of the script's own setting, whose figure stands in a ratio), its warm-up goes on to
    its 1 s cap, then one block's worth of timed steps shows it cannot win (20 steps: the blocks
    doubled twice while it did not settle)."""
    clock = FakeClock()
    plan = WindowPlan(warmup=2, steps=20, min_time_s=1.0, settle=SETTLE, race_below=1000.0, race_warmup=False)
    window = Window(plan, clock.clock())
    _steps(window, clock, [50.0, 50.0])
    warmup = [2.0 * 1.06 ** (i // 5) for i in range(400)]
    while window.phase == "warmup":
        _steps(window, clock, [warmup.pop(0)])
    assert window.shape.warmup_end == "time cap" and window.shape.warmup_s >= 1.0
    assert window.blocks is not None and window.blocks.scale == 4
    _steps(window, clock, warmup[:19])
    assert window.phase == "timed"
    _steps(window, clock, warmup[19:30])
    assert window.phase == "done" and len(window.records) == 20
    assert window.shape.timed_end == "raced"  # its 20 steps, not its 1 s


def test_a_race_in_the_timed_steps_only_reaches_the_childs_window(tmp_path: Path) -> None:
    """From the parent's window size, through the command file, to the plan the child measures."""
    options = ProfileOptions(Path("train.py"), [], Path("out"))
    size = size_for(options, Overrides(), None, 3.0, 40.0, race_warmup=False)
    _serial.save_json(WindowCommand(1, "baseline-pair-1", warmup=5, steps=20, size=size), tmp_path / "c.json")
    sent = _serial.load_json(WindowCommand, tmp_path / "c.json")
    plan = window_plan(sent.warmup, sent.steps, sent.size)
    assert (plan.race_below, plan.race_warmup) == (40.0, False)
    assert window_plan(5, 20, size_for(options, Overrides(), None, 3.0, 40.0)).race_warmup is True


def test_a_window_still_speeding_up_is_given_its_time() -> None:
    """Blocks at 4, 3 and 2 ms a step: each loses to 1,000 steps/s, but the last is more than
    10% faster than the first of the three: the loop is still speeding up, so the window goes
    on; at 1 ms a step (1,250 steps/s allowing 25%) it can win, and settles."""
    clock = FakeClock()
    window = Window(
        WindowPlan(warmup=0, steps=4, min_time_s=0.020, settle=SETTLE, race_below=1000.0), clock.clock()
    )
    _steps(window, clock, [4.0] * 5 + [3.0] * 5 + [2.0] * 5)
    assert window.phase == "warmup"
    _steps(window, clock, [1.0] * 30)
    assert window.phase == "timed" and window.shape.warmup_end == "settled"
    _steps(window, clock, [1.0] * 20)
    assert window.phase == "done" and window.shape.timed_end == "plan" and len(window.records) == 20


def test_a_settled_window_that_loses_while_timed_stops_after_one_block() -> None:
    """Settled at 1 ms a step; the best so far runs 1,500 steps/s: 1,000 (1,250 allowing 25%,
    more than a busy core drifts the machine between two windows) cannot reach it. Timing stops
    once a block's worth (5 steps and 10 ms: 10 steps) shows it, with no slide and no memory
    step."""
    clock = FakeClock()
    plan = WindowPlan(warmup=0, steps=20, min_time_s=1.0, settle=SETTLE, race_below=1500.0, memory_step=True)
    window = Window(plan, clock.clock())
    _steps(window, clock, [1.0] * 30)
    assert window.phase == "timed" and window.shape.warmup_end == "settled"
    _steps(window, clock, [1.0] * 9)
    assert window.phase == "timed"
    _steps(window, clock, [1.0])
    assert window.phase == "done" and len(window.records) == 10 and window.shape.timed_end == "raced"
    assert window.memory is None


def test_a_window_that_can_win_is_timed_to_its_floor() -> None:
    clock = FakeClock()
    window = Window(
        WindowPlan(warmup=0, steps=4, min_time_s=0.050, settle=SETTLE, race_below=1050.0), clock.clock()
    )
    _steps(window, clock, [1.0] * 80)  # 1,000 steps/s; 1,250 allowing 25%: it may still win
    assert window.phase == "done" and window.shape.timed_end == "plan" and len(window.records) == 50


def test_a_trials_settling_is_capped_after_its_counted_warmup_not_from_its_first_step() -> None:
    """A compile's 500 ms first steps are the counted warm-up; the blocks after them never
    agree, and end 50 ms later (the trial's cap from the baseline's settling), not at the
    global 2 s."""
    clock = FakeClock()
    capped = Settling(block_s=0.010, block_steps=5, blocks=3, tolerance=0.10, max_s=2.0, blocks_max_s=0.050)
    window = Window(WindowPlan(warmup=2, steps=4, settle=capped), clock.clock())
    _steps(window, clock, [500.0, 500.0])
    _steps(window, clock, ([1.0] * 10 + [3.0] * 5) * 8)  # blocks of 1 and 3 ms a step: never settled
    assert window.phase != "warmup" and window.shape.warmup_end == "settle cap"
    assert 1.050 <= window.shape.warmup_s < 1.060
    assert window.shape.settle_s is not None and round(window.shape.settle_s, 6) == 0.050  # after the counted


def _shape(end: str, warmup_s: float) -> RawRun:
    raw = RawRun("baseline", "window_complete", None, None, 5, 20, 0, 25, [], [], None)
    raw.shape = WindowShape(30, warmup_s, end)
    return raw


def test_a_trials_warmup_cap_comes_from_the_baselines_settling() -> None:
    assert pace.trial_settle_cap(_shape("settled", 0.4), 60.0).max_s == 3.0  # at least 3 s
    assert pace.trial_settle_cap(_shape("settled", 2.5), 60.0).max_s == 7.5  # 3x
    assert pace.trial_settle_cap(_shape("settled", 2.5), 5.0).max_s == 5.0  # never past --max-warmup
    assert pace.trial_settle_cap(_shape("settled", 6.2), 60.0).max_s == 10.0  # nor past 10 s
    unsettled = pace.trial_settle_cap(_shape("time cap", 60.0), 60.0)
    assert (unsettled.max_s, unsettled.why) == (10.0, "10 s: the baseline's own warm-up did not settle")
    assert pace.trial_settle_cap(_shape("count", 0.1), 0.0).max_s == 0.0
    fresh = _shape("settled", 10.6)  # a fresh run's warm-up: 8 s of the script's set-up, then 2.6 s
    assert fresh.shape is not None
    fresh.shape.settle_s = 1.3  # settling after its first (counted) steps
    assert pace.trial_settle_cap(fresh, 60.0).max_s == pytest.approx(3.9)


def _trial(label: str, step_ms: list[float], end: str = "plan") -> Trial:
    raw = _run(step_ms).raw
    raw.shape = WindowShape(10, 1.0, "settled", timed_s=sum(step_ms) / 1e3, timed_end=end)
    return Trial(label, Overrides(), "measured", 1e3 / (sum(step_ms) / len(step_ms)), None, raw)


def test_a_trial_races_the_slow_windows_of_the_best_setting_so_far() -> None:
    """The bar is the 10th percentile of the best run's window throughputs: the baseline at
    10 ms a step (100 steps/s) until a trial measured whole beats it; a trial cut short never
    sets it."""
    baseline = _run([10.0] * 60)
    assert pace.race_below([baseline], []) == (100.0, "the script's own setting")
    faster = _trial("num_workers=2", [5.0] * 100)
    assert pace.race_below([baseline], [faster]) == (200.0, "num_workers=2")
    cut = _trial("num_workers=4", [2.0] * 100, end="raced")
    assert pace.race_below([baseline], [faster, cut]) == (200.0, "num_workers=2")
    assert pace.raced(cut.raw) and not pace.raced(faster.raw)  # type: ignore[arg-type]


def test_pairs_decide_on_adjacent_windows_and_say_how_many_it_took() -> None:
    """(speedup, low, high) per pair. One pair decides where its slow windows gain 1.5x or its
    fast windows lose; else two pairs that agree; else the majority of three."""
    assert pace.paired([(8.0, 7.3, 9.4)], 1.05) == pace.Paired("gain", 8.0, 7.3, 9.4, 1)
    assert pace.paired([(0.8, 0.7, 0.9)], 1.05).state == "no_gain"
    assert pace.paired([(1.2, 1.1, 1.3)], 1.05).state == "open"
    assert pace.paired([(1.2, 1.1, 1.3), (1.3, 1.15, 1.4)], 1.05) == pace.Paired("gain", 1.25, 1.1, 1.4, 2)
    split = [(1.2, 1.1, 1.3), (1.02, 0.95, 1.1)]
    assert pace.paired(split, 1.05).state == "open"
    assert pace.paired([*split, (1.01, 0.9, 1.1)], 1.05) == pace.Paired("no_gain", 1.02, 0.9, 1.3, 3)
    # a majority's gain is given by its winning pairs: a losing pair would put its range under 1
    assert pace.paired([*split, (1.3, 1.2, 1.4)], 1.05) == pace.Paired("gain", 1.25, 1.1, 1.4, 3)


def test_a_background_load_that_stops_between_windows_cancels_in_a_pair_not_against_one_baseline() -> None:
    """A simulated background load halves the loop's speed until it stops, after the baseline's
    window: the candidate, which truly gains 3%, measures 2.06x against that baseline; in a pair
    with the script's own setting measured beside it (both after the load stopped) it gains 1.03x,
    no gain."""
    from trainadvisor.profile.judge import ratio

    loaded, quiet, candidate = _windows_at(50.0), _windows_at(100.0), _windows_at(103.0)
    against_first = ratio(loaded, candidate)
    assert round(against_first.speedup or 0.0, 2) == 2.06 and (against_first.low or 0.0) > 1.5
    pair = ratio(quiet, candidate)
    paired = pace.paired([(pair.speedup, pair.low, pair.high)] * 2, 1.05)  # type: ignore[list-item]
    assert paired.state == "no_gain" and round(paired.speedup or 0.0, 2) == 1.03


def test_fresh_runs_are_compared_only_where_the_baseline_measured_next_to_them_agrees() -> None:
    loaded, quiet = _windows_at(50.0), _windows_at(100.0)
    assert pace.machine_changed(loaded, quiet) == (
        "the machine's speed changed between runs: the script's own setting measured 50.0 steps/s in "
        "the baseline and 100.0 next to the confirmation run (+100%, more than the 10% two settled "
        "measurements of one loop differ by)"
    )
    assert pace.machine_changed(quiet, _windows_at(105.0)) is None  # 5%: a steady machine
    assert pace.machine_changed(quiet, _windows_at(111.0)) is not None
    # how much: a gain whose slow windows beat the faster baseline by more than this stands
    assert pace.machine_drift(loaded, quiet) == 2.0 and pace.machine_drift(quiet, loaded) == 2.0


def test_a_windows_estimate_takes_the_trials_settle_cap_not_a_slow_baselines_warmup() -> None:
    """Before any window was measured, one is estimated from the baseline's: its settling (at
    least 1 s), its timed steps and 0.5 s. A baseline that never settled (60 s of warm-up on a
    busy machine) gave each window a minute; a trial's warm-up is capped at 10 s, and so is its
    estimate. A candidate up to 4x as fast settles and times the baseline's steps in a quarter of
    the time (its blocks are counted in steps too), never under 1 s and the minimum time."""
    settled = _shape("settled", 3.5)
    assert settled.shape is not None
    settled.shape.timed_s, settled.shape.min_time_s = 1.2, 1.0
    assert pace.cost_s("window", [], settled) == pytest.approx(3.5 + 1.2 + 0.5)
    assert pace.cost_s("window", [], settled, speedup=4.0) == pytest.approx(1.0 + 1.0 + 0.5)
    assert pace.cost_s("window", [], settled, speedup=1.4) == pytest.approx(2.5 + 1.0 + 0.5)  # 3.5 / 1.4
    assert pace.cost_s("window", [], settled, settle_cap_s=3.0) == pytest.approx(3.0 + 1.2 + 0.5)
    assert pace.cost_s("pair", [], settled) == pytest.approx(3.0 + 1.2 + 0.5)  # a pair's settles 3 s
    # where its fix can decide in one pair, the script's setting's window is cut after one block:
    # 5 of the baseline's 20 timed steps (0.3 s), or the block's 0.2 s where those are shorter
    assert pace.cost_s("pair", [], settled, speedup=1.875) == pytest.approx(3.0 + 0.3 + 0.5)
    assert pace.cost_s("pair", [], settled, speedup=1.87) == pytest.approx(3.0 + 1.2 + 0.5)
    settled.shape.timed_s = 0.4
    assert pace.cost_s("pair", [], settled, speedup=8.0) == pytest.approx(3.0 + 0.2 + 0.5)
    settled.shape.timed_s = 1.2
    assert pace.cost_s("prestarted", [], settled) == pytest.approx(3.5 + 1.2 + 1.5)  # and its end
    unsettled = _shape("time cap", 60.0)
    assert unsettled.shape is not None
    unsettled.shape.timed_s = 1.2
    assert pace.cost_s("window", [], unsettled) == pytest.approx(10.0 + 1.2 + 0.5)
    assert pace.cost_s("window", [3.0, 5.0, 4.0], unsettled) == 4.0  # measured windows decide


def test_a_fresh_runs_estimate_is_the_baselines_whole_run_with_its_warmup_capped_as_a_trials() -> None:
    """On a loaded machine the baseline warmed up for 50 s of its 70 s; a fresh trial's warm-up
    waits at most 10 s (or the cap given): 30 s, not 70 (a compile trial took 18 s where 70 s
    a run had been estimated)."""
    loaded = _shape("time cap", 50.0)
    loaded.wall_s = 70.0
    assert pace.cost_s("fresh", [], loaded) == pytest.approx(30.0)
    assert pace.cost_s("fresh", [], loaded, settle_cap_s=3.0) == pytest.approx(23.0)
    assert pace.cost_s("fresh", [41.0, 25.0], loaded) == 41.0  # the longest fresh run measured
    assert pace.cost_s("fresh", [20.0], loaded) == pytest.approx(30.0)  # never under the baseline's
    quick = _shape("settled", 1.5)
    quick.wall_s = 12.0
    assert pace.cost_s("fresh", [], quick) == 12.0  # a warm-up under the cap counts whole


def test_a_confirmation_of_workers_times_six_rounds_of_their_batches() -> None:
    """A baseline of 10 steps/s (20 timed steps in 2 s), its fix up to 4x: a run started ahead
    with 32 workers settles over three blocks of 64 steps and times 192 (six rounds), at 40
    steps/s 4.8 s each, at the 20 steps/s they can load 9.6 s; then 1.5 s. A trial's window of
    those workers times what the baseline's did (at 4x, under the minimum 1 s), then 0.5 s."""
    steps = [StepRecord(i, i * 100.0, 100.0, 0.0) for i in range(20)]
    baseline = RawRun("baseline", "window_complete", None, None, 5, 20, 0, 25, steps, [], None)
    baseline.shape = WindowShape(5, 3.5, "settled", timed_s=2.0, min_time_s=1.0)
    assert pace.CONFIRMATION_ROUNDS == 6
    assert pace.cost_s("prestarted", [], baseline, 4.0, 10.0, (32, None)) == pytest.approx(4.8 + 4.8 + 1.5)
    assert pace.cost_s("prestarted", [], baseline, 4.0, 10.0, (32, 20.0)) == pytest.approx(9.6 + 9.6 + 1.5)
    assert pace.cost_s("prestarted", [], baseline, 4.0, 10.0) == pytest.approx(1.0 + 1.0 + 1.5)
    assert pace.cost_s("window", [], baseline, 4.0, 10.0, (32, None)) == pytest.approx(4.8 + 1.0 + 0.5)


def test_a_fresh_runs_estimate_without_its_settling_keeps_its_set_up() -> None:
    """A baseline of 30 s whose 12 s warm-up held 4 s of set-up and 80 steps of 100 ms: a fresh run
    is estimated at 28 s (its warm-up capped at 10 s), 22 s of it neither settling nor capped
    (the 18 s after the warm-up and the 4 s of set-up); where a fresh run measured 29 s, no part
    of the estimate is known to be settling."""
    steps = [StepRecord(i, i * 100.0, 100.0, 0.0) for i in range(100)]
    baseline = RawRun("baseline", "window_complete", None, None, 80, 20, 0, 25, steps, [], None)
    baseline.shape, baseline.wall_s = WindowShape(80, 12.0, "time cap"), 30.0
    assert (pace.setup_s(baseline), pace.cost_s("fresh", [], baseline)) == (4.0, 28.0)
    assert (pace.fresh_unsettled_s([], baseline), pace.fresh_unsettled_s([29.0], baseline)) == (22.0, 29.0)


def test_a_confirmations_warmup_waits_as_long_as_the_baseline_settled_in_not_3x_it() -> None:
    """Compared with the baseline itself, a confirmation may settle 3x as long as the baseline
    did, at most 10 s or the baseline's own settling where that was longer (slow steps, blocks
    of seconds): 11 s, not 33."""
    slow = _shape("settled", 13.9)
    assert slow.shape is not None
    slow.shape.settle_s = 11.0
    compared = pace.trial_settle_cap(slow, 60.0, None)
    assert compared.max_s == 11.0 and compared.why.endswith("(at least 3 s, at most 11 s)")
    assert pace.trial_settle_cap(slow, 60.0).max_s == 10.0  # a trial's
    assert pace.trial_settle_cap(_shape("settled", 2.5), 60.0, None).max_s == 7.5  # 3x
    assert pace.trial_settle_cap(_shape("settled", 2.5), 5.0, None).max_s == 5.0  # never past --max-warmup


def test_a_fresh_trial_is_stopped_past_five_times_the_baselines_run_and_what_its_fix_pays_once() -> None:
    """A fresh trial of a fix that compiles is given five times its prior compile time more than
    the baseline's run gives (5 x 11 s, and the 60 s warm-up: 115 s; with a 13 s compile, 180 s),
    and 60 s at least."""
    from trainadvisor.profile.trials import trial_timeout_s

    options = ProfileOptions(Path("train.py"), [], Path("out"))
    baseline = _run([10.0] * 60)
    baseline.raw.wall_s = 11.0
    assert [trial_timeout_s(options, baseline, once_s) for once_s in (0.0, 13.0)] == [115.0, 180.0]
    baseline.raw.wall_s = 0.5
    assert trial_timeout_s(replace(options, max_warmup_s=0.0), baseline, 0.0) == 60.0
