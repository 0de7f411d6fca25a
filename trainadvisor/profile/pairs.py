"""A choice made in trial windows, measured against the script's own setting in pairs of adjacent
windows (the script's setting, then the chosen one; repeated while the pairs leave it open,
`pace.paired`): a drift in background load between two windows seconds apart shows in both and
cancels in their ratio, where one baseline window measured before the trials would set a
candidate measured in a quiet spell against a baseline measured in a busy one (interleaved A/B
measurement, as benchmark harnesses repeat and pair their runs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from trainadvisor import fixes
from trainadvisor.analyze.run.summary import summarize
from trainadvisor.profile import pace
from trainadvisor.profile.judge import KEEP_MIN_SPEEDUP, ratio, spread
from trainadvisor.profile.trials import Measurer
from trainadvisor.records import FixOutcome, Overrides, Run, Trial

AS_SCRIPT = "as the script runs"
PAIR_SETTLE_S = pace.PAIR_SETTLE_S  # a pair's windows' longest warm-up


class AsScript(fixes.Fix):
    """The baseline's own setting, measured again (no fix)."""

    id = ""


def as_script(settle_s: float | None = None, race_below: float | None = None) -> fixes.Setting:
    # raced in its timed steps only: cut in a warm-up still coming up to speed, its steps/s would
    # be understated, and the pair's gain overstated
    return fixes.Setting(AS_SCRIPT, Overrides(), race_below, race_warmup=False, settle_s=settle_s)


def decisive_below(chosen: Run | None) -> float | None:
    """The steps/s under which a pair's window of the script's own setting stops early
    (`measure.race`): even RACE_MARGIN faster, it stays under the chosen setting's slow windows
    (as last measured) divided by DECISIVE, so that the pair decides a gain by itself and the
    rest of the window would only cost time. None where the chosen setting has no windows."""
    low = pace.slow_windows(chosen) if chosen is not None else None
    return low / pace.DECISIVE if low else None


@dataclass
class PairedOutcome:
    """A fix's outcome after its pairs, the script's setting as last measured beside it, and
    how the pairs went (for the report's details)."""

    outcome: FixOutcome
    again: Run | None
    detail: str


def chosen_trial(outcome: FixOutcome) -> Trial:
    """The trial whose setting `outcome` chose: its latest (a setting measured again stands at
    its latest window: `fixes.worker_pairs`)."""
    measured = [t for t in outcome.trials if t.status == "measured"]
    return next(t for t in reversed(measured) if t.overrides == outcome.settings)


def pair_choice(
    outcome: FixOutcome,
    measure: Measurer,
    fits: Callable[[float], bool],
    window_cost_s: Callable[[], float],
    last_window: bool = False,
) -> PairedOutcome:
    """The chosen setting of `outcome` (status "unconfirmed", chosen in windows) measured in
    pairs of windows with the script's own; its gain becomes the pairs' (median, and the range
    from the slowest pair's slow windows to the fastest's fast ones), or it is no gain. Pairs
    stop where the budget would not fit two more windows, or the script ended: the search's
    figure then stands, and the detail says so. `last_window`: the chosen trial's own window was
    the last the run measured; the first pair is that window and the script's setting measured
    right after it (a drift between adjacent windows cancels in either order), one window fewer."""
    fix = fixes.REGISTRY[outcome.fix]
    chosen = chosen_trial(outcome)
    # what the script's setting's window races (steps/s fixes only): the chosen, as last measured
    races = fix.metric == "steps_per_s"
    # its trial's run, summarised where a pair reuses it or races against it (not where it was cut)
    raw = chosen.raw if (races or last_window) and chosen.raw and not pace.raced(chosen.raw) else None
    whole = summarize(raw) if raw is not None else None
    reuse = whole if last_window else None
    reused = reuse is not None  # the first pair's window of the chosen setting is its trial's
    latest = whole if races else None
    cut: list[str] = []
    ratios: list[tuple[float, float, float]] = []
    again: Run | None = None
    stopped = ""
    while len(ratios) < pace.MAX_PAIRS:
        if not fits((1 if reuse is not None else 2) * window_cost_s()):
            stopped = "the --budget left no time for another pair"
            break
        k = len(ratios) + 1
        below = decisive_below(latest)
        before = measure(AsScript(), f"baseline-pair-{k}", as_script(PAIR_SETTLE_S, below))
        if below is not None and (note := pace.race_note(before.raw, below, _decisive(chosen.label))):
            cut.append(f"pair {k}'s window of the script's own setting was {note}")
        after_run, reuse = reuse, None
        if after_run is None:
            chosen_setting = fixes.Setting(chosen.label, chosen.overrides, settle_s=PAIR_SETTLE_S)
            after_run = measure(fix, f"{fix.id}-pair-{k}", chosen_setting).run
        if before.run is None or after_run is None or not before.run.steps_per_s:
            stopped = "a window of the pair measured nothing (the script ended?)"
            break
        again, latest = before.run, after_run if races else None
        r = ratio(before.run, after_run, fix.metric == "samples_per_s")
        if r.speedup is None or r.low is None or r.high is None:
            stopped = "a window of the pair had no throughput to compare"
            break
        ratios.append((r.speedup, r.low, r.high))
        if pace.paired(ratios, KEEP_MIN_SPEEDUP).state != "open":
            break
    decided, detail = _decided(outcome, pace.paired(ratios, KEEP_MIN_SPEEDUP), fix.metric, stopped)
    if ratios and reused:
        detail += f" (the first pair's {chosen.label} window was its trial's own, just before)"
    if cut:
        detail += f"; {'; '.join(cut)}"
    return PairedOutcome(decided, again, detail)


def _decisive(label: str) -> str:
    return f"{label} over {pace.DECISIVE:g}, where one pair decides a gain"


def _decided(outcome: FixOutcome, decision: pace.Paired, metric: str, stopped: str) -> tuple[FixOutcome, str]:
    unit = "samples/s" if metric == "samples_per_s" else "steps/s"
    if decision.speedup is None:
        return (
            outcome,
            f"{outcome.fix}: no pair of windows was measured ({stopped}); the search's figure stands",
        )
    figure = spread(decision.speedup, decision.low, decision.high, unit)
    plural = "s" if decision.pairs > 1 else ""
    pairs = f"{decision.pairs} pair{plural} of adjacent windows with the script's own setting"
    detail = f"{outcome.fix}: {figure} in {pairs}"
    if decision.state == "open":
        detail += f", undecided ({stopped}); the search's figure stands"
        return outcome, detail
    if decision.state == "no_gain":
        reason = f"{outcome.chosen or outcome.fix} measured {figure} in {pairs}: not a reliable gain"
        return replace(
            outcome, status="no_gain", reason=reason, settings=Overrides(), gain=None, gain_low=None
        ), detail
    reason = f"measured {figure} in {pairs}; no confirmation run measured it"
    decided = replace(outcome, reason=reason, gain=decision.speedup, gain_low=decision.low, unit=unit)
    return decided, detail
