"""The confirmation stage of `profile` (`profile.confirm`) on runs built in memory (steps at a fixed
pace, `support.race`), the fresh run and the code change replaced by stand-ins, nothing started:
each fix's verdict and reason after the confirmation run, after a run the budget had no room
for, and after one that did not complete; the comparison against the faster baseline, and against
the script's own setting measured next to it when the machine's speed changed; the notes on a run
cut short; which plans start the confirmation run ahead of the trials; the GPU device files."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.race import _run, _windows_at

from trainadvisor.analyze.run.summary import summarize
from trainadvisor.frameworks import change as framework_change
from trainadvisor.frameworks.change import Change
from trainadvisor.measure import priority
from trainadvisor.measure.config import AHEAD_ENV_CHANGED
from trainadvisor.measure.runner import PROFILE_STEPS, RunSpec
from trainadvisor.profile import confirm as confirming
from trainadvisor.profile.confirm import (
    _adjacent,
    _comparison,
    _final,
    _Judge,
    _length_note,
    _over_budget,
    _reference_note,
    _scoped,
    _short_run,
    _together,
    _unsure,
    confirm,
)
from trainadvisor.profile.runs import ProfileOptions
from trainadvisor.profile.tuning import Tuning
from trainadvisor.records import (
    Comparison,
    FixOutcome,
    FixStatus,
    LossCheck,
    Overrides,
    RawRun,
    Run,
    RunLength,
    StepRecord,
)

TF32 = Overrides(runtime={"tf32": True})
WORKERS = Overrides(loaders={"train.py:12": {"num_workers": 4}})
OPTIONS = ProfileOptions(Path("train.py"), [], Path("out"))
MACHINE_SLOWER = (
    "the machine's speed changed between runs: the script's own setting measured 10.0 steps/s in the "
    "baseline and 5.0 next to the confirmation run (-50%, more than the 10% two settled measurements of one "
    "loop differ by)"
)
MACHINE_FASTER = MACHINE_SLOWER.replace("5.0 next", "20.0 next").replace("-50%", "+100%")


def _outcome(
    fix: str,
    status: FixStatus = "unconfirmed",
    mode: str = "in_process",
    reason: str = "measured 1.30x steps/s in its trial windows",
    chosen: str = "",
    settings: Overrides | None = None,
) -> FixOutcome:
    return FixOutcome(fix, "rule", status, reason, settings or Overrides(), [], chosen, mode=mode)


def _tuning(baseline: Run, outcomes: list[FixOutcome], options: ProfileOptions = OPTIONS) -> Tuning:
    return Tuning(options, [], {}, baseline, lambda line: None, time.monotonic(), outcomes)


def _check(equivalent: bool | None = None) -> LossCheck:
    return LossCheck(0, None, None, 0.01, equivalent)


def _sampled(steps_per_s: float, samples: int, n: int = 60) -> Run:
    """A run at `steps_per_s` of batches of `samples`."""
    ms = 1e3 / steps_per_s
    steps = [StepRecord(i, i * ms, ms, 0.0, samples=samples) for i in range(n)]
    return summarize(RawRun("w", "window_complete", None, None, 5, n, 0, 25, steps, [], None))


def _lost(run: Run, loss: float) -> None:
    """Every step of the run with the loss `loss`."""
    run.raw.losses = [loss] * len(run.raw.steps)


# ---- a verdict for each fix ----


def test_an_inconclusive_confirmation_leaves_a_fix_chosen_in_windows_unconfirmed_with_its_pairs_figure() -> (
    None
):
    windows = _outcome("tf32", reason="measured 1.30x steps/s in 2 pairs of adjacent windows")
    assert _scoped(windows, "inconclusive", "the machine changed") == (
        "unconfirmed",
        "measured 1.30x steps/s in 2 pairs of adjacent windows; the confirmation run could not be compared: "
        "the machine changed",
    )
    restarted = _outcome("tf32", mode="restart")
    assert _scoped(restarted, "inconclusive", "the machine changed") == (
        "inconclusive",
        "the machine changed",
    )
    assert _scoped(windows, "kept", "measured 2.00x") == ("kept", "measured 2.00x")
    assert _scoped(windows, "no_gain", "measured 1.01x") == ("no_gain", "measured 1.01x")


def test_an_opportunity_from_fresh_runs_is_inconclusive_where_the_machine_changed() -> None:
    opportunity = _outcome("batch-size", "opportunity", "restart", "measured 1.40x samples/s")
    assert _unsure(opportunity, None) is opportunity
    unsure = _unsure(opportunity, "the machine's speed changed")
    assert (unsure.status, unsure.reason) == (
        "inconclusive",
        "measured 1.40x samples/s; but the machine's speed changed",
    )
    assert opportunity.status == "opportunity"  # a copy: the tuning's outcome stays
    in_windows = _outcome("batch-size", "opportunity", "in_process")
    assert _unsure(in_windows, "changed") is in_windows
    kept = _outcome("batch-size", "kept", "restart")
    assert _unsure(kept, "changed") is kept


def test_a_fix_confirmed_with_others_says_its_verdict_was_the_combinations() -> None:
    assert _together("measured 2.00x", [_outcome("tf32")]) == "measured 2.00x"
    chosen = [_outcome("tf32"), _outcome("dataloader-workers"), _outcome("amp")]
    assert _together("measured 2.00x", chosen) == (
        "measured 2.00x in the confirmation run of tf32, dataloader-workers, amp together"
    )


def test_a_fix_not_confirmed_for_the_budget_gives_the_command_that_confirms_it() -> None:
    options = ProfileOptions(Path("train.py"), ["--epochs", "3"], Path("my runs/out"), budget_s=90.0)
    chosen = [_outcome("tf32"), _outcome("dataloader-workers")]
    assert _over_budget(options, chosen[0], chosen, 123.4) == (
        "measured 1.30x steps/s in its trial windows; not confirmed: a confirmation run (about 123 s) would "
        "have run past the --budget of 90 s; confirm with: trainadvisor profile --warmup 5 --steps 20 "
        "--out 'my runs/out-confirmed' --seed 0 --fix tf32 --fix dataloader-workers train.py --epochs 3"
    )
    short = replace(options, budget_s=1.5, out_dir=Path("out"), args=[])
    assert _over_budget(short, chosen[1], chosen[1:], 2.6).endswith(
        "(about 3 s) would have run past the --budget of 1.5 s; confirm with: trainadvisor profile "
        "--warmup 5 --steps 20 --out out-confirmed --seed 0 --fix dataloader-workers train.py"
    )


def test_a_kept_or_recommended_fix_gets_its_code_change_and_others_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[Any, ...]] = []

    def fix_change(script: Path, fix: str, settings: Overrides, raw: RawRun | None) -> Change:
        asked.append((script, fix, settings, raw))
        return Change(f"diff of {fix}", f"setting of {fix}")

    monkeypatch.setattr(framework_change, "fix_change", fix_change)
    raw = _windows_at(10.0).raw
    verdicts: dict[str, tuple[FixStatus, str]] = {
        "tf32": ("kept", "measured 2.00x"),
        "amp": ("no_gain", "1.01x"),
    }
    kept = _final(OPTIONS, _outcome("tf32", settings=TF32), verdicts, raw)
    assert (kept.status, kept.reason, kept.diff, kept.setting_change) == (
        "kept", "measured 2.00x", "diff of tf32", "setting of tf32",
    )  # fmt: skip
    assert asked == [(Path("train.py"), "tf32", TF32, raw)]
    rejected = _final(OPTIONS, _outcome("amp"), verdicts, raw)
    assert (rejected.status, rejected.reason, rejected.diff) == ("no_gain", "1.01x", "")
    changed: tuple[FixStatus, ...] = ("recommended", "opportunity", "unconfirmed")
    unchanged: tuple[FixStatus, ...] = ("inconclusive", "not_applicable", "refused")
    for status in changed:  # not chosen: its own status stands
        outcome = _final(OPTIONS, _outcome("batch-size", status), verdicts, raw)
        assert (outcome.status, outcome.diff) == (status, "diff of batch-size")
    for status in unchanged:
        assert _final(OPTIONS, _outcome("batch-size", status), verdicts, raw).diff == ""
    assert len(asked) == 4


# ---- the comparison ----


def test_the_confirmation_is_compared_with_the_faster_baseline_at_the_loosest_tolerance() -> None:
    baseline, after = _windows_at(10.0), _windows_at(25.0)
    chosen = [_outcome("tf32", chosen="TF32 on"), _outcome("dataloader-workers")]
    tuning = _tuning(baseline, chosen)
    alone = _comparison(baseline, after, chosen, None, [tuning.again])
    assert (round(alone.speedup or 0.0, 9), alone.unit) == (2.5, "steps/s")
    assert alone.contains == ["tf32: TF32 on", "dataloader-workers"]
    assert alone.loss_check.tolerance_rel == 0.01  # tf32's, looser than the workers' 1e-4
    assert (
        _comparison(baseline, after, chosen, 0.02, [tuning.again]).loss_check.tolerance_rel == 0.08
    )  # 4x the noise
    tuning.again = _windows_at(12.5)  # the script's setting, faster after the trial windows
    assert round(_comparison(baseline, after, chosen, None, [tuning.again]).speedup or 0.0, 9) == 2.0
    beside = _comparison(baseline, after, chosen, None, [tuning.again, _windows_at(20.0)])
    assert round(beside.speedup or 0.0, 9) == 1.25


def test_a_comparison_against_a_faster_measurement_than_the_baseline_window_says_so() -> None:
    """The report's before and after columns are the baseline window's and the after run's: where
    the gain was claimed against the script's setting measured again, faster, a note says so."""
    baseline, after = _windows_at(4.0), _windows_at(128.0)  # a baseline window in a busy spell
    chosen = [_outcome("dataloader-workers")]
    tuning = _tuning(baseline, chosen)
    tuning.again = _windows_at(12.0)
    comparison = _comparison(baseline, after, chosen, None, [tuning.again])
    assert _reference_note(baseline, after, comparison) == (
        "The speedup is measured against the script's own setting as measured again later in the "
        "profile (12.0 steps/s), not the baseline window (4.0 steps/s, 3.0x slower, against which the "
        "after run reads 32.00x): a gain is claimed against the fastest measurement of the script's own "
        "setting, so that a baseline measured in a slow spell cannot inflate it."
    )
    for again in (4.3, 3.0, None):  # within the 10% two measurements of one loop differ by; slower
        tuning.again = _windows_at(again) if again else None
        assert (
            _reference_note(baseline, after, _comparison(baseline, after, chosen, None, [tuning.again]))
            is None
        )
    assert _reference_note(baseline, None, comparison) is None


