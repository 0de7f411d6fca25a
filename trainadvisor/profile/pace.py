"""How long a trial may take, and when it stops: a trial's warm-up is capped from the baseline's
own settling time, not the global `--max-warmup`; a trial window races the best setting measured
so far (`measure.race`); and the cost of what is still to run is estimated from what the runs so
far took, so that `--budget` holds and the progress line's estimate is honest.

Pure functions over the saved runs and trials."""

from __future__ import annotations

from dataclasses import dataclass

from trainadvisor.analyze.summary import percentile, summarize
from trainadvisor.measure.settle import TOLERANCE
from trainadvisor.records import RawRun, Run, Trial

# A trial's warm-up waits for its step time to settle at most this many times as long as the
# baseline's did (its loop is the baseline's, with one setting changed: a new DataLoader's
# workers start, a cache refills), and never less than TRIAL_SETTLE_MIN_S ...
TRIAL_SETTLE_FACTOR = 3.0
TRIAL_SETTLE_MIN_S = 3.0
# ... or this long where the baseline's own warm-up never settled (it ran to --max-warmup: a
# noisy machine, where waiting longer buys no steadier window; the pairing judges instead).
UNSETTLED_TRIAL_SETTLE_S = 10.0


@dataclass(frozen=True)
class SettleCap:
    """A trial's longest warm-up, and what set it (for the report)."""

    max_s: float
    why: str


def trial_settle_cap(baseline: RawRun, max_warmup_s: float) -> SettleCap:
    """The longest a trial's warm-up waits for its step time to settle."""
    shape = baseline.shape
    if max_warmup_s <= 0:
        return SettleCap(0.0, "--max-warmup 0: warm-ups are counts of steps")
    if shape is None or shape.warmup_end != "settled":
        cap = min(max_warmup_s, max(TRIAL_SETTLE_MIN_S, UNSETTLED_TRIAL_SETTLE_S))
        return SettleCap(cap, f"{cap:g} s: the baseline's own warm-up did not settle")
    cap = min(max_warmup_s, max(TRIAL_SETTLE_MIN_S, TRIAL_SETTLE_FACTOR * shape.warmup_s))
    return SettleCap(
        cap,
        f"{cap:.1f} s: {TRIAL_SETTLE_FACTOR:g}x the {shape.warmup_s:.1f} s the baseline's settled in "
        f"(at least {TRIAL_SETTLE_MIN_S:g} s, at most --max-warmup {max_warmup_s:g} s)",
    )


def slow_windows(run: Run) -> float | None:
    """A run's throughput in its slow windows: the 10th percentile of its windows' steps/s (its
    whole timed steps' figure where it has no windows)."""
    low = percentile(run.window_steps_per_s, 10)
    return low if low is not None else run.steps_per_s


def race_below(references: list[Run], trials: list[Trial]) -> tuple[float, str] | None:
    """The steps/s a trial window must be able to reach, and whose they are: the slow windows
    of the best setting measured so far (the baseline's, or a trial's measured whole); None
    where nothing was measured yet."""
    best: tuple[float, str] | None = None
    for run in references:
        low = slow_windows(run)
        if low and (best is None or low > best[0]):
            best = (low, "the script's own setting")
    for trial in trials:
        if trial.status != "measured" or trial.raw is None or raced(trial.raw):
            continue
        low = slow_windows(summarize(trial.raw))
        if low and (best is None or low > best[0]):
            best = (low, trial.label)
    return best


def raced(raw: RawRun) -> bool:
    """Whether a window stopped early, its race lost."""
    shape = raw.shape
    return shape is not None and "raced" in (shape.warmup_end, shape.timed_end)


def race_note(raw: RawRun, below: float, whose: str) -> str | None:
    """Why a window was cut, in words (None where it was not)."""
    shape = raw.shape
    if shape is None or not raced(raw):
        return None
    timed = sum(1 for step in raw.steps if not step.profiled)
    where = "in its warm-up" if shape.warmup_end == "raced" else "in its timed steps"
    return (
        f"cut {where} after {shape.warmup_s + shape.timed_s:.1f} s ({timed} steps timed): even "
        f"{100 * TOLERANCE:.0f}% faster it stays below {below:.1f} steps/s, the slow windows of "
        f"{whose}"
    )
