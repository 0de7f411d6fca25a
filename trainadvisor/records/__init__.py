"""The plain data that flows through the pipeline:

    profile -> RawRun -> Run (measurements) -> [Finding] -> FixPlan -> FixOutcome -> Comparison
    -> Report

Every class here is a dataclass of plain values, saved as JSON (see `_serial`).

May import: _version."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, Literal

from trainadvisor._version import __version__
from trainadvisor.records.across_ranks import CriticalPath
from trainadvisor.records.compute import Utilization
from trainadvisor.records.energy import Energy
from trainadvisor.records.memory import Memory

# 2: two results under one header (`kind`: profile or analyze), with producer, producer_version
# and run_id; `records.upgrade` reads version 1. CHANGELOG.md tells each version's changes.
SCHEMA_VERSION = 2
PRODUCER = "trainadvisor"
ReportKind = Literal["profile", "analyze"]

# The words a report uses, in one place.
Severity = Literal["high", "medium", "low"]
# A run of the script: the window measured | the script ended first (maybe before the window was
# full) | it raised or exited non-zero | a requested DataLoader override could not be applied.
RunStatus = Literal["window_complete", "script_ended", "script_failed", "refused"]
# A candidate setting's run: measured | its override refused | the run failed | the loss changed.
TrialStatus = Literal["measured", "refused", "failed", "changed_training"]
# A fix: kept (confirmed faster, training unchanged) | recommended (a memory fix, from its own
# runs) | no_gain | changed_training | refused | failed | not_applicable | unconfirmed (chosen by
# its trials, faster there; no confirmation run measured it) | not_run (the run ended before its
# trials) | needs_restart (@advise: measured only by the `profile` command it names) |
# opportunity (faster, but it changes what is learned: measured and shown, never applied) |
# redundant (faster alone, but the other kept fixes without it were as fast as with it) |
# inconclusive (faster in fresh runs, but the machine's speed changed between them and the
# script's own setting measured next to them, `profile.pace.machine_changed`: neither kept nor
# rejected, no change given).
FixStatus = Literal[
    "kept", "recommended", "no_gain", "changed_training", "refused", "failed", "not_applicable",
    "unconfirmed", "not_run", "needs_restart", "opportunity", "redundant", "inconclusive",
]  # fmt: skip


# ---- what a run changes in the script's process to try a fix ----


@dataclass(frozen=True)
class Overrides:
    # DataLoader(...) arguments by the "file:line" of the call that built the loader
    loaders: dict[str, dict[str, Any]] = field(default_factory=dict)
    non_blocking_h2d: bool = False  # copy the DataLoader's (pinned) batches without blocking
    # switches by name: tf32, cudnn_benchmark (bool); amp ("bf16" | "fp16"); fused_optimizer
    # (bool); grad_accumulation (micro-batches per update); optimizer_foreach_off (bool)
    runtime: dict[str, Any] = field(default_factory=dict)

    def merged(self, other: Overrides) -> Overrides:
        """Both runs' changes in one (the confirmation run of several kept fixes)."""
        loaders = {site: dict(arguments) for site, arguments in self.loaders.items()}
        for site, arguments in other.loaders.items():
            loaders.setdefault(site, {}).update(arguments)
        return Overrides(
            loaders, self.non_blocking_h2d or other.non_blocking_h2d, {**self.runtime, **other.runtime}
        )

    def buffered_batches(self) -> int:
        """Batches the DataLoader workers hold ready (workers x prefetch_factor): consumed inside
        a window, that buffer would pass for speed."""
        return sum(
            int(loader.get("num_workers", 0)) * int(loader.get("prefetch_factor", 2))
            for loader in self.loaders.values()
        )

    def workers(self) -> int:
        """Worker processes across the DataLoaders these overrides set."""
        return sum(int(loader.get("num_workers", 0)) for loader in self.loaders.values())

    def loader(self) -> dict[str, Any]:
        """The arguments set on the one DataLoader a fix tunes ({} when none)."""
        return next(iter(self.loaders.values()), {})


