"""What `profile` runs: its options, the command that repeats it, and the specification and
measurement of one run of the script (baseline, trial or confirmation)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainadvisor.analysis.kineto import analyze_trace
from trainadvisor.analysis.ranks import rank_stats
from trainadvisor.analysis.summary import attach_trace, summarize
from trainadvisor.measure.runner import RunSpec, measure
from trainadvisor.records import Overrides, RawRun, Run
from trainadvisor.redact import mask_arguments


@dataclass
class ProfileOptions:
    script: Path
    args: list[str]
    out_dir: Path
    warmup: int = 5
    steps: int = 20
    seed: int | None = 0
    rule_dirs: list[Path] = field(default_factory=list)
    run_to_end: bool = False
    apply_fixes: bool = True
    torchrun: list[str] = field(default_factory=list)  # torch.distributed.run options, if any
    timeout_s: float | None = None  # the longest a run may take (a hung rank ends here)
    stall_s: float | None = None  # no step for this long ends a run; None: the watchdog's own limit
    budget_s: float | None = None  # the longest all of profile may take; None: no cap
    only_fixes: list[str] = field(default_factory=list)  # measure only these fixes (--fix)
    trials: str = "auto"  # "auto": windows of one process where they can run; "restart": fresh runs


def reproduce_command(options: ProfileOptions) -> list[str]:
    """The command line that repeats this run, every option spelled out; the values of the
    script's credential-like arguments masked (`redact`): reports are published."""
    command = [
        "trainadvisor",
        "profile",
        "--warmup",
        str(options.warmup),
        "--steps",
        str(options.steps),
        "--out",
        str(options.out_dir),
    ]
    if options.seed is not None:
        command += ["--seed", str(options.seed)]
    for folder in options.rule_dirs:
        command += ["--rules", str(folder)]
    if options.run_to_end:
        command.append("--run-to-end")
    if not options.apply_fixes:
        command.append("--no-fix")
    if options.timeout_s is not None:
        command += ["--timeout", f"{options.timeout_s:g}"]
    if options.stall_s is not None:
        command += ["--stall-timeout", f"{options.stall_s:g}"]
    if options.budget_s is not None:
        command += ["--budget", f"{options.budget_s:g}s"]
    for fix in options.only_fixes:
        command += ["--fix", fix]
    if options.trials != "auto":
        command += ["--trials", options.trials]
    return [*command, *options.torchrun, str(options.script), *mask_arguments(options.args)[0]]


# What every run of the script takes from the command's options.
RUN_OPTIONS = ("script", "args", "out_dir", "warmup", "steps", "seed", "torchrun", "timeout_s", "stall_s")


def spec_for(options: ProfileOptions, label: str, **changes: Any) -> RunSpec:
    shared = {name: getattr(options, name) for name in RUN_OPTIONS}
    return RunSpec(label=label, **{**shared, **changes})


def settle_steps(options: ProfileOptions, overrides: Overrides) -> tuple[int, int]:
    """(warmup, timed steps) of a window that tries a fix. Workers fill up to workers x
    prefetch_factor batches while the first, slow steps run; consumed inside the window, that
    buffer would pass for speed. So the warmup is lengthened by the buffer's depth and the
    window made at least three times as long as it."""
    buffered = overrides.buffered_batches()
    return options.warmup + buffered, max(options.steps, 3 * buffered)


def window_steps(options: ProfileOptions, overrides: Overrides) -> tuple[int, int]:
    """(warmup, timed steps) of a trial window in the baseline's running process. There the
    steps are already at their steady pace when the setting switches, and the new workers start
    with empty buffers: a buffer fills only where the workers outpace the loop, and then stays
    full. What remains is the first round of batches, finished by all workers at about the same
    time: the warmup is lengthened by one batch per worker, and the window spans at least three
    such rounds."""
    workers = overrides.workers()
    return options.warmup + workers, max(options.steps, 3 * workers)


def trial_spec(options: ProfileOptions, label: str, overrides: Overrides, **changes: Any) -> RunSpec:
    """A fresh run of the script that tries a fix."""
    warmup, steps = settle_steps(options, overrides)
    return spec_for(options, label, warmup=warmup, steps=steps, overrides=overrides, **changes)


def confirmation_spec(options: ProfileOptions, overrides: Overrides) -> RunSpec:
    """The fresh run that confirms the chosen settings: the buffer the workers fill while the
    first, slow steps run is drained in its warmup (as in a trial run), and its window holds
    three throughput windows of two rounds of the workers' batches each (the spread the verdict
    is judged on), whatever the prefetch depth."""
    warmup, _ = settle_steps(options, overrides)
    steps = max(options.steps, 6 * overrides.workers())
    return spec_for(options, "after", warmup=warmup, steps=steps, overrides=overrides, show_output=False)


def measure_run(spec: RunSpec) -> Run:
    return run_of(measure(spec), spec)


def run_of(raw: RawRun, spec: RunSpec) -> Run:
    """A measured run summarised, its trace's measurements (every rank's) attached."""
    trace = attach_trace(raw, spec.out_dir, spec.script)
    run = summarize(raw)
    run.trace = trace
    if raw.ranks:
        communication = {}
        for rank in raw.ranks:
            if rank.trace_file and (spec.out_dir / rank.trace_file).is_file():
                analysis = analyze_trace(spec.out_dir / rank.trace_file)
                share = analysis.breakdown_pct.get("communication") if analysis.kernels else None
                communication[rank.rank or 0] = (share, analysis.communication_overlap_pct)
        run.ranks = rank_stats(raw, communication)
    return run
