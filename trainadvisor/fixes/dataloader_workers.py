"""Fix `dataloader-workers`: load batches in worker processes, with the worker count measured.

The search doubles `num_workers` from twice the current count while each step up gains at least
`STEP_GAIN`, up to `max_workers` (four per core, at least 8, at most 32). Loading bound by CPU
stops near the core count; loading bound by storage or network latency keeps scaling far past
it: when the last trial's workers were mostly waiting (each busy less than `WAITING_BUSY` of a
core, from the sampled CPU of the worker processes), the doubling goes on up to `HARD_CAP`, as
long as the workers' sampled memory (RSS) for twice as many fits in half of the memory
available. The report says why the search stopped. Every candidate keeps workers alive across
epochs (`persistent_workers=True`);
the best count is then tried with `prefetch_factor=4`. On a CUDA run every candidate also pins
memory and makes the host-to-device copies of pinned batches non-blocking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes import codechange
from trainadvisor.fixes.common import KEEP_MIN_SPEEDUP, LoaderSetting, Setting, overrides
from trainadvisor.records import Overrides, Trial

STEP_GAIN = 1.10  # a doubling of workers must bring 10% more throughput to go on
PREFETCH_GAIN = 1.05  # a deeper prefetch is kept only for 5% more throughput
PREFETCH = 4
HARD_CAP = 64  # workers, whatever the samples say
WAITING_BUSY = 0.5  # share of a core below which a worker counts as waiting, not computing
MEMORY_SHARE = 0.5  # of the memory available that twice the workers may take


def max_workers(cpu_count: int) -> int:
    return min(32, max(8, 4 * cpu_count))


def _worker_load(trial: Trial) -> tuple[float, float] | None:
    """(share of a core each worker was busy, RSS bytes per worker) in the trial's window."""
    samples = [h for h in (trial.raw.host_samples if trial.raw else []) if h.workers and h.t_ms >= 0]
    if not samples:
        return None
    busy = sum(h.workers_cpu_pct / 100.0 / h.workers for h in samples) / len(samples)
    rss = sum(h.workers_rss_bytes / h.workers for h in samples) / len(samples)
    return busy, rss


def next_count(values: dict[str, Any], last: Trial, workers: int) -> tuple[int | None, str]:
    """After a trial that gained: the next worker count to try, or None and why the search
    stops there."""
    ceiling = max_workers(values.get("cpu_count", 1))
    if workers * 2 <= ceiling:
        return workers * 2, ""
    load = _worker_load(last)
    if load is None:
        return None, f"stopped at {workers} workers, four per core (the workers' CPU was not sampled)"
    busy, rss = load
    if busy >= WAITING_BUSY:
        return None, (
            f"stopped at {workers} workers, four per core: each was busy {100 * busy:.0f}% of a "
            "core (loading bound by CPU)"
        )
    if workers * 2 > HARD_CAP:
        return (
            None,
            f"stopped at the hard cap of {HARD_CAP} workers (each was busy {100 * busy:.0f}% of a core)",
        )
    available = float(values.get("memory_available_bytes") or 0.0)
    if available and rss * workers * 2 > MEMORY_SHARE * available:
        return None, (
            f"stopped at {workers} workers: {workers * 2} would take about "
            f"{rss * workers * 2 / 1e9:.1f} GB of the {available / 1e9:.1f} GB available"
        )
    return workers * 2, ""


class DataLoaderWorkers(LoaderSetting):
    id = "dataloader-workers"
    bound_by = "data_wait_pct"

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if "dataloader_call_site" not in values:
            return "no torch DataLoader fed the profiled steps, so there is nothing to tune"
        if values["num_workers"] * 2 > HARD_CAP:
            return (
                f"the DataLoader already has {values['num_workers']} workers, the most this "
                "search tries: make loading itself cheaper instead"
            )
        return None

    def expected_trials(self, values: dict[str, Any]) -> int:
        """The doublings up to four workers per core, and the deeper prefetch."""
        workers, ceiling, count = (
            max(2, 2 * int(values.get("num_workers") or 0)),
            max_workers(int(values.get("cpu_count") or 1)),
            1,
        )
        while workers * 2 <= ceiling:
            workers, count = workers * 2, count + 1
        return count + 1

    def _setting(self, values: dict[str, Any], workers: int, prefetch: int | None) -> Setting:
        cuda = bool(values.get("cuda_used"))
        loader: dict[str, Any] = {"num_workers": workers, "persistent_workers": True}
        label = f"num_workers={workers}"
        if prefetch is not None:
            loader["prefetch_factor"] = prefetch
            label += f", prefetch_factor={prefetch}"
        if cuda:
            loader["pin_memory"] = True
        # Keyed by the DataLoader(...) call site: a loader rebuilt every epoch gets it every time.
        return Setting(label, overrides({values["dataloader_call_site"]: loader}, non_blocking_h2d=cuda))

    @staticmethod
    def _workers(trial: Trial) -> int:
        return int(trial.overrides.loader()["num_workers"])

    @staticmethod
    def _prefetch(trial: Trial) -> bool:
        return "prefetch_factor" in trial.overrides.loader()

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        if not trials:
            return self._setting(values, max(2, 2 * values["num_workers"]), None)
        last = trials[-1]
        if last.status != "measured" or self._prefetch(last):
            return None  # refused, failed or changed training: more workers will not do better
        count, _ = self._doubling(values, trials)
        if count is not None:
            return self._setting(values, count, None)
        measured = [t for t in trials if t.status == "measured" and t.steps_per_s]
        best = max(measured, key=lambda t: t.steps_per_s or 0.0)
        return self._setting(values, self._workers(best), PREFETCH)

    def _doubling(self, values: dict[str, Any], trials: list[Trial]) -> tuple[int | None, str]:
        """After the last plain trial: the next count, or None and why the doubling stops."""
        plain = [t for t in trials if not self._prefetch(t)]
        last = plain[-1]
        if last.status != "measured":
            return None, f"stopped: {last.label} {last.status.replace('_', ' ')}"
        earlier = [t.steps_per_s or 0.0 for t in plain[:-1] if t.status == "measured"]
        best_before = max([*earlier, values.get("steps_per_s") or 0.0])
        workers = self._workers(last)
        if (last.steps_per_s or 0.0) < STEP_GAIN * best_before:
            return None, (
                f"stopped at {workers} workers: they gained less than {100 * (STEP_GAIN - 1):.0f}% "
                "over the best before them"
            )
        return next_count(values, last, workers)

    def search_note(self, trials: list[Trial], values: dict[str, Any]) -> str | None:
        if not any(not self._prefetch(t) for t in trials):
            return None
        return self._doubling(values, trials)[1] or None

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        baseline_steps_per_s = float(values.get(self.metric) or 0.0)
        measured = [t for t in trials if t.status == "measured" and t.steps_per_s]
        if not measured:
            return None
        best = max(measured, key=lambda t: t.steps_per_s or 0.0)
        if self._prefetch(best):
            plain = [t for t in measured if not self._prefetch(t)]
            same = [t for t in plain if self._workers(t) == self._workers(best)]
            if same and (best.steps_per_s or 0.0) < PREFETCH_GAIN * (same[0].steps_per_s or 0.0):
                best = same[0]
        if (best.steps_per_s or 0.0) < KEEP_MIN_SPEEDUP * baseline_steps_per_s:
            return None
        return best

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        return codechange.loader_change(source, script, overrides)

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        parts = [f"{key}={value}" for key, value in trial.overrides.loader().items()]
        if trial.overrides.non_blocking_h2d:
            parts.append("non_blocking=True host-to-device copies")
        return ", ".join(parts)
