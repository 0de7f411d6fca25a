"""Which fix's trials run when, and how: the order (most to gain first), the mode (windows of
the live baseline run, or fresh runs), the bracket around the windows (the baseline's setting
measured again after them: a gain counts only beyond the drift it shows), the budget, and one
progress line per fix."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from trainadvisor import fixes
from trainadvisor.analyze.length import run_length
from trainadvisor.measure.live import LiveRun
from trainadvisor.profile import attribution, pace
from trainadvisor.profile.judge import KEEP_MIN_SPEEDUP
from trainadvisor.profile.runs import ProfileOptions, reproduce_command
from trainadvisor.profile.trials import Echo, Measurer, decide, restarts, tune, windows
from trainadvisor.records import FixOutcome, Overrides, PlannedFix, Run, RunLength, TrialWindow

# A trial window fitted into a short run gets at least this many steps (warm-up and timed):
# fewer would time too few steps to count (`judge.MIN_TIMED_STEPS`).
MIN_WINDOW_STEPS = 15


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


def loader_problem(baseline: Run) -> str | None:
    """Why DataLoader settings cannot switch in this run's process, or None."""
    raw = baseline.raw
    used = [info for info in raw.loaders if info.batches_in_window]
    sites = [info.created_at for info in raw.loaders]
    for info in used:
        if sites.count(info.created_at) > 1:
            return (
                f"the DataLoader at {info.created_at} is built anew every epoch "
                f"({sites.count(info.created_at)} times so far): each trial needs loaders built "
                "with its setting"
            )
        if info.iterable_dataset:
            return (
                f"its dataset ({info.dataset_class}) is an IterableDataset: a new iterator would "
                "start its stream again, and its sharding across workers decides what each reads"
            )
    return None


