"""`advise(trials=True)`: after its window, the advisor measures the fixes that can switch while
the loop runs, in further windows of the user's own process, without any restart: DataLoader
workers, prefetch and pinning (the loop's iterator serves a stand-in loader's batches for the
window), TF32, cuDNN autotuning and bf16 autocast (installed for one window, undone after).
Then the script's own setting is measured again (a later window can be faster by itself), and
everything goes back as it was: the loop's own iterator goes on where it stopped, the stand-ins'
workers are shut down, every switch is undone.

The trial windows are training steps of the user's run: the model trains on the stand-ins'
batches meanwhile (drawn from fresh passes of the same sampler), and under autocast in an amp
window. Nothing is confirmed in a fresh seeded run here: each chosen setting is reported with
the `trainadvisor profile` command that confirms it, loss check included."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from trainadvisor import fixes
from trainadvisor.analyze.run.summary import summarize
from trainadvisor.profile.pace import ordered
from trainadvisor.profile.runs import ProfileOptions, window_steps
from trainadvisor.profile.trials import decide
from trainadvisor.profile.tuning import AS_SCRIPT
from trainadvisor.records import (
    FixOutcome,
    LoaderInfo,
    Overrides,
    PlannedFix,
    ProfileReport,
    Trial,
    TrialWindow,
)
from trainadvisor.training import gpu, loaders
from trainadvisor.training.hooks import Patches, window_run
from trainadvisor.training.window import Window
from trainadvisor.training.window_plan import WindowPlan

MAX_TRIALS_PER_FIX = 8


class _Patches(Patches):
    """A trial window's patches in the user's process: only switches that need neither a loss
    transform nor step control are tried there (`Fix.in_process_problem`)."""

    loss_transform = None

    def optimizer_step(self, *_: Any) -> None:
        pass


def stand_in(iterator: Any, wanted: dict[str, Any], info: LoaderInfo) -> DataLoader | str:
    """A DataLoader built from what an iterator of the user's loader holds (its dataset,
    sampler, collate_fn; its worker init, context and generator as `loaders.built_with` knows
    them), with `wanted` changed; or why it cannot be built."""
    args: dict[str, Any] = {
        "dataset": iterator._dataset,
        "collate_fn": iterator._collate_fn,
        "timeout": iterator._timeout,
        "num_workers": iterator._num_workers,
        "pin_memory": iterator._pin_memory,
    }
    args.update(loaders.built_with(iterator))
    if iterator._auto_collation:
        args["batch_sampler"] = iterator._index_sampler
    else:
        args.update(sampler=iterator._index_sampler, batch_size=None)
    if iterator._num_workers:
        args.update(
            prefetch_factor=iterator._prefetch_factor, persistent_workers=iterator._persistent_workers
        )
    checked = replace(info, overrides_applied={})
    loaders.apply(args, dict(wanted), checked)
    if checked.override_refused:
        return checked.override_refused
    return DataLoader(**args)


class AdviseTrials:
    """The trial windows of one advisor, fed by its step calls (`advisor.window` is always the
    window being measured)."""

    def __init__(self, advisor: Any, report: ProfileReport, values: dict[str, Any]) -> None:
        self.advisor, self.report, self.values = advisor, report, dict(values)
        self.options = ProfileOptions(Path("<in-process>"), [], advisor.out, advisor.warmup, advisor.steps)
        plan = report.plan
        self.queue: list[PlannedFix] = [
            plan[i]
            for i in ordered(plan, values)
            if fixes.REGISTRY[plan[i].fix].in_process_problem(values) is None
        ]
        self.planned: PlannedFix | None = None
        self.trials: list[Trial] = []
        self.outcomes: dict[str, FixOutcome] = {}
        baseline = report.baseline
        assert baseline is not None  # trials follow a measured window
        self.windows = [
            TrialWindow(
                "baseline",
                "",
                AS_SCRIPT,
                "measured",
                baseline.steps_per_s,
                baseline.samples_per_s,
                0.0,
                baseline.steps,
            )  # fmt: skip
        ]
        self.setting: fixes.Setting | None = None
        self.patches = _Patches()
        self.stand_ins: list[Any] = []
        self.bracketing = False
        self.served = 0  # batches the stand-in loaders served: steps the script would not have taken
        self.switched = 0  # the script's own steps taken with a trial's switch on (TF32, autocast)

    def any(self) -> bool:
        return bool(self.queue)

    def fix_ids(self) -> list[str]:
        return [p.fix for p in self.queue]

    def abandon(self) -> None:
        """Stop here (the advisor failed or was closed): the script's own setting back."""
        self.patches.undo()
        self._stop_stand_ins()
        serving = self.advisor.serving()
        if serving is not None:
            _forget_delegate(serving[0])

    # ---- one window after another ----

    def next_window(self) -> Window | None:
        """The next window, its setting switched on; None when all are measured."""
        while True:
            if self.planned is None and not self.queue and not self.bracketing:
                self.bracketing = True
                return self._open(fixes.Setting(AS_SCRIPT, Overrides()), "baseline-again")
            if self.bracketing and self.planned is None:
                return None
            if self.planned is None:
                self.planned, self.trials = self.queue.pop(0), []
            fix = fixes.REGISTRY[self.planned.fix]
            candidate = (
                fix.next_candidate(self.values, self.trials)
                if len(self.trials) < MAX_TRIALS_PER_FIX
                else None
            )
            if candidate is not None:
                window = self._open(candidate, f"{fix.id}-{len(self.trials) + 1}")
                if window is not None:
                    return window
                continue  # refused: recorded as such, on to the next candidate
            self.outcomes[self.planned.fix] = decide(
                self.planned, self.trials, self.values, self._references()
            )
            self.planned = None

    def _open(self, setting: fixes.Setting, label: str) -> Window | None:
        self.setting, self.label = setting, label
        problem = self._switch(setting.overrides)
        if problem is not None:
            self._record(Trial(setting.label, setting.overrides, "refused", None, problem), None)
            return None
        warmup, steps = window_steps(self.options, setting.overrides)
        amp = setting.overrides.runtime.get("amp")
        advisor = self.advisor
        settle = advisor.settling(setting.overrides.workers())
        return Window(
            WindowPlan(warmup, steps, 0, False, advisor.min_time_s, settle),
            advisor.clock,
            first_index=advisor.calls,
            device=advisor.window.device,
            on_open=lambda w: gpu.torch_facts(None, amp, w.device),
            on_close=advisor.trial_window_closes,
        )

    def _switch(self, overrides: Overrides) -> str | None:
        """The loader and the switches as `overrides` ask (nothing: as the script runs)."""
        self.patches.undo()
        self._stop_stand_ins()
        serving = self.advisor.serving()
        wanted = overrides.loader()
        if serving is not None:
            iterator, info = serving
            if wanted:
                loader = stand_in(iterator, wanted, info)
                if isinstance(loader, str):
                    return loader
                first = iter(loader)
                self.stand_ins.append(first)
                iterator._trainadvisor_delegate = first
                iterator._trainadvisor_again = lambda: self._again(loader)
            else:
                _forget_delegate(iterator)
        elif wanted:
            return "the loop's DataLoader iterator is no longer in use"
        fixes.install(self.patches, Overrides(runtime=overrides.runtime))
        return None

    def _again(self, loader: DataLoader) -> Any:
        again = iter(loader)
        self.stand_ins.append(again)
        return again

    def _stop_stand_ins(self) -> None:
        for iterator in self.stand_ins:
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        self.stand_ins = []

    def window_done(self, window: Window) -> None:
        self.advisor.outside_calls(window)
        raw = window_run(
            window,
            label=self.label,
            status="window_complete",
            exit_code=None,
            error=None,
            steps_seen=self.advisor.calls,
            step_source="@advise",
            loaders=[],
        )
        self.advisor.attach_window_samples(raw)
        run = summarize(raw)
        assert self.setting is not None
        if self.setting.overrides.runtime:
            self.switched += window.steps_done
        trial = Trial(
            self.setting.label,
            self.setting.overrides,
            "measured",
            run.steps_per_s,
            self.setting.note,
            raw,
            run.samples_per_s,
        )
        self._record(trial, raw.window_start_unix_s)
        if self.bracketing:
            self.planned = None
            self.again = run

    def _record(self, trial: Trial, started_unix_s: float | None) -> None:
        t0 = self.report.baseline.raw.window_start_unix_s if self.report.baseline else None
        started = started_unix_s - t0 if started_unix_s and t0 else None
        fix = self.planned.fix if self.planned is not None and not self.bracketing else ""
        self.windows.append(
            TrialWindow(
                self.label,
                fix,
                trial.label,
                trial.status,
                trial.steps_per_s,
                trial.samples_per_s,
                started,
                len(trial.raw.steps) if trial.raw else 0,
            )
        )
        if not self.bracketing:
            self.trials.append(trial)

    # ---- the end ----

    def finish(self, command: list[str] | None) -> ProfileReport:
        """Everything back as the script runs it; the report with each fix's windows, judged
        against the faster of the two baseline windows."""
        self.patches.undo()
        self._stop_stand_ins()
        serving = self.advisor.serving()
        if serving is not None:
            _forget_delegate(serving[0])
        reference = dict(self.values)
        again = getattr(self, "again", None)
        if (
            again is not None
            and again.steps_per_s
            and (reference.get("steps_per_s") or 0) < again.steps_per_s
        ):
            reference["steps_per_s"] = again.steps_per_s
        confirm = f"confirm it, loss check included, with: {shlex.join(command)}" if command else ""
        outcomes = []
        for outcome in self.report.fix_outcomes:
            measured = self.outcomes.get(outcome.fix)
            if measured is None:
                outcomes.append(outcome)
                continue
            planned = next(p for p in self.report.plan if p.fix == outcome.fix)
            decided = decide(planned, measured.trials, reference, self._references())
            if decided.status == "unconfirmed":
                decided = replace(
                    decided, reason=f"measured in windows of this process; {confirm}".rstrip("; ")
                )
            outcomes.append(replace(decided, mode="in_process"))
        first = self.report.baseline.steps_per_s if self.report.baseline else None
        note = (
            f"Trial windows ran in this process after the advisor's window, bracketed by the script's "
            f"own setting ({first or 0:.1f} steps/s first, {again.steps_per_s or 0:.1f} after); a trial "
            "counted only against the faster of the two."
            if again is not None
            else "Trial windows ran in this process after the advisor's window."
        )
        kept_notes = [n for n in self.report.notes if not n.startswith("Measured in-process by ")]
        kept_notes.append(self.extra_steps_note())
        return replace(
            self.report,
            findings=fixes.with_claims(self.report.findings, outcomes),
            fix_outcomes=outcomes,
            trial_windows=self.windows,
            notes=kept_notes,
            details=[*self.report.details, note],
        )

    def extra_steps_note(self) -> str:
        """What the trial windows did to the user's training, exactly."""
        extra = self.served
        text = (
            f"The trial windows trained {extra} extra steps of your run (advise(trials=True)): on batches "
            "drawn from fresh passes of your DataLoader's own sampler by stand-in loaders; your loader's "
            "iterator then went on where it stopped, so the epoch they fell in ran "
            f"{extra} steps longer than it would have (its printed averages include them)."
        )
        if self.switched:
            text += f" {self.switched} of your own steps ran with a trial's switch on (TF32, autocast)."
        return text + " Without trials=True the advisor changes nothing of your training."

    def _references(self) -> list[Any]:
        """The runs a trial must beat: the advisor's window, and the script's setting measured
        again after the trials once it has been."""
        again = getattr(self, "again", None)
        return [run for run in (self.report.baseline, again) if run is not None]


def _forget_delegate(iterator: Any) -> None:
    for name in ("_trainadvisor_delegate", "_trainadvisor_again"):
        if hasattr(iterator, name):
            delattr(iterator, name)
