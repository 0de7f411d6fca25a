"""The worker search beside other processes: a count that lost is checked against the best count
before it, measured again right after it (`fixes.worker_pairs`). Simulated background load: each
window's pace is the count's own times the machine's speed in that window. Exact decisions."""

from __future__ import annotations

from support.runs import raw, trial

from trainadvisor.analyze.run.summary import summarize
from trainadvisor.fixes.common import Setting
from trainadvisor.fixes.dataloader_workers import DataLoaderWorkers
from trainadvisor.fixes.worker_pairs import figures, paired_stop, repeats, to_measure_again
from trainadvisor.profile.pairs import chosen_trial
from trainadvisor.profile.trials import Measured, tune
from trainadvisor.records import FixOutcome, HostSample, Overrides, Trial

VALUES = {"dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 4, "steps_per_s": 10.0}


def window(workers: int, steps_per_s: float, other_pct: float) -> Trial:
    """A window of `workers` workers each busy 90% of a core (loading bound by CPU: the search
    doubles), the loop waiting 40% of each step, other processes using `other_pct` of a core."""
    done = trial(workers, steps_per_s)
    done.raw = raw([10.0] * 10, [4.0] * 10, workers=workers)
    done.raw.host_samples = [
        HostSample(t, 50.0, 90.0 * workers, 1, workers * 10**6, workers, other_pct) for t in (0, 100)
    ]
    return done


def search(own: dict[int, float], speed: list[float], other_pct: float) -> list[Trial]:
    """The search run to its end: the k-th window measures its count at `own[count]` times
    `speed[k]` (the machine's pace in it: a slow spell is under 1)."""
    fix, trials = DataLoaderWorkers(), []  # type: ignore[var-annotated]
    while (candidate := fix.next_candidate(VALUES, trials)) is not None:
        workers = int(candidate.overrides.loader()["num_workers"])
        assert "prefetch_factor" not in candidate.overrides.loader()
        done = window(workers, own[workers] * speed[len(trials)], other_pct)
        done.label, done.reason = candidate.label, candidate.note
        trials.append(done)
    return trials


def counts(trials: list[Trial]) -> list[int]:
    return [int(t.overrides.loader()["num_workers"]) for t in trials]


OWN = {2: 25.0, 4: 45.0, 8: 60.0, 16: 100.0}
SLOW_SPELL = [1.0, 1.0, 1.0, 0.5, 0.5, 0.5]  # from the fourth window on, the machine runs at half pace


def test_beside_a_busy_core_a_count_that_lost_in_a_slow_spell_is_measured_against_the_count_again() -> None:
    """16 workers read 50 steps/s in a slow spell, under 8's 60 measured before it: the doubling
    would stop at 8. Beside other processes 8 is measured again right after 16 (30 steps/s: the same
    spell), 16 gained 1.67x over it, and 16 is kept. On a quiet machine the same figures stop the
    search at 8, as before."""
    fix = DataLoaderWorkers()
    busy = search(OWN, SLOW_SPELL, other_pct=100.0)
    assert counts(busy) == [2, 4, 8, 16, 8]
    assert busy[-1].reason == "measured again right after num_workers=16, beside other processes"
    chosen = fix.choose(busy, VALUES)  # 16 at the machine's first pace: 50 x 60 / 30
    assert chosen is not None and (chosen.raw, chosen.steps_per_s) == (busy[3].raw, 100.0)
    assert fix.search_note(busy, VALUES) == (
        "stopped at 16 workers, four per core: each was busy 90% of a core (loading bound by CPU); no "
        "deeper prefetch tried: num_workers=16's window kept 398% of the 4 cores busy, none idle for "
        "workers to load ahead"
    )
    quiet = search(OWN, SLOW_SPELL, other_pct=0.0)
    assert counts(quiet) == [2, 4, 8, 16]
    assert fix.choose(quiet, VALUES) is quiet[2]


def test_a_count_that_lost_against_the_count_again_ends_the_search_there() -> None:
    """16 workers gain 3% on 8 at the machine's steady pace: measured again right after, 8 reads
    what it read before, the search stops at 16, and 8 (its latest window) is kept."""
    fix = DataLoaderWorkers()
    trials = search({**OWN, 16: 62.0}, [1.0] * 6, other_pct=100.0)
    assert counts(trials) == [2, 4, 8, 16, 8]
    assert fix.choose(trials, VALUES) is trials[-1]
    assert fix.search_note(trials, VALUES) == (
        "stopped at 16 workers: they gained less than 10% over 8 workers measured again right after them "
        "(62.0 against 60.0 steps/s; other processes used 1.0 cores beside them); no deeper prefetch "
        "tried: num_workers=8's window kept 217% of the 4 cores busy, none idle for workers to load ahead; "
        "num_workers=8 kept: num_workers=16 ran 3.3% faster, under the 10% more workers must bring"
    )
    outcome = FixOutcome("dataloader-workers", "data-stall", "unconfirmed", "", trials[-1].overrides, trials)
    assert chosen_trial(outcome) is trials[-1]  # the pairs that check the choice start from its latest


def test_no_count_is_measured_again_where_it_gained_or_nothing_before_it_beat_the_script() -> None:
    shared = 100.0
    best, lost = window(8, 60.0, shared), window(16, 50.0, shared)
    assert to_measure_again([best, lost], 10.0, 1.10) is best
    assert to_measure_again([best, window(16, 66.0, shared)], 10.0, 1.10) is None  # it gained 10%
    assert to_measure_again([best, lost], 60.0, 1.10) is None  # 8 did not beat the script's own
    assert to_measure_again([best, window(16, 50.0, 0.0)], 10.0, 1.10) is best  # 8's window was shared
    assert to_measure_again([window(8, 60.0, 0.0), window(16, 50.0, 0.0)], 10.0, 1.10) is None  # quiet
    again = window(8, 30.0, shared)
    assert repeats([best, lost, again]) and not repeats([best, lost])
    assert to_measure_again([best, lost, again], 10.0, 1.10) is None  # the count again is not checked
    assert [t for t, _ in figures([best, lost, again])] == [lost, again]
    assert paired_stop([best, lost, again], 1.10) is None  # 50 against 30: it goes on
    assert to_measure_again([best, lost, again, window(32, 52.0, shared)], 10.0, 1.10) is lost  # 16, at 50
    unmeasured = Trial("w16", Overrides({"0": {"num_workers": 16}}), "failed", None, "exited")
    assert to_measure_again([best, unmeasured], 10.0, 1.10) is None


def test_the_counts_after_a_count_measured_again_stand_at_the_machines_first_pace() -> None:
    """A light loop beside a busy core (15 ms an image, 4 a batch; its windows in order): 16
    workers read 47.8 steps/s, 32 read 24.7 in a slower spell, and 16 read 22.6 right after it. 32
    gained under 10% over its pair and the search stops; at the first pace 32 stands at 24.7 x
    47.8 / 22.6 = 52.2, within 10% of 16's 47.8, and 16, the fewer, is kept (at its latest
    window, the one next to the pairs that check it), not 8, which read 36.6 before the spell."""
    rates = [(2, 17.5), (4, 21.9), (8, 36.6), (16, 47.8), (32, 24.7), (16, 22.6)]
    trials = [window(n, r, 80.0) for n, r in rates]
    assert [(counts([t])[0], round(f, 1)) for t, f in figures(trials)] == [
        (2, 17.5), (4, 21.9), (8, 36.6), (32, 52.2), (16, 47.8)
    ]  # fmt: skip
    fix = DataLoaderWorkers()
    assert (
        fix.next_candidate(VALUES, trials[:5]).note
        == "measured again right after w32, beside other processes"
    )
    chosen = fix.choose(trials, VALUES)
    assert chosen is not None and chosen.raw is trials[-1].raw and chosen.steps_per_s == 47.8
    assert fix.search_note(trials, VALUES).startswith(
        "stopped at 32 workers: they gained less than 10% over 16 workers measured again right after them "
        "(24.7 against 22.6 steps/s; other processes used 0.8 cores beside them)"
    )


def test_after_a_count_measured_again_the_races_bar_follows_the_machines_pace() -> None:
    """The slow spell, driven through the trials' loop on 8 cores (up to 32 workers): each window
    races the slow windows of the best so far (8 workers' 60 steps/s), a count measured again
    races in its timed steps only, and once 8 read half of what it had, 32's bar is half as
    high: 30 steps/s. 32 then stands at 100 at the first pace, under 16's 100 x 1.1: 16 is
    measured again right after it, and the search stops there."""
    seen: list[tuple[str, float, bool, str | None]] = []
    speed = iter(SLOW_SPELL + [0.5] * 4)

    def trial_window(fix: object, label: str, candidate: Setting) -> Measured:
        seen.append(
            (candidate.label, round(candidate.race_below or 0.0, 1), candidate.race_warmup, candidate.note)
        )
        workers = int(candidate.overrides.loader()["num_workers"])
        done = window(workers, OWN.get(workers, 100.0) * next(speed), 100.0)
        step_ms = 1000.0 / (done.steps_per_s or 1.0)
        done.raw = raw([step_ms] * 10, [0.4 * step_ms] * 10, workers=workers)
        done.raw.host_samples = window(workers, 1.0, 100.0).raw.host_samples  # type: ignore[union-attr]
        return Measured(summarize(done.raw), done.raw, "measured", None)

    baseline = summarize(raw([100.0] * 10))
    values = {**VALUES, "cpu_count": 8}
    fix = DataLoaderWorkers()
    trials = tune(fix, values, trial_window, lambda line: None, references=[baseline])
    again = "measured again right after num_workers={}, beside other processes"
    assert seen == [
        ("num_workers=2", 10.0, True, None),
        ("num_workers=4", 25.0, True, None),
        ("num_workers=8", 45.0, True, None),
        ("num_workers=16", 60.0, True, None),
        ("num_workers=8", 60.0, False, again.format(16)),
        ("num_workers=32", 30.0, True, None),
        ("num_workers=16", 30.0, False, again.format(32)),
    ]
    assert fix.pace_now(trials) == 0.5 and fix.pace_now(trials[:4]) == 1.0
    chosen = fix.choose(trials, values)
    assert chosen is not None and chosen.raw is trials[-1].raw and chosen.steps_per_s == 100.0
