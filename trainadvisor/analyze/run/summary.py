"""From a raw run to measurements: per-run statistics, the step-time breakdown, throughput per
window, and the flat table of named measurements that rules are written against. Pure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypeVar

from trainadvisor.analyze.run.critical_path import critical_measurements, with_cause
from trainadvisor.analyze.run.energy import run_energy
from trainadvisor.analyze.run.measures import runtime_measurements, trace_measurements
from trainadvisor.analyze.run.ranks import rank_measurements, rank_oom
from trainadvisor.analyze.run.shapes import traced_whole
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.compute.mfu import utilization
from trainadvisor.frameworks.vocab import loop_call
from trainadvisor.memory.peak import memory_measurements, step_memory
from trainadvisor.records import LoaderInfo, RawRun, Run, Stats, StepRecord, timed_steps

T = TypeVar("T")

# Steps per throughput window, at least: the spread of a speedup is taken over windows of this
# many steps, and of at least WINDOW_MIN_S where the run timed enough steps.
WINDOW_STEPS = 5
WINDOW_MIN_S = 0.1

# A window's CUDA-event step times stand for its host ones where they add up to the same window
# within this share (both span it from the drained start to the drained end; a gap says the
# events do not cover the same steps).
GPU_CLOCK_AGREEMENT = 0.05

BREAKDOWN_KEYS = ("data_wait", "h2d_copy", "compute")
# the steps of a trace `analyze` read: its ProfilerStep markers, or the iterations found in it
TRACED = "trace"
# An @advise-decorated function's steps: the loop's time outside the function, a part of its own
OUTSIDE_CALL = "outside_call"
NO_LOADER = "no DataLoader was seen: input time is part of the step"
# The main DataLoader's measurements: name -> LoaderInfo field.
LOADER_MEASUREMENTS = {
    "dataloader_index": "index",
    "num_workers": "num_workers",
    "batch_size": "batch_size",
    "pin_memory": "pin_memory",
    "persistent_workers": "persistent_workers",
    "prefetch_factor": "prefetch_factor",
    "iterable_dataset": "iterable_dataset",
    "dataloader_call_site": "created_at",
    "dataset_class": "dataset_class",
}


def percentile(values: list[float], pct: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def stats(values: list[float]) -> Stats:
    if not values:
        return Stats(None, None, None, None, None)
    return Stats(
        median=percentile(values, 50),
        p90=percentile(values, 90),
        mean=sum(values) / len(values),
        min=min(values),
        max=max(values),
    )


def attach_trace(raw: RawRun, out_dir: Path, script: Path | None = None) -> dict[str, Any]:
    """Copy the device-side per-step facts of the run's trace onto its step records; returns
    the trace's measurements (call sites resolved against the script's folder)."""
    if not raw.trace_file:
        return {}
    sources = (script.resolve().parent,) if script else ()
    analysis = analyze_trace(out_dir / raw.trace_file, sources, last_step=traced_whole(raw) or None)
    # ProfilerStep#N is the N-th step since the profiler started (#0: its warmup step, not
    # recorded); a trace without step markers is one window and is copied onto no step.
    profiled = [s for s in raw.steps if s.profiled]
    for traced in analysis.steps if analysis.steps_marked else []:
        if 0 <= traced.number < len(profiled):
            profiled[traced.number].h2d_copy_ms = traced.h2d_ms
            profiled[traced.number].trace_step = traced.number
    return trace_measurements(analysis)


def input_shapes_fixed(raw: RawRun) -> bool | None:
    """Whether every step drew batches of the same shapes (from the batch fingerprints)."""
    shapes = {
        ",".join(part.split(":")[0] for part in fingerprint.split(","))
        for fingerprint in raw.batch_fingerprints
        if fingerprint
    }
    return len(shapes) == 1 if shapes else None


def step_durations_ms(raw: RawRun) -> list[float]:
    """The timed steps' durations: on a GPU, the times between the CUDA events recorded at their
    boundaries, where every step has one and they add up to the window's host time; else the
    host's. Where the host runs ahead of the GPU, its clock sees each step as the time to queue
    it and the last one as the whole queue's drain (the window ends drained): the steps' own
    times, their spread and the windows' throughputs are the GPU's."""
    steps = timed_steps(raw)
    host = [s.step_ms for s in steps]
    device = [s.gpu_ms for s in steps]
    host_ms = sum(host)
    if not steps or any(ms is None for ms in device):
        return host
    device_ms = [float(ms or 0.0) for ms in device]
    return device_ms if abs(sum(device_ms) - host_ms) <= GPU_CLOCK_AGREEMENT * host_ms else host


def window_size(raw: RawRun, durations: list[float]) -> int:
    """Steps per throughput window: at least WINDOW_STEPS, two rounds of the workers (N workers
    deliver batches in bursts of about N), and WINDOW_MIN_S long where the timed steps make four
    windows of that (at GPU speed five steps are a few milliseconds: their spread is the timer's)."""
    workers = max((loader.num_workers for loader in raw.loaders), default=0)
    durations = sorted(durations)
    by_time = 0
    if durations and durations[len(durations) // 2] > 0:
        by_time = min(math.ceil(WINDOW_MIN_S * 1e3 / durations[len(durations) // 2]), len(durations) // 4)
    return max(WINDOW_STEPS, 2 * workers, by_time)


def window_throughputs(raw: RawRun, durations: list[float] | None = None) -> list[float]:
    """Steps per second in consecutive windows of `window_size` steps (a short tail is dropped
    unless it is the only window); `durations`: the timed steps' (`step_durations_ms`), where
    the caller has them already."""
    durations = step_durations_ms(raw) if durations is None else durations
    window_steps = window_size(raw, durations)
    windows = [
        durations[i : i + window_steps]
        for i in range(0, len(durations), window_steps)
        if len(durations[i : i + window_steps]) == window_steps
    ] or ([durations] if durations else [])
    return [len(w) / (sum(w) / 1e3) for w in windows if sum(w) > 0]


def drained_batches(steps: list[StepRecord]) -> int:
    """How many of the timed `steps` ran on batches their workers had loaded before the window:
    the batches waiting at the first step's draw less those at the last's, where that fell (0
    where it held or grew, or was not told). A window's pace counts only the rest, what the
    workers kept up with: beside a busy core their queue swung from 0 to 15 batches and back
    within a second (8 workers, 64 images a batch, 5 ms an image), one-second windows read up to 28
    steps/s where the workers loaded 20 a second, and 8 workers looked as fast as 16."""
    if len(steps) < 2 or steps[0].ready_batches is None or steps[-1].ready_batches is None:
        return 0
    return min(max(steps[0].ready_batches - steps[-1].ready_batches, 0), len(steps) - 1)


def summarize(raw: RawRun) -> Run:
    """Timing from the timed steps; device-side copy time (only in the trace) from the traced
    steps, as a mean per step."""
    steps = timed_steps(raw)
    durations = step_durations_ms(raw)
    # the steps the trace recorded (not the profiler's warmup step); all traced ones in runs
    # saved before steps carried their trace step
    traced = [s for s in raw.steps if s.trace_step is not None] or [s for s in raw.steps if s.profiled]
    total_ms = sum(s.step_ms for s in steps)
    per_step = _breakdown(raw, steps, traced)
    mean_ms = total_ms / len(steps) if steps else 0.0
    samples = [s.samples for s in steps]
    gpu_ms = [s.gpu_ms for s in steps if s.gpu_ms is not None]  # CUDA events, on a GPU
    kept = 1.0 - drained_batches(steps) / len(steps) if steps else 1.0  # the window's own pace
    steps_per_s = kept * len(steps) / (total_ms / 1e3) if total_ms > 0 else None
    gpu_name = raw.device.gpu_name if raw.device is not None else None
    return Run(
        label=raw.label,
        steps=len(steps),
        step_time_ms=stats(durations),
        steps_per_s=steps_per_s,
        samples_per_s=(
            kept * sum(n for n in samples if n is not None) / (total_ms / 1e3)
            if steps and total_ms > 0 and all(n is not None for n in samples)
            else None
        ),
        breakdown_pct={k: 100.0 * v / mean_ms for k, v in per_step.items()} if mean_ms else {},
        breakdown_ms_per_step=per_step,
        window_steps_per_s=[kept * rate for rate in window_throughputs(raw, durations)],
        raw=raw,
        gpu_step_time_ms=stats(gpu_ms) if gpu_ms else None,
        utilization=utilization(raw.runtime, gpu_name, steps_per_s),
        memory=step_memory(raw.runtime),
        energy=run_energy(raw),
    )


def _breakdown(raw: RawRun, steps: list[StepRecord], traced: list[StepRecord]) -> dict[str, float]:
    """Milliseconds per step: data wait (inside DataLoader `__next__`; not a part where no
    DataLoader was seen, whose input time is part of the step), host-to-device copies, the time
    outside an @advise-decorated function (where steps are its calls), and the rest."""
    if not steps:
        return {}
    mean = sum(s.step_ms for s in steps) / len(steps)
    h2d = sum(s.h2d_copy_ms for s in traced) / len(traced) if traced else 0.0
    parts = {"data_wait": sum(s.data_wait_ms for s in steps) / len(steps)} if raw.loaders else {}
    parts["h2d_copy"] = h2d
    outside = [s.outside_call_ms for s in steps if s.outside_call_ms is not None]
    if outside:
        parts[OUTSIDE_CALL] = sum(outside) / len(steps)
    parts["compute"] = max(mean - sum(parts.values()), 0.0)
    return parts


def input_note(run: Run) -> str | None:
    """Where the run's input time is, when no DataLoader was seen (None: one was)."""
    if run.raw.loaders or not run.steps:
        return None
    note = f"{NO_LOADER[0].upper()}{NO_LOADER[1:]} (data wait is timed inside DataLoader `__next__`)"
    if OUTSIDE_CALL in run.breakdown_pct:
        note += (
            f"; {run.breakdown_pct[OUTSIDE_CALL]:.0f}% of the step was spent outside the decorated "
            "function (the loop's input and whatever else it runs between calls)"
        )
    return note + "."


def window_samples(raw: RawRun, samples: list[T]) -> list[T]:
    """The host or GPU samples taken while the timed steps ran."""
    window_ms = sum(s.step_ms for s in timed_steps(raw))
    return [s for s in samples if 0 <= s.t_ms <= window_ms]  # type: ignore[attr-defined]


def main_loader(raw: RawRun) -> LoaderInfo | None:
    """The DataLoader that fed the profiled steps: the one that served most batches in the window."""
    used = [loader for loader in raw.loaders if loader.batches_in_window > 0]
    return max(used, key=lambda loader: loader.batches_in_window) if used else None


def named_measurements(run: Run) -> dict[str, Any]:
    """The flat table rules are evaluated against, for `profile`, `@advise` and `analyze` alike;
    a name absent here is 'not measured'. Measurements from the trace come first (`run.trace`);
    a run the script's own process watched adds what only that process saw (torch's state, the
    exact CUDA memory statistics, its DataLoaders, the sampled CPU), its clock-timed steps
    replacing the traced ones; a trace `analyze` read gives its own steps' times and breakdown
    (`step_source` "trace")."""
    raw = run.raw
    watched = raw.step_source != TRACED
    table: dict[str, Any] = dict(run.trace)
    if watched:
        table.update(runtime_measurements(raw.runtime))
        if (raw.step_source == "optimizer" and raw.runtime.get("optimizers")) or (
            raw.step_source == "backward" and raw.steps
        ):
            # The run's own hooks ended its steps at its optimizer's step (or at backward passes):
            # a training loop, whatever a trace that holds none of them (one the script's end cut)
            # would say. Not where a step is a decorated function's (@advise): an inference
            # function called between training steps would see their optimizer step too.
            table.update(training_loop=True, inference_loop=False)
        table["input_shapes_fixed"] = input_shapes_fixed(raw)
        table.update(rank_measurements(run.ranks))
        table.update(rank_oom(raw))
        table.update(critical_measurements(run.critical_path))
        with_cause(table, run.critical_path)
    table.update({
        "steps": run.steps,
        "step_time_ms_median": run.step_time_ms.median,
        "step_time_ms_mean": run.step_time_ms.mean,
        "step_time_ms_p90": run.step_time_ms.p90,
        "steps_per_s": run.steps_per_s,
        "samples_per_s": run.samples_per_s,
    })  # fmt: skip
    table.update(_watched(run, table) if watched else _traced(run))
    return {k: v for k, v in table.items() if v is not None}


def _traced(run: Run) -> dict[str, Any]:
    """A trace's share of each part of the step (kernels, copies, communication, data wait,
    idle, ...) and its data wait per step."""
    table: dict[str, Any] = {f"{key}_pct": pct for key, pct in run.breakdown_pct.items()}
    table["data_wait_ms_per_step"] = run.breakdown_ms_per_step.get("data_wait")
    return table


def _watched(run: Run, table: dict[str, Any]) -> dict[str, Any]:
    """What only the script's own process saw: the clock-timed breakdown, the machine, the
    framework and DataLoader that built the loop, one step's memory, the counted FLOPs against
    the peak, and the CPU sampled in the window."""
    raw, added = run.raw, dict[str, Any]()
    for key in (*BREAKDOWN_KEYS, OUTSIDE_CALL):
        if key in run.breakdown_pct:
            added[f"{key}_pct"] = run.breakdown_pct[key]
            added[f"{key}_ms_per_step"] = run.breakdown_ms_per_step[key]
    if not raw.loaders and run.steps:  # no DataLoader wait to stall on (rules read it as zero)
        added.update(data_wait_pct=0.0, data_wait_ms_per_step=0.0)
    backwards = sorted(s.backwards for s in timed_steps(raw) if s.backwards)
    if backwards:  # gradient accumulation: backward() calls per optimizer step
        added["backwards_per_step"] = backwards[len(backwards) // 2]
        added["backwards_even"] = backwards[0] == backwards[-1]
    if raw.device is not None:
        added["cpu_count"] = raw.device.cpu_count
        added["cuda_used"] = raw.device.cuda_used
    framework = loop_call(raw)
    if framework is not None:  # the framework that built the loop: advice in its terms
        added["framework"] = framework.framework
    loader = main_loader(raw)
    added["dataloaders"] = len(raw.loaders)
    if loader is not None:
        added.update({name: getattr(loader, field) for name, field in LOADER_MEASUREMENTS.items()})
    added.update(memory_measurements(run.memory))
    use = run.utilization
    if use is not None:  # FLOPs of the step against the hardware's peak (compute.mfu)
        added.update(mfu_pct=use.mfu_pct, achieved_tflops=use.achieved_tflops, peak_tflops=use.peak_tflops)
    inside = window_samples(raw, raw.host_samples)
    workers = [h.workers_cpu_pct for h in inside]
    main = [h.main_cpu_pct for h in inside]
    if main:
        added["main_process_cpu_pct"] = sum(main) / len(main)
        added["workers_cpu_pct"] = sum(workers) / len(workers)
        added.update(_cores({**table, **added}, [h.other_cpu_pct for h in inside]))
    return added


def _cores(table: dict[str, Any], other: list[float]) -> dict[str, float]:
    """How the machine's cores were shared in the window, from the sampled CPU: the cores the
    DataLoader workers kept busy, the cores left to them (neither the training process's nor
    other processes'), and the share of all cores busy."""
    cores = table.get("cpu_count")
    if not cores:
        return {}
    main, workers = table["main_process_cpu_pct"] / 100.0, table["workers_cpu_pct"] / 100.0
    others = sum(other) / len(other) / 100.0 if other else 0.0
    return {
        "workers_busy_cores": workers,
        "free_cores": max(cores - main - others, 0.0),
        "cpu_busy_pct": 100.0 * (main + workers + others) / cores,
    }
