"""The trials of a fix: each candidate setting measured, and what the trials decide. A
candidate is measured in a window of the live baseline run where its setting can switch while
the loop runs (`measure.live`; no restart), otherwise in a fresh run of its own, judged against
the baseline (faster? training unchanged, within the loss tolerance raised above the GPU's own
noise?). Windows in one process skip the loss check (their steps are not the baseline's): the
chosen settings are confirmed in a fresh seeded run with it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainadvisor import fixes
from trainadvisor.analysis.summary import summarize
from trainadvisor.judge import judge_trial, loss_check
from trainadvisor.measure.live import LiveRun
from trainadvisor.measure.runner import measure
from trainadvisor.records import FixOutcome, Overrides, PlannedFix, RawRun, Run, Trial, TrialStatus
from trainadvisor.runs import ProfileOptions, measure_run, spec_for, trial_spec, window_steps

Echo = Callable[[str], None]

MAX_TRIALS_PER_FIX = 8
# A loss tolerance is at least this many times the loss noise between two identical GPU runs.
NOISE_MARGIN = 4.0


def loss_noise(options: ProfileOptions, baseline: Run, echo: Echo) -> float | None:
    """How far the loss of the same seeded steps moves between two identical runs: on a GPU,
    atomics-based kernels (cuDNN weight gradients, embedding backward) sum in a varying order,
    so a bit-for-bit tolerance would reject every fix. Measured by running the baseline's steps
    once more; None when that run does not complete or records no comparable loss. A CPU run is
    not repeated: its arithmetic is deterministic, and the tolerances stay as they are."""
    echo("trainadvisor: running the baseline's seeded steps again to measure the GPU's loss noise")
    timeout_s = max(60.0, 5 * baseline.raw.wall_s)
    spec = spec_for(options, "noise", profile=False, show_output=False, timeout_s=timeout_s)
    raw = measure(spec)
    if raw.status != "window_complete":
        return None
    check = loss_check(baseline.raw, raw, 0.0)
    if not check.steps_compared or check.max_rel_diff is None or check.max_rel_diff == float("inf"):
        return None
    return check.mean_rel_diff if check.same_batches is False else check.max_rel_diff


def tolerance(fix: fixes.Fix, noise_rel: float | None) -> float:
    """The fix's own loss tolerance, raised above the measured noise of identical runs."""
    return max(fix.loss_tolerance_rel, NOISE_MARGIN * (noise_rel or 0.0))


def noise_note(noise_rel: float | None) -> str:
    if noise_rel is None:
        return (
            "The baseline's seeded steps were run twice to measure the GPU's loss noise, but the "
            "second run did not complete: fixes were held to their own loss tolerances."
        )
    return (
        f"Two identical runs of the baseline's seeded steps differed in loss by up to "
        f"{100 * noise_rel:.3g}% (GPU kernels that sum in a varying order); every fix was held to "
        f"at least {NOISE_MARGIN:g}x that."
    )


@dataclass
class Measured:
    run: Run | None  # None: nothing was measured (a refused or failed window)
    raw: RawRun
    status: TrialStatus
    reason: str | None


# How one candidate is measured: (fix, the window's or run's label, candidate) -> what it measured.
Measurer = Callable[[fixes.Fix, str, fixes.Setting], Measured]


def restarts(options: ProfileOptions, baseline: Run, noise_rel: float | None) -> Measurer:
    """Each candidate in a fresh run of the script, its loss checked against the baseline's."""
    timeout_s = max(60.0, 5 * baseline.raw.wall_s)

    def measure_candidate(fix: fixes.Fix, label: str, candidate: fixes.Setting) -> Measured:
        spec = trial_spec(
            options, label, candidate.overrides, profile=False, show_output=False, timeout_s=timeout_s
        )
        run = measure_run(spec)
        status, reason = judge_trial(baseline.raw, run.raw, tolerance(fix, noise_rel))
        return Measured(run, run.raw, status, reason)  # type: ignore[arg-type]

    return measure_candidate


