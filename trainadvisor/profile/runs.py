"""What `profile` runs: its options, the command that repeats it, and the specification and
measurement of one run of the script (baseline, trial or confirmation)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainadvisor.analyze.run.critical_path import critical_path
from trainadvisor.analyze.run.ranks import rank_stats
from trainadvisor.analyze.run.shapes import traced_whole
from trainadvisor.analyze.run.summary import attach_trace, summarize
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.measure.config import PROFILER_WARMUP_STEPS, WindowSize
from trainadvisor.measure.runner import PROFILE_STEPS, RunSpec, measure, measures_memory
from trainadvisor.measure.settle import Settling
from trainadvisor.options.table import (
    default,
    receiving,
    record_values,
    repeated,
    torchrun_argv,
)
from trainadvisor.profile.judge import usable
from trainadvisor.profile.pace import CONFIRMATION_ROUNDS
from trainadvisor.records import Overrides, RawRun, Run, RunLength
from trainadvisor.redact import mask_arguments


@dataclass
class ProfileOptions:
    """`profile`'s options: one field for each option of its table (`options.table.PROFILE`,
    with its default), torchrun's as one list, and where the runs write until a report is
    published."""

    script: Path
    args: list[str]
    out_dir: Path
    warmup: int = default("warmup")
    steps: int = default("steps")
    seed: int | None = default("seed")
    rule_dirs: list[Path] = field(default_factory=list)
    run_to_end: bool = default("run_to_end")
    apply_fixes: bool = default("apply_fixes")
    torchrun: list[str] = field(default_factory=list)  # torch.distributed.run options, if any
    timeout_s: float | None = default("timeout_s")
    stall_s: float | None = default("stall_s")
    budget_s: float | None = default("budget_s")
    only_fixes: list[str] = field(default_factory=list)
    trials: str = default("trials")
    min_time_s: float = default("min_time_s")
    max_warmup_s: float = default("max_warmup_s")
    memory_budget_bytes: int | None = default("memory_budget_bytes")
    max_workers: int | None = default("max_workers")
    output_format: str = default("output_format")
    workload: str | None = default("workload")
    log_to: list[str] = field(default_factory=list)
    # Where the runs write their traces and logs until a report is published (the writer's
    # staging folder, `report.folder`); None: into out_dir itself.
    stage_dir: Path | None = None


def options_from(params: dict[str, Any]) -> ProfileOptions:
    """The options record of what click parsed (`SCRIPT`, its arguments, the table's options)."""
    given = dict(params)
    return ProfileOptions(
        script=given.pop("script"),
        args=list(given.pop("script_args")),
        torchrun=torchrun_argv(given),
        **record_values(given),
    )


def reproduce_command(options: ProfileOptions) -> list[str]:
    """The command line that repeats this run: every option that differs from its default (and
    the window's size, the folder and the seed always), in the table's order; the values of the
    script's credential-like arguments masked (`redact`): reports are published."""
    command = ["trainadvisor", "profile", *repeated(options)]
    return [*command, *options.torchrun, str(options.script), *mask_arguments(options.args)[0]]


# What every run of the script takes from the command's options.
RUN_OPTIONS = ("script", "args", "out_dir", "torchrun", *receiving("run"))


def spec_for(options: ProfileOptions, label: str, **changes: Any) -> RunSpec:
    """A run of the script; a measuring window settles and lasts `--min-time` unless `changes`
    say otherwise (the call-sites and loss-noise runs need steps, not timings)."""
    shared: dict[str, Any] = {name: getattr(options, name) for name in RUN_OPTIONS}
    shared["out_dir"] = options.stage_dir or options.out_dir
    shared["size"] = size_for(options, Overrides())
    return RunSpec(label=label, **{**shared, **changes})


def size_for(
    options: ProfileOptions,
    overrides: Overrides,
    max_steps: int | None = None,
    settle_cap_s: float | None = None,
    race_below: float | None = None,
    race_warmup: bool = True,
) -> WindowSize:
    """A window's time floor, its warm-up's steadiness test (blocks of two rounds of the
    setting's DataLoader workers, fewer where they keep ahead, `settle.Blocks`; a trial's blocks
    capped at `settle_cap_s`, `pace`), the steps it may use and the steps/s it races
    (`race_below`; in its warm-up too unless `race_warmup` is False). Under torchrun a window is a
    count of steps: every rank must stop at the same step (the others would wait in their next
    all-reduce), and each rank would judge its own clock and blocks differently."""
    if options.torchrun:
        return WindowSize(max_steps=max_steps)
    settle = Settling(max_s=options.max_warmup_s, blocks_max_s=settle_cap_s).for_workers(overrides.workers())
    settled = settle if options.max_warmup_s else None
    race = race_below if settled else None
    return WindowSize(options.min_time_s, settled, max_steps, race, race_warmup)


def fit(warmup: int, steps: int, available: int | None) -> tuple[int, int, int | None]:
    """(warmup, timed steps at least, the most steps) of a window that must end within
    `available` steps (None: not known to be short): the minimums shrink, warm-up first,
    where they do not fit."""
    if available is None or available >= warmup + steps:
        return warmup, steps, available
    timed = max(2, (2 * available) // 3)
    return max(1, available - timed), timed, max(available, 3)


def settle_steps(options: ProfileOptions, overrides: Overrides) -> tuple[int, int]:
    """(warmup, timed steps) at least, of a fresh run that tries a fix. Workers fill up to
    workers x prefetch_factor batches while the first, slow steps run; consumed inside the
    window, that buffer would pass for speed. So the warmup is lengthened by the buffer's depth
    and the window made at least three times as long as it."""
    buffered = overrides.buffered_batches()
    return options.warmup + buffered, max(options.steps, 3 * buffered)


def window_steps(options: ProfileOptions, overrides: Overrides) -> tuple[int, int]:
    """(warmup, timed steps) at least, of a trial window in the baseline's running process.
    There the steps are already at their steady pace when the setting switches, and the new
    workers start with empty buffers: a buffer fills only where the workers outpace the loop,
    and then stays full. What remains is the first round of batches, finished by all workers at
    about the same time: the warmup is lengthened by one batch per worker, and the window spans
    at least three such rounds."""
    workers = overrides.workers()
    return options.warmup + workers, max(options.steps, 3 * workers)


def fresh_spec(
    options: ProfileOptions,
    label: str,
    overrides: Overrides,
    length: RunLength | None,
    traced: int,
    settle_cap_s: float | None = None,
    race_below: float | None = None,
    **changes: Any,
) -> RunSpec:
    """A fresh run of the script with `overrides`, its window fitted into the steps the script
    is known to have (less the `traced` ones after it)."""
    warmup, steps = settle_steps(options, overrides)
    total = length.total_steps if length is not None else None
    warmup, steps, most = fit(warmup, steps, total - traced if total is not None else None)
    size = size_for(options, overrides, most, settle_cap_s, race_below)
    return spec_for(options, label, warmup=warmup, steps=steps, overrides=overrides, size=size, **changes)


def trial_spec(
    options: ProfileOptions,
    label: str,
    overrides: Overrides,
    length: RunLength | None = None,
    settle_cap_s: float | None = None,
    race_below: float | None = None,
    **changes: Any,
) -> RunSpec:
    """A fresh run of the script that tries a fix: traced by nothing, one untimed step after
    its timed ones measures its memory (none for a compiled model: see `measure.runner`)."""
    memory_step = 1 if measures_memory(False, overrides) else 0
    return fresh_spec(options, label, overrides, length, memory_step, settle_cap_s, race_below, **changes)


def window_words(options: ProfileOptions, size: WindowSize) -> str:
    """The baseline's window as `size` will measure it: a count of steps where it has no
    steadiness test or no time floor (under torchrun, or --max-warmup 0 / --min-time 0)."""
    warmup = (
        f"warm-up until step time settles, at least {options.warmup} steps"
        if size.settle is not None
        else f"a warm-up of {options.warmup} steps"
    )
    timed = (
        f"timing at least {options.steps} steps and {size.min_time_s:g} s"
        if size.min_time_s
        else f"timing {options.steps} steps"
    )
    return f"{warmup}; {timed}; then tracing {PROFILE_STEPS} with torch.profiler"


def confirmation_spec(
    options: ProfileOptions, overrides: Overrides, length: RunLength | None, settle_cap_s: float | None = None
) -> RunSpec:
    """The fresh run that confirms the chosen settings: the buffer the workers fill while the
    first, slow steps run is drained in its warmup (as in a trial run), its timed steps hold at
    least three throughput windows of two rounds of the workers' batches each (the spread the
    verdict is judged on), and the whole of it fits in the steps the script has."""
    traced = PROFILER_WARMUP_STEPS + PROFILE_STEPS
    spec = fresh_spec(options, "after", overrides, length, traced, settle_cap_s, show_output=False)
    steps = max(spec.steps, CONFIRMATION_ROUNDS * overrides.workers())
    if spec.size.max_steps is not None:
        steps = min(steps, max(2, spec.size.max_steps - spec.warmup))
    return replace(spec, steps=steps)


def measure_run(spec: RunSpec) -> Run:
    return run_of(measure(spec), spec)


def measure_fitted(
    spec_of: Callable[[RunLength | None], RunSpec],
    length: Callable[[], RunLength | None],
    learn: Callable[[RawRun], None],
    first: Callable[[RunSpec], Run] = measure_run,
) -> Run:
    """A fresh run with its window fitted into the steps the script is known to have. A script
    of unknown length that ends before its window timed enough steps, or before the step after
    them that measures its memory, has just told its length: the run is measured once more,
    fitted into it."""
    known = length()
    spec = spec_of(known)
    run = first(spec)
    learn(run.raw)
    now = length()
    learnt = (known is None or known.total_steps is None) and now is not None and now.total_steps
    measured = (run.raw.runtime.get("memory") or {}).get("peak_bytes") is not None
    incomplete = not usable(run.raw) or (measures_memory(spec.profile, spec.overrides) and not measured)
    if incomplete and run.raw.status == "script_ended" and learnt:
        run = measure_run(spec_of(now))
        learn(run.raw)
    return run


def run_of(raw: RawRun, spec: RunSpec) -> Run:
    """A measured run summarised, its trace's measurements (every rank's) attached."""
    trace = attach_trace(raw, spec.out_dir, spec.script)
    run = summarize(raw)
    run.trace = trace
    if run.memory is not None and spec.memory_budget_bytes is not None:
        run.memory.budget_bytes, run.memory.budget_source = spec.memory_budget_bytes, "--memory-budget"
    if raw.ranks:
        analyses = {}
        for rank in raw.ranks:
            if rank.trace_file and (spec.out_dir / rank.trace_file).is_file():
                path = spec.out_dir / rank.trace_file
                analyses[rank.rank or 0] = analyze_trace(path, last_step=traced_whole(rank) or None)
        run.ranks = rank_stats(raw, analyses)
        run.critical_path = critical_path({rank: a.steps for rank, a in analyses.items()})
    return run
