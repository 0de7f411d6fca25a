"""The baseline run's checks before its diagnosis: whether the script took any step (and how to
mark steps where it took none), and, where the script ended inside the baseline's window, the
baseline measured again fitted into the steps it turned out to have; whether its DataLoaders
can switch settings in its process (`loader_problem`)."""

from __future__ import annotations

from trainadvisor.analyze.run.length import run_length
from trainadvisor.analyze.run.shapes import traced_whole
from trainadvisor.errors import NoStepsError, UsageError
from trainadvisor.measure.config import PROFILER_WARMUP_STEPS
from trainadvisor.measure.runner import PROFILE_STEPS, RunSpec
from trainadvisor.profile.judge import MIN_TIMED_STEPS, usable
from trainadvisor.profile.runs import ProfileOptions, fresh_spec, measure_run
from trainadvisor.profile.trials import Echo
from trainadvisor.records import LoaderInfo, Overrides, RawRun, Run

STEP_MARKING_HELP = (
    "trainadvisor finds steps through torch.optim optimizers' optimizer.step() (global optimizer "
    "hooks), or, where no optimizer is built, through backward(). If your loop does neither, add "
    "`import trainadvisor` and call "
    "`trainadvisor.step()` once at the end of every training step; outside trainadvisor the "
    "call does nothing."
)


def check_steps(raw: RawRun, options: ProfileOptions) -> None:
    if raw.status == "script_failed":
        return
    if raw.steps_seen == 0:
        raise NoStepsError(
            f"{options.script} ran to the end but no training step was seen. " + STEP_MARKING_HELP
        )
    if not raw.steps:
        raise UsageError(
            f"{options.script} ran only {raw.steps_seen} step(s), too few to time any after a warm-up "
            f"of at least {options.warmup}: lower --warmup, or pass arguments that make the script "
            "train longer"
        )


def too_short(raw: RawRun) -> bool:
    """The script ended by itself before the baseline's window timed enough steps, or before
    the profiler recorded a whole step: then no step was traced (the script's end can fall there
    where the warm-up settled late, on a loaded machine)."""
    if raw.status != "script_ended" or not raw.steps_seen:
        return False
    return not usable(raw) or (raw.profile_steps > 0 and not traced_whole(raw))


def fitted_baseline(options: ProfileOptions, spec: RunSpec, first: Run, echo: Echo) -> tuple[Run, str] | None:
    """The baseline measured again, its window fitted into the steps the script turned out to
    have (it ended inside the first one's warm-up, or its timed steps): fewer traced steps where
    the script is that short; and why no trial can run in its process. None where even a fitted
    window would time too few steps, or trace none where the first timed enough."""
    total = first.raw.steps_seen
    spare = total - options.warmup - MIN_TIMED_STEPS
    if spare < 0:
        return None
    traced = min(PROFILE_STEPS, spare - PROFILER_WARMUP_STEPS)  # the profiler's warm-up step first
    if traced <= 0 and usable(first.raw):
        return None  # fitted, it would trace nothing either: its timed steps are as good
    missed = "traced any" if usable(first.raw) else "timed enough"
    echo(
        f"trainadvisor: the script ended after {total} steps, before the window had {missed} of "
        "them; measuring the baseline again, fitted into those steps"
    )
    after_window = PROFILER_WARMUP_STEPS + traced if traced > 0 else 0
    fitted = fresh_spec(
        options, "baseline", Overrides(), run_length(first.raw), after_window,
        show_output=spec.show_output, stop_after_window=spec.stop_after_window,
        profile=traced > 0, profile_steps=max(traced, 0),
    )  # fmt: skip
    return measure_run(fitted), f"the script's {total} steps leave none for trial windows after the baseline"


def loader_problem(baseline: Run) -> str | None:
    """Why DataLoader settings cannot switch in this run's process, or None. A loader is built
    anew every epoch where its site built it more than once (`rebuilt`); loaders of other data at
    the same line, a train and an eval loader built by one helper function, are others."""
    raw = baseline.raw
    used = [info for info in raw.loaders if info.batches_in_window]
    for info in used:
        same = [other for other in raw.loaders if rebuilt(info, other)]
        if len(same) > 1:
            return (
                f"the DataLoader at {info.created_at} is built anew every epoch "
                f"({len(same)} times so far): each trial needs loaders built with its setting"
            )
        if info.iterable_dataset:
            return (
                f"its dataset ({info.dataset_class}) is an IterableDataset: a new iterator would "
                "start its stream again, and its sharding across workers decides what each reads"
            )
    return None


def rebuilt(a: LoaderInfo, b: LoaderInfo) -> bool:
    """Whether two loaders are one loader built twice: at one site, over the same dataset object,
    or over datasets alike in class, batch size and batches per pass (a dataset rebuilt with its
    loader); not two loaders of other data built at one line (timm builds its train and eval
    loaders in one helper)."""
    if a.created_at != b.created_at:
        return False
    if a.dataset_id is not None and a.dataset_id == b.dataset_id:
        return True
    return (a.dataset_class, a.batch_size, a.length) == (b.dataset_class, b.batch_size, b.length)