def test_the_note_on_a_faster_reference_reads_samples_per_second_where_the_batch_changed() -> None:
    baseline, after = _sampled(4.0, 32), _sampled(8.0, 64)  # 128 and 512 samples/s
    chosen = [_outcome("batch-size", chosen="batch_size=64")]
    tuning = _tuning(baseline, chosen)
    tuning.again = _sampled(12.0, 32)  # 384 samples/s
    comparison = _comparison(baseline, after, chosen, None, [tuning.again])
    assert (round(comparison.speedup or 0.0, 9), comparison.unit) == (round(512 / 384, 9), "samples/s")
    note = _reference_note(baseline, after, comparison) or ""
    assert note.startswith(
        "The speedup is measured against the script's own setting as measured again later in the profile "
        "(384.0 samples/s), not the baseline window (128.0 samples/s, 3.0x slower, against which the after "
        "run reads 4.00x)"
    )


def test_the_note_on_a_faster_reference_comes_only_with_a_kept_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    for after_steps_per_s, notes in [(12.5, 0), (128.0, 1)]:  # 1.04x the faster: no gain; 10.7x: kept
        _stage(monkeypatch, FreshRun(_windows_at(after_steps_per_s)))
        baseline = _windows_at(4.0)
        tuning = _tuning(baseline, [_outcome("dataloader-workers", settings=WORKERS)])
        tuning.again = _windows_at(12.0)
        done = confirm(OPTIONS, baseline, tuning, None, lambda line: None)
        assert len(done.notes) == notes, done.notes
        assert done.outcomes[0].status == ("kept" if notes else "no_gain")


