"""A gain judged as a quiet machine would measure it (issue 36: "on a busy or changing machine,
no fix is kept that a quiet machine would not keep").

Beside other busy processes a loop's steps hold the time its thread waited for a CPU (runnable,
not running: `HostSample.main_queued_pct`, read from the kernel's run-queue count), and one
setting can wait far more than another: a loop that reads its samples in its main thread waits
at every wake-up, where DataLoader workers do their waiting outside the step's path. The fix
then gains under the load and not without it. A drift in time cancels in adjacent windows;
this does not, as it is the load acting on one setting more than on another.

Where other processes used CPU during a compared window (`disturbance.DISTURBED_MIN_CORES`),
the confirmation is judged a second time on each run's steps less its waits
(`without_waits`); a gain that does not hold there is inconclusive, with the waits and the
load named. Only where others were busy: the waits a script's own threads and workers cause
are the script's, and no fix is judged without them. The correction takes out only the main
thread's waits: a setting whose waiting is done by its workers keeps theirs, so it can only
make a fix's gain smaller, never larger."""

from __future__ import annotations

from dataclasses import replace
from statistics import fmean

from trainadvisor.analyze.run.disturbance import disturbed_cores
from trainadvisor.analyze.run.summary import window_samples
from trainadvisor.records import Run

# Fewer host samples (0.1 s apart) inside a window than this, and its waits are not known.
MIN_SAMPLES = 3
# A run whose main thread waited for a CPU more than this share of its time is not scaled
# beyond it (a loop that nearly never ran: its figure without waits would be a guess).
MAX_SHARE = 0.9


def queued_share(run: Run) -> float | None:
    """The share of its timed steps the run's main thread waited for a CPU, averaged over the
    host samples inside its window; None where fewer than MIN_SAMPLES were read."""
    inside = [s.main_queued_pct for s in window_samples(run.raw, run.raw.host_samples)]
    read = [pct for pct in inside if pct is not None]
    return min(MAX_SHARE, fmean(read) / 100.0) if len(read) >= MIN_SAMPLES else None


def without_waits(run: Run) -> Run:
    """The run as a quiet machine would have measured it: every rate divided by the share of
    the time its main thread was not waiting for a CPU (unchanged where that was not read)."""
    share = queued_share(run) or 0.0
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
    disturbed one of them; None where none was disturbed."""
    found = [disturbed_cores(window_samples(run.raw, run.raw.host_samples)) for run in runs]
    cores = [c for c in found if c is not None]
    return max(cores) if cores else None


def waits(named: dict[str, Run], cores: float) -> str:
    """The load and each run's waits, in words: "other processes used 1.6 cores, and the training
    loop waited for a CPU 47% of its time in the baseline window, ... and 2% in the
    confirmation run"."""
    parts = [
        f"{100 * share:.0f}% of its time {label}"
        for label, run in named.items()
        if (share := queued_share(run)) is not None
    ]
    listed = ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else "".join(parts)
    return f"other processes used {cores:.1f} cores, and the training loop waited for a CPU {listed}"
