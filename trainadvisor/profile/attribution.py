"""Which of several fixes chosen by their own trials earns its place among the others.

Each fix's trial measures it alone. Together, one can make another redundant: TF32 speeds up
fp32 matmuls, and under bf16 autocast the matmuls no longer run in fp32 (on the first H100 runs
amp alone measured 1.71x and TF32 alone 1.47x, and all four chosen fixes were credited one
combined 1.70x). Where the trials ran as windows of one process, a window costs a few steps and
no restart, so the combination of every chosen fix is measured with and without each of them
(leave one out). The fix whose absence costs least is dropped when the others without it are
within KEEP_MIN_SPEEDUP of the combination, and the rest are measured again, until every fix
left adds at least that on top of the others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from trainadvisor import fixes
from trainadvisor.profile.judge import KEEP_MIN_SPEEDUP, Ratio, ratio
from trainadvisor.records import FixOutcome, Overrides, Run, merge_overrides

# How one combination is measured: (label, its setting) -> its run, or None when the window
# could not be measured (the script ended).
MeasureSetting = Callable[[str, fixes.Setting], Run | None]


@dataclass
class Round:
    """One round: the combination of `fixes`, and each of them left out."""

    fixes: list[str]
    together: Run
    without: dict[str, Ratio]  # fix -> the combination with it over the others without it


def combination(outcomes: list[FixOutcome], leave_out: str | None = None) -> fixes.Setting:
    """Every outcome's chosen settings in one setting (less one fix's)."""
    kept = [o for o in outcomes if o.fix != leave_out]
    merged: Overrides = merge_overrides([o.settings for o in kept])
    names = " + ".join(o.fix for o in kept)
    label = f"{names} together" if leave_out is None else f"{names} (without {leave_out})"
    return fixes.Setting(label, merged)


def measure_round(outcomes: list[FixOutcome], measure: MeasureSetting, number: int) -> Round | None:
    """The combination, then the combination without each fix in turn; None when a window could
    not be measured."""
    together = measure(f"combined-{number}", combination(outcomes))
    if together is None:
        return None
    without: dict[str, Ratio] = {}
    for outcome in outcomes:
        run = measure(f"without-{outcome.fix}-{number}", combination(outcomes, outcome.fix))
        if run is None:
            return None
        without[outcome.fix] = ratio(run, together)
    return Round([o.fix for o in outcomes], together, without)


def attribute(chosen: list[FixOutcome], measure: MeasureSetting) -> tuple[list[FixOutcome], list[str]]:
    """The chosen outcomes, each with what it adds on top of the others (`added_gain`), those the
    others make redundant marked so; and notes on what could not be measured."""
    left = list(chosen)
    decided: dict[str, FixOutcome] = {}
    number = 1
    while len(left) >= 2:
        found = measure_round(left, measure, number)
        if found is None:
            names = ", ".join(o.fix for o in left)
            return _merged(chosen, decided, left), [
                f"The combination of {names} could not be measured with and without each (the "
                "script ended): each keeps the gain of its own trial."
            ]
        weakest = min(left, key=lambda o: found.without[o.fix].speedup or 0.0)
        added = found.without[weakest.fix]
        if (added.speedup or 0.0) >= KEEP_MIN_SPEEDUP:
            left = [replace(o, added_gain=found.without[o.fix].speedup) for o in left]
            break
        others = [o.fix for o in left if o.fix != weakest.fix]
        decided[weakest.fix] = _redundant(weakest, others, found, added)
        left = [o for o in left if o.fix != weakest.fix]
        number += 1
    return _merged(chosen, decided, left), []


def _redundant(outcome: FixOutcome, others: list[str], found: Round, added: Ratio) -> FixOutcome:
    together = found.together.steps_per_s or 0.0
    alone = f"{outcome.gain:.2f}x {outcome.unit} alone" if outcome.gain else "faster alone"
    reason = (
        f"{alone}, but {', '.join(others)} measured {together / (added.speedup or 1.0):.1f} steps/s "
        f"without it and {together:.1f} with it ({added.speedup or 0.0:.2f}x): it adds nothing "
        f"the {'other fix does' if len(others) == 1 else 'others do'} not"
    )
    return replace(outcome, status="redundant", reason=reason, settings=Overrides(), added_gain=added.speedup)


def _merged(
    chosen: list[FixOutcome], decided: dict[str, FixOutcome], left: list[FixOutcome]
) -> list[FixOutcome]:
    by_fix = {o.fix: o for o in left} | decided
    return [by_fix.get(o.fix, o) for o in chosen]