def merge_overrides(all_overrides: list[Overrides]) -> Overrides:
    merged = Overrides()
    for overrides in all_overrides:
        merged = merged.merged(overrides)
    return merged


# ---- what one child process measured (written by the child, completed by the parent) ----


@dataclass
class StepRecord:
    """One training step inside the profiled window."""

    index: int  # 0-based count of steps since the script started
    start_ms: float  # since the window started
    step_ms: float  # wall time from the previous step boundary to this one
    data_wait_ms: float  # time spent inside DataLoader `__next__`
    h2d_copy_ms: float = 0.0  # host-to-device copy time in the step (from the trace)
    samples: int | None = None  # first dimension of the batch(es) drawn in the step
    loss: float | None = None  # last scalar `.backward()` was called on in the step
    profiled: bool = False  # traced by torch.profiler (not used for timing: it adds overhead)
    # from the step's start to its first backward(): data, forward and loss, but not the
    # gradient all-reduce a data-parallel rank waits in for the others
    pre_backward_ms: float | None = None
    # GPU time between this step's boundaries, from CUDA events (timed steps of a GPU run): the
    # host clock's step_ms can differ by how far the host ran ahead of the GPU's queue
    gpu_ms: float | None = None
    trace_step: int | None = None  # its ProfilerStep#N in the run's trace, when it was recorded
    # an @advise-decorated function's step: the time from the previous call's end to this call,
    # less DataLoader waits (the loop around the function: its input where it has no
    # DataLoader, and whatever else runs there, such as a framework's backward and optimizer step)
    outside_call_ms: float | None = None
    backwards: int = 0  # backward() calls in the step (gradient accumulation: one per micro-step)
    # every batch the step drew was loaded and waiting when asked for, the one it needed among
    # them (`training.loaders.served_ahead`): its wait was the hand-over only; None: not told
    loaded_ahead: bool | None = None
    # the batches the workers had loaded and waiting when the step drew its own (summed over its
    # loaders; `training.loaders.ready_batches`); None: not told
    ready_batches: int | None = None


@dataclass
class WindowShape:
    """How a window's steps were spent: its warm-up (until step time settled, or a cap), its timed
    steps, and why they stopped where they did."""

    warmup_steps: int
    warmup_s: float
    # why the warm-up ended: "settled" (consecutive blocks agreed, `measure.settle`), "count"
    # (a fixed count, no steadiness test), "time cap" (it had not settled by the longest warm-up
    # allowed), "settle cap" (a trial's: not settled within its cap from the baseline's settling,
    # `profile.pace`), "raced" (a trial's: it lost its race, `measure.race`), "step cap" (the
    # steps the script has left were needed for the timed ones)
    warmup_end: str
    block_ms: list[float] = field(default_factory=list)  # time per step of each warm-up block
    timed_s: float = 0.0
    # why the timed steps ended: "plan" (the minimum steps and time both reached), "step cap"
    # (the steps the script has left), "script ended" (the script finished inside the window),
    # "raced" (a trial's: it lost its race, `measure.race`)
    timed_end: str = "plan"
    min_time_s: float = 0.0  # the timed steps were to last at least this long
    # timed steps moved into the warm-up because the loop changed speed while they were timed
    # (the warm-up had settled on a plateau); counted in warmup_steps too
    slid_steps: int = 0
    # of warmup_s, the settling after the counted warm-up steps (the blocks); None: not known (a
    # count, or saved before it was). A fresh run's warmup_s holds the script's set-up too.
    settle_s: float | None = None


