"""After a script died of out-of-memory: the fixes its diagnosis proposes (`rules/out-of-memory.toml`)
are each tried in fresh runs of the script, and the question a trial answers is no longer "is it
faster" but "does the script now run". A fix whose run got through its window is recommended with
that run's figures; one whose run died of out-of-memory again says so. No confirmation run
follows: the baseline has no window of its own to compare one with."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trainadvisor.fixes.common import cuda_memory, trial_peak
from trainadvisor.memory.oom import summary_text
from trainadvisor.records import FixOutcome, RawRun, Trial

WHY_RESTART = "the script died of out-of-memory: each candidate runs it afresh"


def died_of_oom(raw: RawRun) -> bool:
    """Whether the run failed with an out-of-memory error (`training.failure` recorded it)."""
    return raw.status == "script_failed" and bool(raw.runtime.get("oom"))


def _figures(trial: Trial) -> str:
    """'12.3 steps/s, peak reserved 2.41 GB' of a trial's run."""
    parts = [f"{trial.steps_per_s:.1f} steps/s"] if trial.steps_per_s else []
    peak = trial_peak(trial)
    if peak:
        what = "peak reserved" if cuda_memory(trial).get("peak_reserved_bytes") else "peak of one step"
        parts.append(f"{what} {peak / 1e9:.2f} GB")
    return ", ".join(parts)


def rescued(outcome: FixOutcome, script: Path, baseline: RawRun) -> FixOutcome:
    """A tried fix's outcome after an out-of-memory death: recommended where a candidate's run
    got through its window (the first that did: the least change), with its code change; failed
    where every run died, saying when it was of out-of-memory again."""
    if not outcome.trials:
        return outcome
    ran = next((t for t in outcome.trials if t.status == "measured"), None)
    if ran is None:
        last = outcome.trials[-1]
        again = last.raw.runtime.get("oom") if last.raw is not None else None
        if not again:
            return outcome
        reason = f"{last.label}: it died of out-of-memory again ({summary_text(again)})"
        return replace(outcome, status="failed", reason=reason)
    figures = _figures(ran)
    reason = "without it the script died of out-of-memory; with it the run got through its window"
    outcome = replace(
        outcome,
        status="recommended",
        reason=reason + (f": {figures}" if figures else ""),
        settings=ran.overrides,
        chosen=ran.label,
        gain=None,
        gain_low=None,
    )
    from trainadvisor.frameworks.change import fix_change  # libcst: only where a change is written

    change = fix_change(script, outcome.fix, outcome.settings, baseline)
    return replace(outcome, diff=change.diff, setting_change=change.setting)


def note(outcomes: list[FixOutcome]) -> str:
    """How the fixes were judged after the death, or why none was tried."""
    if not any(o.trials for o in outcomes):
        return "The script died of out-of-memory; no fix it proposes applies to this run (each says why)."
    return (
        "The script died of out-of-memory, so there is no speed of its own to compare a fix with: "
        "each fix was tried in fresh runs of the script, and one whose run got through its window "
        "is recommended with that run's figures (not confirmed in a further run)."
    )
