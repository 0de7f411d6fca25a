"""A choice made in trial windows, measured against the script's own setting in pairs of adjacent
windows (`profile.pairs`), with a simulated background load: a fake measurer gives each window the
steps/s its setting reaches at the load of that moment, so that the decisions are exact."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from support.race import _windows_at

from trainadvisor import fixes
from trainadvisor.measure.race import raised
from trainadvisor.measure.settle import Settling
from trainadvisor.profile.pace import DECISIVE
from trainadvisor.profile.pairs import AS_SCRIPT, PAIR_SETTLE_S, pair_choice
from trainadvisor.profile.trials import Measured
from trainadvisor.records import FixOutcome, Overrides, Trial, WindowShape

CHOSEN = Overrides(loaders={"train.py:12": {"num_workers": 4}})


def _outcome(trial_speedup: float) -> FixOutcome:
    """dataloader-workers chose 4 workers in its trial windows, at `trial_speedup` x the baseline's
    10 steps/s."""
    trial = Trial("num_workers=4", CHOSEN, "measured", 10.0 * trial_speedup, None)
    return FixOutcome(
        "dataloader-workers", "data-stall", "unconfirmed", "measured in its trial", CHOSEN, [trial],
        "num_workers=4", gain=trial_speedup, gain_low=trial_speedup, unit="steps/s",
    )  # fmt: skip


Calls = list[tuple[str, str, float | None]]
Races = list[tuple[str, float | None]]


def _measurer(
    quiet_speedup: float, load: list[float], calls: Calls, asked: Races | None = None
) -> Callable[..., Measured]:
    """Windows of the script's setting at 10 steps/s and of the chosen at `quiet_speedup` x that,
    each divided by the background load of its pair (`load[k]`: 2.0 halves both windows). Given
    `asked`, each window's race is recorded there and run (a race of the script's setting is run
    in its timed steps only): a window that loses it (even RACE_MARGIN faster, under the steps/s
    it was given) is cut after a settled warm-up, as `training.window` cuts it: one block's worth
    timed."""

    def window(fix: fixes.Fix, label: str, setting: fixes.Setting) -> Measured:
        pair = int(label.rsplit("-", 1)[1]) - 1
        calls.append((label, setting.label, setting.settle_s))
        if asked is not None:
            asked.append((label, setting.race_below))
        assert setting.race_warmup is (setting.label != AS_SCRIPT)
        steps_per_s = 10.0 * (1.0 if setting.label == AS_SCRIPT else quiet_speedup) / load[pair]
        below = setting.race_below
        lost = asked is not None and below is not None and raised(steps_per_s, Settling()) < below
        run = _windows_at(steps_per_s, 5 if lost else 60)
        if lost:
            shape = WindowShape(20, 1.5, "settled", [1e3 / steps_per_s] * 3, 0.5, "raced")
            run = replace(run, raw=replace(run.raw, shape=shape))
        return Measured(run, run.raw, "measured", None)

    return window


def test_a_gain_the_load_halves_in_both_windows_of_a_pair_stands_after_two_pairs() -> None:
    calls: Calls = []
    paired = pair_choice(_outcome(1.25), _measurer(1.2, [1.0, 2.0], calls), lambda s: True, lambda: 1.0)
    assert calls == [
        ("baseline-pair-1", AS_SCRIPT, PAIR_SETTLE_S),
        ("dataloader-workers-pair-1", "num_workers=4", PAIR_SETTLE_S),
        ("baseline-pair-2", AS_SCRIPT, PAIR_SETTLE_S),
        ("dataloader-workers-pair-2", "num_workers=4", PAIR_SETTLE_S),
    ]  # the script's setting first, then the chosen, seconds apart
    outcome = paired.outcome
    assert (outcome.status, outcome.settings, round(outcome.gain or 0.0, 6)) == ("unconfirmed", CHOSEN, 1.2)
    assert outcome.reason == (
        "measured 1.20x steps/s (range 1.20-1.20x) in 2 pairs of adjacent windows with the script's own "
        "setting; no confirmation run measured it"
    )
    assert paired.again is not None and round(paired.again.steps_per_s or 0.0, 6) == 5.0  # the last pair's


def test_a_gain_measured_in_a_quiet_spell_is_no_gain_in_pairs() -> None:
    """The trial read 2x against a baseline measured while something else ran; beside the
    script's own setting in the same load it gains nothing: no gain, its settings dropped."""
    calls: Calls = []
    paired = pair_choice(_outcome(2.0), _measurer(1.0, [1.0, 1.0], calls), lambda s: True, lambda: 1.0)
    assert len(calls) == 4  # as fast in each window: undecided by one pair, decided by two that agree
    outcome = paired.outcome
    assert (outcome.status, outcome.settings, outcome.gain) == ("no_gain", Overrides(), None)
    assert outcome.reason == (
        "num_workers=4 measured 1.00x steps/s (range 1.00-1.00x) in 2 pairs of adjacent windows with the "
        "script's own setting: not a reliable gain"
    )


def test_a_decisive_gain_takes_one_pair() -> None:
    calls: Calls = []
    paired = pair_choice(_outcome(3.0), _measurer(3.0, [1.0], calls), lambda s: True, lambda: 1.0)
    assert [c[0] for c in calls] == ["baseline-pair-1", "dataloader-workers-pair-1"]
    assert "3.00x steps/s (range 3.00-3.00x) in 1 pair" in paired.outcome.reason