@dataclass
class Tuning:
    """The fixes' outcomes as trials finish, and the windows of the live run in order."""

    options: ProfileOptions
    plan: list[PlannedFix]
    values: dict[str, Any]
    baseline: Run
    echo: Echo
    started: float  # time.monotonic() when profile began
    outcomes: list[FixOutcome]
    windows: list[TrialWindow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # caveats
    details: list[str] = field(default_factory=list)  # how the trials were measured
    tried: set[str] = field(default_factory=set)
    live_ended: str = ""  # why the baseline's process could measure no more windows
    on_progress: Callable[[], None] = lambda: None
    length: RunLength | None = None  # how many steps the script takes, as far as it is known
    live_steps: int = 0  # steps the baseline's process has run so far
    again: Run | None = None  # the baseline's setting measured again after the trial windows
    settle: pace.SettleCap | None = None  # the trials' longest warm-up (`pace`), set on the first

    @property
    def settle_cap_s(self) -> float | None:
        """The trials' longest settling after their counted warm-up (None: --max-warmup alone)."""
        if self.settle is None:
            self.settle = pace.trial_settle_cap(self.baseline.raw, self.options.max_warmup_s)
            if self.settle.max_s:
                self.details.append(
                    f"Each trial's warm-up waited for its step time to settle at most {self.settle.why}."
                )
        return self.settle.max_s or None

    # ---- budget and progress ----

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def budget_left(self) -> bool:
        budget = self.options.budget_s
        return budget is None or self.elapsed_s() < budget

    def _progress(self, planned: PlannedFix, mode: str) -> None:
        left = [self.plan[i] for i in ordered(self.plan, self.values) if self.plan[i].fix not in self.tried]
        spent = [o for o in self.outcomes if o.fix in self.tried]
        per_fix = (
            (self.elapsed_s() - self.baseline.raw.wall_s) / len(spent) if spent else self.baseline.raw.wall_s
        )
        estimate = per_fix * len(left) + self.baseline.raw.wall_s  # and the confirmation run
        self.echo(
            f"trainadvisor: {planned.rule} -> measuring fix {planned.fix} ({mode}) "
            f"[{_clock(self.elapsed_s())} elapsed, about {_clock(estimate)} left]"
        )

    # ---- the trials ----

    def run(self, planned: PlannedFix, measurer: Measurer, mode: str, reason: str = "") -> None:
        index = self.plan.index(planned)
        if not self.budget_left():
            self.outcomes[index] = self._over_budget(planned)
            return
        self.tried.add(planned.fix)
        self._progress(planned, "in this process" if mode == "in_process" else "restarting the script")
        fix = fixes.REGISTRY[planned.fix]
        trials = tune(
            fix, self.values, measurer, self.echo, more=self.budget_left, references=[self.baseline]
        )
        outcome = decide(planned, trials, self.values, [self.baseline])
        self.outcomes[index] = replace(outcome, mode=mode, mode_reason=reason)
        self.on_progress()

    # ---- the steps the script has ----

    def learn(self, raw: Any) -> None:
        """What a window or a run tells of the script's length (a run that ended by itself)."""
        self.length = run_length(raw, self.length)
        # what a fix that costs time once (compile) weighs it against
        if self.length.total_steps is not None:
            self.values["run_total_steps"] = self.length.total_steps
        self.values["run_seen_steps"] = self.length.seen_steps

    def window_budget(self, eligible: list[PlannedFix]) -> int | None:
        """The steps the next trial window may use: where the script's length is known, what it
        has left shared among the windows still to come (each fix's candidates, the bracket);
        None where it is not known (then the windows are timed, and one the script's end cuts
        short counts if it timed enough steps)."""
        if self.length is None or self.length.total_steps is None:
            return None
        left = self.length.total_steps - self.live_steps
        remaining = [p for p in eligible if p.fix not in self.tried or p.fix == self._current]
        windows = 1 + sum(fixes.REGISTRY[p.fix].expected_trials(self.values) for p in remaining)
        return max(MIN_WINDOW_STEPS, left // max(windows, 1))

    def _over_budget(self, planned: PlannedFix) -> FixOutcome:
        budget = self.options.budget_s or 0.0
        alone = self.options.out_dir.with_name(
            f"{self.options.out_dir.name}-{planned.fix}"
        )  # not over this one
        command = reproduce_command(
            replace(self.options, only_fixes=[planned.fix], budget_s=None, out_dir=alone)
        )
        return FixOutcome(
            planned.fix, planned.rule, "not_run",
            f"not measured: the --budget of {_clock(budget)} was spent; measure it alone with: "
            + shlex.join(command),
            Overrides(), [],
        )  # fmt: skip

    def in_process(self, live: LiveRun) -> None:
        """Every fix that can switch while the loop runs, as windows of the live run; then the
        baseline's setting again, each choice judged against the faster of the two, and the
        chosen ones measured together with and without each (`attribution`)."""
        loaders_blocked = loader_problem(self.baseline)
        eligible = [
            self.plan[i]
            for i in ordered(self.plan, self.values)
            if fixes.REGISTRY[self.plan[i].fix].in_process_problem(self.values) is None
            and not (fixes.REGISTRY[self.plan[i].fix].switches_loaders and loaders_blocked)
        ]
        if not eligible:
            return
        self.windows.append(_window("baseline", "", AS_SCRIPT, self.baseline, 0.0))
        self.live_steps = self.baseline.raw.steps_seen
        measure = self._recording(
            windows(
                live, self.options, self.baseline, lambda: self.window_budget(eligible), self.settle_cap_s
            )
        )
        for planned in eligible:
            if live.ended is not None:
                break
            self._current = planned.fix
            self.run(planned, measure, "in_process")
            if live.ended is None:
                continue
            self._script_ended(live, planned)
        self._current = ""
        in_process = [o for o in self.outcomes if o.mode == "in_process" and o.fix in self.tried]
        if in_process and live.ended is None:
            self._bracket(live, measure, in_process)
        if live.ended is None:
            self._attribute(measure)

    _current = ""  # the fix whose trial windows are being measured

    def _script_ended(self, live: LiveRun, planned: PlannedFix) -> None:
        """The script ended during this fix's windows: its length is known from here on."""
        self.live_ended = live.ended or ""
        outcome = self.outcomes[self.plan.index(planned)]
        if not any(t.status == "measured" for t in outcome.trials):
            self.tried.discard(planned.fix)  # nothing measured: its trials restart the script
        else:
            self.notes.append(f"{live.ended}: {planned.fix} was decided by the windows measured before that.")

    def _recording(self, measurer: Measurer) -> Measurer:
        def measure(fix: fixes.Fix, label: str, candidate: fixes.Setting) -> Any:
            measured = measurer(fix, label, candidate)
            self.live_steps = max(self.live_steps, measured.raw.steps_seen)
            self.learn(measured.raw)  # the script ended inside this window: its length is known
            t0 = self.baseline.raw.window_start_unix_s or 0.0
            started = (measured.raw.window_start_unix_s - t0) if measured.raw.window_start_unix_s else None
            self.windows.append(
                TrialWindow(
                    label, fix.id, candidate.label, measured.status,
                    measured.run.steps_per_s if measured.run else None,
                    measured.run.samples_per_s if measured.run else None,
                    started, len(measured.raw.steps),
                )
            )  # fmt: skip
            return measured

        return measure

    def _bracket(self, live: LiveRun, measure: Measurer, outcomes: list[FixOutcome]) -> None:
        """The baseline's setting measured again: where the loop got faster by itself (a cache
        warming, clocks), a trial must beat that too."""
        again = measure(_AsScript(), "baseline-again", fixes.Setting(AS_SCRIPT, Overrides()))
        if again.run is None or not again.run.steps_per_s:
            self.notes.append("The baseline's setting could not be measured again after the trials.")
            return
        self.again = again.run
        first = self.baseline.steps_per_s or 0.0
        drift = again.run.steps_per_s / first - 1.0 if first else 0.0
        reference = dict(self.values)
        for key in ("steps_per_s", "samples_per_s"):
            later = getattr(again.run, key)
            if later is not None and (reference.get(key) or 0.0) < later:
                reference[key] = later
        self.details.append(
            f"Trial windows ran in the baseline's own process, bracketed by the baseline's setting "
            f"({first:.1f} steps/s first, {again.run.steps_per_s:.1f} after the trials: "
            f"{100 * drift:+.0f}% drift); a trial, and the confirmation run, counted only when "
            f"{KEEP_MIN_SPEEDUP:.2f}x faster than the faster of the two, and their slow windows "
            "faster than its fast ones."
        )
        for outcome in outcomes:
            index = self.outcomes.index(outcome)
            decided = decide(self.plan[index], outcome.trials, reference, [self.baseline, again.run])
            if outcome.status == "unconfirmed" and decided.status == "no_gain" and drift > 0:
                decided = replace(
                    decided,
                    reason=f"{decided.reason}, once the baseline's own drift ({100 * drift:+.0f}% "
                    "between the windows before and after the trials) is counted",
                )
            self.outcomes[index] = replace(decided, mode=outcome.mode, mode_reason=outcome.mode_reason)
        self.on_progress()

    def _attribute(self, measure: Measurer) -> None:
        """Two or more fixes chosen in windows: measured together, and without each in turn."""
        chosen = [o for o in self.outcomes if o.mode == "in_process" and o.status == "unconfirmed"]
        if len(chosen) < 2:
            return
        self.echo(f"trainadvisor: measuring {', '.join(o.fix for o in chosen)} together and without each")

        def measure_setting(label: str, setting: fixes.Setting) -> Run | None:
            found = measure(_AsScript(), label, setting)
            self.echo(
                f"  tried {setting.label}: "
                + (f"{found.run.steps_per_s:.1f} steps/s" if found.run else found.status)
            )
            return found.run if found.run is not None and found.run.steps_per_s else None

        decided, notes = attribution.attribute(chosen, measure_setting)
        for outcome in decided:
            self.outcomes[self.outcomes.index(next(o for o in self.outcomes if o.fix == outcome.fix))] = (
                outcome
            )
        self.notes += notes
        self.on_progress()

    def restarted(self, noise_rel: float | None, why: str) -> None:
        """Every applicable fix not yet tried, each candidate in a fresh run of the script."""
        measure = restarts(
            self.options, self.baseline, noise_rel, lambda: self.length, self.learn, self.settle_cap_s
        )
        for i in ordered(self.plan, self.values):
            planned = self.plan[i]
            if planned.fix in self.tried:
                continue
            fix = fixes.REGISTRY[planned.fix]
            loaders = loader_problem(self.baseline) if fix.switches_loaders else None
            reason = why or fix.in_process_problem(self.values) or loaders or self.live_ended
            self.run(planned, measure, "restart", reason)


AS_SCRIPT = "as the script runs"


class _AsScript(fixes.Fix):
    """The baseline's own setting, measured again (no fix)."""

    id = ""


def _window(label: str, fix: str, setting: str, run: Run, started_s: float) -> TrialWindow:
    return TrialWindow(
        label, fix, setting, "measured", run.steps_per_s, run.samples_per_s, started_s, run.steps
    )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
