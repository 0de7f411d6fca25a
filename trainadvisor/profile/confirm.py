"""The confirmation stage of `profile`: the fixes chosen by their trials, measured together in
one fresh, seeded run fitted into the steps the script has; each kept only if that run is
faster and trains the same, and each kept or recommended fix given its code change."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import cast

from trainadvisor import fixes
from trainadvisor.compute.mfu import with_baseline_flops
from trainadvisor.measure import priority
from trainadvisor.measure.config import AHEAD_ENV_CHANGED
from trainadvisor.measure.kept_alive import Prestarted
from trainadvisor.measure.runner import PROFILE_STEPS, RunSpec
from trainadvisor.profile import pace, quiet
from trainadvisor.profile.judge import MIN_TIMED_STEPS, compare, usable, verdict
from trainadvisor.profile.pace import MACHINE_DRIFT, machine_changed, machine_drift, raced
from trainadvisor.profile.runs import (
    ProfileOptions,
    confirmation_spec,
    measure_fitted,
    measure_run,
    reproduce_command,
    run_of,
)
from trainadvisor.profile.trials import Echo, run_cap_s, tolerance
from trainadvisor.profile.tuning import Tuning
from trainadvisor.records import (
    Comparison,
    FixOutcome,
    FixStatus,
    RawRun,
    Run,
    merge_overrides,
    timed_steps,
)

# Outcomes whose setting the report gives as a change to the script: kept, recommended (memory),
# and measured faster but not confirmed or not applied (a gain is never left without its change)
CHANGED = ("kept", "recommended", "unconfirmed", "opportunity")


@dataclass
class Confirmed:
    """Every fix's final outcome, the confirmation run and its comparison with the baseline."""

    outcomes: list[FixOutcome]
    after: Run | None = None
    comparison: Comparison | None = None
    notes: list[str | None] = field(default_factory=list)


def confirm(
    options: ProfileOptions,
    baseline: Run,
    tuning: Tuning,
    noise_rel: float | None,
    echo: Echo,
    prestarted: Prestarted | None = None,
    adjacent: Callable[[], Run | None] | None = None,
) -> Confirmed:
    """Where no confirmation could be measured (the run failed, or would have run past
    --budget), each chosen fix stays `unconfirmed` with the gain its own trial measured. A
    confirmation that would keep its fixes is compared, too, with the script's own setting
    measured next to it (`adjacent`): where the machine's speed changed since the baseline
    (`pace.machine_changed`), only a gain beyond that change is kept; the fixes of anything less
    are `inconclusive` (those chosen in pairs of windows stay `unconfirmed`), never kept."""
    chosen = [o for o in tuning.outcomes if o.status == "unconfirmed"]
    after, comparison = None, None
    verdicts: dict[str, tuple[FixStatus, str]] = {}
    changed = None
    waiting = prestarted if prestarted is not None and prestarted.waiting() else None
    estimate_s = _estimate_s(tuning, waiting is not None)
    if chosen and not tuning.fits(estimate_s):
        verdicts = {o.fix: ("unconfirmed", _over_budget(options, o, chosen, estimate_s)) for o in chosen}
    elif chosen:
        echo("trainadvisor: confirming the chosen settings in a fresh profiled run")
        merged = merge_overrides([o.settings for o in chosen])
        first = measure_run if waiting is None else _ahead_or_fresh(waiting, tuning, echo)
        cap = _settle_cap_s(tuning, estimate_s, _estimate_s(tuning, waiting is not None, unsettled=True))
        spec_of = lambda known: confirmation_spec(options, merged, known, cap)  # noqa: E731
        after = with_baseline_flops(
            measure_fitted(spec_of, lambda: tuning.length, tuning.learn, first), baseline
        )
        if waiting is None:  # a run started ahead counts its wait at the gate too: no estimate
            tuning.walls["fresh"].append(after.raw.wall_s)
        if usable(after.raw):
            judge = _Judge(baseline, after, tuning, chosen, noise_rel, _once(adjacent))
            status, reason, comparison, changed = judge()
            # a gain the load made, kept or within a change of the machine's speed: neither kept
            # nor rejected, and no change given (a fix chosen in windows is not left unconfirmed)
            loaded = judge.loaded() if status in ("kept", "inconclusive") else None
            if status == "no_gain":  # a gain its trials measured, not found beside other processes
                loaded = judge.contradicted()
            if loaded is not None:
                verdicts = {
                    o.fix: ("inconclusive", _together(f"{reason}; but {loaded}", chosen)) for o in chosen
                }
            else:
                verdicts = {o.fix: _scoped(o, status, _together(reason, chosen)) for o in chosen}
        else:
            why = after.raw.error or _short_run(after.raw)
            verdicts = {o.fix: ("unconfirmed", f"{o.reason} ({why})") for o in chosen}
    final = [_final(options, _unsure(o, changed), verdicts, baseline.raw) for o in tuning.outcomes]
    notes: list[str | None] = [
        *_length_note(tuning, comparison),
        _reference_note(baseline, after, comparison) if any(o.status == "kept" for o in final) else None,
    ]
    return Confirmed(final, after, comparison, [note for note in notes if note])


