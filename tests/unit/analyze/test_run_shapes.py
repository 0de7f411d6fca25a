"""How a run's windows spent their steps, in the report's words (`analyze.run.shapes`): which runs
can be judged, how many steps the profiler recorded whole, why timed steps stopped short, the
baseline's warm-up note and the note naming every window whose warm-up ended on a cap."""

from __future__ import annotations

from dataclasses import replace

from support.race import _windows_at

from trainadvisor.analyze.run.shapes import (
    MIN_TIMED_STEPS,
    baseline_note,
    cut_short,
    traced_whole,
    unsettled_note,
    usable,
    window_notes,
)
from trainadvisor.records import FixOutcome, Overrides, RawRun, Run, RunStatus, StepRecord, Trial, WindowShape

# the last three of these four blocks are shown, each with three significant digits
BLOCKS = [12.0, 10.51, 10.26, 10.13]


def _raw(
    status: RunStatus = "window_complete",
    timed: int = 30,
    profiled: int = 0,
    steps_seen: int = 60,
    profile_steps: int = 0,
    shape: WindowShape | None = None,
) -> RawRun:
    """`timed` steps timed by clocks, then `profiled` steps under the profiler, 10 ms each."""
    steps = [StepRecord(i, 10.0 * i, 10.0, 0.0, profiled=i >= timed) for i in range(timed + profiled)]
    return RawRun(
        "baseline", status, 0, None, 5, timed, profile_steps, steps_seen, steps, [], None, shape=shape
    )


def _shape(warmup_end: str, **fields: object) -> WindowShape:
    values: dict[str, object] = {"warmup_steps": 40, "warmup_s": 2.345, "block_ms": BLOCKS, "timed_s": 1.5}
    return WindowShape(warmup_end=warmup_end, **(values | fields))  # type: ignore[arg-type]


def test_a_complete_window_is_usable_whatever_its_steps() -> None:
    assert usable(_raw("window_complete", timed=0, steps_seen=0))


def test_a_script_that_ended_is_usable_only_with_ten_steps_timed_by_clocks() -> None:
    assert MIN_TIMED_STEPS == 10
    assert usable(_raw("script_ended", timed=10, profiled=3))
    # traced steps carry the profiler's overhead: they do not count towards the ten
    assert not usable(_raw("script_ended", timed=9, profiled=5))


def test_a_failed_or_refused_run_is_never_usable() -> None:
    assert not usable(_raw("script_failed", timed=50))
    assert not usable(_raw("refused", timed=50))


def test_the_profilers_warmup_step_is_not_counted_as_traced_whole() -> None:
    assert traced_whole(_raw(profiled=4, profile_steps=4)) == 3
    assert traced_whole(_raw(profiled=1, profile_steps=4)) == 0
    assert traced_whole(_raw(profiled=0, profile_steps=4)) == 0


def test_without_a_profiler_the_one_untimed_step_is_the_memory_step_not_a_traced_one() -> None:
    assert traced_whole(_raw(profiled=1, profile_steps=0)) == 0


def test_a_script_that_ended_in_the_window_is_said_with_its_steps_seen_and_timed() -> None:
    raw = _raw(
        "script_ended", timed=12, profiled=2, steps_seen=37, shape=_shape("settled", timed_end="script ended")
    )
    assert cut_short(raw) == "the script ended after 37 steps, 12 of them timed"


def test_a_window_capped_by_the_scripts_length_is_said_with_its_timed_seconds() -> None:
    raw = _raw(timed=12, shape=_shape("settled", timed_end="step cap", timed_s=1.234))
    assert cut_short(raw) == "12 timed steps in 1.23 s: the script has no more steps to spare"


def test_a_window_timed_as_planned_or_without_a_shape_was_not_cut_short() -> None:
    assert cut_short(_raw(shape=_shape("settled", timed_end="plan"))) == ""
    assert cut_short(_raw(shape=_shape("settled", timed_end="raced"))) == ""
    assert cut_short(_raw(shape=None)) == ""


def test_a_baseline_saved_without_its_shape_has_no_note() -> None:
    assert baseline_note(_raw(shape=None)) is None


def test_a_settled_warmup_is_told_with_its_last_three_blocks_and_the_timed_steps() -> None:
    raw = _raw(timed=30, profiled=3, shape=_shape("settled"))
    assert baseline_note(raw) == (
        "Warm-up: the baseline's step time settled after 40 steps (2.3 s; the last blocks took "
        "10.5, 10.3, 10.1 ms per step); then 30 steps were timed over 1.50 s."
    )


def test_a_warmup_that_slid_into_the_timed_steps_says_how_many_moved() -> None:
    raw = _raw(timed=30, shape=_shape("settled", slid_steps=6, warmup_steps=46))
    assert baseline_note(raw) == (
        "Warm-up: the baseline's step time seemed settled (10.5, 10.3, 10.1 ms per step in its last "
        "blocks), then changed while it was timed: the first 6 timed steps were counted as warm-up too "
        "(46 steps, 2.3 s in all); then 30 steps were timed over 1.50 s."
    )


