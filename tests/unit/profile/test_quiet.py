"""A gain judged as a quiet machine would measure it (`profile.quiet`, issue 36): each run's
steps less its main thread's waits for a CPU, where other processes used CPU during a compared
window. Runs built in memory (steps at a fixed pace, `support.race`) with host samples 0.1 s
apart; the confirmation's fresh run and the code change replaced by stand-ins."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.race import _windows_at

from trainadvisor.frameworks import change as framework_change
from trainadvisor.frameworks.change import Change
from trainadvisor.profile import confirm as confirming
from trainadvisor.profile import quiet
from trainadvisor.profile.confirm import _Judge, confirm
from trainadvisor.profile.runs import ProfileOptions
from trainadvisor.profile.tuning import Tuning
from trainadvisor.records import FixOutcome, HostSample, Overrides, Run, WindowShape

WORKERS = Overrides(loaders={"train.py:12": {"num_workers": 2}})
OPTIONS = ProfileOptions(Path("train.py"), [], Path("out"))


def _loaded(steps_per_s: float, queued_pct: float | None, other_pct: float = 150.0, samples: int = 10) -> Run:
    """A run at `steps_per_s` whose main thread waited `queued_pct` of each 0.1 s for a CPU while
    other processes used `other_pct` of a core."""
    run = _windows_at(steps_per_s)
    run.raw.host_samples = [
        HostSample(100.0 * i, 90.0, 0.0, 1, 0, 0, other_pct, main_queued_pct=queued_pct)
        for i in range(samples)
    ]
    return run


def _outcome(mode: str = "restart") -> FixOutcome:
    reason = "measured 2.00x steps/s in its trial"
    return FixOutcome(
        "dataloader-workers", "rule", "unconfirmed", reason, WORKERS, [], "num_workers=2", mode=mode
    )


def _judge(baseline: Run, after: Run, beside: Run | None = None, mode: str = "restart") -> _Judge:
    chosen = [_outcome(mode)]
    tuning = Tuning(OPTIONS, [], {}, baseline, lambda line: None, 0.0, chosen)
    return _Judge(baseline, after, tuning, chosen, None, (lambda: beside) if beside is not None else None)


def test_a_runs_waits_are_the_mean_of_its_window_samples_and_its_rates_are_divided_by_what_is_left() -> None:
    run = _loaded(10.0, 50.0)
    run.raw.host_samples[0].main_queued_pct = None  # the first tick: not read
    run.raw.host_samples.append(HostSample(9000.0, 0.0, 0.0, 1, 0, 0, 0.0, main_queued_pct=0.0))  # after
    assert quiet.queued_share(run) == 0.5
    alone = quiet.without_waits(run)
    assert (alone.steps_per_s, alone.window_steps_per_s[0]) == pytest.approx((20.0, 20.0))
    assert run.steps_per_s == pytest.approx(10.0)  # the measured run is left as it was
    assert quiet.queued_share(_loaded(10.0, 100.0)) == quiet.MAX_SHARE == 0.99  # a tick late
    for unread in (_loaded(10.0, None), _loaded(10.0, 50.0, samples=2)):  # fewer than 3 read
        assert quiet.queued_share(unread) is None
        assert quiet.without_waits(unread) is unread
    undisturbed = _loaded(10.0, 50.0, other_pct=20.0)  # its waits are the script's own
    assert quiet.queued_share(undisturbed) == 0.5 and quiet.without_waits(undisturbed) is undisturbed


def test_the_load_is_the_busiest_disturbed_window() -> None:
    assert quiet.load_cores([_loaded(10.0, 0.0, 60.0), _loaded(10.0, 0.0, 140.0)]) == pytest.approx(1.4)
    assert quiet.LOAD_MIN_CORES == 0.25
    assert quiet.load_cores([_loaded(10.0, 50.0, 24.0), _windows_at(10.0)]) is None  # 0.24 cores: quiet
    assert quiet.load_cores([_loaded(10.0, 50.0, 25.0)]) == pytest.approx(0.25)


def test_a_gain_the_load_made_is_not_kept() -> None:
    """The script's own setting waited half its time for a CPU, the fix none: 2.00x as measured,
    1.00x without the waits."""
    judge = _judge(_loaded(10.0, 50.0), _loaded(20.0, 0.0))
    status, reason, _, changed = judge()
    assert (status, reason, changed) == ("kept", "measured 2.00x steps/s (range 2.00-2.00x)", None)
    assert judge.loaded() == (
        "other processes used 1.5 cores, and the training loop waited for a CPU 50% of its time in the "
        "baseline window; judged with those waits taken out of its steps (the fix's run as measured): "
        "measured 1.00x steps/s (range 1.00-1.00x): not a reliable gain; a quiet machine would not "
        "keep it"
    )


def test_the_fixs_run_keeps_its_waits() -> None:
    """Beside a test suite's load the workers' run waited 40% of its time too, off its steps'
    path (the workers loaded the next batch meanwhile): taken out, it read 25.8 steps/s, a 1.29x
    gain kept. The script's setting alone has its waits taken out: 15.5 against 20.0."""
    judge = _judge(_loaded(10.0, 50.0), _loaded(15.5, 40.0))
    assert judge()[0] == "kept"
    loaded = judge.loaded()
    assert loaded is not None and "measured 0.78x steps/s (range 0.78-0.78x): not a reliable gain" in loaded


