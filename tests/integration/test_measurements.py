"""Pure stages: summaries, windows, speedups, loss checks, verdicts, fix search. Exact numbers."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from conftest import gpu_run
from support.runs import raw, trial

from trainadvisor.analyze.run.summary import (
    named_measurements,
    percentile,
    stats,
    step_durations_ms,
    summarize,
)
from trainadvisor.fixes import merge_overrides, plan
from trainadvisor.fixes.dataloader_workers import DataLoaderWorkers
from trainadvisor.fixes.worker_counts import next_count
from trainadvisor.profile.judge import compare, judge_trial, loss_change, loss_check, verdict
from trainadvisor.records import (
    Finding,
    HostSample,
    LoaderInfo,
    Overrides,
    RawRun,
    Trial,
    timed_steps,
)
from trainadvisor.report import render
from trainadvisor.report.render import load_report


def test_percentiles_interpolate_like_numpy() -> None:
    assert percentile([10.0, 20.0, 30.0, 40.0], 50) == 25.0
    assert percentile([10.0, 20.0, 30.0, 40.0], 90) == 37.0
    assert percentile([], 50) is None
    s = stats([4.0, 1.0, 3.0, 2.0])
    assert (s.median, s.p90, s.mean, s.min, s.max) == (2.5, 3.7, 2.5, 1.0, 4.0)


def test_summary_breakdown_adds_up_to_the_step() -> None:
    run = summarize(raw([100.0, 100.0, 100.0, 100.0, 100.0], [80.0, 60.0, 70.0, 90.0, 50.0]))
    assert run.steps == 5
    assert run.steps_per_s == 10.0 and run.samples_per_s == 320.0
    assert run.breakdown_ms_per_step == {"data_wait": 70.0, "h2d_copy": 0.0, "compute": 30.0}
    assert run.breakdown_pct == {"data_wait": 70.0, "h2d_copy": 0.0, "compute": 30.0}
    assert run.window_steps_per_s == [10.0]


def test_traced_steps_do_not_count_for_timing() -> None:
    r = raw([10.0] * 5 + [50.0] * 5)
    for step in r.steps[5:]:
        step.profiled = True
        step.h2d_copy_ms = 2.0
    run = summarize(r)
    assert run.steps == 5 and run.step_time_ms.median == 10.0
    assert run.breakdown_ms_per_step["h2d_copy"] == 2.0  # from the traced steps only


def test_windows_are_two_rounds_of_workers_long() -> None:
    assert summarize(raw([10.0] * 20)).window_steps_per_s == [100.0] * 4
    assert summarize(raw([10.0] * 20, workers=4)).window_steps_per_s == [100.0, 100.0]  # 8 steps each


def test_speedup_and_its_range() -> None:
    before = summarize(raw([50.0] * 10 + [40.0] * 10))  # windows: 20, 20, 25, 25 steps/s
    after = summarize(raw([10.0] * 10 + [12.5] * 10))  # windows: 100, 100, 80, 80 steps/s
    c = compare(before, after)
    assert c.windows == 4
    assert c.speedup == after.steps_per_s / before.steps_per_s == (20 / 0.225) / (20 / 0.9)
    assert c.speedup_low == 80.0 / 25.0 and c.speedup_high == 100.0 / 20.0
    assert c.loss_check.equivalent is True and c.loss_check.steps_compared == 22
    assert verdict(c) == ("kept", "measured 4.00x steps/s (range 3.20-5.00x)")


def test_no_gain_is_not_kept() -> None:
    before = summarize(raw([10.0] * 20))
    after = summarize(raw([9.8] * 20))
    status, reason = verdict(compare(before, after))
    assert status == "no_gain" and reason.startswith("measured 1.02x")


def test_changed_loss_is_not_kept() -> None:
    before = raw([10.0] * 10, losses=[1.0] * 12)
    after = raw([5.0] * 10, losses=[1.0] * 11 + [1.001])
    check = loss_check(before, after)
    assert check.steps_compared == 12
    assert round(check.max_abs_diff, 9) == 0.001 and round(check.max_rel_diff, 9) == 0.001
    assert check.equivalent is False
    status, reason = verdict(compare(summarize(before), summarize(after)))
    assert status == "changed_training" and "0.1%" in reason
    assert judge_trial(before, after)[0] == "changed_training"


def test_missing_losses_are_not_compared() -> None:
    check = loss_check(raw([1.0], losses=[None, None, None]), raw([1.0], losses=[None, 2.0]))
    assert (check.steps_compared, check.equivalent) == (0, None)


def test_repeated_batches_reject_a_trial_of_an_iterable_dataset() -> None:
    baseline, trial = raw([10.0] * 10), raw([5.0] * 10)
    baseline.batch_fingerprints = [f"b{i}" for i in range(12)]
    trial.batch_fingerprints = ["b0", "b1"] + [f"b{2 + i // 2}" for i in range(10)]  # 2 workers, same data
    trial.loaders[0].iterable_dataset = True
    status, reason = judge_trial(baseline, trial)
    assert status == "changed_training" and "5 of 10 batches" in reason and "get_worker_info" in reason
    trial.loaders[0].iterable_dataset = False  # map-style data repeats only by wrapping an epoch
    assert judge_trial(baseline, trial)[0] == "measured"


def test_batches_without_host_tensors_are_not_repeats() -> None:
    trial = raw([5.0] * 10)
    trial.batch_fingerprints = [None] * 12
    trial.loaders[0].iterable_dataset = True
    assert judge_trial(raw([10.0] * 10), trial)[0] == "measured"


def test_a_diverged_loss_is_a_change() -> None:
    nan, inf = float("nan"), float("inf")
    check = loss_check(raw([1.0], losses=[1.0, 0.5, 0.4]), raw([1.0], losses=[1.0, 0.5, nan]))
    assert check.equivalent is False and check.max_rel_diff == inf
    assert loss_change(check) == "the loss diverged (NaN or infinite) in one run but not in the other"
    same = loss_check(raw([1.0], losses=[1.0, nan, inf]), raw([1.0], losses=[1.0, nan, inf]))
    assert same.equivalent is True and same.steps_compared == 3


def test_different_batches_compare_the_mean_loss() -> None:
    before = raw([1.0] * 2, losses=[1.0, 0.75, 0.5, 0.25])
    after = raw([1.0] * 2, losses=[1.125, 0.625, 0.5, 0.25])
    before.batch_fingerprints = ["a", "b", "c", "d"]
    after.batch_fingerprints = ["a", "x", "y", "z"]
    check = loss_check(before, after)
    assert check.same_batches is False and check.tolerance_rel == 0.1
    assert check.max_rel_diff == 0.125 / 0.75  # 0.625 against 0.75: a step alone would fail
    assert check.mean_rel_diff == 0.0 and check.equivalent is True
    after.losses = [1.25, 1.0, 0.625, 0.25]  # mean 0.78125 against 0.625
    check = loss_check(before, after)
    assert check.equivalent is False
    assert loss_change(check) == (
        "the mean loss of the same steps changed by 25% (tolerance 10%, the batches differ between runs)"
    )


def test_refused_override_rejects_a_trial() -> None:
    trial = raw([5.0] * 10)
    trial.loaders[0].override_refused = "the DataLoader's dataset cannot be pickled"
    assert judge_trial(raw([10.0] * 10), trial) == ("refused", "the DataLoader's dataset cannot be pickled")


def test_named_measurements_for_rules() -> None:
    values = named_measurements(summarize(raw([100.0] * 5, [80.0] * 5)))
    assert values["data_wait_pct"] == 80.0 and values["data_wait_ms_per_step"] == 80.0
    assert values["num_workers"] == 0 and values["batch_size"] == 32 and values["cpu_count"] == 2
    assert values["dataloader_call_site"] == "train.py:12" and values["cuda_used"] is False


def test_worker_search_doubles_while_it_gains_then_tries_prefetch() -> None:
    fix = DataLoaderWorkers()
    values = {"dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 2, "steps_per_s": 10.0}
    first = fix.next_candidate(values, [])
    assert first.label == "num_workers=2"
    assert first.overrides == Overrides({"train.py:12": {"num_workers": 2, "persistent_workers": True}})
    assert fix.next_candidate(values, [trial(2, 20.0)]).label == "num_workers=4"
    # 8 workers gained less than 10% over 4: the search stops doubling and tries prefetch at 4.
    done = [trial(2, 20.0), trial(4, 35.0), trial(8, 36.0)]
    assert fix.next_candidate(values, done).label == "num_workers=4, prefetch_factor=4"
    assert fix.choose(done, values) is done[1]  # 8 gained under 10%: 4 are kept
    done = [trial(2, 20.0), trial(4, 35.0), trial(8, 30.0)]
    assert fix.next_candidate(values, done).label == "num_workers=4, prefetch_factor=4"
    assert fix.next_candidate(values, [*done, trial(4, 36.0, prefetch=4)]) is None
    # 8 is the ceiling on 2 cores (4 per core, at least 8).
    assert fix.next_candidate(values, [trial(2, 20.0), trial(4, 40.0), trial(8, 80.0)]).label == (
        "num_workers=8, prefetch_factor=4"
    )
    assert fix.next_candidate(values, [trial(2, None, status="refused")]) is None


def test_max_workers_caps_the_doubling_whatever_the_workers_wait() -> None:
    fix = DataLoaderWorkers()
    values = {
        "dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 2, "steps_per_s": 10.0,
        "worker_cap": 4,
    }  # fmt: skip
    assert fix.expected_trials(values) == 3  # 2, 4, and 4 with a deeper prefetch
    assert fix.next_candidate(values, [trial(2, 20.0)]).label == "num_workers=4"
    done = [trial(2, 20.0), trial(4, 40.0)]  # still doubling its gain: the cap stops it
    assert fix.next_candidate(values, done).label == "num_workers=4, prefetch_factor=4"
    assert fix.search_note(done, values) == "stopped at 4 workers: 8 is past --max-workers 4"
    many = {**values, "num_workers": 16}  # fewer than the script's own are tried, more are not
    assert [fix.next_candidate(many, done[:i]).label for i in range(2)] == ["num_workers=8", "num_workers=0"]
    tried = [trial(8, 10.5), trial(0, 9.0)]
    assert fix.next_candidate(many, tried).label == "num_workers=8, prefetch_factor=4"
    assert fix.search_note(tried, many) == (
        "fewer than the script's 16 workers tried (8, 0); more were not tried: 32 is past --max-workers 4"
    )
    assert fix.search_note([trial(2, 20.0), trial(4, 40.0)], {**values, "worker_cap": None}) == (
        "more tried up to 4"
    )


def _sampled(workers: int, step_ms: float, wait_ms: float, busy_pct: float, steps_per_s: float) -> Trial:
    """A trial whose timed steps waited `wait_ms` of `step_ms` on input, its workers each busy
    `busy_pct` of a core."""
    done = trial(workers, steps_per_s)
    done.raw = raw([step_ms] * 10, [wait_ms] * 10, workers=workers)
    done.raw.host_samples = [
        HostSample(t, 50.0, busy_pct * workers, 1, workers * 10**6, workers) for t in (0, 100)
    ]
    return done


def test_the_next_worker_count_comes_from_what_the_last_window_showed() -> None:
    """At 2 workers that mostly sleep (5% of a core each), the loop still waited 75% of each
    step: about 2 / (1 - 0.75) = 8 workers would hide it, so the search leaps to 8 (at most 4x);
    with workers busy computing it only doubles; a loop that waited 2% stops the search, whatever
    it gained, and is given no deeper prefetch either."""
    fix = DataLoaderWorkers()
    values = {"dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 4, "steps_per_s": 10.0}
    waiting = _sampled(2, 40.0, 30.0, 5.0, 25.0)
    assert fix.next_candidate(values, [waiting]).label == "num_workers=8"
    assert fix.next_candidate(values, [_sampled(2, 40.0, 30.0, 90.0, 25.0)]).label == "num_workers=4"
    assert (
        fix.next_candidate(values, [_sampled(2, 40.0, 38.0, 5.0, 25.0)]).label == "num_workers=8"
    )  # 4x at most
    hidden = [waiting, _sampled(8, 10.0, 0.2, 5.0, 100.0)]
    assert fix.next_candidate(values, hidden) is None  # nor a deeper prefetch: nothing left to hide
    assert fix.search_note(hidden, values) == (
        "stopped at 8 workers: the loop waited on its input for 2% of its steps there, too little for "
        "more workers to gain the 10% they must bring"
    )
    # 8% waited: 16 workers could make it at most 1.09x faster, under the 10% they must bring; a
    # deeper queue at 8 (kept for 5%) is tried
    little = [waiting, _sampled(8, 10.0, 0.8, 5.0, 100.0)]
    assert fix.next_candidate(values, little).label == "num_workers=8, prefetch_factor=4"


def test_the_search_stops_where_the_loop_waits_only_for_batches_its_workers_loaded_ahead() -> None:
    """The slow-input example's 16 workers on 2 cores: the loop waited 25% of each step, and every
    step's batch was loaded ahead: that wait is the hand-over, which 32 workers did not shorten. The
    same waits where no step could tell go on to 16 / (1 - 0.25) -> 32 workers."""
    fix = DataLoaderWorkers()
    values = {"dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 8, "steps_per_s": 10.0}
    waiting = _sampled(8, 20.0, 10.0, 5.0, 50.0)
    kept_up = _sampled(16, 8.0, 2.0, 5.0, 125.0)
    assert fix.next_candidate(values, [waiting, kept_up]).label == "num_workers=32"
    for step in kept_up.raw.steps:  # type: ignore[union-attr]
        step.loaded_ahead = True
    assert fix.next_candidate(values, [waiting, kept_up]) is None  # nor a deeper queue: nothing to hide
    assert fix.search_note([waiting, kept_up], values) == (
        "stopped at 16 workers: the loop waited on its input for 25% of its steps there, but 100% of its "
        "steps found their batch loaded ahead and waited 2.0 ms (the median) for its hand-over from the "
        "worker, which more workers cannot hide; the 0% left is too little for them to gain the 10% they "
        "must bring"
    )


def test_the_search_counts_the_memory_each_worker_takes_not_the_pages_it_shares() -> None:
    """16 workers of a loader bound by latency (each busy 5% of a core) left the loop waiting 75%
    of each step: 64 would hide it. Each worker's RSS read 300 MB, most of it the training
    process's pages it shares (torch's libraries, the heap it was forked with), so that counted
    by RSS 32 would take 9.6 GB, past half of the 16 GB available, and the search stopped. Each
    worker's own memory (USS) read 12 MB: it leaps to 64; where each took 200 MB, 32 fit (6.4 GB)
    and 64 (12.8 GB) do not."""
    values = {"num_workers": 0, "cpu_count": 2, "memory_available_bytes": 16e9}

    def sixteen(own_mb: int | None) -> Trial:
        done = _sampled(16, 40.0, 30.0, 5.0, 100.0)
        own = None if own_mb is None else own_mb * 10**6
        done.raw.host_samples = [  # type: ignore[union-attr]
            HostSample(t, 50.0, 80.0, 1, 16 * 300 * 10**6, 16, worker_uss_bytes=read)
            for t, read in ((0, own), (100, None), (200, own))
        ]
        return done

    assert next_count(values, sixteen(None), 16) == (
        None, "stopped at 16 workers: 32 would take about 9.6 GB (300 MB each) of the 16.0 GB available"
    )  # fmt: skip
    assert next_count(values, sixteen(12), 16) == (64, "")
    assert next_count(values, sixteen(200), 16) == (32, "")
    assert next_count(values, sixteen(300), 16)[0] is None


def test_beside_other_processes_the_search_measures_the_next_count_instead_of_stopping_on_the_wait() -> None:
    """8 workers left the loop waiting 2% of each step: on a quiet machine the search stops there.
    Where other processes used half a core or more in that window, the wait does not tell what
    more workers gain (beside a busy core 8 workers left 8% and 16 ran 1.65x as fast): 16 is
    measured, and the gain it must bring decides; below half a core it stops as before."""
    fix = DataLoaderWorkers()
    values = {"dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 4, "steps_per_s": 10.0}
    waiting = _sampled(2, 40.0, 30.0, 5.0, 25.0)

    def beside(other_pct: float, workers: int = 8, steps_per_s: float = 100.0) -> Trial:
        done = _sampled(workers, 10.0, 0.2, 5.0, steps_per_s)
        for sample in done.raw.host_samples:  # type: ignore[union-attr]
            sample.other_cpu_pct = other_pct
        return done

    assert fix.next_candidate(values, [waiting, beside(49.0)]) is None
    shared = [waiting, beside(80.0)]
    assert fix.next_candidate(values, shared).label == "num_workers=16"
    lost = [*shared, beside(80.0, 16, 105.0)]  # 5% more: under the 10% a doubling must bring
    again = fix.next_candidate(values, lost)  # beside other processes 8 is measured right after it
    assert (again.label, again.note) == (
        "num_workers=8",
        "measured again right after w16, beside other processes",
    )
    no_more = [*lost, beside(80.0, 8, 100.0)]
    assert fix.next_candidate(values, no_more) is None
    assert fix.search_note(no_more, values) == (
        "went on past 8 workers, where the loop waited on its input for 2% of its steps: other processes "
        "used 0.8 cores in its window, beside which that wait does not tell what more workers gain; "
        "stopped at 16 workers: they gained less than 10% over 8 workers measured again right after them "
        "(105.0 against 100.0 steps/s; other processes used 0.8 cores beside them); w8 kept: w16 ran 5.0% "
        "faster, under the 10% more workers must bring"
    )
    assert fix.choose(no_more, values) is no_more[-1]  # 8 at its latest window
    # the counts below the script's own are tried whatever they showed: going past them is no news
    own = {**values, "num_workers": 4, "steps_per_s": 30.0}
    below = [beside(80.0, 2, 25.0), beside(80.0, 0, 31.0), beside(80.0, 8, 32.0)]
    assert fix.search_note(below, own) == (
        "fewer than the script's 4 workers tried (2, 0); stopped at 8 workers: they gained less than 10% "
        "over the best before them"
    )


def test_the_fewest_workers_within_10_percent_are_kept_and_get_the_deeper_prefetch() -> None:
    """Of the counts within 10% of the fastest, the fewest; among those that gained the 5% a fix
    must over the script (the deeper prefetch goes to the count that could be kept), and a deeper
    prefetch at that count needs 5% over it, not the 10% more workers must bring."""
    fix = DataLoaderWorkers()
    values = {"dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 2, "steps_per_s": 10.0}
    close = [trial(2, 33.0), trial(4, 35.0), trial(8, 36.0)]
    assert fix.choose(close, values) is close[0]
    assert fix.search_note(close, values) == (
        f"stopped at 8 workers: they gained less than 10% over the best before them; {close[0].label} "
        f"kept: {close[2].label} ran 9.0% faster, under the 10% more workers must bring"
    )
    short = [trial(2, 10.4), trial(4, 11.0)]  # 2 workers gained 4%: not a fix
    assert fix.choose(short, values) is short[1]
    assert fix.next_candidate(values, short).label == "num_workers=4, prefetch_factor=4"
    deeper = [trial(4, 35.0), trial(8, 36.0), trial(4, 37.5, prefetch=4)]
    assert fix.choose(deeper, values) is deeper[2]
    # 8 ran slower than the setting kept: the note says only why the search stopped
    assert (
        fix.search_note(deeper, values)
        == "stopped at 8 workers: they gained less than 10% over the best before them"
    )


@pytest.mark.parametrize(
    ("busy_pct", "other_pct", "then"),
    [
        (20.0, 0.0, "num_workers=4, prefetch_factor=4"),  # 50 + 80 of 200%: cores left idle
        (34.0, 0.0, None),  # 50 + 136 of 200%: 93% of the cores busy
        (10.0, 100.0, None),  # 50 + 40, and another process's 100: 95%
        (10.0, 80.0, "num_workers=4, prefetch_factor=4"),  # 50 + 40 + 80: 85%, under 90%
    ],
)
def test_no_deeper_prefetch_where_the_kept_counts_window_kept_the_cores_busy(
    busy_pct: float, other_pct: float, then: str | None
) -> None:
    """After 2, 4 and 8 workers (8 gained under 10% on 4: 4 are the count kept), the kept count
    gets a deeper prefetch only where its window left cores idle: the training process (50% of a
    core), its workers and every other process sampled together under 90% of the 2 cores. A
    deeper queue lets idle workers load ahead; with no core idle, it has nothing to run on."""
    fix = DataLoaderWorkers()
    values = {"dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 2, "steps_per_s": 10.0}
    kept = _sampled(4, 28.0, 18.0, busy_pct, 35.0)
    assert kept.raw is not None
    kept.raw.host_samples = [dataclasses.replace(h, other_cpu_pct=other_pct) for h in kept.raw.host_samples]
    done = [_sampled(2, 50.0, 40.0, 5.0, 20.0), kept, _sampled(8, 28.0, 18.0, 5.0, 36.0)]
    if other_pct >= 50.0:  # beside another process 4 is measured again after 8 (`worker_pairs`)
        assert (
            fix.next_candidate(values, done).note == "measured again right after w8, beside other processes"
        )
        done.append(dataclasses.replace(kept))
    deeper = fix.next_candidate(values, done)
    assert (deeper.label if deeper is not None else None) == then
    stopped = "stopped at 8 workers: they gained less than 10% over the best before them"
    if other_pct >= 50.0:
        stopped = (
            "stopped at 8 workers: they gained less than 10% over 4 workers measured again right after "
            f"them (36.0 against 35.0 steps/s; other processes used {other_pct / 100:.1f} cores beside them)"
        )
    fewer = f"{kept.label} kept: {done[2].label} ran 2.8% faster, under the 10% more workers must bring"
    if then is None:
        busy = round((50.0 + 4 * busy_pct + other_pct) / 2)
        assert fix.search_note(done, values) == (
            f"{stopped}; no deeper prefetch tried: {kept.label}'s window kept {busy}% of the 2 cores "
            f"busy, none idle for workers to load ahead; {fewer}"
        )
    else:
        assert fix.search_note(done, values) == f"{stopped}; {fewer}"


@pytest.mark.parametrize(
    ("values", "likely", "most"),
    [
        ({"cpu_count": 2}, 2, 4),  # 2 (a core each), 4 finds no gain; at most 8 and a deeper prefetch
        ({"cpu_count": 16}, 5, 6),  # 2, 4, 8, 16, then 32; at most a deeper prefetch too
        ({"cpu_count": 2, "num_workers": 4}, 3, 4),  # 2 and 0 below, 8 (four a core: the most)
        ({"cpu_count": 2, "worker_cap": 2}, 1, 2),  # --max-workers 2: 2 alone; at most its prefetch
        # loading that waited (6% of a core busy, the loop waiting 87%): the leap to 8 would hide
        # it, 16 finds no gain; at most 32 and a deeper prefetch
        ({"cpu_count": 2, "data_wait_pct": 87.0, "main_process_cpu_pct": 13.0 * 2 + 6.0}, 2, 4),
        # waiting 97%: 1 / (1 - 0.97) = 33 loaders would hide it, past the first leap's 8: the
        # search usually goes 8, 16, 32 (its ceiling: four times the first count); at most a
        # deeper prefetch too
        ({"cpu_count": 2, "data_wait_pct": 97.0, "main_process_cpu_pct": 3.0 * 2 + 6.0}, 3, 4),
        # the 87% one beside other processes (0.8 of a core, under half a core for 0.4): 32 too,
        # measured past where the loop kept up, then 16 measured again right after it
        ({"cpu_count": 2, "data_wait_pct": 87.0, "main_process_cpu_pct": 32.0, "cpu_busy_pct": 56.0}, 4, 4),
        ({"cpu_count": 2, "data_wait_pct": 87.0, "main_process_cpu_pct": 32.0, "cpu_busy_pct": 36.0}, 2, 4),
    ],
)
def test_the_estimate_counts_the_worker_counts_a_search_usually_measures(
    values: dict[str, Any], likely: int, most: int
) -> None:
    """The progress line counts the counts the search usually tries (up to the core count, or
    for loading bound by latency up to the count that would hide the wait, then one doubling
    more that stops it), where the steps shared among windows count the most it may try."""
    fix = DataLoaderWorkers()
    values = {"dataloader_call_site": "train.py:12", "num_workers": 0, "steps_per_s": 10.0, **values}
    assert (fix.likely_trials(values), fix.expected_trials(values)) == (likely, most)


def test_the_first_worker_count_comes_from_what_the_baseline_showed() -> None:
    """The baseline's loop waited 87% of each step on loading in its own process, which used 56%
    of a core: at most 56% - 13% x 2 cores of it went to loading, 34% of a core over the wait,
    so loading mostly waited: 1 / (1 - 0.87) = 7.7 loaders would hide it, and the search starts
    at 8 workers, not 2 (the estimate: 8, 16 and 32, as such a search goes past the cores, then
    the deeper prefetch). A process busy loading (150% of a core) starts at 2; so does one whose
    CPU was not sampled. With the script's 2 workers each busy 5% of a core and a 75% wait, it
    starts at 8 (2 / 0.25), not 4; at --max-workers 4, at 4."""
    fix = DataLoaderWorkers()
    values = {
        "dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 2, "steps_per_s": 12.0,
        "data_wait_pct": 87.0, "main_process_cpu_pct": 56.0,
    }  # fmt: skip
    assert fix.next_candidate(values, []).label == "num_workers=8"
    assert fix.expected_trials(values) == 4
    assert fix.expected_trials({**values, "worker_cap": 16}) == 3
    assert fix.next_candidate({**values, "main_process_cpu_pct": 150.0}, []).label == "num_workers=2"
    assert fix.expected_trials({**values, "main_process_cpu_pct": 150.0}) == 4
    assert fix.next_candidate({k: v for k, v in values.items() if "cpu_pct" not in k}, []).label == (
        "num_workers=2"
    )
    two = {**values, "num_workers": 2, "data_wait_pct": 75.0, "workers_cpu_pct": 10.0, "cpu_count": 8}
    assert fix.next_candidate(two, [trial(1, 11.0), trial(0, 9.0)]).label == "num_workers=8"
    assert fix.next_candidate({**two, "worker_cap": 4}, [trial(1, 11.0), trial(0, 9.0)]).label == (
        "num_workers=4"
    )


def test_worker_choice_prefers_the_simpler_setting_within_noise() -> None:
    fix = DataLoaderWorkers()
    trials = [trial(2, 20.0), trial(4, 35.0), trial(4, 36.0, prefetch=4)]
    baseline = {"steps_per_s": 10.0}
    assert fix.choose(trials, baseline) is trials[1]  # prefetch gained < 5%
    trials[2].steps_per_s = 40.0
    assert fix.choose(trials, baseline) is trials[2]
    assert fix.choose([trial(2, 10.4)], baseline) is None  # < 5% over the baseline
    # 8 workers ran 3% faster than 4: 4 are kept; 8 with a deeper prefetch, 5% over 8's own, is
    # kept only where it also brings the 10% more workers must over 4
    fewer = [trial(4, 35.0), trial(8, 36.0), trial(8, 38.0, prefetch=4)]
    assert fix.choose(fewer, baseline) is fewer[0]
    fewer[2].steps_per_s = 38.6
    assert fix.choose(fewer, baseline) is fewer[2]
    assert fix.describe(trials[2], baseline) == "num_workers=4, persistent_workers=True, prefetch_factor=4"


def test_cuda_runs_also_pin_memory_and_copy_without_blocking() -> None:
    values = {"dataloader_call_site": "t.py:3", "num_workers": 0, "cpu_count": 8, "cuda_used": True}
    setting = DataLoaderWorkers().next_candidate(values, [])
    assert setting.overrides == Overrides(
        {"t.py:3": {"num_workers": 2, "persistent_workers": True, "pin_memory": True}}, non_blocking_h2d=True
    )


def test_plan_lists_each_fix_once_with_why_it_cannot_apply() -> None:
    finding = Finding(
        "data-stall", "t", "high", "m", [], ["dataloader-workers", "unknown-fix"], "r", "a", "b", "s"
    )
    planned = plan([finding, finding], {"num_workers": 40, "cpu_count": 2, "dataloader_call_site": "t.py:3"})
    # 40 workers: past the search's hard cap for more, but fewer (and none) are measured
    assert [(p.fix, p.applicable) for p in planned] == [("dataloader-workers", True), ("unknown-fix", False)]
    assert plan([finding], {})[0].reason.startswith("no torch DataLoader fed the profiled steps")


def test_merge_overrides() -> None:
    merged = merge_overrides(
        [
            Overrides({"0": {"num_workers": 4}}),
            Overrides({"0": {"pin_memory": True}, "1": {"num_workers": 2}}, non_blocking_h2d=True),
            Overrides(runtime={"tf32": True}),
        ]
    )
    assert merged == Overrides(
        {"0": {"num_workers": 4, "pin_memory": True}, "1": {"num_workers": 2}}, True, {"tf32": True}
    )


def test_a_run_whose_optimizer_stepped_is_a_training_loop_whatever_its_trace_says() -> None:
    """A trace that holds no optimizer step or backward (the script ended inside it) reads as
    inference, which silences every training rule; the run's own hooks saw the optimizer step
    in the window, and that decides. Without them (a trace analysed alone) the trace decides."""
    inference_trace = {"training_loop": False, "inference_loop": True}
    for optimizers, training in ((1, True), (0, False)):
        run = summarize(raw([10.0] * 5))
        run.raw.runtime["optimizers"] = optimizers
        run.trace = dict(inference_trace)
        values = named_measurements(run)
        assert (values["training_loop"], values["inference_loop"]) == (training, not training)


def _loader(site: str, dataset_id: int, length: int, batches: int = 0) -> LoaderInfo:
    info = LoaderInfo(0, site, "ImageFolder", False, 64, 0, False, False, None, "fork", None, batches)
    info.dataset_id, info.length = dataset_id, length
    return info


def test_loaders_are_one_loader_rebuilt_by_identity_not_by_call_site() -> None:
    """timm builds its train and eval loaders at one line of a helper: two loaders of other data,
    not one built anew every epoch (which sent every worker trial to fresh runs). A loader rebuilt
    over the same dataset object, or over a dataset rebuilt alike, is one."""
    from types import SimpleNamespace

    from trainadvisor.profile.baseline import loader_problem

    def run(*loaders: LoaderInfo) -> Any:
        return SimpleNamespace(raw=SimpleNamespace(loaders=list(loaders)))

    train, evaluate = _loader("timm/loader.py:300", 1, 500, batches=40), _loader("timm/loader.py:300", 2, 50)
    assert loader_problem(run(train, evaluate)) is None
    again = _loader("timm/loader.py:300", 1, 500)
    assert loader_problem(run(train, evaluate, again)) == (
        "the DataLoader at timm/loader.py:300 is built anew every epoch (2 times so far): each trial needs "
        "loaders built with its setting"
    )
    alike = _loader("timm/loader.py:300", 3, 500)  # the dataset rebuilt with its loader
    assert loader_problem(run(train, alike)) is not None


def test_on_a_gpu_the_steps_times_are_the_cuda_events_where_the_host_ran_ahead() -> None:
    """The host queued 19 steps in 1 ms each and waited 81 ms for the queue to drain in the last
    (the window ends drained); the GPU took 5 ms a step. The steps' times, their median and the
    windows' throughputs are the CUDA events' (four windows of 5 steps, 200 steps/s each), not a
    1 ms median and windows of 1,000 and 59 steps/s; the run's steps/s is the same either way.
    Events that do not add up to the host's window (40 ms of 100), or a step without one, leave
    the host's times."""
    run = raw([1.0] * 19 + [81.0])
    for step in run.steps:
        step.gpu_ms = 5.0
    summary = summarize(run)
    assert summary.step_time_ms.median == 5.0 and summary.steps_per_s == pytest.approx(200.0)
    assert summary.window_steps_per_s == pytest.approx([200.0] * 4)
    for step in run.steps:
        step.gpu_ms = 2.0
    assert summarize(run).step_time_ms.median == 1.0
    assert summarize(run).window_steps_per_s == pytest.approx([1000.0] * 3 + [5 / 0.085])
    run.steps[3].gpu_ms = None
    for step in run.steps[4:]:
        step.gpu_ms = 5.0
    assert summarize(run).step_time_ms.median == 1.0