def _estimate_s(tuning: Tuning, ahead: bool, unsettled: bool = False) -> float:
    """About how long the confirmation takes: a fresh run's, or the run started `ahead`'s and what
    is left of its set-up; `unsettled`: without the settling of its warm-up."""
    if not ahead:
        walls = tuning.walls["fresh"]
        return pace.fresh_unsettled_s(walls, tuning.baseline.raw) if unsettled else tuning.cost_s("fresh")
    settle_cap_s = 0.0 if unsettled else None
    return tuning.confirmation_cost_s(settle_cap_s) + (tuning.ahead_left()[0] if tuning.ahead_left else 0.0)


def _settle_cap_s(tuning: Tuning, estimate_s: float, unsettled_s: float) -> float | None:
    """The confirmation's settling cap: the trials' comparison with the baseline's
    (`Tuning.compared_settle_cap_s`), and within what is left of --budget (`trials.run_cap_s`).
    Beside a busy core a confirmation estimated at 3.5 s, the budget's last, settled to its cap
    in 6.5 s and the command ended 16% past its 30 s budget."""
    return run_cap_s(tuning.compared_settle_cap_s, tuning.left_s(), estimate_s, unsettled_s)


def _ahead_or_fresh(ready: Prestarted, tuning: Tuning, echo: Echo) -> Callable[[RunSpec], Run]:
    """The run started ahead, its set-up done while the trials ran, measured with `spec`'s
    settings. Where a thread of it could not get its priority back (its speed beside a busy core
    would be a starved thread's), or the script set a variable that what it imported ahead reads
    (`config.AHEAD_ENV_CHANGED`), it stopped at its gate: a fresh run is measured instead, where
    the budget has room for one."""

    def first(spec: RunSpec) -> Run:
        raw = ready.run(spec, PROFILE_STEPS)
        why = _stood_aside(raw)
        if why is None:
            return run_of(raw, spec)
        estimate_s = tuning.cost_s("fresh")
        if not tuning.fits(estimate_s):
            error = f"{why}, and a fresh run (about {estimate_s:.0f} s) would have run past the --budget"
            return run_of(replace(raw, status="refused", error=error), spec)  # it measured nothing
        echo(f"trainadvisor: {why}; confirming in a fresh run")
        run = measure_run(spec)
        tuning.walls["fresh"].append(run.raw.wall_s)
        return run

    return first


def _stood_aside(raw: RawRun) -> str | None:
    """Why the run started ahead stopped at its gate, or None where it was measured."""
    lowered, changed = raw.runtime.get(priority.LOWERED), raw.runtime.get(AHEAD_ENV_CHANGED)
    if lowered:
        return f"{lowered} thread(s) of the run started ahead could not get their CPU priority back"
    if changed:
        return (
            f"the script set {', '.join(changed)} after the run started ahead had imported "
            "torch._dynamo, which reads them when imported"
        )
    return None


