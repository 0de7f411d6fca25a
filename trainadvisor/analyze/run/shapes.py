"""How a run's windows spent their steps, in words for the report: the baseline's warm-up (how
long step time took to settle, from which blocks), every window whose warm-up hit its cap before
step time settled, and every window the script's end or its length cut short. Pure."""

from __future__ import annotations

from trainadvisor.measure import config
from trainadvisor.records import FixOutcome, RawRun, Run, timed_steps

# A window the script's end cut short still counts with at least this many timed steps: two
# throughput windows of the smallest size (`analyze.run.summary.WINDOW_STEPS`).
MIN_TIMED_STEPS = 10


def usable(raw: RawRun) -> bool:
    """Whether a run's timings can be judged: its window complete, or cut short by the script's
    own end after at least MIN_TIMED_STEPS timed steps."""
    if raw.status == "window_complete":
        return True
    return raw.status == "script_ended" and len(timed_steps(raw)) >= MIN_TIMED_STEPS


def traced_whole(raw: RawRun) -> int:
    """Steps the run's profiler recorded whole (`measure.config.traced_whole`)."""
    return config.traced_whole(raw.steps, raw.profile_steps)


def cut_short(raw: RawRun) -> str:
    """Why a run's timed steps stopped short of its plan, in words ("" when they did not)."""
    shape = raw.shape
    timed = len(timed_steps(raw))
    if shape is not None and shape.timed_end == "script ended":
        return f"the script ended after {raw.steps_seen} steps, {timed} of them timed"
    if shape is not None and shape.timed_end == "step cap":
        return f"{timed} timed steps in {shape.timed_s:.2f} s: the script has no more steps to spare"
    return ""


def _blocks(block_ms: list[float], last: int = 3) -> str:
    return ", ".join(f"{ms:.3g}" for ms in block_ms[-last:])


def baseline_note(raw: RawRun) -> str | None:
    """How the baseline's warm-up ended, and how its timed steps did where they were cut."""
    shape = raw.shape
    if shape is None:
        return None
    timed = len(timed_steps(raw))
    if shape.warmup_end == "settled" and shape.slid_steps:
        text = (
            f"Warm-up: the baseline's step time seemed settled ({_blocks(shape.block_ms)} ms per step "
            f"in its last blocks), then changed while it was timed: the first {shape.slid_steps} timed "
            f"steps were counted as warm-up too ({shape.warmup_steps} steps, {shape.warmup_s:.1f} s in "
            f"all); then {timed} steps were timed over {shape.timed_s:.2f} s."
        )
    elif shape.warmup_end == "settled":
        text = (
            f"Warm-up: the baseline's step time settled after {shape.warmup_steps} steps "
            f"({shape.warmup_s:.1f} s; the last blocks took {_blocks(shape.block_ms)} ms per step); "
            f"then {timed} steps were timed over {shape.timed_s:.2f} s."
        )
    elif shape.warmup_end == "count":
        text = (
            f"Warm-up: {shape.warmup_steps} steps; then {timed} steps were timed over {shape.timed_s:.2f} s."
        )
    else:
        text = ""  # a capped warm-up has its own note (`unsettled_note`)
    cut = cut_short(raw)
    if cut:
        text = f"{text} The baseline's window was cut short: {cut}.".strip()
    return text or None


def unsettled_note(windows: dict[str, RawRun | None]) -> str | None:
    """One note naming every window whose warm-up ended on a cap before step time settled."""
    named = []
    for name, raw in windows.items():
        shape = raw.shape if raw is not None else None
        if shape is None or shape.warmup_end not in ("time cap", "settle cap", "step cap"):
            continue
        why = (
            # one decimal: the cap is checked as each step ends, once the first --warmup steps
            # are done, so 2.6 s under a cap of 2 s would have read "3 s"
            f"after {shape.warmup_s:.1f} s (the longest warm-up allowed, --max-warmup, had passed)"
            if shape.warmup_end == "time cap"
            else f"after {shape.warmup_s:.1f} s (a trial's warm-up settles for at most 3x as long as the "
            "baseline's took, and at most 10 s, or as long as it took for a confirmation; a pair's "
            "windows for 3 s)"
            if shape.warmup_end == "settle cap"
            else f"after {shape.warmup_steps} steps (the script had no more to spare)"
        )
        blocks = f"; its last blocks took {_blocks(shape.block_ms)} ms per step" if shape.block_ms else ""
        named.append(f"{name} {why}{blocks}")
    if not named:
        return None
    return (
        "Step time had not settled when the warm-up ended in " + "; ".join(named) + ": those windows "
        "measure a loop still changing speed (a longer --max-warmup, or more steps, lets it settle)."
    )


def window_notes(baseline: Run, outcomes: list[FixOutcome], after: Run | None) -> list[str]:
    """The caveat on the windows of a `profile` run (the baseline's, each trial's, the
    confirmation run's) that measured a loop still changing speed."""
    windows: dict[str, RawRun | None] = {"the baseline window": baseline.raw}
    for outcome in outcomes:
        windows.update({f"{outcome.fix}'s trial {trial.label}": trial.raw for trial in outcome.trials})
    windows["the confirmation run's window"] = after.raw if after else None
    note = unsettled_note(windows)
    return [note] if note else []
