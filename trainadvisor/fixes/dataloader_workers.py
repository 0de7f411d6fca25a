"""Fix `dataloader-workers`: load batches in worker processes, with the worker count measured.

The search doubles `num_workers` from twice the current count while each step up gains at least
`STEP_GAIN`, up to `max_workers` (four per core, at least 8, at most 32: loading bound by I/O
latency keeps scaling past the core count, loading bound by CPU stops near it, and the search
finds which). Every candidate keeps workers alive across epochs (`persistent_workers=True`);
the best count is then tried with `prefetch_factor=4`. On a CUDA run every candidate also pins
memory and makes the host-to-device copies of pinned batches non-blocking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor import codechange
from trainadvisor.fixes.common import Fix, Setting, overrides
from trainadvisor.judge import KEEP_MIN_SPEEDUP
from trainadvisor.records import Overrides, Trial

STEP_GAIN = 1.10  # a doubling of workers must bring 10% more throughput to go on
PREFETCH_GAIN = 1.05  # a deeper prefetch is kept only for 5% more throughput
PREFETCH = 4


def max_workers(cpu_count: int) -> int:
    return min(32, max(8, 4 * cpu_count))


class DataLoaderWorkers(Fix):
    id = "dataloader-workers"

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if "dataloader_call_site" not in values:
            return "no torch DataLoader fed the profiled steps, so there is nothing to tune"
        if values["num_workers"] * 2 > max_workers(values.get("cpu_count", 1)):
            return (
                f"the DataLoader already has {values['num_workers']} workers, the most this "
                "search tries on this machine: make loading itself cheaper instead"
            )
        return None

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
        ceiling = max_workers(values.get("cpu_count", 1))
        if not trials:
            return self._setting(values, max(2, 2 * values["num_workers"]), None)
        last = trials[-1]
        if last.status != "measured":
            return None  # refused, failed or changed training: more workers will not do better
        measured = [t for t in trials if t.status == "measured" and t.steps_per_s]
        if self._prefetch(last):
            return None
        previous = [t.steps_per_s for t in measured[:-1]] + [values.get("steps_per_s") or 0.0]
        gained = (last.steps_per_s or 0.0) >= STEP_GAIN * max(previous)
        workers = self._workers(last)
        if gained and workers * 2 <= ceiling:
            return self._setting(values, workers * 2, None)
        best = max(measured, key=lambda t: t.steps_per_s or 0.0)
        return self._setting(values, self._workers(best), PREFETCH)

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
