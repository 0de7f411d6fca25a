"""What every fix shares: a candidate setting, the measured facts of a trial it reads, and the
shape of a one-setting fix (`Switch`). A fix is one module in this package: when it applies, its
candidates and its choice, its run-time switch (`install`, run in the script's process before
the script starts; torch is imported there only) and its code change (`code_change`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainadvisor.records import FixOutcome, Overrides, Trial

# With the same batches (same fingerprints) in both runs, the loss of each step must agree to
# this relative difference: fixes that only change how batches are loaded give bit-identical
# losses on the same machine, and the tolerance leaves room for non-deterministic kernels only.
LOSS_TOLERANCE_REL = 1e-4
# With different batches (random augmentation drawn from per-worker generators) single steps
# cannot be compared; the mean loss over the shared steps must agree to this.
MEAN_LOSS_TOLERANCE_REL = 0.10

# A change is kept when the slow windows after it (10th percentile of window throughput) beat
# the fast windows before it (90th percentile) and throughput gains at least this much.
KEEP_MIN_SPEEDUP = 1.05

NO_GPU = "the run used no GPU, and this fix only changes GPU work"
NO_GAIN = "no candidate was at least 5% faster than the baseline"


@dataclass
class Setting:
    """One candidate: what it is in words, and what a run changes to measure it."""

    label: str
    overrides: Overrides
    # the steps/s its trial window must be able to reach, or it stops early (`measure.race`);
    # None: measured to the end
    race_below: float | None = None
    # whether its warm-up races too (False: only its timed steps, after a warm-up that settled or
    # reached its cap: a pair's window of the script's own setting, whose figure stands in a ratio)
    race_warmup: bool = True
    # the longest its window's warm-up waits to settle, below the trials' own cap (a pair's
    # windows: their adjacency matters more than a steadiness a loaded machine never reaches)
    settle_s: float | None = None
    # why it is measured, where that is not plain from its label (a setting measured again), for
    # its trial's reason in the report
    note: str | None = None


def overrides(
    loaders: dict[str, dict[str, Any]] | None = None, non_blocking_h2d: bool = False, **runtime: Any
) -> Overrides:
    """DataLoader arguments by call site, non-blocking copies of its batches, in-process switches."""
    return Overrides(loaders or {}, non_blocking_h2d, runtime)


def cuda_memory(trial: Trial) -> dict[str, Any]:
    """The trial run's CUDA memory statistics ({} when not measured)."""
    return dict((trial.raw.runtime.get("cuda_memory") if trial.raw else None) or {})


