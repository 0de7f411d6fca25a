"""The baseline run's checks before its diagnosis (`profile.baseline`): a script that took no step,
or too few to time, stops with trainadvisor's own error and what to do about it; and a script
that ended inside the baseline's window is too short where it timed too few steps or traced none."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainadvisor.errors import NoStepsError, UsageError
from trainadvisor.profile.baseline import STEP_MARKING_HELP, check_steps, too_short
from trainadvisor.profile.runs import ProfileOptions
from trainadvisor.records import RawRun, RunStatus, StepRecord

OPTIONS = ProfileOptions(Path("train.py"), [], Path("out"), warmup=8)


def _raw(
    status: RunStatus, steps_seen: int, timed: int = 0, profiled: int = 0, profile_steps: int = 0
) -> RawRun:
    """`timed` steps timed by clocks, then `profiled` steps under the profiler."""
    steps = [StepRecord(i, 10.0 * i, 10.0, 0.0, profiled=i >= timed) for i in range(timed + profiled)]
    return RawRun("baseline", status, 0, None, 8, timed, profile_steps, steps_seen, steps, [], None)


def test_a_script_that_ran_to_its_end_without_a_step_is_told_how_to_mark_steps() -> None:
    with pytest.raises(NoStepsError) as raised:
        check_steps(_raw("script_ended", 0), OPTIONS)
    assert str(raised.value) == "train.py ran to the end but no training step was seen. " + STEP_MARKING_HELP
    assert raised.value.exit_code == 2
    assert STEP_MARKING_HELP.startswith(
        "trainadvisor finds steps through torch.optim optimizers' optimizer.step()"
    )


def test_a_script_with_too_few_steps_to_time_is_told_to_lower_the_warmup() -> None:
    with pytest.raises(UsageError) as raised:
        check_steps(_raw("script_ended", 6), OPTIONS)
    assert str(raised.value) == (
        "train.py ran only 6 step(s), too few to time any after a warm-up of at least 8: lower --warmup, "
        "or pass arguments that make the script train longer"
    )
    assert raised.value.exit_code == 2


def test_a_failed_script_is_left_to_its_own_report_however_few_its_steps() -> None:
    assert check_steps(_raw("script_failed", 0), OPTIONS) is None
    assert check_steps(_raw("script_failed", 3), OPTIONS) is None


def test_a_script_with_steps_in_its_window_passes_the_check() -> None:
    assert check_steps(_raw("window_complete", 40, timed=1), OPTIONS) is None
    # only traced steps count as steps measured too: the window is not empty
    assert check_steps(_raw("script_ended", 12, profiled=2), OPTIONS) is None


def test_a_script_that_ended_with_fewer_than_ten_timed_steps_is_too_short() -> None:
    assert too_short(_raw("script_ended", 17, timed=9))
    # the traced steps do not make up for it
    assert too_short(_raw("script_ended", 22, timed=9, profiled=5, profile_steps=5))


def test_a_script_that_ended_with_ten_timed_steps_and_no_profiler_is_long_enough() -> None:
    assert not too_short(_raw("script_ended", 18, timed=10))


def test_a_script_that_ended_inside_the_profilers_warmup_step_traced_nothing_and_is_too_short() -> None:
    assert too_short(_raw("script_ended", 19, timed=10, profiled=1, profile_steps=3))
    assert not too_short(_raw("script_ended", 20, timed=10, profiled=2, profile_steps=3))


def test_only_a_script_that_ended_by_itself_after_some_steps_can_be_too_short() -> None:
    assert not too_short(_raw("window_complete", 9, timed=0))
    assert not too_short(_raw("script_failed", 9, timed=0))
    assert not too_short(_raw("script_ended", 0))
