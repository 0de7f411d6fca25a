"""The progress line's "about N left" (`Tuning.remaining_s`) before any window was measured: the
candidates each fix's search usually measures, each window its settling (at least 1 s: its
workers start) and its timed steps at the pace its fix can reach at most; the pair that checks
a choice made in windows (the script's own setting as the baseline ran it, cut after one block
where the fix can decide in one pair, and the choice again, unless the search usually ends on
its choice: a single candidate, a loader bound by latency; its own trial window is the pair's
first); the confirmation run, and where it was started ahead, what is left of its set-up.
A fix that costs time once in a fresh run (compiling) counts its prior
(`Fix.once_s`) until one of its runs measured it, in its trial and in the confirmation where it
could be kept; --budget counts it too."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.race import _run, _windows_at

from trainadvisor.fixes import REGISTRY
from trainadvisor.fixes.compile import COMPILE_FIXED_S, COMPILE_PER_OP_S
from trainadvisor.profile.pace import setup_s
from trainadvisor.profile.runs import ProfileOptions
from trainadvisor.profile.tuning import Tuning
from trainadvisor.records import FixOutcome, Overrides, PlannedFix, WindowShape

# The baseline settled 0.5 s after its counted warm-up, then timed its steps over 0.6 s (at least
# 1 s for the windows); its whole run, set-up included, took 12 s. The loop waited on its input
# for 75% of each step: more workers make it at most 4x as fast.
VALUES = {
    "dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 2, "cuda_used": True,
    "data_wait_pct": 75.0,
}  # fmt: skip


def _tuning(*fixes_planned: str, budget_s: float | None = None, **values: Any) -> Tuning:
    baseline = _windows_at(100.0)
    baseline.raw.wall_s = 12.0
    baseline.raw.shape = WindowShape(30, 1.0, "settled", timed_s=0.6, min_time_s=1.0, settle_s=0.5)
    plan = [PlannedFix(fix, "rule", True, "") for fix in fixes_planned]
    options = ProfileOptions(Path("train.py"), [], Path("out"), budget_s=budget_s)
    not_tried = [FixOutcome(p.fix, p.rule, "not_run", "", Overrides(), []) for p in plan]
    return Tuning(
        options, plan, {**VALUES, **values}, baseline, lambda line: None, time.monotonic(), not_tried
    )


def _left_s(*fixes_planned: str, live: bool = True, prestarted: bool = False, **values: Any) -> float:
    tuning = _tuning(*fixes_planned, **values)
    tuning.ahead_left = (lambda: (0.0, False)) if prestarted else None  # its set-up done long ago
    return tuning.remaining_s(live)


def test_a_single_candidate_in_windows_counts_one_window_for_its_pair() -> None:
    # its window: 1 s settling (its workers start: more than the baseline's 0.5 s), 1 s timed, 0.5 s; the
    # pair's other window: the baseline's 5 counted warm-up steps (0.05 s), 0.5 s settling and 0.6 s
    # timed, 0.5 s; a fresh confirmation: the baseline's whole run
    assert round(_left_s("tf32"), 6) == 2.5 + 1.65 + 12.0


def test_a_search_counts_both_windows_of_its_pair_and_a_run_started_ahead_skips_its_setup() -> None:
    # the two candidates the workers search usually measures, 2.5 s each: 2 workers (one a core)
    # and 4, which finds no gain and stops it (it may try 8 and a deeper prefetch too); the
    # pair's 1.25 s (at up to 4x, one pair decides: the script's setting is cut after one block of
    # 0.2 s, not its 0.6 s timed) and the choice again (2.5 s); the run started ahead: 1 s
    # settling, 1 s timed (0.6 s at 4x the pace is under the minimum) and 1.5 s of traced steps
    # and the report made while it exits
    assert round(_left_s("dataloader-workers", prestarted=True), 6) == 2 * 2.5 + (1.25 + 2.5) + 3.5


# The training process used 30% of a core while it waited on its input (no workers) 87% of each
# step: its loading mostly waited (bound by latency); a batch's loading took 0.87 / 0.13 = 6.7
# times the step's compute. Gains at most 7.7x.
LATENCY = {"main_process_cpu_pct": 30.0, "data_wait_pct": 87.0}


def test_a_loader_bound_by_latency_counts_the_doubling_past_the_hiding_count_and_no_pair_window_again() -> (
    None
):
    """The slow-input example at 1 ms a sample: 8 workers (1.2 times the 6.7 that load as fast as
    the loop computes) still waited, 16 kept up and stopped the search there, its window the
    pair's first; at 0.5 ms a sample (82%: 4.4), 8 workers, 1.8 times that, kept up."""
    workers = REGISTRY["dataloader-workers"]
    assert workers.likely_trials({**VALUES, **LATENCY}) == 2 and workers.likely_ends_on_choice(
        {**VALUES, **LATENCY}
    )
    assert workers.likely_trials({**VALUES, **LATENCY, "data_wait_pct": 82.0}) == 1
    assert workers.likely_trials({**VALUES, **LATENCY, "data_wait_pct": 85.0}) == 2  # 5.7 x 1.5 > 8
    assert not workers.likely_ends_on_choice(VALUES)  # bound by CPU: a doubling finds no gain
    # 98%: a batch's loading took 49 steps' compute; the search leaps 8, 32 (at most 4x) and stops
    # at its ceiling (32, four times its first count) still waiting: a deeper prefetch follows,
    # and the count it keeps is the plain 32 again in the pair
    deep = {**VALUES, **LATENCY, "data_wait_pct": 98.0}
    assert [n for n, _ in workers.likely_windows(deep)] == [8, 32, 32]
    assert not workers.likely_ends_on_choice(deep)
    # 8 workers' window 2.5 s (0.5 s settling at 7.7x is under the 1 s its workers take to start),
    # 16's 2.62 s (0.07 s a worker to start: 1.12 s); the pair's window of the script's setting
    # 1.25 s (cut after one block); a run started ahead with 16 workers 3.62 s
    assert round(_left_s("dataloader-workers", prestarted=True, **LATENCY), 6) == 2.5 + 2.62 + 1.25 + 3.62