def test_a_gain_beyond_the_load_stands() -> None:
    assert _judge(_loaded(10.0, 50.0), _loaded(40.0, 0.0)).loaded() is None  # 2.00x without the waits
    # the script's own threads and workers made it wait, nobody else: its own, not taken out
    assert _judge(_loaded(10.0, 50.0, other_pct=0.0), _loaded(20.0, 0.0, other_pct=0.0)).loaded() is None


def test_only_the_runs_other_processes_disturbed_have_their_waits_taken_out() -> None:
    """A baseline measured quietly that waited half its time behind its own threads, a fix run
    beside 0.6 cores of others' load: the baseline's waits are the script's, and the 2.00x
    stands."""
    judge = _judge(_loaded(10.0, 50.0, other_pct=0.0), _loaded(20.0, 0.0, other_pct=60.0))
    assert judge()[0] == "kept" and judge.loaded() is None


def test_where_a_disturbed_runs_waits_were_not_read_the_runs_are_judged_as_measured() -> None:
    for baseline in (_loaded(10.0, None), _loaded(10.0, 50.0, samples=2)):
        judge = _judge(baseline, _loaded(20.0, 40.0))
        assert judge()[0] == "kept" and judge.loaded() is None
    assert quiet.readable([_loaded(10.0, 50.0, other_pct=0.0), _loaded(10.0, None, other_pct=0.0)]) is False
    ranked = _loaded(10.0, 50.0)
    ranked.raw.ranks = [_loaded(10.0, 50.0).raw]  # torchrun: the launcher was sampled
    assert quiet.readable([_loaded(10.0, 50.0)]) is True and quiet.readable([ranked]) is False


def test_a_window_of_the_scripts_setting_cut_short_in_its_pair_is_judged_as_measured() -> None:
    """The pair's window of the script's own setting was cut after one block (`pairs`): its two
    samples say nothing of its waits, and it neither turns the judgement off nor has waits taken
    out; the baseline window's are, and the gain the load made is caught as without the pair."""
    judge = _judge(_loaded(10.0, 50.0), _loaded(20.0, 0.0))
    cut = _loaded(9.0, 50.0, samples=2)
    cut.raw.shape = WindowShape(20, 1.5, "settled", [111.0] * 3, 0.4, "raced")
    judge.tuning.again = cut
    assert judge()[0] == "kept"
    assert judge.loaded() == (
        "other processes used 1.5 cores, and the training loop waited for a CPU 50% of its time in the "
        "baseline window; judged with those waits taken out of its steps (the fix's run as measured): "
        "measured 1.00x steps/s (range 1.00-1.00x): not a reliable gain; a quiet machine would not "
        "keep it"
    )
    whole = _loaded(9.0, 50.0, samples=2)  # the same window measured whole: its waits unread
    judge.tuning.again = whole
    assert judge.loaded() is None  # judged as measured, as before


def test_without_the_waits_the_machine_change_decides() -> None:
    """The baseline (first run: reads twice as slow) and the script's own setting next to the
    confirmation measured alike beside the load, 10.0 and 10.5 steps/s; without the waits they are
    10.0 and 21.0: the machine sped up, and the fix's 2.38x (25.0 against 10.5) is 1.19x, within it."""
    judge = _judge(_loaded(10.0, 0.0), _loaded(25.0, 0.0), beside=_loaded(10.5, 50.0))
    status, reason, _, changed = judge()
    assert (status, changed) == ("kept", None)
    loaded = judge.loaded()
    assert loaded is not None and loaded.startswith(
        "other processes used 1.5 cores, and the training loop waited for a CPU 0% of its time in the "
        "baseline window and 50% of its time in the script's own setting measured next to the confirmation "
        "run; judged with those waits taken out of its steps (the fix's run as measured): measured "
        "1.19x steps/s (range 1.19-1.19x), against the script's own setting measured next to it too (21.0 "
        "steps/s): not a gain beyond the change, as the machine's speed changed between runs: the script's "
        "own setting measured 10.0 steps/s in the baseline and 21.0 next to the confirmation run (+110%"
    )