def test_a_counted_warmup_cut_by_the_scripts_length_says_both() -> None:
    raw = _raw(timed=12, shape=_shape("count", warmup_steps=5, timed_s=0.62, timed_end="step cap"))
    assert baseline_note(raw) == (
        "Warm-up: 5 steps; then 12 steps were timed over 0.62 s. The baseline's window was cut short: "
        "12 timed steps in 0.62 s: the script has no more steps to spare."
    )


def test_a_capped_warmup_leaves_its_words_to_the_unsettled_note() -> None:
    assert baseline_note(_raw(shape=_shape("time cap"))) is None
    ended = _raw("script_ended", timed=12, steps_seen=52, shape=_shape("time cap", timed_end="script ended"))
    assert baseline_note(ended) == (
        "The baseline's window was cut short: the script ended after 52 steps, 12 of them timed."
    )


def test_every_window_whose_warmup_ended_on_a_cap_is_named_in_one_note_in_order() -> None:
    windows: dict[str, RawRun | None] = {
        "the baseline window": _raw(shape=_shape("time cap", warmup_s=60.04)),
        "a settled window": _raw(shape=_shape("settled")),
        "a raced window": _raw(shape=_shape("raced")),
        "a window saved without its shape": _raw(shape=None),
        "a window that did not run": None,
        "amp's trial bf16": _raw(shape=_shape("settle cap", warmup_s=3.0, block_ms=[])),
        "the short window": _raw(shape=_shape("step cap", warmup_steps=25, block_ms=[8.0, 9.0])),
    }
    assert unsettled_note(windows) == (
        "Step time had not settled when the warm-up ended in "
        "the baseline window after 60.0 s (the longest warm-up allowed, --max-warmup, had passed); "
        "its last blocks took 10.5, 10.3, 10.1 ms per step; "
        "amp's trial bf16 after 3.0 s (a trial's warm-up settles for at most 3x as long as the "
        "baseline's took, and at most 10 s, or as long as it took for a confirmation; a pair's windows "
        "for 3 s); "
        "the short window after 25 steps (the script had no more to spare); its last blocks took 8, 9 ms "
        "per step: those windows measure a loop still changing speed (a longer --max-warmup, or more "
        "steps, lets it settle)."
    )


def test_windows_that_all_settled_have_no_unsettled_note() -> None:
    windows: dict[str, RawRun | None] = {
        "one": _raw(shape=_shape("settled")),
        "two": _raw(shape=_shape("count")),
    }
    assert unsettled_note(windows) is None
    assert unsettled_note({}) is None


def _with_shape(run: Run, shape: WindowShape) -> Run:
    return replace(run, raw=replace(run.raw, shape=shape))


def test_a_profiles_window_notes_name_the_trials_and_the_confirmation_run_after_the_baseline() -> None:
    baseline = _with_shape(_windows_at(50.0), _shape("settled"))
    capped = replace(_windows_at(40.0).raw, shape=_shape("settle cap", warmup_s=3.0, block_ms=[20.0]))
    trials = [
        Trial("num_workers=2", Overrides(), "measured", 40.0, None, raw=capped),
        Trial("num_workers=4", Overrides(), "measured", 60.0, None, raw=_raw(shape=_shape("settled"))),
        Trial("num_workers=8", Overrides(), "failed", None, "it crashed", raw=None),
    ]
    outcome = FixOutcome("dataloader-workers", "data-stall", "kept", "faster", Overrides(), trials)
    after = _with_shape(_windows_at(60.0), _shape("time cap", warmup_s=60.0, block_ms=[16.7, 16.6, 16.5]))
    assert window_notes(baseline, [outcome], after) == [
        "Step time had not settled when the warm-up ended in "
        "dataloader-workers's trial num_workers=2 after 3.0 s (a trial's warm-up settles for at most 3x "
        "as long as the baseline's took, and at most 10 s, or as long as it took for a confirmation; a "
        "pair's windows for 3 s); its last blocks took 20 ms per step; "
        "the confirmation run's window after 60.0 s (the longest warm-up allowed, --max-warmup, had "
        "passed); its last blocks took 16.7, 16.6, 16.5 ms per step: those windows measure a loop still "
        "changing speed (a longer --max-warmup, or more steps, lets it settle)."
    ]


def test_a_profile_whose_windows_all_settled_has_no_window_note() -> None:
    baseline = _with_shape(_windows_at(50.0), _shape("settled"))
    assert window_notes(baseline, [], None) == []
    # a baseline saved before shapes were recorded has none either
    assert window_notes(_windows_at(50.0), [], None) == []