@dataclass
class LoaderInfo:
    """One `DataLoader` the script built, in creation order, with any override applied."""

    index: int
    created_at: str  # file:line of the DataLoader(...) call in the user's code
    dataset_class: str
    iterable_dataset: bool
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    start_method: str | None  # multiprocessing start method the workers would use
    collate_fn: str | None  # qualified name of a user collate_fn, None for the default
    batches_in_window: int = 0
    overrides_applied: dict[str, Any] = field(default_factory=dict)
    override_refused: str | None = None  # why a requested override was not applied
    length: int | None = None  # batches per pass (len(loader)); None: it has no length
    # A loader built inside a training framework (transformers, accelerate, lightning): the
    # framework, and the file:line of the loader it was built from (accelerate's prepare()
    # wraps the user's DataLoader), "" for a loader of the user's own.
    framework: str = ""
    origin_site: str = ""
    # the dataset object's identity in the script's process: a loader built anew every epoch
    # builds over the same dataset at one site, a train and an eval loader built at one line (a
    # helper function's) over two; None: not known (saved before it was)
    dataset_id: int | None = None


@dataclass
class FrameworkCall:
    """A training framework's settings object the script built (a transformers
    `TrainingArguments`, a Lightning `Trainer`, an `Accelerator`): where, from what, and the
    current values of the settings a fix may change."""

    framework: str  # "transformers", "lightning" or "accelerate"
    name: str  # the class built: "TrainingArguments", "Trainer", "Accelerator"
    site: str  # file:line in the user's code of the call (or of the parser call that built it)
    # where the values come from: "code" (the call's arguments), "command line", "json" or
    # "yaml" (HfArgumentParser, LightningCLI), "dict" (HfArgumentParser.parse_dict)
    source: str = "code"
    config_file: str = ""  # the JSON/YAML file the values were read from
    inside: str = ""  # the framework whose code built it (the Accelerator a transformers Trainer makes)
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunLength:
    """How many training steps the script takes, as far as it is known: exactly where a training
    framework's settings say (max_steps, or epochs x the loader's batches) or a run of the script
    ended by itself; otherwise only that it takes at least the steps a run was seen to take."""

    total_steps: int | None  # None: not known
    source: str  # how it is known, in words
    seen_steps: int = 0  # the most steps a run of the script was seen to take


@dataclass
class HostSample:
    t_ms: float  # since the window started (negative: before it)
    main_cpu_pct: float
    workers_cpu_pct: float
    main_rss_bytes: int
    workers_rss_bytes: int
    workers: int
    # CPU of every process outside the profiled tree and trainadvisor's own, in percent of one
    # core (150.0: 1.5 cores busy elsewhere); 0.0 in reports saved before it was sampled
    other_cpu_pct: float = 0.0
    # where that was half a core or more: the busiest of those processes, "name (pid N)" -> cores
    other_processes: dict[str, float] = field(default_factory=dict)
    # of the time since the last tick, the share the script's main thread waited for a CPU
    # (runnable, not running: the kernel's run-queue wait), in percent; None: not read (the
    # first tick, no /proc/<pid>/task/<pid>/schedstat, or saved before it was sampled)
    main_queued_pct: float | None = None
    # one DataLoader worker's own memory (USS: the pages no other process maps), read from one
    # worker in turn every `measure.sampling.USS_EVERY_S`; None: not read at this tick
    worker_uss_bytes: int | None = None


# Other processes' CPU, averaged over a window, from which that window is called disturbed
# (`analyze.run.disturbance`) and its loop's waits no longer tell what more DataLoader workers
# gain (`fixes.loader_waits.shared`).
DISTURBED_MIN_CORES = 0.5


def other_cores(samples: list[HostSample]) -> float | None:
    """The CPU other processes used, in cores, averaged over the samples (None without any)."""
    return fmean(s.other_cpu_pct for s in samples) / 100.0 if samples else None


@dataclass
class GpuSample:
    t_ms: float
    util_pct: float | None  # None where the GPU does not report it (a MIG instance)
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_w: float | None
    sm_clock_mhz: int | None
    device: str | None = None  # which GPU: "GPU 0", or the rank's under torchrun
    # processes on this GPU that are not the run's (pids of this machine's namespace; None: unknown)
    other_pids: list[int] | None = None
    energy_mj: int | None = None  # NVML's energy counter, since the driver loaded (None: no counter)