@pytest.mark.parametrize("name", ["compute", "fp32", "hf", "host", "lightning", "mnist", "smallb"])
def test_the_h100_runs_cuda_events_add_up_to_their_host_windows(name: str) -> None:
    """On the first H100 runs (../shared/gpu-runs) the CUDA events' step times add up to the
    host's window within 1.6% (each a step that read its loss: the host never ran ahead): they
    are the steps' times, their median within 2.5% of the host's."""
    report = load_report(gpu_run(f"{name}/report.json").parent)  # saved by version 1, read as 2
    raw_run = report.baseline.raw
    durations = step_durations_ms(raw_run)
    assert durations == [s.gpu_ms for s in timed_steps(raw_run)]
    host = [s.step_ms for s in timed_steps(raw_run)]
    assert abs(sum(durations) / sum(host) - 1) < 0.016
    assert abs(percentile(durations, 50) / percentile(host, 50) - 1) < 0.025


def test_a_script_killed_by_a_signal_python_has_no_name_for_is_told_by_its_number() -> None:
    """A real-time signal (SIGRTMIN+3 is 37 on Linux) has no member in `signal.Signals`: the run
    says its number instead of ending in an internal error."""
    from trainadvisor.measure.journal import say_how_it_ended
    from trainadvisor.units import signal_name

    assert (signal_name(9), signal_name(37)) == ("SIGKILL", "37")
    ended = raw([10.0, 10.0])
    say_how_it_ended(ended, -37)
    assert ended.error is not None  # the window it completed stays complete
    assert ended.error.startswith("the script was killed by signal 37 ")


