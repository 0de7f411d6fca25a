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

from statistics import fmean

from trainadvisor.analysis.summary import window_samples
from trainadvisor.records import FixOutcome, HostSample, RawRun, Run

# Other processes' CPU, averaged over a window, from which that window is called disturbed.
DISTURBED_MIN_CORES = 0.5


def other_cores(samples: list[HostSample]) -> float | None:
    """The CPU other processes used, in cores, averaged over the samples (None without any)."""
    return fmean(s.other_cpu_pct for s in samples) / 100.0 if samples else None


def disturbance_note(samples: list[HostSample], window: str, cpu_count: int | None) -> str | None:
    """A note for the report when other processes used `DISTURBED_MIN_CORES` or more during the
    window named by `window` ("the baseline window"), given its samples; else None."""
    cores = other_cores(samples)
    if cores is None or cores < DISTURBED_MIN_CORES:
        return None
    of = f" (of the machine's {cpu_count})" if cpu_count else ""
    return (
        f"Other processes used {cores:.1f} cores{of} during {window}: its timings may be "
        "disturbed; measure again on a quiet machine."
    )


def run_note(raw: RawRun | None, window: str, cpu_count: int | None) -> str | None:
    """`disturbance_note` for the samples inside a run's timed window."""
    if raw is None:
        return None
    return disturbance_note(window_samples(raw, raw.host_samples), window, cpu_count)


def disturbance_notes(baseline: Run, outcomes: list[FixOutcome], after: Run | None) -> list[str]:
    """The notes for every disturbed window of a `profile` run: the baseline's, each fix's
    trials', and the confirmation run's."""
    cpu_count = baseline.raw.device.cpu_count if baseline.raw.device else None
    notes = [run_note(baseline.raw, "the baseline window", cpu_count)]
    for outcome in outcomes:
        notes += [
            run_note(trial.raw, f"the window of {outcome.fix}'s trial {trial.label}", cpu_count)
            for trial in outcome.trials
        ]
    notes.append(run_note(after.raw if after else None, "the confirmation run's window", cpu_count))
    return [note for note in notes if note]