def test_a_larger_batch_is_compared_in_samples_per_second_with_no_loss_bound() -> None:
    baseline, after = _sampled(10.0, 32), _sampled(8.0, 64)  # 320 and 512 samples/s
    chosen = [_outcome("batch-size", chosen="batch_size=64")]
    comparison = _comparison(baseline, after, chosen, None)
    assert (round(comparison.speedup or 0.0, 9), comparison.unit) == (1.6, "samples/s")
    assert comparison.loss_check.tolerance_rel == math.inf
    assert comparison.contains == ["batch-size: batch_size=64"]


def _judged_beside(adjacent_steps_per_s: float, losses: tuple[float, float] | None = None) -> tuple[Any, ...]:
    baseline, after = _windows_at(10.0), _windows_at(25.0)
    if losses:
        _lost(baseline, losses[0])
        _lost(after, losses[1])
    return _adjacent(baseline, after, _windows_at(adjacent_steps_per_s), [_outcome("tf32")], None, [])


def test_a_confirmation_with_no_adjacent_measurement_keeps_its_verdict() -> None:
    baseline, after = _windows_at(10.0), _windows_at(25.0)
    chosen = [_outcome("tf32")]
    judge = _Judge(baseline, after, _tuning(baseline, chosen), chosen, None, lambda: None)
    status, reason, comparison, changed = judge()
    assert (status, reason, changed) == ("kept", "measured 2.50x steps/s (range 2.50-2.50x)", None)
    assert judge.loaded() is None  # no host samples: no window was disturbed