def test_no_time_left_for_a_pair_leaves_the_searchs_figure_and_says_so() -> None:
    calls: Calls = []
    asked: list[float] = []
    fits = lambda estimate_s: asked.append(estimate_s) or False  # noqa: E731
    paired = pair_choice(_outcome(1.3), _measurer(1.3, [1.0], calls), fits, lambda: 4.0)
    assert calls == [] and asked == [8.0]  # two windows of 4 s each did not fit
    assert paired.outcome == _outcome(1.3) and paired.again is None
    assert paired.detail == (
        "dataloader-workers: no pair of windows was measured (the --budget left no time for another "
        "pair); the search's figure stands"
    )


def _reusable(trial_speedup: float) -> FixOutcome:
    """As `_outcome`, its chosen trial's window kept (measured whole at `trial_speedup` x)."""
    outcome = _outcome(trial_speedup)
    trial = replace(outcome.trials[0], raw=_windows_at(10.0 * trial_speedup).raw)
    return replace(outcome, trials=[trial])


def test_the_chosen_trials_own_window_just_before_is_the_first_pairs_and_saves_a_window() -> None:
    """The trial measured 1.2x and was the last window: the first pair is it and the script's
    setting right after it; the load halves the second pair's two windows alike."""
    calls: Calls = []
    asked: list[float] = []
    fits = lambda estimate_s: asked.append(estimate_s) or True  # noqa: E731
    paired = pair_choice(_reusable(1.2), _measurer(1.2, [1.0, 2.0], calls), fits, lambda: 4.0, True)
    assert calls == [
        ("baseline-pair-1", AS_SCRIPT, PAIR_SETTLE_S),
        ("baseline-pair-2", AS_SCRIPT, PAIR_SETTLE_S),
        ("dataloader-workers-pair-2", "num_workers=4", PAIR_SETTLE_S),
    ]
    assert asked == [4.0, 8.0]  # one window for the first pair, two for the second
    assert round(paired.outcome.gain or 0.0, 6) == 1.2 and paired.outcome.status == "unconfirmed"
    assert paired.detail == (
        "dataloader-workers: 1.20x steps/s (range 1.20-1.20x) in 2 pairs of adjacent windows with the "
        "script's own setting (the first pair's num_workers=4 window was its trial's own, just before)"
    )


def test_a_trial_window_that_was_not_the_last_is_measured_again_for_its_pair() -> None:
    calls: Calls = []
    pair_choice(_reusable(3.0), _measurer(3.0, [1.0], calls), lambda s: True, lambda: 1.0, False)
    assert [c[0] for c in calls] == ["baseline-pair-1", "dataloader-workers-pair-1"]


def test_the_script_settings_window_stops_once_the_pair_decides_a_gain_by_itself() -> None:
    """The chosen setting's trial ran at 8x, the last window: the script's setting right after it
    races 8x over DECISIVE (its slow windows are its steps/s: steps alike), and at 10 steps/s,
    even 25% faster, it stays under that; cut short, it still decides the gain in one pair."""
    asked: Races = []
    paired = pair_choice(_reusable(8.0), _measurer(8.0, [1.0], [], asked), lambda s: True, lambda: 1.0, True)
    assert asked == [("baseline-pair-1", 80.0 / DECISIVE)]
    outcome = paired.outcome
    assert (outcome.status, round(outcome.gain or 0.0, 6)) == ("unconfirmed", 8.0)
    assert paired.detail == (
        "dataloader-workers: 8.00x steps/s (range 8.00-8.00x) in 1 pair of adjacent windows with the "
        "script's own setting (the first pair's num_workers=4 window was its trial's own, just before); "
        "pair 1's window of the script's own setting was cut in its timed steps after 2.0 s (5 steps timed): "
        "even 25% faster it stays below 53.3 steps/s, the slow windows of num_workers=4 over 1.5, where "
        "one pair decides a gain"
    )
    assert paired.again is not None and paired.again.steps_per_s == 10.0


def test_a_gain_short_of_deciding_in_one_pair_leaves_the_scripts_windows_whole() -> None:
    """At 1.4x in its trial and 1.3x in its pairs, the race's bar (the chosen setting as last
    measured, over DECISIVE: 9.3 steps/s, then 8.7) is under the script's own 10 steps/s raised by
    RACE_MARGIN: its windows are measured to their end; the chosen's windows race nothing."""
    asked: Races = []
    measurer = _measurer(1.3, [1.0, 1.0], [], asked)
    paired = pair_choice(_reusable(1.4), measurer, lambda s: True, lambda: 1.0, False)
    assert [(label, round(below or 0.0, 6)) for label, below in asked] == [
        ("baseline-pair-1", round(14.0 / DECISIVE, 6)),
        ("dataloader-workers-pair-1", 0.0),
        ("baseline-pair-2", round(13.0 / DECISIVE, 6)),  # the first pair's window of the chosen
        ("dataloader-workers-pair-2", 0.0),
    ]
    assert "cut" not in paired.detail
    assert paired.outcome.status == "unconfirmed" and paired.again is not None
    assert paired.again.steps_per_s == 10.0


def test_a_gain_in_samples_per_second_races_no_window_of_its_pairs() -> None:
    """A larger batch is slower per step by design: its pairs' steps/s decide nothing alone."""
    asked: Races = []
    outcome = replace(_reusable(8.0), fix="batch-size")
    pair_choice(outcome, _measurer(8.0, [1.0], [], asked), lambda s: True, lambda: 1.0, True)
    assert asked == [("baseline-pair-1", None)]
