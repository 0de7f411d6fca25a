"""How long a trial may take, and when it stops: a trial's warm-up is capped from the baseline's
own settling time, not the global `--max-warmup`; a trial window races the best setting measured
so far (`measure.race`); and the cost of what is still to run is estimated from what the runs so
far took, so that `--budget` holds and the progress line's estimate is honest.

Pure functions over the saved runs and trials."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from trainadvisor import fixes
from trainadvisor.analyze.run.summary import percentile, summarize
from trainadvisor.measure.race import RACE_MARGIN
from trainadvisor.measure.settle import BLOCK_S, BLOCK_STEPS, BLOCKS, TOLERANCE
from trainadvisor.records import PlannedFix, RawRun, Run, Trial, timed_steps

# A trial's warm-up waits for its step time to settle at most this many times as long as the
# baseline's did (its loop is the baseline's, with one setting changed: a new DataLoader's
# workers start, a cache refills), and never less than TRIAL_SETTLE_MIN_S ...
TRIAL_SETTLE_FACTOR = 3.0
TRIAL_SETTLE_MIN_S = 3.0
TRIAL_SETTLE_MAX_S = 10.0  # and never more: on a loaded machine the baseline's took 6 s and more
# ... or this long where the baseline's own warm-up never settled (it ran to --max-warmup: a
# noisy machine, where waiting longer buys no steadier window; the pairing judges instead).
UNSETTLED_TRIAL_SETTLE_S = 10.0


@dataclass(frozen=True)
class SettleCap:
    """A trial's longest warm-up, and what set it (for the report)."""

    max_s: float
    why: str