def test_a_steady_machine_judges_the_confirmation_against_the_faster_of_the_baselines() -> None:
    status, reason, comparison, changed = _judged_beside(10.2)
    assert (status, changed) == ("kept", None)
    assert reason == (
        "measured 2.45x steps/s (range 2.45-2.45x), against the script's own setting measured next to it too "
        "(10.2 steps/s)"
    )
    assert round(comparison.speedup, 9) == round(25.0 / 10.2, 9)


def test_a_gain_beyond_a_slowdown_of_the_machine_stands() -> None:
    status, reason, comparison, changed = _judged_beside(5.0)
    assert (status, changed) == ("kept", None)
    assert reason == (
        "measured 2.50x steps/s (range 2.50-2.50x), against the script's own setting measured next to it too "
        f"(5.0 steps/s); {MACHINE_SLOWER}, less than the gain"
    )


def test_a_gain_within_a_speedup_of_the_machine_is_inconclusive() -> None:
    status, reason, comparison, changed = _judged_beside(20.0)
    assert (status, changed) == ("inconclusive", MACHINE_FASTER)
    assert reason == (
        "measured 1.25x steps/s (range 1.25-1.25x), against the script's own setting measured next to it too "
        f"(20.0 steps/s): not a gain beyond the change, as {MACHINE_FASTER}"
    )


def test_changed_training_decides_whatever_the_machine_did() -> None:
    status, reason, comparison, changed = _judged_beside(20.0, losses=(1.0, 1.5))
    assert (status, changed) == ("changed_training", None)
    assert reason == (
        "the loss of the same steps changed by up to 50% (tolerance 1%), against the script's own setting "
        "measured next to it too (20.0 steps/s)"
    )


# ---- runs cut short ----


def test_a_confirmation_measured_on_what_fitted_says_so_with_what_is_known_of_the_length() -> None:
    tuning = _tuning(_windows_at(10.0), [])
    cut = Comparison(2.0, 1.8, 2.2, 3, _check(), cut="the script ended after 40 steps, 25 of them timed")
    assert _length_note(tuning, None) == []
    assert _length_note(tuning, replace(cut, cut="")) == []
    note = (
        "The confirmation run was measured on what fitted: the script ended after 40 steps, 25 of them "
        "timed{}; give the script more steps (more data or epochs) for a longer confirmation."
    )
    assert _length_note(tuning, cut) == [note.format("")]
    tuning.length = RunLength(400, "max_steps=400 in TrainingArguments")
    assert _length_note(tuning, cut) == [note.format(" (max_steps=400 in TrainingArguments)")]
    tuning.length = RunLength(None, "at least the 60 steps a run took", 60)
    assert _length_note(tuning, cut) == [note.format("")]
    tuning.length = RunLength(45, "a run of the script ended after 45 steps")  # learnt, not told
    assert _length_note(tuning, cut) == [note.format("")]