def _once(measure: Callable[[], Run | None] | None) -> Callable[[], Run | None] | None:
    """`measure`, measured at its first call only (the run next to the confirmation, which the
    judgement with and without the CPU waits both read)."""
    if measure is None:
        return None
    measured: list[Run | None] = []

    def once() -> Run | None:
        if not measured:
            measured.append(measure())
        return measured[0]

    return once


_Verdict = tuple[str, str, Comparison, str | None]


@dataclass
class _Judge:
    """The confirmation's verdict against the baselines, as measured (`__call__`) and as a quiet
    machine would have measured it (`loaded`, `profile.quiet`)."""

    baseline: Run
    after: Run
    tuning: Tuning
    chosen: list[FixOutcome]
    noise_rel: float | None
    adjacent: Callable[[], Run | None] | None

    def __call__(self, view: Callable[[Run], Run] = lambda run: run) -> _Verdict:
        """(status, reason, comparison, why the machine's figures cannot be compared or None) of
        the script's own setting's runs as `view` gives them, against the fix's run as measured."""
        baseline, after = view(self.baseline), self.after
        again: list[Run | None] = [self._again(view)] if self.tuning.again is not None else []
        comparison = _comparison(baseline, after, self.chosen, self.noise_rel, again)
        status, reason = verdict(comparison)
        if status != "kept" or self.adjacent is None:
            return status, reason, comparison, None
        beside = self.adjacent()
        if beside is None:
            return status, reason, comparison, None
        return _adjacent(baseline, after, view(beside), self.chosen, self.noise_rel, again)

    @property
    def whole_again(self) -> Run | None:
        """The script's own setting measured again after the trials, where its window was not
        cut short (`pairs.decisive_below`): one block holds too few samples for its waits to
        say anything."""
        again = self.tuning.again
        return None if again is None or raced(again.raw) else again

    def _again(self, view: Callable[[Run], Run]) -> Run | None:
        """The script's own setting measured again after the trials, as `view` gives it; as
        measured where its window was cut short (`whole_again`)."""
        whole = self.whole_again
        return view(whole) if whole is not None else self.tuning.again

    def loaded(self) -> str | None:
        """Where other processes used CPU during a compared window and the gain does not hold
        with the waits for a CPU taken out of the steps of the script's own setting, why, in
        words; else None (also where a loaded run's waits were not read: judged as measured).
        The fix's run keeps its waits: where its loop waits on its workers, a wait for a CPU
        after a batch came is hidden by the batches they load meanwhile, and taking it out
        would make the fix look faster than any machine runs it."""
        named = {
            "in the baseline window": self.baseline,
            "in the script's own setting measured again after the trials": self.whole_again,
            "in the script's own setting measured next to the confirmation run": (
                self.adjacent() if self.adjacent is not None else None
            ),
        }
        own = {label: run for label, run in named.items() if run is not None}
        cores = quiet.load_cores([*own.values(), self.after])
        if cores is None or not quiet.readable(list(own.values())):
            return None
        status, reason, _, _ = self(quiet.without_waits)
        if status == "kept":
            return None
        return (
            f"{quiet.waits(own, cores)}; judged with those waits taken out of its steps (the fix's "
            f"run as measured): {reason}; a quiet machine would not keep it"
        )

    def contradicted(self) -> str | None:
        """Where the confirmation measured no gain while other processes used CPU during a
        compared window, though the trial of every fix in it measured a gain whose slow windows
        beat the baseline's fast ones: why, in words; else None. The load may have decided, not
        the fix: it is neither kept nor reported as no gain (a fix worth 4.7x on a quiet machine
        read 0.69x in a confirmation run beside 1.7 busy cores)."""
        if not self.chosen or any((o.gain_low or 0.0) <= 1.0 for o in self.chosen):
            return None
        cores = quiet.load_cores([run for run in (self.baseline, self.whole_again, self.after) if run])
        if cores is None:
            return None
        trials = ", ".join(f"{o.fix}'s trial measured {o.gain or 0.0:.2f}x {o.unit}" for o in self.chosen)
        return (
            f"other processes used {cores:.1f} cores during the compared windows, where {trials}: "
            "the load may have decided, not the fix; measure again on a quiet machine"
        )