def test_a_run_started_ahead_is_confirmed_once_its_set_up_is_done() -> None:
    """Its set-up, 9 s still to run (the baseline's took that long before its first step),
    outlasts the trials and their pair (6.37 s): the confirmation of 16 workers (3.62 s) starts
    after it. Starved (in the idle class beside busy cores), its set-up runs after them, once its
    settings come."""
    tuning = _tuning("dataloader-workers", **LATENCY)
    tuning.ahead_left = lambda: (9.0, False)
    assert round(tuning.remaining_s(True), 6) == round(9.0 + 3.62, 6)
    tuning.ahead_left = lambda: (5.0, False)  # 5 s left: the trials and pair take longer
    assert round(tuning.remaining_s(True), 6) == round(2.5 + 2.62 + 1.25 + 3.62, 6)
    tuning.ahead_left = lambda: (5.0, True)
    assert round(tuning.remaining_s(True), 6) == round(2.5 + 2.62 + 1.25 + 5.0 + 3.62, 6)


def test_fresh_runs_count_the_script_measured_again_beside_the_confirmation() -> None:
    assert round(_left_s("tf32", live=False), 6) == 12.0 + 12.0 + 12.0


# A step of 400 aten ops: compiling it is estimated at 18 s + 400 x 14 ms = 23.6 s, until measured.
COMPILING_S = COMPILE_FIXED_S + 400 * COMPILE_PER_OP_S


