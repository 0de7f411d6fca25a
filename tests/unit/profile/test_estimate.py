"""The progress line's "about N left" (`Tuning.remaining_s`) before any window was measured: the
candidates each fix's search usually measures, each window its settling (at least 2 s: its
workers start) and its timed steps at the pace its fix can reach at most; the pair that checks
a choice made in windows (the script's own setting as the baseline ran it, cut after one block
where the fix can decide in one pair, and the choice again,
unless the last fix had a single candidate: its own trial window is the pair's first); the
confirmation run."""

from __future__ import annotations

import time
from pathlib import Path

from support.race import _windows_at

from trainadvisor.profile.runs import ProfileOptions
from trainadvisor.profile.tuning import Tuning
from trainadvisor.records import PlannedFix, WindowShape

# The baseline settled 0.5 s after its counted warm-up, then timed its steps over 0.6 s (at least
# 1 s for the windows); its whole run, set-up included, took 12 s. The loop waited on its input
# for 75% of each step: more workers make it at most 4x as fast.
VALUES = {
    "dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 2, "cuda_used": True,
    "data_wait_pct": 75.0,
}  # fmt: skip


def _left_s(*fixes_planned: str, live: bool = True, prestarted: bool = False) -> float:
    baseline = _windows_at(100.0)
    baseline.raw.wall_s = 12.0
    baseline.raw.shape = WindowShape(30, 1.0, "settled", timed_s=0.6, min_time_s=1.0, settle_s=0.5)
    plan = [PlannedFix(fix, "rule", True, "") for fix in fixes_planned]
    options = ProfileOptions(Path("train.py"), [], Path("out"))
    tuning = Tuning(options, plan, dict(VALUES), baseline, lambda line: None, time.monotonic(), [])
    tuning.prestarted = prestarted
    return tuning.remaining_s(live)


def test_a_single_candidate_in_windows_counts_one_window_for_its_pair() -> None:
    # its window: 2 s settling (its workers start: more than the baseline's 0.5 s), 1 s timed, 0.5 s; the
    # pair's other window: the baseline's 0.5 s settling and 0.6 s timed, 0.5 s; a fresh
    # confirmation: the baseline's whole run
    assert round(_left_s("tf32"), 6) == 3.5 + 1.6 + 12.0


def test_a_search_counts_both_windows_of_its_pair_and_a_run_started_ahead_skips_its_setup() -> None:
    # the two candidates the workers search usually measures, 3.5 s each: 2 workers (one a core)
    # and 4, which finds no gain and stops it (it may try 8 and a deeper prefetch too); the
    # pair's 1.2 s (at up to 4x, one pair decides: the script's setting is cut after one block of
    # 0.2 s, not its 0.6 s timed) and the choice again (3.5 s); the run started ahead: 3 s
    # settling, 1 s timed (0.6 s at 4x the pace is under the minimum) and 2.5 s of traced steps
    # and exit
    assert round(_left_s("dataloader-workers", prestarted=True), 6) == 2 * 3.5 + (1.2 + 3.5) + 6.5


def test_fresh_runs_count_the_script_measured_again_beside_the_confirmation() -> None:
    assert round(_left_s("tf32", live=False), 6) == 12.0 + 12.0 + 12.0