def _adjacent(
    baseline: Run,
    after: Run,
    beside: Run,
    chosen: list[FixOutcome],
    noise_rel: float | None,
    more: list[Run | None],
) -> _Verdict:
    """A kept confirmation judged again with the script's own setting measured next to it too
    (`beside`; the fastest of the baselines is what it must beat): (status, reason, comparison,
    why the machine's figures cannot be compared or None). Where the machine's speed changed
    between the baselines, a gain whose slow windows still beat the faster baseline's fast ones
    by more than that change stands; anything less is inconclusive, neither kept nor rejected."""
    comparison = _comparison(baseline, after, chosen, noise_rel, [*more, beside])
    status, reason = verdict(comparison)
    figure = f"{beside.steps_per_s or 0.0:.1f} steps/s"
    reason = f"{reason}, against the script's own setting measured next to it too ({figure})"
    changed, drift = machine_changed(baseline, beside), machine_drift(baseline, beside)
    if changed is None:
        return status, reason, comparison, None
    if status == "kept" and (comparison.speedup_low or 0.0) > drift:
        return status, f"{reason}; {changed}, less than the gain", comparison, None
    if comparison.loss_check.equivalent is False:
        return status, reason, comparison, None  # training changed: that decides, whatever the speed
    return "inconclusive", f"{reason}: not a gain beyond the change, as {changed}", comparison, changed


def _scoped(outcome: FixOutcome, status: str, reason: str) -> tuple[FixStatus, str]:
    """A confirmation's verdict for one of its fixes: where it is inconclusive (the machine's
    speed changed between fresh runs), a fix chosen in windows of the baseline's own process,
    its gain measured in pairs of adjacent windows, stays unconfirmed with its pairs' figure."""
    if status == "inconclusive" and outcome.mode == "in_process":
        return "unconfirmed", f"{outcome.reason}; the confirmation run could not be compared: {reason}"
    return cast(FixStatus, status), reason


def _unsure(outcome: FixOutcome, changed: str | None) -> FixOutcome:
    """A fix measured in fresh runs faster but not confirmed with the others (a larger batch's
    opportunity), where the machine's speed changed between runs: inconclusive too."""
    if changed is None or outcome.mode != "restart" or outcome.status != "opportunity":
        return outcome
    return replace(outcome, status="inconclusive", reason=f"{outcome.reason}; but {changed}")


def _over_budget(
    options: ProfileOptions, outcome: FixOutcome, chosen: list[FixOutcome], estimate_s: float
) -> str:
    """Why a chosen fix was not confirmed for the budget, and the command that confirms them."""
    budget = options.budget_s or 0.0
    out = options.out_dir.with_name(f"{options.out_dir.name}-confirmed")
    command = reproduce_command(
        replace(options, only_fixes=[o.fix for o in chosen], budget_s=None, out_dir=out)
    )
    return (
        f"{outcome.reason}; not confirmed: a confirmation run (about {estimate_s:.0f} s) would have run "
        f"past the --budget of {budget:g} s; confirm with: {shlex.join(command)}"
    )