def test_a_compile_trial_counts_its_compile_and_a_confirmation_only_where_compiling_could_pay() -> None:
    assert round(COMPILING_S, 6) == 23.6
    # one candidate on a CPU (on a GPU two: its CUDA graphs mode too, each compiled). At 100
    # steps/s and 23.6 s to compile, no run shorter than 2,360 steps can pay for it: compiling a
    # run seen to take 1,000 steps (its length unknown) is at best recommended, with no
    # confirmation run and no measurement beside it
    compiling: dict[str, Any] = {
        "live": False,
        "cuda_used": False,
        "model_aten_ops_per_step": 400,
        "steps_per_s": 100.0,
    }
    assert round(_left_s("compile", run_seen_steps=1000, **compiling), 6) == 12.0 + COMPILING_S
    long = _left_s("compile", run_total_steps=5000, **compiling)
    assert round(long, 6) == (12.0 + COMPILING_S) + 12.0 + (12.0 + COMPILING_S)
    assert _left_s("compile", run_seen_steps=3000, **compiling) == long
    # with a fix beside it that could be kept, the confirmation runs, without compiling
    both = _left_s("compile", "tf32", run_seen_steps=1000, **compiling)
    assert round(both, 6) == (12.0 + COMPILING_S) + 12.0 + 12.0 + 12.0
    # a trace without host ops: the fixed part alone
    compiling.pop("model_aten_ops_per_step")
    assert round(_left_s("compile", run_seen_steps=1000, **compiling), 6) == 12.0 + COMPILE_FIXED_S


def test_once_a_compiled_run_was_measured_its_wall_stands_for_the_compile() -> None:
    tuning = _tuning("compile", model_aten_ops_per_step=400, steps_per_s=100.0, run_total_steps=5000)
    compile_fix = REGISTRY["compile"]
    assert round(tuning.first_once_s(compile_fix, "fresh"), 6) == round(COMPILING_S, 6)  # 400 ops
    assert tuning.first_once_s(compile_fix, "window") == 0.0
    tuning.tried.add("compile")
    tuning.outcomes[0] = FixOutcome("compile", "rule", "unconfirmed", "", Overrides(), [])
    tuning.walls["fresh"].append(31.0)
    tuning.ran_fresh.add("compile")
    assert tuning.first_once_s(compile_fix, "fresh") == 0.0
    assert tuning.confirmation_cost_s() == 31.0  # the compiled trial's run: the longest fresh one
    # a run started ahead is estimated from the baseline's shape: plus the compile its trial
    # measured (the confirmation reads the inductor cache that trial left), else the prior
    tuning.ahead_left = lambda: (0.0, False)
    started_ahead_s = tuning.cost_s("prestarted", 1.0)
    tuning.outcomes[0] = replace(tuning.outcomes[0], compile_s=9.5)
    assert round(tuning.confirmation_cost_s() - started_ahead_s, 6) == 9.5
    tuning.outcomes[0] = replace(tuning.outcomes[0], compile_s=None)
    assert round(tuning.confirmation_cost_s() - started_ahead_s, 6) == round(COMPILING_S, 6)
    tuning.outcomes[0] = FixOutcome("compile", "rule", "recommended", "", Overrides(), [])
    assert tuning.confirmation_cost_s() == started_ahead_s  # not chosen: not compiled
    assert tuning.remaining_s(False) == 0.0  # and nothing left to confirm


def test_a_compile_trial_its_prior_puts_past_the_budget_does_not_start() -> None:
    tuning = _tuning("compile", budget_s=25.0, model_aten_ops_per_step=400, steps_per_s=100.0)
    tuning.run(tuning.plan[0], lambda *args: pytest.fail("measured past the budget"), "restart")
    assert tuning.outcomes[0].status == "not_run"
    assert "(about 36s each)" in tuning.outcomes[0].reason  # 12 s + 23.6 s
    assert not tuning.tried


def test_a_compile_refused_for_the_budget_counts_in_no_estimate_after() -> None:
    tuning = _tuning(
        "tf32", "compile", budget_s=25.0, model_aten_ops_per_step=400, steps_per_s=100.0, run_total_steps=5000
    )
    tuning.outcomes[0] = FixOutcome("tf32", "rule", "unconfirmed", "", Overrides(), [], gain=1.3)
    tuning.tried.add("tf32")
    tuning.ahead_left = lambda: (0.0, False)
    before_s = tuning.confirmation_cost_s()
    assert round(before_s - tuning.cost_s("prestarted", 1.3), 6) == round(COMPILING_S, 6)  # confirmable
    tuning.run(tuning.plan[1], lambda *args: pytest.fail("measured past the budget"), "restart")
    assert tuning.outcomes[1].status == "not_run" and tuning.refused == {"compile"}
    assert tuning.confirmation_cost_s() == tuning.cost_s("prestarted", 1.3)
    assert tuning.remaining_s(False) == tuning.cost_s("fresh") + tuning.cost_s("prestarted", 1.3)