def windows(live: LiveRun, options: ProfileOptions, baseline: Run) -> Measurer:
    """Each candidate in a window of the live baseline run, switched at a step boundary."""
    step_s = (baseline.step_time_ms.median or 100.0) / 1e3

    def measure_candidate(fix: fixes.Fix, label: str, candidate: fixes.Setting) -> Measured:
        overrides = candidate.overrides
        warmup, steps = window_steps(options, overrides)
        # generous: a candidate may be slower than the baseline, and workers take time to start
        timeout_s = max(60.0, 20 * (warmup + steps) * step_s)
        if options.timeout_s is not None:
            timeout_s = min(timeout_s, options.timeout_s)
        raw = live.window(label, overrides, warmup, steps, timeout_s)
        if raw is None:
            gone = RawRun(label, "script_failed", None, live.ended, warmup, steps, 0, 0, [], [], None)
            return Measured(None, gone, "failed", live.ended)
        if raw.status != "window_complete":
            return Measured(None, raw, "refused" if raw.status == "refused" else "failed", raw.error)
        return Measured(summarize(raw), raw, "measured", None)

    return measure_candidate


def tune(
    fix: fixes.Fix,
    values: dict[str, Any],
    measure_candidate: Measurer,
    echo: Echo,
    more: Callable[[], bool] = lambda: True,
) -> list[Trial]:
    """The fix's candidates, one after another, until it has none left (or `more` says stop)."""
    trials: list[Trial] = []
    while len(trials) < MAX_TRIALS_PER_FIX and more():
        candidate = fix.next_candidate(values, trials)
        if candidate is None:
            break
        measured = measure_candidate(fix, f"{fix.id}-{len(trials) + 1}", candidate)
        run = measured.run
        trial = Trial(
            candidate.label,
            candidate.overrides,
            measured.status,
            run.steps_per_s if run else None,
            measured.reason,
            measured.raw,
            run.samples_per_s if run else None,
        )
        trials.append(trial)
        echo(f"  tried {candidate.label}: {_shown(fix, trial)}")
    return trials


def _shown(fix: fixes.Fix, trial: Trial) -> str:
    value = fixes.trial_value(trial, fix.metric)
    if trial.status != "measured" or not value:
        shown = trial.status
    elif fix.metric == "peak_reserved_bytes":
        shown = f"peak reserved {value / 1e9:.2f} GB"
    else:
        shown = f"{value:.1f} {fix.metric.removesuffix('_per_s')}/s"
    return shown + (f" ({trial.reason})" if trial.reason else "")


def decide(planned: PlannedFix, trials: list[Trial], values: dict[str, Any]) -> FixOutcome:
    """What a fix's trials decide, against the baseline's measurements in `values`."""
    fix = fixes.REGISTRY[planned.fix]
    note = fix.search_note(trials, values)
    chosen = fix.choose(trials, values)
    if chosen is not None:
        described = fix.describe(chosen, values)
        if fixes.goal(planned.fix) == "memory":
            status, reason = "recommended", "measured in its own run; " + described
        else:
            status, reason = "unconfirmed", "chosen by its trials; the run ended before the confirmation run"
        outcome = FixOutcome(planned.fix, planned.rule, status, reason, chosen.overrides, trials, described)
    elif (blocked := next((t for t in trials if t.status != "measured"), None)) is not None and not any(
        t.status == "measured" for t in trials
    ):  # refused | failed | changed_training
        outcome = FixOutcome(
            planned.fix,
            planned.rule,
            blocked.status,
            f"{blocked.label}: {blocked.reason}",
            Overrides(),
            trials,
        )
    else:
        outcome = FixOutcome(planned.fix, planned.rule, "no_gain", fix.no_gain, Overrides(), trials)
    outcome.search = note or ""
    return outcome
