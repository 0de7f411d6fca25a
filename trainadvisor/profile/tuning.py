"""Which fix's trials run when, and how: the order (most to gain first), the mode (windows of
the live baseline run, or fresh runs), the pairs of adjacent windows that check a choice made in
windows against the script's own setting (`pairs`), the budget (nothing starts that its estimate
puts past it, `pace`), and one progress line per fix."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from trainadvisor import fixes
from trainadvisor.analyze.run.length import run_length
from trainadvisor.measure.kept_alive import LiveRun
from trainadvisor.profile import attribution, pace
from trainadvisor.profile.baseline import loader_problem
from trainadvisor.profile.judge import KEEP_MIN_SPEEDUP, usable
from trainadvisor.profile.pace import gain_bound, ordered
from trainadvisor.profile.pairs import AS_SCRIPT, AsScript, chosen_trial, pair_choice
from trainadvisor.profile.runs import ProfileOptions, fresh_spec, measure_run, reproduce_command
from trainadvisor.profile.trials import Echo, Measurer, decide, restarts, run_cap_s, tune, windows
from trainadvisor.records import FixOutcome, Overrides, PlannedFix, Run, RunLength, TrialWindow
from trainadvisor.units import clock

# A trial window fitted into a short run gets at least this many steps (warm-up and timed):
# fewer would time too few steps to count (`judge.MIN_TIMED_STEPS`).
MIN_WINDOW_STEPS = 15


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
    # what each trial window ("window") and each fresh run ("fresh") took, seconds, as measured
    walls: dict[str, list[float]] = field(default_factory=lambda: {"window": [], "fresh": []})
    # a run started ahead: what is left of its set-up, and whether it is starved (`Prestarted.setup_left`)
    ahead_left: Callable[[], tuple[float, bool]] | None = None
    ran_fresh: set[str] = field(default_factory=set)  # fixes with a fresh run measured (`once_s`)
    refused: set[str] = field(default_factory=set)  # fixes not tried: past the budget

    @property
    def settle_cap_s(self) -> float | None:
        """The trials' longest settling after their counted warm-up (None: --max-warmup alone)."""
        if self.settle is None:
            self.settle = pace.trial_settle_cap(self.baseline.raw, self.options.max_warmup_s)
            if self.settle.max_s and not self.options.torchrun:  # torchrun: windows are counts
                self.details.append(
                    f"Each trial's warm-up waited for its step time to settle at most {self.settle.why}."
                )
        return self.settle.max_s or None

    @property
    def compared_settle_cap_s(self) -> float | None:
        """The confirmation run's, and the measurement beside it: compared with the baseline
        itself, they may settle as long as 3x the baseline did, with no trial's ceiling."""
        return pace.trial_settle_cap(self.baseline.raw, self.options.max_warmup_s, None).max_s or None

    # ---- budget and progress ----

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def cost_s(
        self,
        kind: str,
        speedup: float = 1.0,
        loading: tuple[int, float | None] = (0, None),
        settle_cap_s: float | None = None,
    ) -> float:
        """About how long the next trial window ("window"), window of the script's own setting
        in a pair ("pair"), fresh run ("fresh") or run started ahead ("prestarted") takes, for a
        setting up to `speedup` x as fast as the script's (`pace`), its warm-up capped at
        `settle_cap_s` where given (else the cap of its kind)."""
        caps = {"window": self.settle_cap_s, "prestarted": self.compared_settle_cap_s}
        cap = settle_cap_s if settle_cap_s is not None else caps.get(kind)
        walls = self.walls.get(kind, [])
        counted = self.options.warmup if kind == "pair" else 0
        return pace.cost_s(kind, walls, self.baseline.raw, speedup, cap, loading, counted)

    def confirmation_cost_s(self, settle_cap_s: float | None = None) -> float:
        """About how long the confirmation run takes: its timed steps at the pace its chosen
        fixes measured (where none is chosen yet, the most the fixes to try can give), and what
        the fixes it may hold pay once (compiling: as measured where chosen, else the prior),
        unless a fresh run's wall counts it already; its warm-up capped at `settle_cap_s` where
        given."""
        picked = self._chosen()
        gains = [o.gain for o in picked.values() if o.gain]
        speedup = max(gains) if gains else max((gain_bound(p, self.values) for p in self.plan), default=1.0)
        kind, once_s = "prestarted" if self.ahead_left is not None else "fresh", 0.0
        workers = max((int(o.settings.loader().get("num_workers") or 0) for o in picked.values()), default=0)
        may_confirm = self._may_confirm()
        loading: tuple[int, float | None] = (workers, None)
        if not picked:  # none chosen yet: the workers a search usually keeps
            likely = [fixes.REGISTRY[p.fix].likely_kept(self.values) for p in may_confirm]
            loading = max(likely, key=lambda kept: kept[0], default=loading)
        for p in may_confirm:
            if kind == "fresh" and p.fix in self.ran_fresh:
                continue  # its fresh run's wall counts it (`cost_s`)
            fix = fixes.REGISTRY[p.fix]
            measured = fix.measured_once_s(picked[p.fix]) if p.fix in picked else None
            once_s += measured if measured is not None else fix.once_s(self.values)
        return self.cost_s(kind, speedup, loading, settle_cap_s) + once_s

    def _chosen(self) -> dict[str, FixOutcome]:
        """The fixes chosen so far, waiting for the confirmation run, by id."""
        return {o.fix: o for o in self.outcomes if o.status == "unconfirmed"}

    def _to_try(self, planned: PlannedFix) -> bool:
        """Whether the fix is still to try: not tried (or being tried now), not refused for the
        budget."""
        return planned.fix not in self.refused and (
            planned.fix not in self.tried or planned.fix == self._current
        )

    def _may_confirm(self) -> list[PlannedFix]:
        """The fixes a confirmation run may hold: those chosen, and those still to try that could
        be kept as far as the estimate tells (`could_keep`)."""
        picked = self._chosen()
        return [
            p
            for p in self.plan
            if p.fix in picked
            or (p.applicable and self._to_try(p) and fixes.REGISTRY[p.fix].could_keep(self.values))
        ]

    def first_once_s(self, fix: fixes.Fix, kind: str) -> float:
        """What a fresh trial of `fix` spends once (compiling) until one of its runs measured it."""
        return fix.once_s(self.values) if kind == "fresh" and fix.id not in self.ran_fresh else 0.0

    def left_s(self) -> float | None:
        """What is left of --budget, seconds (None without one)."""
        budget = self.options.budget_s
        return None if budget is None else budget - self.elapsed_s()

    def fits(self, estimate_s: float) -> bool:
        """Whether what takes about `estimate_s` ends within --budget."""
        budget = self.options.budget_s
        return budget is None or self.elapsed_s() + estimate_s <= budget

    def remaining_s(self, live: bool) -> float:
        """About how long the rest takes: each fix not yet tried (the candidates its search
        usually measures, each a window of the live run where it can switch there, else a fresh
        run, plus what it pays once until measured: compiling), the pair of windows that checks a
        choice made in windows, and the confirmation run with its adjacent baseline where a fix
        may be confirmed (`_may_confirm`)."""
        total, beside = 0.0, self.cost_s("fresh")
        for i in ordered(self.plan, self.values):
            planned = self.plan[i]
            if not self._to_try(planned):
                continue
            fix = fixes.REGISTRY[planned.fix]
            in_window = live and fix.in_process_problem(self.values) is None
            speedup = gain_bound(planned, self.values)
            fresh_s = self.cost_s("fresh") + self.first_once_s(fix, "fresh")
            likely = fix.likely_windows(self.values)
            windows_s = [self.cost_s("window", speedup, loading) for loading in likely]
            total += sum(windows_s) if in_window else len(windows_s) * fresh_s
            window_s = windows_s[-1] if windows_s else self.cost_s("window", speedup)
            if in_window:  # the pair: the script's setting, and the choice again (`pairs`; its
                # own trial window where the search usually ends on it)
                again_s = 0.0 if fix.likely_ends_on_choice(self.values) else self._pair_window_s(speedup)
                beside = self.cost_s("pair", speedup) + min(window_s, again_s)
        # a pair of windows checks a choice made in windows, and stands beside the confirmation
        # run; fresh runs get the script's own setting measured again after it; neither where
        # nothing can be confirmed (a compile that cannot pay is only recommended). A run started
        # ahead is measured once its set-up, overlapping all that, is done; a starved one sets up
        # after all that.
        if not self._may_confirm():
            return total
        setup_left_s, starved = self.ahead_left() if self.ahead_left is not None else (0.0, False)
        if starved:
            return total + beside + setup_left_s + self.confirmation_cost_s()
        return max(total + beside, setup_left_s) + self.confirmation_cost_s()

    def _pair_window_s(self, speedup: float) -> float:
        """A pair's window of the chosen setting: its warm-up capped for pairs."""
        walls = self.walls["window"]
        return pace.cost_s("window", walls, self.baseline.raw, speedup, pace.PAIR_SETTLE_S)

    def _progress(self, planned: PlannedFix, in_window: bool) -> None:
        estimate = self.remaining_s(in_window)
        mode = "in this process" if in_window else "restarting the script"
        self.echo(
            f"trainadvisor: {planned.rule} -> measuring fix {planned.fix} ({mode}) "
            f"[{clock(self.elapsed_s())} elapsed, about {clock(estimate)} left]"
        )

    # ---- the trials ----

    def run(self, planned: PlannedFix, measurer: Measurer, mode: str, reason: str = "") -> None:
        index = self.plan.index(planned)
        kind, fix = "window" if mode == "in_process" else "fresh", fixes.REGISTRY[planned.fix]
        next_s = lambda: self.cost_s(kind) + self.first_once_s(fix, kind)  # noqa: E731
        if not self.fits(next_s()):  # not even its first candidate would end in time
            self.outcomes[index] = self._over_budget(planned, next_s())
            self.refused.add(planned.fix)
            return
        self.tried.add(planned.fix)
        self._current = planned.fix
        self._progress(planned, mode == "in_process")
        more = lambda: self.fits(next_s())  # noqa: E731
        trials = tune(fix, self.values, self._timed(measurer, kind), self.echo, more, [self.baseline])
        self._current = ""
        if (
            len(trials) < fix.expected_trials(self.values)
            and not more()
            and fix.next_candidate(self.values, trials)
        ):
            self.notes.append(
                f"{planned.fix}: its search stopped after {len(trials)} candidates, the next (about "
                f"{clock(next_s())}) would have run past the --budget."
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
        has left shared among the windows still to come (each fix's candidates, a pair);
        None where it is not known (then the windows are timed, and one the script's end cuts
        short counts if it timed enough steps)."""
        if self.length is None or self.length.total_steps is None:
            return None
        left = self.length.total_steps - self.live_steps
        remaining = [p for p in eligible if p.fix not in self.tried or p.fix == self._current]
        windows = 2 + sum(fixes.REGISTRY[p.fix].expected_trials(self.values) for p in remaining)  # + a pair
        return max(MIN_WINDOW_STEPS, left // max(windows, 1))

    def _timed(self, measurer: Measurer, kind: str) -> Measurer:
        """`measurer`, each run's or window's wall time kept for the estimates (`cost_s`)."""

        def measure(fix: fixes.Fix, label: str, candidate: fixes.Setting) -> Any:
            measured = measurer(fix, label, candidate)
            if measured.raw.wall_s and not pace.raced(measured.raw):  # a cut window says little of the next
                self.walls[kind].append(measured.raw.wall_s)
                if kind == "fresh":  # its once-paid cost is in that wall from now on
                    self.ran_fresh.add(fix.id)
            return measured

        return measure

    def _over_budget(self, planned: PlannedFix, estimate_s: float) -> FixOutcome:
        budget = self.options.budget_s or 0.0
        left = max(0.0, budget - self.elapsed_s())
        alone = self.options.out_dir.with_name(
            f"{self.options.out_dir.name}-{planned.fix}"
        )  # not over this one
        command = reproduce_command(
            replace(self.options, only_fixes=[planned.fix], budget_s=None, out_dir=alone)
        )
        return FixOutcome(
            planned.fix, planned.rule, "not_run",
            f"not measured: its trials (about {clock(estimate_s)} each) would have run past the --budget "
            f"of {clock(budget)} ({clock(left)} left); measure it alone with: " + shlex.join(command),
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
        own = self.baseline
        self.windows.append(
            TrialWindow(
                "baseline", "", AS_SCRIPT, "measured", own.steps_per_s, own.samples_per_s, 0.0, own.steps
            )
        )
        self.live_steps = self.baseline.raw.steps_seen
        steps = lambda: self.window_budget(eligible)  # noqa: E731
        measure = self._recording(
            windows(live, self.options, self.baseline, steps, self.settle_cap_s, self.left_s)
        )
        for planned in eligible:
            if live.ended is not None:
                break
            self.run(planned, measure, "in_process")
            if live.ended is None:
                continue
            self._script_ended(live, planned)
        chosen = [
            o
            for o in self.outcomes
            if o.mode == "in_process" and o.fix in self.tried and o.status == "unconfirmed"
        ]
        if chosen and live.ended is None:
            self._pairs(measure, chosen)
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

    def _pairs(self, measure: Measurer, outcomes: list[FixOutcome]) -> None:
        """Each choice made in windows measured against the script's own setting in pairs of
        adjacent windows (`pairs`): its gain is the pairs', or it is no gain."""
        details = []
        for outcome in outcomes:
            last = self.windows[-1] if self.windows else None
            chosen = chosen_trial(outcome).label
            last_window = last is not None and (last.fix, last.setting) == (outcome.fix, chosen)
            paired = pair_choice(outcome, measure, self.fits, lambda: self.cost_s("window"), last_window)
            index = self.outcomes.index(outcome)
            self.outcomes[index] = replace(paired.outcome, mode=outcome.mode, mode_reason=outcome.mode_reason)
            self.again = paired.again or self.again
            details.append(paired.detail)
        if not details:
            return
        first, again = self.baseline.steps_per_s or 0.0, self.again.steps_per_s if self.again else None
        drift = f"; the script's own setting ran {first:.1f} steps/s first" + (
            f" and {again:.1f} in the last pair ({100 * (again / first - 1):+.0f}%)"
            if again and first
            else ""
        )
        self.details.append(
            "Each setting chosen in trial windows was measured against the script's own in pairs of "
            f"adjacent windows (at most {pace.MAX_PAIRS}, while undecided; kept where it was "
            f"{KEEP_MIN_SPEEDUP:.2f}x faster and its slow windows beat the script's fast ones): "
            + "; ".join(details)
            + drift
            + "."
        )
        self.on_progress()

    def _attribute(self, measure: Measurer) -> None:
        """Two or more fixes chosen in windows: measured together, and without each in turn."""
        chosen = [o for o in self.outcomes if o.mode == "in_process" and o.status == "unconfirmed"]
        if len(chosen) < 2:
            return
        names = ", ".join(o.fix for o in chosen)
        over = f"The combination of {names} was not measured with and without each: its windows would "
        over += "have run past the --budget; each keeps the gain of its own windows."
        if not self.fits((len(chosen) + 1) * self.cost_s("window")):  # one round: together, without each
            self.notes.append(over)
            return
        self.echo(f"trainadvisor: measuring {names} together and without each")
        spent = False

        def measure_setting(label: str, setting: fixes.Setting) -> Run | None:
            nonlocal spent
            if spent or not self.fits(self.cost_s("window")):
                spent = True
                return None
            found = measure(AsScript(), label, setting)
            self.echo(
                f"  tried {setting.label}: "
                + (f"{found.run.steps_per_s:.1f} steps/s" if found.run else found.status)
            )
            return found.run if found.run is not None and found.run.steps_per_s else None

        decided, notes = attribution.attribute(chosen, measure_setting)
        notes = [over] if spent and notes else notes
        for outcome in decided:
            self.outcomes[self.outcomes.index(next(o for o in self.outcomes if o.fix == outcome.fix))] = (
                outcome
            )
        self.notes += notes
        self.on_progress()

    def measure_again(self) -> Run | None:
        """The script's own setting measured again next to the confirmation run (`confirm`), in
        a fresh run; None where the budget leaves no time for it, or it measured nothing."""
        estimate_s = self.cost_s("fresh")
        if not self.fits(estimate_s):
            self.notes.append(
                "The script's own setting was not measured again next to the confirmation run: "
                f"it (about {clock(estimate_s)}) would have run past the --budget."
            )
            return None
        unsettled_s = pace.fresh_unsettled_s(self.walls["fresh"], self.baseline.raw)
        quiet = {"profile": False, "show_output": False, "timeout_s": max(60.0, 5 * self.baseline.raw.wall_s)}
        spec = fresh_spec(
            self.options,
            "baseline-adjacent",
            Overrides(),
            self.length,
            0,
            run_cap_s(self.compared_settle_cap_s, self.left_s(), estimate_s, unsettled_s),
            **quiet,
        )
        run = measure_run(spec)
        self.walls["fresh"].append(run.raw.wall_s)
        return run if usable(run.raw) else None

    def restarted(self, noise_rel: float | None, why: str) -> None:
        """Every applicable fix not yet tried, each candidate in a fresh run of the script."""
        measure = restarts(
            self.options,
            self.baseline,
            noise_rel,
            lambda: self.length,
            self.learn,
            self.settle_cap_s,
            self.values,
        )
        for i in ordered(self.plan, self.values):
            planned = self.plan[i]
            if planned.fix in self.tried:
                continue
            fix = fixes.REGISTRY[planned.fix]
            loaders = loader_problem(self.baseline) if fix.switches_loaders else None
            reason = why or fix.in_process_problem(self.values) or loaders or self.live_ended
            self.run(planned, measure, "restart", reason)