def test_the_scripts_set_up_is_its_warm_up_less_its_warm_up_steps() -> None:
    """The baseline warmed up for 10.8 s over 20 steps that, at its timed pace (85 ms a step),
    take 1.7 s: its set-up (imports, loading, building the model) took about 9.1 s. A warm-up
    shorter than its steps at that pace (steps faster than the timed ones) counts no set-up."""
    baseline = _run([85.0] * 20).raw
    baseline.shape = WindowShape(20, 10.8, "settled", timed_s=1.7, min_time_s=1.0, settle_s=1.2)
    assert round(setup_s(baseline), 6) == 9.1
    baseline.shape = WindowShape(20, 1.5, "settled", timed_s=1.7)
    assert setup_s(baseline) == 0.0
    baseline.shape = None
    assert setup_s(baseline) == 0.0


def test_a_window_of_many_workers_settles_over_two_rounds_of_their_batches() -> None:
    """The settling test's blocks hold two rounds of a window's workers' batches: 32 workers that
    load at most 80 steps/s (each batch takes a worker 0.4 s) fill three blocks of 64 steps in
    2.4 s, where the fix's bound (4x the baseline's 100 steps/s) would say 0.48 s; at 50 steps/s
    it would be 3.84 s, past the trials' settling cap (3 s); 8 workers at 400 steps/s fill theirs
    within the second a window's workers take to start."""
    tuning = _tuning("dataloader-workers", **LATENCY)
    assert round(tuning.cost_s("window", 4.0, (32, 80.0)), 6) == 2.4 + 1.0 + 0.5
    assert round(tuning.cost_s("window", 4.0, (32, 50.0)), 6) == 3.0 + 1.0 + 0.5
    assert round(tuning.cost_s("window", 4.0, (8, None)), 6) == 1.0 + 1.0 + 0.5
    # a storage-latency loader whose in-process loading took 340 ms a batch: 8 workers load at
    # most 23.5 batches a second, 16 at 47.1
    workers = REGISTRY["dataloader-workers"]
    likely = workers.likely_windows({**VALUES, **LATENCY, "data_wait_ms_per_step": 340.0})
    assert [(n, round(pace or 0.0, 1)) for n, pace in likely] == [(8, 23.5), (16, 47.1)]
    assert workers.likely_windows(VALUES) == [(2, None), (4, None)]  # bound by CPU: no loading pace


def test_a_confirmation_before_any_choice_is_estimated_with_the_workers_a_search_usually_keeps() -> None:
    """The count the search usually keeps: its last where it usually ends on its choice (bound by
    latency: 16), the one before where a doubling past it finds no gain (bound by CPU: 2 of 2, 4)
    or a deeper prefetch follows (32 of 8, 32, 32). With 16 workers loading at most 47.1 steps/s, a
    run started ahead settles over three blocks of 32 steps (2.04 s) and times six rounds of their
    batches, 96 steps (2.04 s), then 1.5 s: 5.58 s, where no workers counted said 3.5 s."""
    workers = REGISTRY["dataloader-workers"]
    deep = {**VALUES, **LATENCY, "data_wait_pct": 98.0}
    kept = [workers.likely_kept(values) for values in (VALUES, {**VALUES, **LATENCY}, deep)]
    assert kept == [(2, None), (16, None), (32, None)]
    tuning = _tuning("dataloader-workers", **LATENCY, data_wait_ms_per_step=340.0)
    tuning.ahead_left = lambda: (0.0, False)
    assert (round(tuning.confirmation_cost_s(), 6), tuning.cost_s("prestarted", 7.7)) == (5.58, 3.5)
