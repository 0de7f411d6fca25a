"""Whether other processes on the machine took CPU while a window was measured (issue 16, "a busy
machine"): a baseline timed beside a busy loop looks slower than it is, and every fix measured
against it looks better than it is.

The sampler (`measure.sampling`) records, with every host sample, the CPU the machine spent
outside the profiled process tree and trainadvisor's own processes (`HostSample.other_cpu_pct`).
A window is called disturbed when that averaged over the window reaches `DISTURBED_MIN_CORES`:
half a core is more than the noise of a machine's daemons (a few percent of one core) and, on a
machine whose cores the script keeps busy (the main process and its DataLoader workers), enough
to take a core's time from it for a good part of the window."""

from __future__ import annotations

from typing import Any

from trainadvisor.analyze.run.summary import window_samples
from trainadvisor.records import DISTURBED_MIN_CORES, FixOutcome, HostSample, RawRun, Run, other_cores


def disturbed_cores(samples: list[HostSample], min_cores: float = DISTURBED_MIN_CORES) -> float | None:
    """Other processes' CPU in cores over a window's samples, where it reached `min_cores` (by
    default, where it disturbed the window)."""
    cores = other_cores(samples)
    return cores if cores is not None and cores >= min_cores else None


def busiest(samples: list[HostSample], top: int = 3) -> dict[str, float]:
    """The processes named as busiest in the samples, with the most cores each was seen using."""
    seen: dict[str, float] = {}
    for sample in samples:
        for name, cores in sample.other_processes.items():
            seen[name] = max(seen.get(name, 0.0), cores)
    return dict(sorted(seen.items(), key=lambda item: -item[1])[:top])


def disturbance_note(
    disturbed: dict[str, float], cpu_count: int | None, named: dict[str, float] | None = None
) -> str | None:
    """One note for the report naming every disturbed window ("the baseline window") and the
    cores other processes used during it, and the busiest of those processes; None when no
    window was disturbed."""
    if not disturbed:
        return None
    of = f" (of the machine's {cpu_count})" if cpu_count else ""
    if named:
        who = "busiest: " + ", ".join(f"{name} {cores:.1f} cores" for name, cores in named.items())
    else:
        who = "none of them visible from here: another container's, or the host's"
    if len(disturbed) == 1:
        ((window, cores),) = disturbed.items()
        return (
            f"Other processes used {cores:.1f} cores{of} during {window} ({who}): its timings "
            "may be disturbed; measure again on a quiet machine."
        )
    windows = [f"{window} ({cores:.1f} cores)" for window, cores in disturbed.items()]
    return (
        f"Other processes used CPU{of} during {', '.join(windows[:-1])} and {windows[-1]} ({who}): "
        "their timings may be disturbed; measure again on a quiet machine."
    )


def disturbance_notes(baseline: Run, outcomes: list[FixOutcome], after: Run | None) -> list[str]:
    """The note on the disturbed windows of a `profile` run, if any: the baseline's, each fix's
    trials', the confirmation run's."""
    runs: dict[str, RawRun | None] = {"the baseline window": baseline.raw}
    for outcome in outcomes:
        runs.update({f"{outcome.fix}'s trial {trial.label}": trial.raw for trial in outcome.trials})
    runs["the confirmation run's window"] = after.raw if after else None
    disturbed, samples = {}, []
    for window, raw in runs.items():
        inside = window_samples(raw, raw.host_samples) if raw else []
        cores = disturbed_cores(inside)
        if cores is not None:
            disturbed[window] = cores
            samples += inside
    cpu_count = baseline.raw.device.cpu_count if baseline.raw.device else None
    note = disturbance_note(disturbed, cpu_count, busiest(samples))
    threads = threads_note(baseline.raw.runtime.get("intra_op_threads"), disturbed, cpu_count)
    gpu = gpu_note({window: gpu_intruders(raw) for window, raw in runs.items() if raw})
    return [n for n in (note, threads, gpu) if n]


def threads_note(threads: Any, disturbed: dict[str, float], cpu_count: int | None) -> str | None:
    """Where other processes disturbed a window and the training process ran more of torch's
    intra-op threads (`torch.get_num_threads()`, read in the baseline window) than the cores they
    left it, a note saying so, and what to try where the machine stays shared; None elsewhere.
    A parallel op waits for its slowest thread, and a thread sharing a core with a busy process
    waits for its turn: `benchmarks/busy_threads.py` measured a loop fed by DataLoader workers
    1.5-2.6x faster on one thread than on torch's two beside one busy core of 2 (1.03-1.10x
    quietly). Not a fix: its gain is the load's, and a quiet machine would not keep it."""
    if not disturbed or not cpu_count or not isinstance(threads, int) or threads < 2:
        return None
    cores = max(disturbed.values())
    left = cpu_count - cores
    if threads <= left:
        return None
    fewer = max(1, int(left))
    return (
        f"The training process ran {threads} of torch's intra-op threads on the machine's {cpu_count} "
        f"cores while other processes used up to {cores:.1f} of them: a parallel op waits for its "
        "slowest thread, and a thread that shares a core with a busy process waits for its turn. Not "
        f"measured here: where this machine stays shared, torch.set_num_threads({fewer}) at the "
        "start of the script may make each step faster (on a quiet machine, keep torch's default)."
    )


def gpu_intruders(raw: RawRun) -> dict[str, list[int]]:
    """Per GPU, the processes other than the run's that used it during the window (NVML)."""
    found: dict[str, set[int]] = {}
    for sample in window_samples(raw, raw.gpu_samples):
        if sample.other_pids:
            found.setdefault(sample.device or "the GPU", set()).update(sample.other_pids)
    return {device: sorted(pids) for device, pids in found.items()}


def gpu_note(intruders: dict[str, dict[str, list[int]]]) -> str | None:
    """One note naming the windows during which another process ran on a GPU of the run."""
    named = [
        f"{window} ({'; '.join(_pids(device, pids) for device, pids in gpus.items())})"
        for window, gpus in intruders.items()
        if gpus
    ]
    if not named:
        return None
    return (
        f"Other processes ran on the GPU during {', '.join(named)}: kernels of theirs share the GPU "
        "with the script's, so those timings may be disturbed; measure again with the GPU to itself."
    )


def _pids(device: str, pids: list[int]) -> str:
    return f"{device}: pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids))}"
