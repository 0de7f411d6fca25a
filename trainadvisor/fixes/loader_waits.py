"""What a window of DataLoader workers showed: the share of its timed steps the loop spent
waiting for a batch and the part of it more workers could hide, the workers' CPU and memory, and
the cores the window kept busy; and what the baseline's loaders showed (how busy, how long a
batch took each).

A step whose batch the workers had loaded before the loop asked for it
(`training.loaders.loaded_ahead`) still waits for its hand-over: the batch received through the
workers' result queue and rebuilt in the training process, at the pace the training process gets
a core. More workers cannot make that shorter; they can only load sooner the batches that were
not loaded yet. Measured on 2 cores with the slow-input example (64 images a batch): at 16 workers
and at 32 every step's batch was loaded ahead, and the loop still "waited" 29-31% of each step,
about 2 ms (the median; the slowest tenth 3-4 ms) of a 7-8 ms step; 32 workers ran no faster
than 16. At 8 workers 71% of the steps found theirs loaded, and the rest waited up to 12 ms.
So the waits more workers could hide are those of the steps that found no batch loaded, less the
hand-over they pay too (the median wait of the steps that found theirs loaded). A batch loaded
counts only where it was the one the loop needed (`training.loaders.served_ahead`): torch serves
batches in order, and one queued ahead of its turn leaves the loop waiting for the worker whose
batch is next. Counted as loaded, such waits (4 images a batch, 15 ms an image: 98% of the steps
at 8 workers, 1.8 ms each) stopped the search at 8 workers, where 16 ran 26% faster."""

from __future__ import annotations

import statistics
from typing import Any

from trainadvisor.records import DISTURBED_MIN_CORES, StepRecord, Trial, other_cores

# At least this many timed steps that found their batches loaded ahead, for the median of their
# waits to stand for the hand-over (fewer: every wait counts as one more workers could hide).
MIN_LOADED_STEPS = 5


def _timed(trial: Trial) -> list[StepRecord]:
    return [step for step in (trial.raw.steps if trial.raw else []) if not step.profiled]


def wait_share(trial: Trial) -> float | None:
    """The share of the trial's timed steps the loop spent waiting for its next batch."""
    steps = _timed(trial)
    total_ms = sum(step.step_ms for step in steps)
    return sum(step.data_wait_ms for step in steps) / total_ms if total_ms > 0 else None


def loaded_share(trial: Trial) -> float | None:
    """The share of the trial's timed steps (of those where it could be told) whose batches the
    workers had loaded before the loop asked; None where it could be told for none."""
    told = [step.loaded_ahead for step in _timed(trial) if step.loaded_ahead is not None]
    return sum(told) / len(told) if told else None


def handover_ms(trial: Trial) -> float | None:
    """A batch's hand-over from its worker: the median wait of the timed steps whose batches
    were loaded ahead; None where fewer than MIN_LOADED_STEPS were."""
    waits = [step.data_wait_ms for step in _timed(trial) if step.loaded_ahead]
    return statistics.median(waits) if len(waits) >= MIN_LOADED_STEPS else None


def hideable_share(trial: Trial) -> float | None:
    """The share of the trial's timed steps that more workers could hide: the waits of the steps
    that found no batch loaded ahead (or could not tell), less the hand-over each pays
    (`handover_ms`, where it is known)."""
    steps, wait = _timed(trial), wait_share(trial)
    if wait is None:
        return None
    handover = handover_ms(trial) or 0.0
    hidden_ms = sum(max(0.0, step.data_wait_ms - handover) for step in steps if not step.loaded_ahead)
    return hidden_ms / sum(step.step_ms for step in steps)


def worker_load(trial: Trial) -> tuple[float, float] | None:
    """(share of a core each worker was busy, bytes of memory each worker takes) in the trial's
    timed window: each worker's own memory (USS, `measure.sampling.OwnMemory`) where it was read
    there, else its RSS, which counts the pages it shares with the training process too."""
    samples = [h for h in (trial.raw.host_samples if trial.raw else []) if h.workers and h.t_ms >= 0]
    if not samples:
        return None
    busy = sum(h.workers_cpu_pct / 100.0 / h.workers for h in samples) / len(samples)
    own = [h.worker_uss_bytes for h in samples if h.worker_uss_bytes is not None]
    if own:
        return busy, sum(own) / len(own)
    return busy, sum(h.workers_rss_bytes / h.workers for h in samples) / len(samples)


