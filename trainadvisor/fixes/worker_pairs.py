"""The worker search's counts measured again beside other processes (issue 36: candidates against
each other in adjacent windows, A B A, where the machine is shared).

Beside a busy core a loop's pace drifts between windows seconds apart (the light slow-input loop
at 8 workers read 27, 57 and 94 steps/s in three runs beside one), so a count measured in a slow
spell reads slower than the count before it, measured in a fast one, and the doubling stops short
of what the loader needs (it kept 8 workers, 0.21 of the loop's ceiling, where 16 ran faster on a
quiet machine). Where other processes shared either window and the last count lost, the best
count before it is measured again right after it, and those two adjacent windows decide whether
the doubling goes on: a drift slower than a window shows in both and cancels in their ratio. Only
a loss is checked so: it ends the search, where a gain a drift made up is measured again by the
next count and by the pairs that check the choice against the script's own setting
(`profile.pairs`). The counts are then compared at the pace of the machine's first spell: the
count measured again tells how much slower (or faster) the machine ran in the later windows (its
figure before over its figure again), and the count next to it, and every count after, is scaled
by that (`figures`): beside a slow spell from its fourth window on, 8 workers read 60 then 30
steps/s, 16 read 50 between them, and 16 stands at 100. On a quiet machine nothing changes: no
count is measured twice, and every figure is its window's steps/s."""

from __future__ import annotations

from trainadvisor.fixes.loader_waits import shared
from trainadvisor.records import Trial


def workers_of(trial: Trial) -> int:
    return int(trial.overrides.loader()["num_workers"])


def rate(trial: Trial) -> float:
    return trial.steps_per_s or 0.0


def repeats(trials: list[Trial]) -> bool:
    """Whether the last of `trials` measured a setting measured before it (a count again)."""
    return bool(trials) and any(t.overrides == trials[-1].overrides for t in trials[:-1])


def figures(trials: list[Trial]) -> list[tuple[Trial, float]]:
    """Each setting's latest trial among the measured `trials` (in the order measured), with its
    steps/s at the pace of the machine's first spell: a setting measured again keeps its figure,
    and scales the window just before it (its pair) and every window after it by its figure over
    what it read again."""
    return _walk(trials)[0]


def pace_now(trials: list[Trial]) -> float:
    """The machine's pace in the latest windows against its first spell's: what the last count
    measured again read over its figure before (1.0 where none was measured again)."""
    return 1.0 / _walk(trials)[1]


def _walk(trials: list[Trial]) -> tuple[list[tuple[Trial, float]], float]:
    """`figures`, and the scale from the latest windows' steps/s to the first spell's."""
    scale, out = 1.0, list[tuple[Trial, float]]()
    for trial in (t for t in trials if t.status == "measured"):
        before = next((f for t, f in out if t.overrides == trial.overrides), None)
        if before is None or not rate(trial):
            out.append((trial, rate(trial) * scale))
            continue
        scale = before / rate(trial)
        out = [(t, f) for t, f in out if t.overrides != trial.overrides]
        if out:  # its pair, measured in the same spell
            out[-1] = (out[-1][0], rate(out[-1][0]) * scale)
        out.append((trial, before))
    return out, scale


def to_measure_again(doubling: list[Trial], own_steps_per_s: float, gain: float) -> Trial | None:
    """The count to measure again right after the last of the doubling's counts (`doubling`: the
    counts above the script's own, in the order measured): the fastest before it, at its latest
    window, where the last gained less than `gain` over it and other processes shared either
    window (`loader_waits.shared`). None where the last is itself a count measured again, was not
    measured or gained, no count before it beat the script's own setting, or both windows were
    quiet."""
    if len(doubling) < 2 or repeats(doubling) or doubling[-1].status != "measured":
        return None
    *before, (last, figure) = figures(doubling)
    best, best_figure = max(before, key=lambda pair: pair[1], default=(None, 0.0))
    if best is None or best_figure <= own_steps_per_s or figure >= gain * best_figure:
        return None
    if shared(last) is None and shared(best) is None:
        return None
    return best


def paired_stop(doubling: list[Trial], gain: float) -> str | None:
    """After a count measured again (the last of `doubling`) right after a count that had lost to
    it (the one before): why the doubling stops there, where that count gained less than `gain`
    over the adjacent window; None where it gained that (the doubling goes on from it)."""
    again, candidate = doubling[-1], doubling[-2]
    if again.status == "measured" and rate(candidate) >= gain * rate(again):
        return None
    found = [cores for cores in (shared(candidate), shared(again)) if cores is not None]
    beside = f"; other processes used {max(found):.1f} cores beside them" if found else ""
    return (
        f"stopped at {workers_of(candidate)} workers: they gained less than {100 * (gain - 1):.0f}% over "
        f"{workers_of(again)} workers measured again right after them ({rate(candidate):.1f} against "
        f"{rate(again):.1f} steps/s{beside})"
    )