@dataclass
class DeviceInfo:
    torch_version: str
    python_version: str
    cpu_count: int
    cuda_used: bool
    cuda_version: str | None = None
    gpu_name: str | None = None


@dataclass
class RawRun:
    """Everything one run of the script measured. Status is one of:
    `window_complete` (the window was measured), `script_ended` (the script finished, maybe
    before the window was full), `script_failed` (it raised or exited non-zero), `refused` (a
    requested DataLoader override could not be applied, so the run was stopped)."""

    label: str
    status: RunStatus
    exit_code: int | None
    error: str | None
    warmup_steps: int
    window_steps: int
    profile_steps: int
    steps_seen: int
    steps: list[StepRecord]
    loaders: list[LoaderInfo]
    device: DeviceInfo | None
    window_start_unix_s: float | None = None
    losses: list[float | None] = field(default_factory=list)  # by step index, warmup included
    # by step index: a content hash of the host tensors the step drew from DataLoaders
    batch_fingerprints: list[str | None] = field(default_factory=list)
    trace_file: str | None = None  # relative to the report folder
    host_samples: list[HostSample] = field(default_factory=list)
    gpu_samples: list[GpuSample] = field(default_factory=list)
    nvml_status: str = "not sampled"
    overrides: Overrides = field(default_factory=Overrides)  # what this run changed to try a fix
    wall_s: float = 0.0
    log_file: str | None = None  # script output, when it was captured rather than shown
    # torch's state read in the child at the window: flags, optimizer, CUDA memory statistics
    runtime: dict[str, Any] = field(default_factory=dict)
    ended_unix_s: float | None = None  # when the child last wrote this (its failure, say)
    # what ended each step: "optimizer" (the first torch.optim optimizer's step()),
    # "trainadvisor.step()", "backward" (a loop without any optimizer), what @advise decorated;
    # "trace": a trace `analyze` read, its steps those the trace shows (no process was watched)
    step_source: str = "optimizer"
    rank: int | None = None  # under torchrun: this run's global rank
    frameworks: list[FrameworkCall] = field(default_factory=list)  # the training frameworks' settings built
    ranks: list[RawRun] = field(default_factory=list)  # under torchrun: every rank's run
    shape: WindowShape | None = None  # how the window's steps were spent (None: saved before it was)


# ---- measurements: a summarised run ----


@dataclass
class Stats:
    median: float | None
    p90: float | None
    mean: float | None
    min: float | None
    max: float | None


@dataclass
class RankStats:
    """One rank of a torchrun run, summarised (see analysis.ranks)."""

    rank: int
    status: RunStatus
    error: str | None
    steps: int
    step_time_ms_mean: float | None
    pre_backward_ms_mean: float | None
    data_wait_ms_mean: float | None
    communication_pct: float | None = None  # from the rank's trace
    communication_overlap_pct: float | None = None
    # its trace's collectives per step (`analyze.trace.phases`): in all, exposed (no compute
    # beside them), torchtitan's overlap efficiency, and [ms, exposed ms] by kind, by the phase
    # that launched them and by process group
    collective_ms_per_step: float | None = None
    collective_exposed_ms_per_step: float | None = None
    overlap_efficiency_pct: float | None = None
    collectives_by_kind: dict[str, list[float]] = field(default_factory=dict)
    collectives_by_phase: dict[str, list[float]] = field(default_factory=dict)
    collectives_by_group: dict[str, list[float]] = field(default_factory=dict)
    # its counted step's memory (`memory.step`): the peak, and under FSDP the parameters it
    # holds sharded and those gathered at that peak
    peak_bytes: int | None = None
    sharded_parameter_bytes: int | None = None
    gathered_parameter_bytes: int | None = None


