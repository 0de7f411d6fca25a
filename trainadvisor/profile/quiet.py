"""A gain judged as a quiet machine would measure it (issue 36: "on a busy or changing machine,
no fix is kept that a quiet machine would not keep").

Beside other busy processes a loop's steps hold the time its thread waited for a CPU (runnable,
not running: `HostSample.main_queued_pct`, read from the kernel's run-queue count), and one
setting can wait far more than another: a loop that reads its samples in its main thread waits
at every wake-up, where DataLoader workers do their waiting outside the step's path. The fix
then gains under the load and not without it. A drift in time cancels in adjacent windows;
this does not, as it is the load acting on one setting more than on another.

A confirmation is judged a second time with the steps of the script's own setting less its
main thread's waits (`without_waits`), taken out only of the runs during whose own window other
processes used LOAD_MIN_CORES or more (the waits a script's own threads and workers cause in a
quiet window are the script's). The fix's run is taken as measured: its waits need not lie on
its steps' path (a loop fed by workers waits for a CPU after a batch came while they load the
next), and taking them out kept, beside a test suite's load, a workers fix a quiet machine
measures no gain for. So the estimate only ever makes a gain smaller, never larger: it can take
a kept verdict away, never give one. A gain that does not hold there is inconclusive, with the
waits and the load named. Where a loaded run's waits were not read (a window shorter than
MIN_SAMPLES ticks, no `schedstat`: another OS; under torchrun the sampled process is the
launcher), the runs are judged as measured, as before the waits were read."""

from __future__ import annotations

from dataclasses import replace
from statistics import fmean

from trainadvisor.analyze.run.disturbance import disturbed_cores
from trainadvisor.analyze.run.summary import window_samples
from trainadvisor.records import Run

# Fewer host samples (0.1 s apart) inside a window than this, and its waits are not known.
MIN_SAMPLES = 3
# Other processes' CPU over a window from which its loop's waits for a CPU are taken as theirs: a
# quarter of a core, many times a machine's daemons (a few percent of one). Less than the half a
# core from which the report calls a window disturbed: one busy process sharing the loop's core
# takes half of that core, and its samples read 0.3-0.6 cores.
LOAD_MIN_CORES = 0.25
# A share read as all of the time (a tick late) is taken as this: a loop that ran 1% of it.
MAX_SHARE = 0.99


def queued_share(run: Run) -> float | None:
    """The share of its timed steps the run's main thread waited for a CPU, averaged over the
    host samples inside its window; None where fewer than MIN_SAMPLES were read."""
    inside = [s.main_queued_pct for s in window_samples(run.raw, run.raw.host_samples)]
    read = [pct for pct in inside if pct is not None]
    return min(MAX_SHARE, fmean(read) / 100.0) if len(read) >= MIN_SAMPLES else None


def load(run: Run) -> float | None:
    """The cores other processes used during the run's window, where LOAD_MIN_CORES or more."""
    return disturbed_cores(window_samples(run.raw, run.raw.host_samples), LOAD_MIN_CORES)


def disturbed(run: Run) -> bool:
    """Whether other processes used LOAD_MIN_CORES or more during the run's window."""
    return load(run) is not None


def readable(runs: list[Run]) -> bool:
    """Whether the waits of every disturbed run among `runs` were read, and of one at least; not
    under torchrun (the process sampled is the launcher, whose waits are not the ranks')."""
    if any(run.raw.ranks for run in runs):
        return False
    shares = [queued_share(run) for run in runs if disturbed(run)]
    return bool(shares) and all(share is not None for share in shares)


def without_waits(run: Run) -> Run:
    """The run as a quiet machine would have measured it where other processes disturbed its
    window: every rate divided by the share of the time its main thread was not waiting for a
    CPU. Unchanged where its window was quiet or its waits were not read."""
    share = (queued_share(run) or 0.0) if disturbed(run) else 0.0
    if share <= 0.0:
        return run
    scale = 1.0 / (1.0 - share)
    return replace(
        run,
        steps_per_s=run.steps_per_s * scale if run.steps_per_s else run.steps_per_s,
        samples_per_s=run.samples_per_s * scale if run.samples_per_s else run.samples_per_s,
        window_steps_per_s=[rate * scale for rate in run.window_steps_per_s],
    )


def load_cores(runs: list[Run]) -> float | None:
    """The most CPU, in cores, other processes used during any of the runs' windows, where that
    reached LOAD_MIN_CORES in one of them; None where none did."""
    cores = [c for c in map(load, runs) if c is not None]
    return max(cores) if cores else None


def waits(named: dict[str, Run], cores: float) -> str:
    """The load and the waits of each run it disturbed, in words: "other processes used 1.6
    cores, and the training loop waited for a CPU 47% of its time in the baseline window and 45%
    of its time in the script's own setting measured again after the trials"."""
    parts = [
        f"{100 * share:.0f}% of its time {label}"
        for label, run in named.items()
        if disturbed(run) and (share := queued_share(run)) is not None
    ]
    listed = ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else "".join(parts)
    return f"other processes used {cores:.1f} cores, and the training loop waited for a CPU {listed}"