def test_a_short_confirmation_says_how_far_the_script_got() -> None:
    raw = _run([100.0] * 12).raw
    raw.status, raw.steps_seen = "script_ended", 12
    for step in raw.steps[-3:]:
        step.profiled = True
    assert _short_run(raw) == (
        "the script ended after 12 steps, before the confirmation run had timed enough steps (9 of at least "
        "10): give the script more steps to train (more data or epochs) to confirm it"
    )
    assert _short_run(replace(raw, steps_seen=0)) == "the confirmation run did not complete"
    assert _short_run(replace(raw, status="script_failed")) == "the confirmation run did not complete"


# ---- the stage ----


class FreshRun:
    """measure_fitted's stand-in: records what it was given, runs `first` only for a run started
    ahead (a fresh run would start a process), and returns `after`."""

    def __init__(self, after: Run | None, call_first: bool = False) -> None:
        self.after = after
        self.call_first = call_first
        self.given: list[tuple[Any, ...]] = []

    def __call__(self, spec_of: Any, length: Any, learn: Any, first: Any) -> Run:
        self.given.append((spec_of, length, learn, first))
        if self.call_first:
            return first(spec_of(length()))  # type: ignore[no-any-return]
        assert self.after is not None
        return self.after


def _stage(monkeypatch: pytest.MonkeyPatch, fresh: FreshRun) -> list[str]:
    monkeypatch.setattr(confirming, "measure_fitted", fresh)
    diff_of = lambda script, fix, settings, raw: Change(f"diff of {fix}")  # noqa: E731
    monkeypatch.setattr(framework_change, "fix_change", diff_of)
    return []


def test_the_chosen_fixes_are_kept_together_when_their_confirmation_run_is_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    baseline, after = _windows_at(10.0), _windows_at(25.0)
    after.raw.wall_s = 42.0
    fresh = FreshRun(after)
    echoed = _stage(monkeypatch, fresh)
    outcomes = [
        _outcome("tf32", chosen="TF32 on", settings=TF32),
        _outcome("dataloader-workers", chosen="num_workers=4", settings=WORKERS),
        _outcome("amp", "no_gain", reason="measured 1.01x steps/s: not a reliable gain"),
    ]
    tuning = _tuning(baseline, outcomes)
    done = confirm(OPTIONS, baseline, tuning, None, echoed.append)
    assert echoed == ["trainadvisor: confirming the chosen settings in a fresh profiled run"]
    spec_of, _, learn, first = fresh.given[0]
    assert first is confirming.measure_run and learn == tuning.learn
    spec = spec_of(None)
    assert (spec.label, spec.overrides) == (
        "after",
        Overrides(loaders=WORKERS.loaders, runtime={"tf32": True}),
    )
    assert tuning.walls["fresh"] == [42.0]  # the next fresh run's estimate
    together = (
        "measured 2.50x steps/s (range 2.50-2.50x) in the confirmation run of tf32, dataloader-workers "
        "together"
    )
    assert [(o.fix, o.status, o.reason, o.diff) for o in done.outcomes] == [
        ("tf32", "kept", together, "diff of tf32"),
        ("dataloader-workers", "kept", together, "diff of dataloader-workers"),
        ("amp", "no_gain", "measured 1.01x steps/s: not a reliable gain", ""),
    ]
    assert done.after is after and done.comparison is not None
    assert done.comparison.contains == ["tf32: TF32 on", "dataloader-workers: num_workers=4"]
    assert done.notes == []


def test_with_nothing_chosen_no_confirmation_runs() -> None:
    outcomes = [_outcome("amp", "no_gain"), _outcome("compile", "not_applicable")]
    done = confirm(OPTIONS, _windows_at(10.0), _tuning(_windows_at(10.0), outcomes), None, lambda line: None)
    assert done.outcomes == outcomes and (done.after, done.comparison, done.notes) == (None, None, [])