def _comparison(
    baseline: Run,
    after: Run,
    chosen: list[FixOutcome],
    noise_rel: float | None,
    more: list[Run | None] | None = None,
) -> Comparison:
    """The after run against the fastest of the baseline and its setting measured again (`more`:
    after the trial windows, next to the confirmation run), with the loss check at the loosest
    tolerance of the fixes confirmed."""
    confirmed = [fixes.REGISTRY[o.fix] for o in chosen]
    comparison = compare(
        baseline,
        after,
        max(tolerance(fix, noise_rel) for fix in confirmed),
        per_sample=any(fix.metric == "samples_per_s" for fix in confirmed),
        references=[r for r in (baseline, *(more or [])) if r is not None],
    )
    comparison.contains = [f"{o.fix}: {o.chosen}" if o.chosen else o.fix for o in chosen]
    return comparison


def _together(reason: str, chosen: list[FixOutcome]) -> str:
    """A verdict's reason, saying it is the combination's where several fixes were confirmed
    together (each fix's own gain is its trial's)."""
    if len(chosen) < 2:
        return reason
    return f"{reason} in the confirmation run of {', '.join(o.fix for o in chosen)} together"


def _length_note(tuning: Tuning, comparison: Comparison | None) -> list[str | None]:
    """What the script's length did to the windows: a confirmation measured on what fitted."""
    if comparison is None or not comparison.cut:
        return []
    length = tuning.length
    told = length is not None and length.total_steps is not None and "ended after" not in length.source
    known = f" ({length.source})" if told and length is not None else ""
    return [
        f"The confirmation run was measured on what fitted: {comparison.cut}{known}; give the "
        "script more steps (more data or epochs) for a longer confirmation."
    ]


def _reference_note(baseline: Run, after: Run | None, comparison: Comparison | None) -> str | None:
    """Where the confirmation was compared with the script's own setting measured again, faster
    than the baseline window by more than two settled measurements of one loop differ (a busy
    spell in the baseline's window), the note that says so: the report's before and after
    columns would otherwise read as a larger gain than the one claimed."""
    if after is None or comparison is None or not comparison.speedup:
        return None
    per_sample = comparison.unit == "samples/s"
    after_rate = after.samples_per_s if per_sample else after.steps_per_s
    base_rate = baseline.samples_per_s if per_sample else baseline.steps_per_s
    if not after_rate or not base_rate:
        return None
    reference = after_rate / comparison.speedup  # the speedup is after / the reference used
    if reference <= (1.0 + MACHINE_DRIFT) * base_rate:
        return None
    unit = comparison.unit
    return (
        f"The speedup is measured against the script's own setting as measured again later in the "
        f"profile ({reference:.1f} {unit}), not the baseline window ({base_rate:.1f} {unit}, "
        f"{reference / base_rate:.1f}x slower, against which the after run reads "
        f"{after_rate / base_rate:.2f}x): a gain is claimed against the fastest measurement of the "
        "script's own setting, so that a baseline measured in a slow spell cannot inflate it."
    )


def _short_run(raw: RawRun) -> str:
    timed = len(timed_steps(raw))
    return (
        f"the script ended after {raw.steps_seen} steps, before the confirmation run had timed enough "
        f"steps ({timed} of at least {MIN_TIMED_STEPS}): give the script more steps to train (more "
        "data or epochs) to confirm it"
        if raw.status == "script_ended" and raw.steps_seen
        else "the confirmation run did not complete"
    )


def _final(
    options: ProfileOptions, outcome: FixOutcome, verdicts: dict[str, tuple[FixStatus, str]], raw: RawRun
) -> FixOutcome:
    """The outcome as the report keeps it: the confirmation's verdict for a chosen fix, and the
    change to the user's script for what is kept or recommended."""
    if outcome.fix in verdicts:
        status, reason = verdicts[outcome.fix]
        outcome = replace(outcome, status=status, reason=reason)
    if outcome.status in CHANGED:
        from trainadvisor.frameworks.change import fix_change  # libcst: only where a change is written

        change = fix_change(options.script, outcome.fix, outcome.settings, raw)
        outcome = replace(outcome, diff=change.diff, setting_change=change.setting)
    return outcome