class Fix:
    """The defaults of every fix: a throughput goal, no run-time switch of its own (DataLoader
    arguments and non-blocking copies are applied by the measuring hooks for every fix), no code
    change."""

    id = ""
    metric = "steps_per_s"  # what a candidate must improve: steps_per_s, samples_per_s, peak_reserved_bytes
    # "throughput": confirmed with the other fixes and kept; "memory": recommended from its own
    # runs; "opportunity": faster but changes what is learned (a larger batch): measured, shown,
    # never applied
    goal = "throughput"
    loss_tolerance_rel = LOSS_TOLERANCE_REL  # how far the loss may move for training to count as the same
    no_gain = NO_GAIN  # why no candidate was kept, in the terms of what the fix improves
    # The measurement of the share of the step the fix's bottleneck takes (trials are ordered by
    # the most they can gain: 1 / (1 - share)); "" when no measurement bounds it.
    bound_by = ""
    # Why its setting cannot switch while the loop runs (its trials restart the script); ""
    # when it can, in a trial window of the baseline's own process.
    restarts_because = "its setting is read when the script builds its model or optimizer"
    switches_loaders = False  # its setting changes DataLoaders (stand-ins in a trial window)
    # what else than a change of what is learned can make its losses differ, and how to check
    changed_training_hint = ""

    def once_s(self, values: dict[str, Any]) -> float:
        """About how long a fresh run of this fix's candidate spends once beyond the script's
        own run (`compile`: compiling), before one of its runs has measured it: what the
        progress line's estimate and --budget count for its first trial. 0 for most fixes."""
        return 0.0

    def pace_now(self, trials: list[Trial]) -> float:
        """The machine's pace in the latest of `trials`' windows against its pace in the first,
        where a setting measured again told it (1.0 where none did): a trial window's race bar
        is lowered by it (`profile.trials.tune`)."""
        return 1.0

    def could_keep(self, values: dict[str, Any]) -> bool:
        """Whether, as far as the estimate can tell before its trials, the fix could be kept and
        so confirmed in a fresh run, paying `once_s` there too (False for fixes that are only
        recommended)."""
        return self.goal == "throughput"

    def measured_once_s(self, outcome: FixOutcome) -> float | None:
        """What its trials measured of `once_s` (None: nothing)."""
        return None

    def in_process_problem(self, values: dict[str, Any]) -> str | None:
        """Why this fix's trials cannot run as windows of the baseline's process, or None."""
        return self.restarts_because or None

    def expected_trials(self, values: dict[str, Any]) -> int:
        """About how many candidates the fix will try (to share a short run's steps among them)."""
        return 1

    def likely_trials(self, values: dict[str, Any]) -> int:
        """How many candidates the search usually measures, for the progress line's estimate
        of what is left (`expected_trials` is the most it may try)."""
        return self.expected_trials(values)

    def likely_windows(self, values: dict[str, Any]) -> list[tuple[int, float | None]]:
        """Each candidate the search usually measures, as its window's estimate needs it: the
        DataLoader workers it runs (their batches' rounds set how long it settles) and the steps/s
        they can load at most (None: not known)."""
        return [(0, None)] * self.likely_trials(values)

    def likely_kept(self, values: dict[str, Any]) -> tuple[int, float | None]:
        """The candidate the search usually keeps, as `likely_windows` gives it: its last where
        the search usually ends on its choice (`likely_ends_on_choice`), else the one before."""
        windows = self.likely_windows(values)
        if not windows:
            return (0, None)
        ends_on_it = self.likely_ends_on_choice(values) or len(windows) < 2
        return windows[-1] if ends_on_it else windows[-2]

    def likely_ends_on_choice(self, values: dict[str, Any]) -> bool:
        """Whether the search's last candidate is usually the one it chooses: the pair that
        checks the choice then reuses its window (`profile.pairs`), one window fewer."""
        return self.expected_trials(values) == 1

    def search_note(self, trials: list[Trial], values: dict[str, Any]) -> str | None:
        """Why the search over candidates stopped where it did (for the report), or None."""
        return None

    def measured_figures(self, trials: list[Trial]) -> dict[str, Any]:
        """Figures of the outcome's own fields that its trials measured whatever the verdict
        (a compile time where compiling did not pay), for the outcome to carry."""
        return {}

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        """Why the fix cannot be tried on this run, or None."""
        raise NotImplementedError

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        """The next setting to measure given the trials so far, or None when done."""
        raise NotImplementedError

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        """The trial worth keeping (`values`: the baseline's measurements), or None."""
        raise NotImplementedError

    def verdict(self, trial: Trial, values: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
        """Where the chosen trial's gain alone does not decide: (a status in place of the
        usual one, "" to keep it; the reason in words; figures for the outcome's fields), else
        None. (`compile`: whether the run is long enough to pay for compiling.)"""
        return None

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        """The chosen settings in words, e.g. 'num_workers=8, persistent_workers=True'."""
        return trial.label

    def install(self, recorder: Any, overrides: Overrides) -> None:
        """The fix's switch in the script's process (`training.hooks.Recorder` undoes it)."""

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        """`source` changed to do at every run what the fix did at run time; None when the fix
        has no single place in the code (its finding carries the code to write)."""
        return None

    def loop_change(self, overrides: Overrides) -> str:
        """What the kept setting asks of the script's own loop, in words, where no single line
        holds it ("" for most fixes: their code change is the diff)."""
        return ""

    def practice(self, snippet: str, outcome: FixOutcome) -> str:
        """A finding's best-practice snippet after this fix's outcome: a value the run measured
        best put in place of the snippet's example. A snippet's comment claims a measurement only
        for a value measured best in this run; every other value in it says it is an example."""
        return snippet


class LoaderSetting(Fix):
    """A fix that changes the DataLoader's arguments: it switches while the loop runs (a
    stand-in loader in a trial window)."""

    restarts_because = ""
    switches_loaders = True


class Switch(Fix):
    """One candidate; kept when it is at least KEEP_MIN_SPEEDUP faster."""

    def setting(self, values: dict[str, Any]) -> Setting:
        raise NotImplementedError

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        return None if trials else self.setting(values)

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        measured = [t for t in trials if t.status == "measured" and t.steps_per_s]
        baseline = float(values.get(self.metric) or 0.0)
        if not measured or (measured[0].steps_per_s or 0.0) < KEEP_MIN_SPEEDUP * baseline:
            return None
        return measured[0]


class GpuFlag(Switch):
    """A switch torch reads at every op on the GPU (TF32, cuDNN autotuning): it switches while
    the loop runs."""

    restarts_because = ""

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        return NO_GPU if not values.get("cuda_used") else self.flag_problem(values)

    def flag_problem(self, values: dict[str, Any]) -> str | None:
        """Why the flag cannot help on this GPU, or None."""
        raise NotImplementedError


def trial_peak(trial: Trial) -> int | None:
    """The trial's peak memory: on a GPU the allocator's reserved peak (what the card must
    hold), else its counted step's measured peak (`memory.step`)."""
    reserved = cuda_memory(trial).get("peak_reserved_bytes")
    if reserved is not None:
        return int(reserved)
    step = ((trial.raw.runtime.get("memory") if trial.raw else None) or {}).get("peak_bytes")
    return int(step) if step is not None else None


def baseline_peak(values: dict[str, Any]) -> int | None:
    """The baseline's peak, measured as `trial_peak` measures a trial's."""
    peak = values.get("peak_reserved_bytes", values.get("step_peak_bytes"))
    return int(peak) if peak is not None else None


class MemoryFix(Fix):
    """A fix that trades speed for memory: recommended from its own runs, never merged into the
    speed fixes' confirmation. A candidate relieves memory when its peak is `min_relief` lower
    than the baseline's at `min_speed` of its speed or better; where the baseline's peak is
    over the memory budget, a candidate that fits the budget is worth its cost whatever it is
    (the fastest that fits is chosen, and its cost stated)."""

    metric = "peak_bytes"
    goal = "memory"
    min_relief = 0.10
    min_speed = 0.80

    def over_budget(self, values: dict[str, Any]) -> bool:
        budget, peak = values.get("memory_budget_bytes"), baseline_peak(values)
        return budget is not None and peak is not None and peak > budget

    def relieved(self, trial: Trial, values: dict[str, Any]) -> bool:
        peak, base = trial_peak(trial), baseline_peak(values)
        if trial.status != "measured" or peak is None or base is None:
            return False
        if self.over_budget(values):
            return peak <= values["memory_budget_bytes"]
        speed = values.get("steps_per_s")
        speed_ok = not speed or (trial.steps_per_s or 0.0) >= self.min_speed * speed
        return peak <= (1 - self.min_relief) * base and speed_ok

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        """Over the budget: the fastest candidate that fits it; else the first that relieves."""
        fitting = [t for t in trials if self.relieved(t, values)]
        if self.over_budget(values):
            return max(fitting, key=lambda t: t.steps_per_s or 0.0, default=None)
        return fitting[0] if fitting else None

    def cost(self, trial: Trial, values: dict[str, Any]) -> str:
        """'peak 40.1 MB -> 21.3 MB, fits the budget of 30.0 MB; 1.31x slower per step'."""
        from trainadvisor.units import scaled

        peak, base = trial_peak(trial) or 0, baseline_peak(values) or 0
        text = f"peak {scaled(base, 'B', 'kMGT')} -> {scaled(peak, 'B', 'kMGT')}"
        budget = values.get("memory_budget_bytes")
        if budget:
            fits = "fits" if peak <= budget else "still over"
            text += f", {fits} the budget of {scaled(budget, 'B', 'kMGT')}"
        speed = values.get("steps_per_s")
        if speed and trial.steps_per_s:
            ratio = speed / trial.steps_per_s
            text += f"; {ratio:.2f}x slower per step" if ratio >= 1 else f"; {1 / ratio:.2f}x faster per step"
        return text