@dataclass
class Run:
    """A run as the report shows it: the summary keys of report.json's `baseline`/`after`
    plus the raw run it was computed from."""

    label: str
    steps: int
    step_time_ms: Stats
    steps_per_s: float | None
    samples_per_s: float | None
    breakdown_pct: dict[str, float]
    breakdown_ms_per_step: dict[str, float]
    window_steps_per_s: list[float]
    raw: RawRun
    trace: dict[str, Any] = field(default_factory=dict)  # measurements from the run's trace
    ranks: list[RankStats] = field(default_factory=list)  # under torchrun: every rank
    # on a GPU: the timed steps by CUDA events (the GPU's clock), beside the host's step_time_ms
    gpu_step_time_ms: Stats | None = None
    utilization: Utilization | None = None  # FLOPs per step, achieved FLOP/s, MFU
    memory: Memory | None = None  # one step's peak and what fills it
    energy: Energy | None = None  # the GPUs' energy over the timed steps (None: saved before it was)
    critical_path: CriticalPath | None = None  # under torchrun: who gates the steps, and why


# ---- diagnosis ----


@dataclass
class Evidence:
    measurement: str
    label: str
    value: Any
    unit: str = ""


@dataclass
class Finding:
    rule: str
    title: str
    severity: Severity
    message: str
    evidence: list[Evidence]
    fixes: list[str]
    recommendation: str
    anti_pattern: str
    best_practice: str
    threshold_source: str


# ---- fixing ----


@dataclass
class PlannedFix:
    """A fix a finding proposed, and whether it can be tried on this run."""

    fix: str
    rule: str
    applicable: bool
    reason: str  # why not, when it is not applicable


@dataclass
class Trial:
    """One candidate setting of a fix, run and measured."""

    label: str
    overrides: Overrides
    status: TrialStatus
    steps_per_s: float | None
    reason: str | None
    raw: RawRun | None = None
    samples_per_s: float | None = None


@dataclass
class LossCheck:
    """Whether training stayed the same. With the same batches (same fingerprints) every step's
    loss must agree; with different batches (random augmentation drawn in worker processes,
    say) only the mean loss over the shared steps can be compared."""

    steps_compared: int
    max_abs_diff: float | None
    max_rel_diff: float | None
    tolerance_rel: float
    equivalent: bool | None  # None: no loss was captured, so nothing could be compared
    same_batches: bool | None = None  # None: the batches could not be fingerprinted
    mean_rel_diff: float | None = None  # of the mean loss over the shared steps
    baseline: list[float | None] = field(default_factory=list)
    after: list[float | None] = field(default_factory=list)
    # under torchrun: the ranks whose losses were compared, rank by rank (each rank trains on its
    # own batches), and the rank whose loss changed most where training changed
    ranks_compared: int = 0
    changed_rank: int | None = None


@dataclass
class Comparison:
    speedup: float | None  # throughput, after / baseline, in `unit`
    speedup_low: float | None  # 10th percentile of after windows / 90th of baseline windows
    speedup_high: float | None  # 90th percentile of after windows / 10th of baseline windows
    windows: int
    loss_check: LossCheck
    unit: str = "steps/s"  # or "samples/s" (where the batch size changed)
    # what the after run changed, each "fix: the setting in words"
    contains: list[str] = field(default_factory=list)
    # the after run's timed steps, and why there were no more where the script's end or its
    # length cut them short ("" when its window was complete as planned)
    timed_steps: int = 0
    cut: str = ""


@dataclass
class FixOutcome:
    fix: str
    rule: str
    status: FixStatus
    reason: str
    settings: Overrides  # the kept (or recommended) fix's overrides; empty otherwise
    trials: list[Trial]
    chosen: str = ""  # the settings measured best, in words ("num_workers=8, ...")
    diff: str = ""  # the change to the user's script that makes the fix permanent (unified diff)
    # the change as the framework's setting, in words: the arguments of TrainingArguments(...),
    # or the command-line flags / config keys when the values come from there
    setting_change: str = ""
    search: str = ""  # why the search over candidates stopped where it did
    mode: str = ""  # how its trials ran: "in_process" (windows of one run) or "restart"
    mode_reason: str = ""  # why they restarted the script, when they did
    # its own measured gain: the chosen trial against the baseline (in trial windows, the faster
    # of the two windows that bracket them), in `unit`; low: its slow windows against the
    # baseline's fast ones (the gain's lower bound over windows)
    gain: float | None = None
    gain_low: float | None = None
    unit: str = "steps/s"
    # in trial windows, on top of the other chosen fixes: all of them with it / without it
    added_gain: float | None = None
    compile_s: float | None = None  # fix `compile`: the time compiling took, once per run
    break_even_steps: int | None = None  # fix `compile`: steps after which compiling has paid
    # the chosen trial's peak memory (on a GPU the allocator's reserved peak, else the counted
    # step's measured peak): what the fix does to memory, for every fix (mixed precision too)
    peak_bytes: int | None = None


