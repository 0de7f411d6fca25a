"""The trials of a fix: each candidate setting measured, and what the trials decide. A
candidate is measured in a window of the live baseline run where its setting can switch while
the loop runs (`measure.kept_alive`; no restart), otherwise in a fresh run of its own, judged against
the baseline (faster? training unchanged, within the loss tolerance raised above the GPU's own
noise?). Windows in one process skip the loss check (their steps are not the baseline's): the
chosen settings are confirmed in a fresh seeded run with it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from trainadvisor import fixes
from trainadvisor.analyze.run.length import run_length
from trainadvisor.analyze.run.summary import main_loader, summarize
from trainadvisor.fixes.common import trial_peak
from trainadvisor.measure.config import WindowSize
from trainadvisor.measure.kept_alive import LiveRun
from trainadvisor.measure.runner import measure
from trainadvisor.profile import pace
from trainadvisor.profile.judge import Ratio, cut_short, judge_trial, loss_check, ratio, spread, usable
from trainadvisor.profile.runs import (
    ProfileOptions,
    fit,
    measure_fitted,
    size_for,
    spec_for,
    trial_spec,
    window_steps,
)
from trainadvisor.records import (
    FixOutcome,
    FixStatus,
    Overrides,
    PlannedFix,
    RawRun,
    Run,
    RunLength,
    Trial,
    TrialStatus,
)

Echo = Callable[[str], None]
# The steps the next trial window may use (None: as many as it needs).
Budget = Callable[[], int | None]

MAX_TRIALS_PER_FIX = 8
# A loss tolerance is at least this many times the loss noise between two identical GPU runs.
NOISE_MARGIN = 4.0


def loss_noise(options: ProfileOptions, baseline: Run, echo: Echo) -> float | None:
    """How far the loss of the same seeded steps moves between two identical runs: on a GPU,
    atomics-based kernels (cuDNN weight gradients, embedding backward) sum in a varying order,
    so a bit-for-bit tolerance would reject every fix. Measured by running the baseline's steps
    once more (as many as it recorded losses for: no timing, no settling); None when that run does
    not complete or records no comparable loss. A CPU run is not repeated: its arithmetic is
    deterministic, and the tolerances stay as they are."""
    echo("trainadvisor: running the baseline's seeded steps again to measure the GPU's loss noise")
    timeout_s = max(60.0, 5 * baseline.raw.wall_s)
    recorded = sum(1 for loss in baseline.raw.losses if loss is not None)
    steps = max(2, recorded - options.warmup)
    quiet = {"profile": False, "show_output": False, "timeout_s": timeout_s}
    spec = spec_for(options, "noise", steps=steps, size=WindowSize(), **quiet)
    raw = measure(spec)
    if not usable(raw):
        return None
    check = loss_check(baseline.raw, raw, 0.0)
    if not check.steps_compared or check.max_rel_diff is None or check.max_rel_diff == float("inf"):
        return None
    return check.mean_rel_diff if check.same_batches is False else check.max_rel_diff


def tolerance(fix: fixes.Fix, noise_rel: float | None) -> float:
    """The fix's own loss tolerance, raised above the measured noise of identical runs. An
    opportunity changes what is learned by design: only a loss that diverges stops it."""
    if fix.goal == "opportunity":
        return math.inf
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


def restarts(
    options: ProfileOptions,
    baseline: Run,
    noise_rel: float | None,
    length: Callable[[], RunLength | None],
    learn: Callable[[RawRun], None],
    settle_cap_s: float | None,
    values: dict[str, Any],
) -> Measurer:
    """Each candidate in a fresh run of the script (fitted into the steps the script is known to
    have, `runs.measure_fitted`; its warm-up's blocks capped at `settle_cap_s`, `pace`), its
    loss checked against the baseline's, and stopped past `trial_timeout_s`."""

    def measure_candidate(fix: fixes.Fix, label: str, candidate: fixes.Setting) -> Measured:
        timeout_s = trial_timeout_s(options, baseline, fix.once_s(values))
        quiet = {"profile": False, "show_output": False, "timeout_s": timeout_s}
        own_length, own_learn = length, learn
        per_step = samples_ratio(baseline.raw, candidate.overrides)
        if per_step is not None:  # its steps are not the script's: its length is its own
            own = _OwnLength(in_batches(length(), per_step))
            own_length, own_learn = own.get, own.learn
        race = candidate.race_below
        run = measure_fitted(
            lambda known: trial_spec(options, label, candidate.overrides, known, settle_cap_s, race, **quiet),
            own_length,
            own_learn,
        )
        status, reason = judge_trial(baseline.raw, run.raw, tolerance(fix, noise_rel))
        if status == "changed_training" and fix.changed_training_hint:
            reason = f"{reason}; {fix.changed_training_hint}"
        return Measured(run, run.raw, status, reason)  # type: ignore[arg-type]

    return measure_candidate


def trial_timeout_s(options: ProfileOptions, baseline: Run, once_s: float) -> float:
    """The longest a fresh trial runs before it is stopped: five times the baseline's whole run
    and what its fix pays once (`Fix.once_s`: compiling), plus the longest warm-up, and 60 s at
    least. Beside a busy core and a test suite's other process, a cold compile of a model whose
    baseline run took 11 s ran past the 114 s that five times the run and the warm-up gave."""
    return max(60.0, 5 * (baseline.raw.wall_s + once_s) + options.max_warmup_s)


def samples_ratio(baseline: RawRun, overrides: Overrides) -> float | None:
    """The samples of the candidate's step over the baseline's, where the candidate changes
    them (a larger batch: the script then takes fewer steps); None where its steps are the
    script's (gradients accumulated over k micro-batches of 1/k of the batch are one step)."""
    size = overrides.loader().get("batch_size")
    loader = main_loader(baseline)
    if size is None or loader is None or not loader.batch_size:
        return None
    per_step = int(size) * int(overrides.runtime.get("grad_accumulation") or 1)
    return None if per_step == loader.batch_size else per_step / loader.batch_size


def in_batches(length: RunLength | None, ratio: float) -> RunLength | None:
    """The script's length in the steps of a run whose batches hold `ratio` times the
    baseline's samples (the same data in fewer, larger batches: rounded down, so a window fitted
    into it fits the run)."""
    if length is None:
        return None
    total = None if length.total_steps is None else max(1, math.floor(length.total_steps / ratio))
    seen = math.floor(length.seen_steps / ratio)
    return RunLength(total, f"{length.source}, in batches {ratio:g} times as large", seen)


class _OwnLength:
    """The length of a run whose steps are not the script's (another batch size), learnt from
    its own runs and kept from the script's."""

    def __init__(self, length: RunLength | None) -> None:
        self.length = length

    def get(self) -> RunLength | None:
        return self.length

    def learn(self, raw: RawRun) -> None:
        self.length = run_length(raw, self.length)


def windows(
    live: LiveRun,
    options: ProfileOptions,
    baseline: Run,
    budget: Budget,
    settle_cap_s: float | None = None,
    time_left: Callable[[], float | None] = lambda: None,
) -> Measurer:
    """Each candidate in a window of the live baseline run, switched at a step boundary, fitted
    into the steps `budget` says the window may use, its warm-up's blocks capped at
    `settle_cap_s` (`pace`) and by what `time_left` says is left of --budget (`budget_cap_s`)."""
    step_s = (baseline.step_time_ms.median or 100.0) / 1e3

    def measure_candidate(fix: fixes.Fix, label: str, candidate: fixes.Setting) -> Measured:
        overrides = candidate.overrides
        warmup, steps, most = fit(*window_steps(options, overrides), budget())
        caps = (settle_cap_s, candidate.settle_s, budget_cap_s(time_left(), options.min_time_s))
        cap = min(c for c in (*caps, float("inf")) if c is not None)
        capped = cap if cap < float("inf") else None
        size = size_for(options, overrides, most, capped, candidate.race_below, candidate.race_warmup)
        # generous: a candidate may be slower than the baseline, and workers take time to start
        timeout_s = max(60.0, options.max_warmup_s + 20 * ((warmup + steps) * step_s + options.min_time_s))
        if options.timeout_s is not None:
            timeout_s = min(timeout_s, options.timeout_s)
        raw = live.window(label, overrides, warmup, steps, size, timeout_s)
        if raw is None:
            gone = RawRun(label, "script_failed", None, live.ended, warmup, steps, 0, 0, [], [], None)
            return Measured(None, gone, "failed", live.ended)
        if raw.status == "refused":
            return Measured(None, raw, "refused", raw.error)
        if not usable(raw):
            return Measured(None, raw, "failed", raw.error or live.ended)
        return Measured(summarize(raw), raw, "measured", cut_short(raw) or None)

    return measure_candidate


# The least a window's warm-up may wait to settle where --budget is nearly spent: one block.
BUDGET_SETTLE_MIN_S = 1.0


def budget_cap_s(left_s: float | None, min_time_s: float) -> float | None:
    """The longest a window's warm-up may wait for its step time to settle so that the window,
    its timed steps (`min_time_s`) and its overhead after them, ends within `left_s` of --budget
    (at least BUDGET_SETTLE_MIN_S); None without a budget. A window starts only where its
    estimate fits, but beside a busy core a warm-up that never settled ran to its cap and the
    command ended 14-25% past a 30 s budget: cut there, the window is named unsettled instead."""
    if left_s is None:
        return None
    return max(BUDGET_SETTLE_MIN_S, left_s - min_time_s - pace.WINDOW_OVERHEAD_S)


def run_cap_s(
    cap_s: float | None, left_s: float | None, estimate_s: float, unsettled_s: float
) -> float | None:
    """The longest a fresh run's warm-up may wait to settle (the confirmation, the script's
    setting measured next to it): `cap_s`, and where `left_s` of --budget is left, the settling
    its estimate counts (`estimate_s` less `unsettled_s`, the estimate without any) plus what
    the budget leaves beyond the estimate, BUDGET_SETTLE_MIN_S at least. Cut there, the run is
    named unsettled, as a window cut by `budget_cap_s` is."""
    if left_s is None:
        return cap_s
    budgeted_s = max(BUDGET_SETTLE_MIN_S, max(0.0, estimate_s - unsettled_s) + left_s - estimate_s)
    return budgeted_s if cap_s is None else min(cap_s, budgeted_s)


def tune(
    fix: fixes.Fix,
    values: dict[str, Any],
    measure_candidate: Measurer,
    echo: Echo,
    more: Callable[[], bool] = lambda: True,
    references: list[Run] | None = None,
) -> list[Trial]:
    """The fix's candidates, one after another, until it has none left (or `more` says stop).
    A throughput fix's candidates race the best setting measured so far (the `references`,
    the baseline's runs, and the trials before): a window that cannot beat it stops early."""
    trials: list[Trial] = []
    while len(trials) < MAX_TRIALS_PER_FIX and more():
        candidate = fix.next_candidate(values, trials)
        if candidate is None:
            break
        race = _race(fix, references or [], trials)
        if race is not None:
            candidate = replace(candidate, race_below=race[0])
        measured = measure_candidate(fix, f"{fix.id}-{len(trials) + 1}", candidate)
        run = measured.run
        cut = pace.race_note(measured.raw, race[0], race[1]) if race else None
        trial = Trial(
            candidate.label,
            candidate.overrides,
            measured.status,
            run.steps_per_s if run else None,
            "; ".join(r for r in (candidate.note, measured.reason, cut) if r) or None,
            measured.raw,
            run.samples_per_s if run else None,
        )
        trials.append(trial)
        echo(f"  tried {candidate.label}: {_shown(fix, trial)}")
    return trials


def _race(fix: fixes.Fix, references: list[Run], trials: list[Trial]) -> tuple[float, str] | None:
    """The steps/s a throughput fix's next window must be able to reach, and whose they are;
    None for fixes judged otherwise (memory, samples per second: a larger batch is slower per
    step by design)."""
    if fix.goal != "throughput" or fix.metric != "steps_per_s":
        return None
    race = pace.race_below(references, trials)
    now = min(1.0, fix.pace_now(trials))  # only ever lowered: a slower spell does not cut a window
    if race is None or now >= 1.0:
        return race
    return race[0] * now, f"{race[1]}, at {now:.2f}x their pace: the machine's since a count measured again"


def _shown(fix: fixes.Fix, trial: Trial) -> str:
    value = fixes.trial_value(trial, fix.metric)
    shown: str
    if trial.status != "measured" or not value:
        shown = trial.status
    elif fix.metric == "peak_bytes":
        shown = f"peak {value / 1e6:.1f} MB, {trial.steps_per_s or 0.0:.1f} steps/s"
    else:
        shown = f"{value:.1f} {fix.metric.removesuffix('_per_s')}/s"
    return shown + (f" ({trial.reason})" if trial.reason else "")


def decide(
    planned: PlannedFix, trials: list[Trial], values: dict[str, Any], references: list[Run]
) -> FixOutcome:
    """What a fix's trials decide against the baseline: its measurements in `values` (what
    `choose` reads) and its runs in `references` (the baseline's window, and in trial windows
    the baseline's setting measured again after them; the faster is what a trial must beat).
    A chosen trial also carries its own gain over that reference, and is not chosen where its
    slow windows do not beat the reference's fast ones (a gain within the noise)."""
    fix = fixes.REGISTRY[planned.fix]
    note = fix.search_note(trials, values)
    chosen = fix.choose(trials, values)
    gain = own_gain(fix, chosen, references) if chosen is not None else None
    if chosen is not None and gain is not None and fix.goal != "memory" and (gain.low or 0.0) <= 1.0:
        outcome = FixOutcome(
            planned.fix, planned.rule, "no_gain",
            f"{chosen.label} measured {_figure(gain)}: within the spread of the windows, not a reliable gain",
            Overrides(), trials,
        )  # fmt: skip
    elif chosen is not None:
        outcome = _chosen(planned, fix, chosen, trials, values, gain)
    elif (blocked := next((t for t in trials if t.status != "measured"), None)) is not None and not any(
        t.status == "measured" for t in trials
    ):  # refused | failed | changed_training
        outcome = FixOutcome(
            planned.fix,
            planned.rule,
            cast(FixStatus, blocked.status),  # a trial's refused | failed | changed_training
            f"{blocked.label}: {blocked.reason}",
            Overrides(),
            trials,
        )
    else:
        outcome = FixOutcome(planned.fix, planned.rule, "no_gain", fix.no_gain, Overrides(), trials)
    outcome.search = note or ""
    unset = {k: v for k, v in fix.measured_figures(trials).items() if getattr(outcome, k) is None}
    outcome = replace(outcome, **unset) if unset else outcome  # a field's name misspelt raises
    if outcome.status == "no_gain" and planned.rule != "data-stall":
        outcome.reason += _input_ceiling(fix, values)
    return outcome


def _input_ceiling(fix: fixes.Fix, values: dict[str, Any]) -> str:
    """Where a GPU loop waited on its input for half of each step or more, what a fix that leaves
    the input as it is could gain at most (the step's rest made instant, the input as slow):
    words for a no-gain reason, '' otherwise (a fix of the loader, or one measured per sample, is
    not bounded so; on a CPU the input and the step share the cores, and the bound is not one)."""
    wait = float(values.get("data_wait_pct") or 0.0) / 100.0
    if wait < 0.5 or not values.get("cuda_used") or fix.switches_loaders or fix.metric != "steps_per_s":
        return ""
    return (
        f"; the loop waited on its input for {100 * wait:.0f}% of each step, so a fix of the rest "
        f"could gain at most {1 / wait:.2f}x while the input stays as slow"
    )


def _chosen(
    planned: PlannedFix,
    fix: fixes.Fix,
    chosen: Trial,
    trials: list[Trial],
    values: dict[str, Any],
    gain: Ratio | None,
) -> FixOutcome:
    described = fix.describe(chosen, values)
    status: FixStatus
    if fix.goal == "memory":
        status, reason = (
            "recommended",
            "measured in its own run; not applied for you: it trades speed for memory",
        )
    elif fix.goal == "opportunity":
        status = "opportunity"
        reason = f"measured {_figure(gain)} in its own run; not applied: it changes what is learned"
    else:
        status, reason = (
            "unconfirmed",
            f"measured {_figure(gain)} in its trial; no confirmation run measured it",
        )
    verdict = fix.verdict(chosen, values)
    figures: dict[str, Any] = {}
    if verdict is not None:
        instead, said, figures = verdict
        if instead:  # not confirmed: the verdict replaces "no confirmation run measured it"
            reason = f"measured {_figure(gain)} in its trial"
        status, reason = cast(FixStatus, instead or status), f"{reason}; {said}"
    settings = chosen.overrides if status != "no_gain" else Overrides()
    outcome = FixOutcome(planned.fix, planned.rule, status, reason, settings, trials, described, **figures)
    if gain is not None:
        outcome.gain, outcome.gain_low, outcome.unit = gain.speedup, gain.low, gain.unit
    outcome.peak_bytes = trial_peak(chosen)  # what it does to memory, too
    return outcome


def own_gain(fix: fixes.Fix, trial: Trial, references: list[Run]) -> Ratio | None:
    """The trial's throughput over the fastest reference run's, in the fix's unit."""
    if trial.raw is None or not references:
        return None
    run = summarize(trial.raw)
    per_sample = fix.metric == "samples_per_s"
    ratios = [ratio(reference, run, per_sample) for reference in references]
    found = [r for r in ratios if r.speedup is not None]
    return min(found, key=lambda r: r.speedup or 0.0) if found else None


def _figure(gain: Ratio | None) -> str:
    if gain is None or gain.speedup is None:
        return "a gain"
    return spread(gain.speedup, gain.low, gain.high, gain.unit)