def trial_settle_cap(
    baseline: RawRun, max_warmup_s: float, ceiling_s: float | None = TRIAL_SETTLE_MAX_S
) -> SettleCap:
    """The longest a trial's warm-up waits for its step time to settle (`ceiling_s` None: the
    confirmation run's and the measurement beside it, compared with the baseline itself: 3x its
    settling, at most TRIAL_SETTLE_MAX_S or what the baseline took where that was longer: a
    baseline whose slow steps made its blocks seconds long settled in 11 s, and the confirmation
    of a setting 30x faster, whose trials had already shown it would not settle in 10 s, waited
    33 s for it)."""
    shape = baseline.shape
    if max_warmup_s <= 0:
        return SettleCap(0.0, "--max-warmup 0: warm-ups are counts of steps")
    if shape is None or shape.warmup_end != "settled":
        cap = (
            min(max_warmup_s, max(TRIAL_SETTLE_MIN_S, UNSETTLED_TRIAL_SETTLE_S))
            if ceiling_s
            else max_warmup_s
        )
        return SettleCap(cap, f"{cap:g} s: the baseline's own warm-up did not settle")
    # its settling after the counted warm-up steps: a fresh run's warm-up holds its set-up too
    settled_s = shape.settle_s if shape.settle_s is not None else shape.warmup_s
    most_s = min(max_warmup_s, ceiling_s if ceiling_s is not None else max(TRIAL_SETTLE_MAX_S, settled_s))
    cap = min(most_s, max(TRIAL_SETTLE_MIN_S, TRIAL_SETTLE_FACTOR * settled_s))
    return SettleCap(
        cap,
        f"{cap:.1f} s: {TRIAL_SETTLE_FACTOR:g}x the {settled_s:.1f} s the baseline's settled in after its "
        f"first steps (at least {TRIAL_SETTLE_MIN_S:g} s, at most {most_s:.3g} s)",
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
    timed = len(timed_steps(raw))
    where = "in its warm-up" if shape.warmup_end == "raced" else "in its timed steps"
    return (
        f"cut {where} after {shape.warmup_s + shape.timed_s:.1f} s ({timed} steps timed): even "
        f"{100 * RACE_MARGIN:.0f}% faster it stays below {below:.1f} steps/s, the slow windows of "
        f"{whose}"
    )


# Beyond its warm-up and timed steps, a window's switch, its result file and its samples; and a
# fresh run's traced steps, its profiler's export and its exit (measured on 2 cores: 0.2-1.2 s a
# window, 1.8-2.9 s a run's end).
WINDOW_OVERHEAD_S = 0.5
# A confirmation run times at least this many steps a DataLoader worker of its setting: three
# throughput windows of two rounds of the workers' batches each (`runs.confirmation_spec`).
CONFIRMATION_ROUNDS = 6
RUN_END_S = 2.5
# A run started ahead's end: its traced steps and export, then the report, made while it exits
# (`Prestarted.cancel`): 1.4-1.6 s from its timed steps' end to the command's on 2 cores.
AHEAD_END_S = 1.5
# About how long a candidate's window takes to start its workers and settle, at least, for the
# estimates (its cap stays TRIAL_SETTLE_MIN_S): 0.8-1.2 s measured on 2 cores for 8 and 16
# workers, 1.9-2.4 s for 32 (1.4-3.4 s while a run started ahead still imported torch beside the
# first window); a run started ahead settles its workers as a window does.
WINDOW_SETTLE_S = 1.0
# And at least this long a worker, which its window starts one after another (the 1.9-2.4 s of
# 32 workers above; a light loop's confirmation run of 32 workers took 1.3 s of counted steps
# and 2.7 s of blocks before its timed steps, where the estimate allowed 1 s for both).
WORKER_START_S = 0.07
# A pair's windows settle for at most this long: what pairs them is that they run seconds apart,
# and a warm-up that waits out a loaded machine's noise would part them.
PAIR_SETTLE_S = 3.0


def cost_s(
    kind: str,
    walls: list[float],
    baseline: RawRun,
    speedup: float = 1.0,
    settle_cap_s: float | None = None,
    loading: tuple[int, float | None] = (0, None),
    counted_steps: int = 0,
) -> float:
    """About how long the next trial window ("window"), window of the script's own setting in a
    pair ("pair"), fresh run of the script ("fresh") or run started ahead, its set-up done
    ("prestarted"), takes: the median of the windows measured so far, the longest of the fresh
    runs (a compiled trial's outlasts the others); before any, from the baseline's own shape. A
    candidate's window, or a run started ahead, waits for its step time to settle as the
    baseline did, at the pace its fix can reach at most (at least WINDOW_SETTLE_S, and
    WORKER_START_S a worker: its workers start; at most `settle_cap_s`, the trials' cap) and times
    the baseline's steps at `speedup` x the baseline's pace (the most its fix can give), never
    under the minimum time; a run started ahead does the same, then its traced steps and its end.
    A window of DataLoader workers (`loading`: their count, the steps/s they load at most) settles
    over blocks of two rounds of their batches (`_loader_blocks_s`) at least. A pair's window
    of the script's setting runs its `counted_steps` of warm-up at the baseline's pace first (5
    steps of 346 ms were 1.7 s of a storage-latency loader's 4.8 s warm-up)."""
    if kind == "fresh":  # never under the baseline's own whole run, its warm-up as a trial's
        return max([*walls, _fresh_s(baseline, settle_cap_s)])
    if walls and kind == "window":
        return float(percentile(walls, 50) or 0.0)
    shape = baseline.shape
    if shape is None:
        return baseline.wall_s
    settled_s = shape.settle_s if shape.settle_s is not None else shape.warmup_s
    if kind == "pair":  # cut after its warm-up and one block where its fix can decide in one pair
        timed_s = min(shape.timed_s, _block_s(baseline)) if speedup >= RACED_PAIR_GAIN else shape.timed_s
        counted_s = counted_steps * shape.timed_s / max(len(timed_steps(baseline)), 1)
        return counted_s + min(settled_s, PAIR_SETTLE_S) + timed_s + WINDOW_OVERHEAD_S
    cap = settle_cap_s if settle_cap_s is not None else TRIAL_SETTLE_MAX_S
    # blocks are counted in steps too: a loop `speedup` x as fast fills them that much sooner
    # (a loaded machine's baseline of 190 ms steps settled in 8 s; its trials' windows in 2-3 s)
    blocks_s = _loader_blocks_s(baseline, speedup, *loading)
    start_s = max(WINDOW_SETTLE_S, WORKER_START_S * loading[0])
    settle_s = min(cap, max(settled_s / max(speedup, 1.0), start_s, blocks_s))
    timed_s = max(shape.min_time_s, shape.timed_s / max(speedup, 1.0))
    if kind == "prestarted" and loading[0]:  # a confirmation times CONFIRMATION_ROUNDS of its workers'
        # batches at least (32 workers: 192 steps, 3.6 s where 1 s had been estimated)
        timed_s = max(timed_s, CONFIRMATION_ROUNDS * loading[0] / _steps_per_s(baseline, speedup, loading[1]))
    return settle_s + timed_s + {"window": WINDOW_OVERHEAD_S, "prestarted": AHEAD_END_S}.get(kind, RUN_END_S)


def _loader_blocks_s(baseline: RawRun, speedup: float, workers: int, load_pace: float | None) -> float:
    """How long a window of `workers` DataLoader workers takes to fill the settling test's
    blocks (BLOCKS of two rounds of their batches each, `Settling.for_workers`: the most a block
    takes, where the workers do not keep ahead of the loop), at `speedup` x the
    baseline's pace, or the `load_pace` its workers load at, where that is less (a storage-latency
    loader's 8 and 32 workers at 21 and 93 steps/s filled theirs in 2.0-2.1 s). 0 without workers."""
    shape, timed = baseline.shape, len(timed_steps(baseline))
    if not workers or shape is None or not timed or shape.timed_s <= 0:
        return 0.0
    return BLOCKS * max(BLOCK_S, max(BLOCK_STEPS, 2 * workers) / _steps_per_s(baseline, speedup, load_pace))


def _steps_per_s(baseline: RawRun, speedup: float, load_pace: float | None) -> float:
    """The baseline's timed pace `speedup` x as fast, at most `load_pace` where given."""
    shape, timed = baseline.shape, len(timed_steps(baseline))
    if shape is None or not timed or shape.timed_s <= 0:
        return float("inf")
    pace = timed / shape.timed_s * max(speedup, 1.0)
    return min(pace, load_pace) if load_pace else pace


def setup_s(baseline: RawRun) -> float:
    """About how long the script sets up before its first step (imports, loading, building the
    model): the baseline's warm-up, which holds it, less its warm-up steps at its timed pace."""
    shape, timed = baseline.shape, timed_steps(baseline)
    if shape is None or not timed:
        return 0.0
    step_s = sum(step.step_ms for step in timed) / len(timed) / 1e3
    return max(0.0, shape.warmup_s - shape.warmup_steps * step_s)


def _block_s(baseline: RawRun) -> float:
    """One settling block of the script's own setting: BLOCK_STEPS of its timed steps, at least
    BLOCK_S (`measure.settle`)."""
    shape = baseline.shape
    timed = len(timed_steps(baseline)) or baseline.window_steps
    step_s = shape.timed_s / timed if shape is not None and timed else 0.0
    return max(BLOCK_S, BLOCK_STEPS * step_s)


def _fresh_s(baseline: RawRun, settle_cap_s: float | None) -> float:
    """The baseline's whole run with its warm-up capped as a fresh trial's is (`settle_cap_s`,
    else TRIAL_SETTLE_MAX_S): a baseline on a loaded machine warmed up for 50 s, and each fresh
    run was estimated at a minute where it took 18 s."""
    shape = baseline.shape
    if shape is None:
        return baseline.wall_s
    cap = settle_cap_s if settle_cap_s is not None else TRIAL_SETTLE_MAX_S
    return baseline.wall_s - max(0.0, shape.warmup_s - cap)


def fresh_unsettled_s(walls: list[float], baseline: RawRun) -> float:
    """A fresh run's estimate (`cost_s("fresh")`) without the settling of its warm-up: its
    set-up (`setup_s`), which no settling cap shortens, stays in it."""
    whole_s = cost_s("fresh", walls, baseline)
    return min(whole_s, cost_s("fresh", walls, baseline, settle_cap_s=0.0) + setup_s(baseline))


# ---- paired windows: a choice made in windows, measured against the baseline's setting next to it ----

# At most this many pairs of adjacent windows (the baseline's setting, then the candidate's).
MAX_PAIRS = 3
# One pair decides where the candidate's slow windows beat the baseline's fast ones by this much:
# a gain far beyond what background load drifts by between two windows seconds apart.
DECISIVE = 1.5
# A pair's window of the script's own setting stops once, even RACE_MARGIN faster, it stays under
# the chosen setting's slow windows over DECISIVE (`pairs.decisive_below`): its estimate counts
# one block of timed steps where the fix can reach this much at most (in `benchmarks/verdict_cost.py`'s
# slow-start and ceiling cases the workers reached 0.92-1.07x the bound their loop's wait set).
RACED_PAIR_GAIN = DECISIVE * (1.0 + RACE_MARGIN)


@dataclass(frozen=True)
class Paired:
    """What pairs of adjacent windows decided: "gain", "no_gain", or "open" (measure another
    pair); the candidate's speedup over the baseline's setting (the median pair's), and the range
    from the slowest pair's low end to the fastest's high end."""

    state: str
    speedup: float | None
    low: float | None
    high: float | None
    pairs: int


def paired(ratios: list[tuple[float, float, float]], keep_min: float) -> Paired:
    """The verdict of (speedup, low, high) per pair, the candidate's window against the
    baseline's beside it. A pair wins where its speedup reaches `keep_min` and the candidate's
    slow windows beat the baseline's fast ones (low > 1). Decided: one pair whose low end reaches
    DECISIVE (a gain) or whose high end stays under 1 (slower in every window); else the last two
    pairs agreeing; else, after MAX_PAIRS, the majority. A drift in background load between
    windows seconds apart shows in both of a pair and cancels in its ratio."""
    if not ratios:
        return Paired("open", None, None, None, 0)
    wins = [r[0] >= keep_min and r[1] > 1.0 for r in ratios]
    first = ratios[0]
    if len(ratios) == 1 and (first[1] >= DECISIVE or first[2] < 1.0):
        state = "gain" if wins[0] else "no_gain"
    elif len(ratios) >= 2 and wins[-1] == wins[-2]:
        state = "gain" if wins[-1] else "no_gain"
    elif len(ratios) >= MAX_PAIRS:
        state = "gain" if 2 * sum(wins) > len(wins) else "no_gain"
    else:
        state = "open"
    # a gain's figure is its winning pairs' (a losing pair of a majority would put its range
    # under 1); otherwise every pair's
    shown = [r for r, won in zip(ratios, wins) if won] if state == "gain" else ratios
    median = statistics.median(r[0] for r in shown)
    low, high = min(r[1] for r in shown), max(r[2] for r in shown)
    return Paired(state, median, low, high, len(ratios))


# ---- an adjacent baseline: fresh runs compared with the script's setting measured next to them ----

# Two measurements of the script's own setting that differ by more than this share: the machine's
# speed changed between them (the settling tolerance: what two settled blocks of one loop differ by).
MACHINE_DRIFT = TOLERANCE


def machine_drift(first: Run, adjacent: Run) -> float:
    """How much the machine's speed changed between two measurements of the script's own
    setting: the faster's steps/s over the slower's (1.0: not at all, or not measured)."""
    a, b = first.steps_per_s or 0.0, adjacent.steps_per_s or 0.0
    return max(a, b) / min(a, b) if a > 0 and b > 0 else 1.0


def machine_changed(first: Run, adjacent: Run) -> str | None:
    """Why fresh runs measured between the baseline and the script's setting measured again
    next to the last of them cannot be compared (the machine's speed changed between them), in
    words with the figures; None where they can. Two measurements of the script's setting that
    agree hold for a baseline whose warm-up did not settle too (a loop that never settles, or a
    short --max-warmup): it was reproduced next to the fresh runs."""
    a, b = first.steps_per_s or 0.0, adjacent.steps_per_s or 0.0
    if a <= 0 or b <= 0:
        return "the script's own setting could not be measured next to the confirmation run"
    if max(a, b) > (1.0 + MACHINE_DRIFT) * min(a, b):
        return (
            f"the machine's speed changed between runs: the script's own setting measured "
            f"{a:.1f} steps/s in the baseline and {b:.1f} next to the confirmation run "
            f"({100 * (b / a - 1):+.0f}%, more than the {100 * MACHINE_DRIFT:.0f}% two settled "
            "measurements of one loop differ by)"
        )
    return None


# ---- which fix first ----


def gain_bound(planned: PlannedFix, values: dict[str, Any]) -> float:
    """The most a fix can speed the step up: 1 / (1 - the share its bottleneck takes)."""
    share = values.get(fixes.REGISTRY[planned.fix].bound_by) if planned.fix in fixes.REGISTRY else None
    if not isinstance(share, (int, float)):
        return 1.0
    return 1.0 / max(1.0 - min(float(share), 99.0) / 100.0, 0.01)


def ordered(plan: list[PlannedFix], values: dict[str, Any]) -> list[int]:
    """The applicable fixes' places in the plan, most to gain first (ties keep plan order)."""
    applicable = [i for i, p in enumerate(plan) if p.applicable]
    return sorted(applicable, key=lambda i: -gain_bound(plan[i], values))
