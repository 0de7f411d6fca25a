"""The progress line's "about N left" (`Tuning.remaining_s`): each fix's expected candidates, the
pair that checks a choice made in windows (one window where the last fix has a single candidate:
its own trial window is the pair's first), and the confirmation run."""

from __future__ import annotations

import time
from pathlib import Path

from support.race import _windows_at

from trainadvisor.profile.runs import ProfileOptions
from trainadvisor.profile.tuning import Tuning
from trainadvisor.records import PlannedFix

VALUES = {"dataloader_call_site": "train.py:12", "num_workers": 0, "cpu_count": 2, "cuda_used": True}


def _left_s(*fixes_planned: str, live: bool = True) -> float:
    plan = [PlannedFix(fix, "rule", True, "") for fix in fixes_planned]
    tuning = Tuning(
        ProfileOptions(Path("train.py"), [], Path("out")), plan, dict(VALUES), _windows_at(100.0),
        lambda line: None, time.monotonic(), [],
    )  # fmt: skip
    tuning.walls = {"window": [2.0], "fresh": [10.0], "prestarted": []}
    tuning.prestarted = False
    return tuning.remaining_s(live)


def test_a_single_candidate_in_windows_counts_one_window_for_its_pair() -> None:
    assert _left_s("tf32") == 1 * 2.0 + 1 * 2.0 + 10.0  # its window, the pair's other, the confirmation


def test_a_search_counts_both_windows_of_its_pair() -> None:
    # dataloader-workers: 4 candidates on 2 cores from none (2, 4, 8, and a deeper prefetch)
    assert _left_s("dataloader-workers") == 4 * 2.0 + 2 * 2.0 + 10.0


def test_fresh_runs_count_the_script_measured_again_beside_the_confirmation() -> None:
    assert _left_s("tf32", live=False) == 10.0 + 10.0 + 10.0