def test_a_confirmation_past_the_budget_is_not_run_and_its_fixes_stay_unconfirmed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    baseline = _windows_at(10.0)
    baseline.raw.wall_s = (
        30.0  # a fresh run takes as long as the baseline's whole run, before any was measured
    )
    fresh = FreshRun(None)
    echoed = _stage(monkeypatch, fresh)
    options = replace(OPTIONS, budget_s=10.0)
    outcomes = [_outcome("tf32", settings=TF32), _outcome("dataloader-workers", settings=WORKERS)]
    done = confirm(options, baseline, _tuning(baseline, outcomes, options), None, echoed.append)
    assert fresh.given == [] and echoed == [] and done.after is None
    why = (
        "measured 1.30x steps/s in its trial windows; not confirmed: a confirmation run (about 30 s) would "
        "have run past the --budget of 10 s; confirm with: trainadvisor profile --warmup 5 --steps 20 --out "
        "out-confirmed --seed 0 --fix tf32 --fix dataloader-workers train.py"
    )
    assert [(o.status, o.reason, o.diff) for o in done.outcomes] == [
        ("unconfirmed", why, "diff of tf32"),
        ("unconfirmed", why, "diff of dataloader-workers"),
    ]


def test_a_confirmation_run_that_failed_or_ended_early_leaves_its_fixes_unconfirmed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failed = _windows_at(25.0)
    failed.raw.status, failed.raw.error = "script_failed", "RuntimeError: boom"
    short = _run([40.0] * 8)  # fewer timed steps than a comparison needs
    short.raw.status, short.raw.steps_seen = "script_ended", 8
    for after, why in [
        (failed, "RuntimeError: boom"),
        (short, "the script ended after 8 steps, before the confirmation run had timed enough steps (8 of at "
         "least 10): give the script more steps to train (more data or epochs) to confirm it"),
    ]:  # fmt: skip
        _stage(monkeypatch, FreshRun(after))
        done = confirm(
            OPTIONS,
            _windows_at(10.0),
            _tuning(_windows_at(10.0), [_outcome("tf32")]),
            None,
            lambda line: None,
        )
        assert [(o.status, o.reason) for o in done.outcomes] == [
            ("unconfirmed", f"measured 1.30x steps/s in its trial windows ({why})")
        ]
        assert done.comparison is None and done.after is after


def test_a_run_started_ahead_is_handed_the_confirmation_and_its_wall_time_is_not_an_estimate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: list[tuple[RunSpec, int]] = []

    class Waiting:
        def waiting(self) -> bool:
            return True

        def run(self, spec: RunSpec, profile_steps: int) -> RawRun:
            handed.append((spec, profile_steps))
            return _windows_at(25.0).raw

    _stage(monkeypatch, FreshRun(None, call_first=True))
    baseline = _windows_at(10.0)
    tuning = _tuning(baseline, [_outcome("dataloader-workers", settings=WORKERS)])
    done = confirm(OPTIONS, baseline, tuning, None, lambda line: None, Waiting())  # type: ignore[arg-type]
    [(spec, profile_steps)] = handed
    assert (spec.label, spec.overrides, profile_steps) == ("after", WORKERS, PROFILE_STEPS)
    assert tuning.walls["fresh"] == []
    assert [(o.status, o.reason) for o in done.outcomes] == [
        ("kept", "measured 2.50x steps/s (range 2.50-2.50x)")
    ]


