"""The trials of a fix: each candidate setting measured in a run of its own and judged
against the baseline (faster? training unchanged, within the loss tolerance raised above the
GPU's own noise?), and what they decide."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainadvisor import fixes
from trainadvisor.judge import judge_trial, loss_check
from trainadvisor.measure.runner import measure
from trainadvisor.records import FixOutcome, Overrides, PlannedFix, Run, Trial
from trainadvisor.runs import ProfileOptions, measure_run, spec_for, trial_spec

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


def tune(
    fix: fixes.Fix,
    values: dict[str, Any],
    options: ProfileOptions,
    baseline: Run,
    echo: Echo,
    noise_rel: float | None = None,
) -> list[Trial]:
    trials: list[Trial] = []
    timeout_s = max(60.0, 5 * baseline.raw.wall_s)
    while len(trials) < MAX_TRIALS_PER_FIX:
        candidate = fix.next_candidate(values, trials)
        if candidate is None:
            break
        label = f"{fix.id}-{len(trials) + 1}"
        run = measure_run(
            trial_spec(
                options,
                label,
                candidate.overrides,
                profile=False,
                show_output=False,
                timeout_s=timeout_s,
            )
        )
        status, reason = judge_trial(baseline.raw, run.raw, tolerance(fix, noise_rel))
        trial = Trial(
            candidate.label, candidate.overrides, status, run.steps_per_s, reason, run.raw, run.samples_per_s
        )
        trials.append(trial)
        value = fixes.trial_value(trial, fix.metric)
        if fix.metric == "peak_reserved_bytes":
            shown = f"peak reserved {value / 1e9:.2f} GB" if status == "measured" and value else status
        else:
            shown = (
                f"{value:.1f} {fix.metric.removesuffix('_per_s')}/s"
                if status == "measured" and value
                else status
            )
        echo(f"  tried {candidate.label}: {shown}" + (f" ({reason})" if reason else ""))
    return trials


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


def tune_fix(
    planned: PlannedFix,
    values: dict[str, Any],
    baseline: Run,
    options: ProfileOptions,
    echo: Echo,
    noise_rel: float | None,
) -> FixOutcome:
    """One fix's trials and what they decide: chosen (`unconfirmed` until the confirmation run,
    or `recommended` for a memory fix, which is not part of the speed run), or why not."""
    fix = fixes.REGISTRY[planned.fix]
    echo(f"trainadvisor: {planned.rule} -> measuring fix {planned.fix}")
    trials = tune(fix, values, options, baseline, echo, noise_rel)
    chosen = fix.choose(trials, values)
    if chosen is not None:
        described = fix.describe(chosen, values)
        if fixes.goal(planned.fix) == "memory":
            status, reason = "recommended", "measured in its own run; " + described
        else:
            status, reason = "unconfirmed", "chosen by its trials; the run ended before the confirmation run"
        return FixOutcome(planned.fix, planned.rule, status, reason, chosen.overrides, trials, described)
    blocked = next((t for t in trials if t.status != "measured"), None)
    if blocked is not None and not any(t.status == "measured" for t in trials):
        # refused | failed | changed_training
        return FixOutcome(
            planned.fix,
            planned.rule,
            blocked.status,
            f"{blocked.label}: {blocked.reason}",
            Overrides(),
            trials,
        )
    return FixOutcome(planned.fix, planned.rule, "no_gain", fix.no_gain, Overrides(), trials)