@pytest.mark.parametrize("mode", ["restart", "in_process"])
def test_the_confirmation_of_a_gain_the_load_made_is_inconclusive_with_no_change_given(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Chosen in fresh runs or in the baseline's own windows alike: its trials were measured
    beside the same load, so their figure does not stand for a quiet machine's either."""
    baseline, after = _loaded(10.0, 50.0), _loaded(20.0, 0.0)
    monkeypatch.setattr(confirming, "measure_fitted", lambda spec_of, length, learn, first: after)
    diff_of = lambda script, fix, settings, raw: Change(f"diff of {fix}")  # noqa: E731
    monkeypatch.setattr(framework_change, "fix_change", diff_of)
    tuning = Tuning(OPTIONS, [], {}, baseline, lambda line: None, 0.0, [_outcome(mode)])
    done = confirm(OPTIONS, baseline, tuning, None, lambda line: None)
    (outcome,) = done.outcomes
    assert (outcome.status, outcome.diff) == ("inconclusive", "")
    assert outcome.reason.startswith(
        "measured 2.00x steps/s (range 2.00-2.00x); but other processes used 1.5"
    )
    assert outcome.reason.endswith("a quiet machine would not keep it")
    assert done.comparison is not None and done.comparison.speedup == pytest.approx(2.0)  # as measured


def test_a_fix_chosen_in_windows_whose_confirmation_met_a_change_of_the_machine_and_the_load_is_inconclusive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured, the script's setting next to the confirmation ran twice as fast as in the
    baseline (the machine changed) and the fix 1.20x faster than that, which alone leaves a fix
    chosen in windows unconfirmed with its change; without the waits the fix is slower:
    inconclusive, no change given. The run next to the confirmation is measured once, though
    both judgements read it."""
    baseline, after = _loaded(10.0, 50.0), _loaded(24.0, 0.0)
    monkeypatch.setattr(confirming, "measure_fitted", lambda spec_of, length, learn, first: after)
    diff_of = lambda script, fix, settings, raw: Change(f"diff of {fix}")  # noqa: E731
    monkeypatch.setattr(framework_change, "fix_change", diff_of)
    measured: list[Run] = []
    beside = lambda: measured.append(_loaded(20.0, 50.0)) or measured[-1]  # noqa: E731
    tuning = Tuning(OPTIONS, [], {}, baseline, lambda line: None, 0.0, [_outcome("in_process")])
    done = confirm(OPTIONS, baseline, tuning, None, lambda line: None, adjacent=beside)
    (outcome,) = done.outcomes
    assert (outcome.status, outcome.diff, len(measured)) == ("inconclusive", "", 1)
    assert ": not a gain beyond the change, as the machine's speed changed between runs" in outcome.reason
    assert "; but other processes used 1.5 cores" in outcome.reason
    assert "(the fix's run as measured): measured 0.60x" in outcome.reason


def _trial_gain(outcome: FixOutcome, gain: float, low: float) -> FixOutcome:
    outcome.gain, outcome.gain_low = gain, low
    return outcome


@pytest.mark.parametrize(
    ("other_pct", "low", "status"),
    [
        (150.0, 1.8, "inconclusive"),  # its trial's slow windows beat the baseline's fast ones
        (0.0, 1.8, "no_gain"),  # a quiet machine: the confirmation stands, the trial was a fluke
        (150.0, 0.9, "no_gain"),  # its trial's gain was within the windows' spread too
    ],
)
def test_a_gain_its_trial_measured_that_the_confirmation_beside_other_processes_did_not_is_not_rejected(
    monkeypatch: pytest.MonkeyPatch, other_pct: float, low: float, status: str
) -> None:
    """A fix worth 4.7x on a quiet machine read 0.69x in a confirmation run beside 1.7 busy cores:
    no gain is not what was measured there, but the load's doing as much as the fix's."""
    baseline, after = _loaded(10.0, 0.0, other_pct), _loaded(7.0, 0.0, other_pct)
    monkeypatch.setattr(confirming, "measure_fitted", lambda spec_of, length, learn, first: after)
    diff_of = lambda script, fix, settings, raw: Change(f"diff of {fix}")  # noqa: E731
    monkeypatch.setattr(framework_change, "fix_change", diff_of)
    chosen = _trial_gain(_outcome("in_process"), 2.0, low)
    tuning = Tuning(OPTIONS, [], {}, baseline, lambda line: None, 0.0, [chosen])
    (outcome,) = confirm(OPTIONS, baseline, tuning, None, lambda line: None).outcomes
    assert (outcome.status, outcome.diff) == (status, "")
    if status == "inconclusive":
        assert outcome.reason == (
            "measured 0.70x steps/s (range 0.70-0.70x): not a reliable gain; but other processes used "
            "1.5 cores during the compared windows, where dataloader-workers's trial measured 2.00x "
            "steps/s: the load may have decided, not the fix; measure again on a quiet machine"
        )
    else:
        assert outcome.reason == "measured 0.70x steps/s (range 0.70-0.70x): not a reliable gain"