def cores_busy(trial: Trial, values: dict[str, Any]) -> float | None:
    """The share of the machine's cores (`cpu_count`) busy in the trial's window: the training
    process's sampled CPU, its workers' and every other process's (the baseline's `cpu_busy_pct`,
    for a trial's window; None where nothing was sampled). Where the process may use fewer cores
    than the machine has, this reads low: a deeper prefetch is then tried, never wrongly skipped."""
    samples = [h for h in (trial.raw.host_samples if trial.raw else []) if h.t_ms >= 0]
    cores = int(values.get("cpu_count") or 0)
    if not samples or cores <= 0:
        return None
    busy_pct = sum(h.main_cpu_pct + h.workers_cpu_pct + h.other_cpu_pct for h in samples) / len(samples)
    return busy_pct / 100.0 / cores


def shared(trial: Trial) -> float | None:
    """Other processes' cores in the trial's window where they reached DISTURBED_MIN_CORES, else
    None. Beside them the loop's steps slow while their batches wait (its threads queue for a
    core), and what it waited on its input no longer tells what more workers gain: beside a busy
    core, 8 workers (64 images a batch, 5 ms an image, 2 cores) left the loop waiting 8% of its
    steps, steps of 10-200 ms with 9-14 batches queued, and 16 ran 1.65x as fast (19-20 against
    29-35 steps/s, the script by itself)."""
    cores = other_cores([h for h in (trial.raw.host_samples if trial.raw else []) if h.t_ms >= 0])
    return cores if cores is not None and cores >= DISTURBED_MIN_CORES else None


def baseline_shared(values: dict[str, Any]) -> bool:
    """Whether other processes used DISTURBED_MIN_CORES or more in the baseline's window: its busy
    cores (`cpu_busy_pct`) less the training process's and its workers'."""
    busy_pct, cores = values.get("cpu_busy_pct"), int(values.get("cpu_count") or 0)
    ours_pct = float(values.get("main_process_cpu_pct") or 0.0) + float(values.get("workers_cpu_pct") or 0.0)
    if busy_pct is None or cores <= 0:
        return False
    return (float(busy_pct) * cores - ours_pct) / 100.0 >= DISTURBED_MIN_CORES


def little_left(last: Trial, workers: int, step_gain: float) -> str:
    """Why the doubling stops at `last`: what its loop waited, and the part of it more workers
    could hide (`hideable_share`), too little for the `step_gain` they must bring."""
    wait, hidden = wait_share(last) or 0.0, hideable_share(last) or 0.0
    gain = f"{100 * (step_gain - 1):.0f}%"
    said = (
        f"stopped at {workers} workers: the loop waited on its input for {100 * wait:.0f}% of its steps there"
    )
    handover, loaded = handover_ms(last), loaded_share(last)
    if handover is None or loaded is None or wait - hidden < 0.005:
        return f"{said}, too little for more workers to gain the {gain} they must bring"
    return (
        f"{said}, but {100 * loaded:.0f}% of its steps found their batch loaded ahead and waited "
        f"{handover:.1f} ms (the median) for its hand-over from the worker, which more workers cannot "
        f"hide; the {100 * hidden:.0f}% left is too little for them to gain the {gain} they must bring"
    )


def baseline_loader_busy(values: dict[str, Any], current: int) -> float | None:
    """The share of a core each of the script's own loaders was busy in the baseline's window:
    its workers' sampled CPU, or, with none, the training process's CPU less what its steps'
    compute could have used outside the wait (all its cores: an overestimate, so that a loader
    bound by CPU is never read as waiting), over the wait's share."""
    wait_pct = values.get("data_wait_pct")
    if wait_pct is None or wait_pct <= 0:
        return None
    if current:
        workers_pct = values.get("workers_cpu_pct")
        return None if workers_pct is None else workers_pct / 100.0 / current
    main_pct, cores = values.get("main_process_cpu_pct"), int(values.get("cpu_count") or 1)
    if main_pct is None:
        return None
    wait = min(wait_pct / 100.0, 1.0)
    return max(main_pct / 100.0 - (1.0 - wait) * cores, 0.0) / wait


def batch_load_s(values: dict[str, Any], current: int) -> float | None:
    """How long one of the baseline's loaders took per batch: the loop's wait a step where the
    training process loaded (each step one batch), else `current` steps' time a worker."""
    if not current:
        wait_ms = values.get("data_wait_ms_per_step")
        return float(wait_ms) / 1e3 if wait_ms else None
    steps_per_s = values.get("steps_per_s")
    return current / float(steps_per_s) if steps_per_s else None