class _StoppedAtItsGate:
    """A run started ahead that stopped at its gate, measuring nothing, and said why: threads
    that could not get their priority back (how many), or variables the script set that its
    imports ahead had read."""

    def __init__(self, facts: dict[str, Any] | None = None) -> None:
        self.facts = facts or {priority.LOWERED: 2}

    def waiting(self) -> bool:
        return True

    def run(self, spec: RunSpec, profile_steps: int) -> RawRun:
        raw = replace(_windows_at(3.0).raw, steps=[], status="window_complete")
        raw.runtime.update(self.facts)
        return raw


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        ({priority.LOWERED: 2}, "2 thread(s) of the run started ahead could not get their CPU priority back"),
        (
            {AHEAD_ENV_CHANGED: ["TORCHINDUCTOR_CACHE_DIR", "TORCH_LOGS"]},
            "the script set TORCHINDUCTOR_CACHE_DIR, TORCH_LOGS after the run started ahead had imported "
            "torch._dynamo, which reads them when imported",
        ),
    ],
)
def test_a_run_started_ahead_that_stopped_at_its_gate_is_measured_afresh(
    monkeypatch: pytest.MonkeyPatch, facts: dict[str, Any], why: str
) -> None:
    """Its speed beside a busy core would be a starved thread's, or it would not run as the
    script does: the confirmation is a fresh run, and its wall time the next fresh run's estimate."""
    fresh = _windows_at(25.0)
    fresh.raw.wall_s = 33.0
    measured: list[RunSpec] = []
    monkeypatch.setattr(confirming, "measure_run", lambda spec: measured.append(spec) or fresh)
    _stage(monkeypatch, FreshRun(None, call_first=True))
    echoed: list[str] = []
    baseline = _windows_at(10.0)
    tuning = _tuning(baseline, [_outcome("dataloader-workers", settings=WORKERS)])
    done = confirm(OPTIONS, baseline, tuning, None, echoed.append, _StoppedAtItsGate(facts))  # type: ignore[arg-type]
    assert [(spec.label, spec.overrides) for spec in measured] == [("after", WORKERS)]
    assert echoed[1:] == [f"trainadvisor: {why}; confirming in a fresh run"]
    assert tuning.walls["fresh"] == [33.0]
    assert [(o.status, o.reason) for o in done.outcomes] == [
        ("kept", "measured 2.50x steps/s (range 2.50-2.50x)")
    ]


def test_a_run_started_ahead_whose_threads_stayed_lowered_is_not_replaced_past_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(confirming, "measure_run", lambda spec: pytest.fail("a fresh run past the budget"))
    _stage(monkeypatch, FreshRun(None, call_first=True))
    baseline = _windows_at(10.0)
    baseline.raw.wall_s = 60.0  # a fresh run takes as long as the baseline's whole run
    options = replace(OPTIONS, budget_s=40.0)
    tuning = _tuning(baseline, [_outcome("dataloader-workers", settings=WORKERS)], options)
    monkeypatch.setattr(tuning, "confirmation_cost_s", lambda settle_cap_s=None: 5.0)  # set up: it fits
    assert not tuning.fits(tuning.cost_s("fresh"))
    done = confirm(options, baseline, tuning, None, lambda line: None, _StoppedAtItsGate())  # type: ignore[arg-type]
    assert [(o.status, o.reason) for o in done.outcomes] == [
        (
            "unconfirmed",
            "measured 1.30x steps/s in its trial windows (2 thread(s) of the run started ahead could not get "
            "their CPU priority back, and a fresh run (about 60 s) would have run past the --budget)",
        )
    ]


class _Waiting:
    """A run started ahead, waiting at its gate: the specs it was handed; it measures 25 steps/s."""

    def __init__(self) -> None:
        self.handed: list[RunSpec] = []

    def waiting(self) -> bool:
        return True

    def run(self, spec: RunSpec, profile_steps: int) -> RawRun:
        self.handed.append(spec)
        return _windows_at(25.0).raw


def _waiting(monkeypatch: pytest.MonkeyPatch) -> _Waiting:
    _stage(monkeypatch, FreshRun(None, call_first=True))
    return _Waiting()