def _ranked(losses_by_rank: list[list[float | None]]) -> RawRun:
    """A torchrun run: rank 0's run holding every rank's (each trains on its own batches)."""
    ranks = [raw([1.0], losses=losses) for losses in losses_by_rank]
    for rank, run in enumerate(ranks):
        run.rank = rank
    primary = dataclasses.replace(ranks[0], ranks=ranks)
    return primary


def test_under_torchrun_training_is_the_same_only_where_it_is_on_every_rank() -> None:
    same = loss_check(_ranked([[2.0, 1.5], [2.2, 1.7]]), _ranked([[2.0, 1.5], [2.2, 1.7]]))
    assert (same.equivalent, same.ranks_compared, same.changed_rank, same.max_abs_diff) == (
        True,
        2,
        None,
        0.0,
    )
    assert (
        render.loss_sentence(same)
        == "training unchanged: the loss of 2 seeded steps is identical on each of 2 ranks"
    )
    # rank 0 trains the same; rank 1's second step moved by 10%: the run's training changed
    moved = loss_check(_ranked([[2.0, 1.5], [2.2, 1.7]]), _ranked([[2.0, 1.5], [2.2, 1.87]]))
    assert (moved.equivalent, moved.changed_rank) == (False, 1)
    assert moved.max_rel_diff == pytest.approx(0.1) and moved.baseline == [2.0, 1.5]  # rank 0's shown
    assert render.loss_sentence(moved).startswith("training CHANGED on rank 1: the loss of 2 seeded steps")