@dataclass
class TrialWindow:
    """One window of the baseline's process: the baseline's own, a trial, or the baseline's
    setting measured again after the trials (the bracket that shows drift)."""

    label: str
    fix: str  # "" for the baseline's setting
    setting: str
    status: str
    steps_per_s: float | None
    samples_per_s: float | None
    started_s: float | None  # since the baseline window started
    steps: int


@dataclass
class Report:
    """The header every report.json has, whichever command wrote it: what ran, on what, what the
    rules found. Its two results are `ProfileReport` (a script measured, its fixes tried) and
    `AnalyzeReport` (saved traces read); `kind` says which. `baseline`: profile's run of the
    script as it is; analyze's first trace, as a run. Written as each stage finishes, so a run
    that is interrupted leaves the report of what it measured."""

    schema_version: int
    command: list[str]
    script: str
    environment: DeviceInfo | None
    baseline: Run | None
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    # how the run was measured (the warm-up, the bracket around trial windows, where trials ran):
    # shown in report.md and report.html; `notes` are the caveats, shown in the terminal too
    details: list[str] = field(default_factory=list)
    kind: ReportKind = "profile"
    producer: str = PRODUCER
    producer_version: str | None = __version__  # None: upgraded from version 1, which had none
    # the same for two runs of the same code, arguments and environment (`records.identity`);
    # None: upgraded from version 1
    run_id: str | None = None
    # sha256 of what ran: the script's bytes (analyze: the traces' summaries); None: version 1
    content_digest: str | None = None
    workload: str | None = None  # --workload: what the run trains, as its user names it


@dataclass
class ProfileReport(Report):
    """`profile`'s (and `@advise`'s) result: the fixes planned, each one's trials and outcome,
    and the confirmation run with its comparison. Fixes it did not get to are `not_run`."""

    kind: ReportKind = "profile"
    after: Run | None = None
    plan: list[PlannedFix] = field(default_factory=list)
    fix_outcomes: list[FixOutcome] = field(default_factory=list)
    applied_fixes: list[str] = field(default_factory=list)
    speedup: float | None = None
    comparison: Comparison | None = None
    # on a GPU: how far the loss of the same seeded steps moved between two identical runs
    # (atomics-based kernels sum in varying order); loss tolerances are set above it
    loss_noise_rel: float | None = None
    # every measuring window of the run kept alive for trials, in order
    trial_windows: list[TrialWindow] = field(default_factory=list)


@dataclass
class AnalyzeReport(Report):
    """`analyze`'s result: each trace's measurements, and the per-rank comparison when the
    traces are of several ranks."""

    kind: ReportKind = "analyze"
    traces: list[Any] = field(default_factory=list)
    ranks: Any = None


def fix_outcomes_of(report: Report) -> list[FixOutcome]:
    """A profile's fixes, each with its outcome; an analysis of traces has none."""
    return report.fix_outcomes if isinstance(report, ProfileReport) else []


def after_of(report: Report) -> Run | None:
    """A profile's confirmation run, with the kept fixes; an analysis of traces has none."""
    return report.after if isinstance(report, ProfileReport) else None


def timed_steps(raw: RawRun) -> list[StepRecord]:
    """The steps timed with clocks alone; the traced steps after them carry profiler overhead."""
    return [s for s in raw.steps if not s.profiled]