@pytest.mark.parametrize(("setup_left_s", "measured"), [(30.0, False), (0.0, True)])
def test_a_run_started_ahead_counts_what_is_left_of_its_set_up_against_the_budget(
    monkeypatch: pytest.MonkeyPatch, setup_left_s: float, measured: bool
) -> None:
    """Starved beside busy cores, its set-up (30 s) is left whole when the settings come: with its
    5 s of windows, past the budget's 30 s left; done, it fits."""
    ahead = _waiting(monkeypatch)
    baseline = _windows_at(10.0)
    options = replace(OPTIONS, budget_s=30.0)
    tuning = _tuning(baseline, [_outcome("dataloader-workers", settings=WORKERS)], options)
    monkeypatch.setattr(tuning, "confirmation_cost_s", lambda settle_cap_s=None: 5.0)
    tuning.ahead_left = lambda: (setup_left_s, setup_left_s > 0)
    done = confirm(options, baseline, tuning, None, lambda line: None, ahead)  # type: ignore[arg-type]
    assert bool(ahead.handed) is measured
    (outcome,) = done.outcomes
    assert outcome.status == ("kept" if measured else "unconfirmed")
    assert measured or "a confirmation run (about 35 s) would have run past the --budget" in outcome.reason


@pytest.mark.parametrize(
    ("budget_s", "unsettled_s", "cap_s"),
    [(None, 3.0, 60.0), (100.0, 3.0, 60.0), (29.0, 3.0, 6.0), (26.5, 6.0, 1.0)],
)
def test_the_confirmations_warm_up_ends_within_the_budget(
    monkeypatch: pytest.MonkeyPatch, budget_s: float | None, unsettled_s: float, cap_s: float
) -> None:
    """20 s into a profile, a confirmation estimated at 6 s, 3 s of it settling: under a budget of
    29 s it may settle those 3 s and the 3 s the budget leaves beyond its estimate; one whose
    estimate counts no settling (6 s without it too) and fits with 0.5 s to spare gets the floor,
    1 s; without a budget, or with room, the comparison's own cap (60 s: the baseline's warm-up
    did not settle)."""
    ahead = _waiting(monkeypatch)
    baseline = _windows_at(10.0)
    options = replace(OPTIONS, budget_s=budget_s)
    tuning = _tuning(baseline, [_outcome("dataloader-workers", settings=WORKERS)], options)
    tuning.started = time.monotonic() - 20.0
    monkeypatch.setattr(
        tuning, "confirmation_cost_s", lambda settle_cap_s=None: unsettled_s if settle_cap_s == 0 else 6.0
    )
    tuning.ahead_left = lambda: (0.0, False)
    confirm(options, baseline, tuning, None, lambda line: None, ahead)  # type: ignore[arg-type]
    (spec,) = ahead.handed
    assert spec.size.settle is not None
    assert spec.size.settle.blocks_max_s == pytest.approx(cap_s, abs=0.05)


def test_a_run_started_ahead_that_stepped_aside_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    class SteppedAside:
        def waiting(self) -> bool:
            return False

        def run(self, spec: RunSpec, profile_steps: int) -> RawRun:
            raise AssertionError("handed a run that is gone")

    fresh = FreshRun(_windows_at(25.0))
    _stage(monkeypatch, fresh)
    baseline = _windows_at(10.0)
    tuning = _tuning(baseline, [_outcome("tf32")])
    confirm(OPTIONS, baseline, tuning, None, lambda line: None, SteppedAside())  # type: ignore[arg-type]
    assert fresh.given[0][3] is confirming.measure_run


def test_a_machine_that_sped_up_makes_a_windows_choice_unconfirmed_and_a_fresh_runs_opportunity_inconclusive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _stage(monkeypatch, FreshRun(_windows_at(25.0)))
    baseline = _windows_at(10.0)
    outcomes = [
        _outcome("tf32", settings=TF32),
        _outcome("batch-size", "opportunity", "restart", "measured 1.40x samples/s"),
    ]
    done = confirm(
        OPTIONS,
        baseline,
        _tuning(baseline, outcomes),
        None,
        lambda line: None,
        adjacent=lambda: _windows_at(20.0),
    )
    judged = (
        "measured 1.25x steps/s (range 1.25-1.25x), against the script's own setting measured next to it too "
        f"(20.0 steps/s): not a gain beyond the change, as {MACHINE_FASTER}"
    )
    assert [(o.status, o.reason, o.diff) for o in done.outcomes] == [
        (
            "unconfirmed",
            "measured 1.30x steps/s in its trial windows; the confirmation run could not be compared: "
            + judged,
            "diff of tf32",
        ),
        ("inconclusive", f"measured 1.40x samples/s; but {MACHINE_FASTER}", ""),
    ]
