"""Fix `batch-size`: the DataLoader batch size that gives the most samples per second.

The search doubles the batch size of the DataLoader that fed the steps while each doubling gains
at least `STEP_GAIN` in samples per second, up to `MAX_FACTOR` times the original, and stops at
the first size that fails (out of memory: every candidate runs in a process of its own, so an
OOM ends that trial only and leaves nothing behind) or that reserves more than
`MEMORY_CEILING_PCT` of what its allocator may use. With a memory budget (`--memory-budget`, or
on a GPU what the allocator may use) the search is memory-aware: it doubles while each size's
measured peak fits the budget, whatever the speed, so the report says how large a batch fits
(found by trying) and whether it is faster per sample; on a CPU it runs only against a
`--memory-budget` (the card the run is meant for). A larger batch changes the optimisation, so
the fix is an opportunity (`goal`): the fastest size is measured and reported with the
learning-rate scaling it implies, never applied for the user, and only a loss that diverges rules
a size out."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import (
    KEEP_MIN_SPEEDUP,
    MEAN_LOSS_TOLERANCE_REL,
    NO_GPU,
    Fix,
    Setting,
    baseline_peak,
    cuda_memory,
    overrides,
    trial_peak,
)
from trainadvisor.records import Overrides, Trial

STEP_GAIN = 1.10
MAX_FACTOR = 16
MEMORY_CEILING_PCT = 90.0


def _fits(peak: int | None, budget: int) -> bool:
    """Measured to fit the budget (a peak not measured is not known to fit)."""
    return peak is not None and peak <= budget


def _peak_reserved_pct(trial: Trial) -> float | None:
    """Of what the allocator may use (`gpu.allocator_limit`), or of the card in records
    written before the limit was measured."""
    memory = cuda_memory(trial)
    usable = memory.get("limit_bytes") or memory.get("total_bytes")
    if memory.get("peak_reserved_bytes") is None or not usable:
        return None
    return 100.0 * memory["peak_reserved_bytes"] / usable


class BatchSize(Fix):
    id = "batch-size"
    restarts_because = "the batch size sets the DataLoader's batches, memory and the learning rate's meaning"
    metric = "samples_per_s"
    goal = "opportunity"
    loss_tolerance_rel = MEAN_LOSS_TOLERANCE_REL
    no_gain = "no batch size gave at least 5% more samples per second than the baseline's"

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("cuda_used") and "memory_budget_bytes" not in values:
            return NO_GPU  # on a CPU it is tried against a --memory-budget only
        if "dataloader_call_site" not in values:
            return "no torch DataLoader fed the steps, so trainadvisor cannot change the batch size"
        if not isinstance(values.get("batch_size"), int) or values["batch_size"] < 1:
            return "the DataLoader batches through a batch_sampler; change its batch size in your code"
        return None

    @staticmethod
    def _size(trial: Trial) -> int:
        return int(trial.overrides.loader()["batch_size"])

    def _setting(self, values: dict[str, Any], size: int) -> Setting:
        return Setting(
            f"batch_size={size}", overrides({values["dataloader_call_site"]: {"batch_size": size}})
        )

    def expected_trials(self, values: dict[str, Any]) -> int:
        """Memory-aware (a budget: on a GPU, always), the search doubles while each size fits,
        whatever its speed: every doubling up to `MAX_FACTOR` whose peak, were it to grow as
        fast as the batch, would fit, and the first that would not (it is run to find that out);
        else one, as it stops at the first doubling that does not pay."""
        doublings = int(math.log2(MAX_FACTOR))
        budget, peak = values.get("memory_budget_bytes"), baseline_peak(values)
        if budget is None:
            return 1
        if not peak:
            return doublings
        return min(doublings, int(math.log2(max(budget / peak, 1.0))) + 1)

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        base = int(values["batch_size"])
        if not trials:
            return self._setting(values, 2 * base)
        last = trials[-1]
        if last.status != "measured" or not last.samples_per_s:
            return None  # out of memory or changed training: larger will not do better
        earlier = [t.samples_per_s or 0.0 for t in trials[:-1]] + [values.get("samples_per_s") or 0.0]
        pct = _peak_reserved_pct(last)
        size = self._size(last)
        if 2 * size > MAX_FACTOR * base:
            return None
        budget, peak = values.get("memory_budget_bytes"), trial_peak(last)
        if budget is not None:  # memory-aware: on while it is measured to fit
            return self._setting(values, 2 * size) if _fits(peak, budget) else None
        if last.samples_per_s < STEP_GAIN * max(earlier):
            return None
        if pct is not None and pct > MEMORY_CEILING_PCT:
            return None
        return self._setting(values, 2 * size)

    def search_note(self, trials: list[Trial], values: dict[str, Any]) -> str | None:
        """Against a budget: the largest batch measured to fit it, and the first that did not."""
        from trainadvisor.units import scaled

        budget = values.get("memory_budget_bytes")
        if budget is None:
            return None
        sized = [(self._size(t), t) for t in trials if t.status == "measured" and trial_peak(t) is not None]
        fits = [(size, t) for size, t in sized if (trial_peak(t) or 0) <= budget]
        over = [(size, t) for size, t in sized if (trial_peak(t) or 0) > budget]
        said = []
        if fits:
            size, t = max(fits, key=lambda st: st[0])
            said.append(
                f"batch_size={size} is the largest tried that fits the budget of "
                f"{scaled(budget, 'B', 'kMGT')} (peak {scaled(trial_peak(t) or 0, 'B', 'kMGT')})"
            )
        if over:
            size, t = min(over, key=lambda st: st[0])
            said.append(f"batch_size={size} needs {scaled(trial_peak(t) or 0, 'B', 'kMGT')}")
        unknown = [self._size(t) for t in trials if t.status == "measured" and trial_peak(t) is None]
        if unknown:
            why = "its run ended before the step that measures it"
            said.append(f"batch_size={min(unknown)}'s peak was not measured ({why})")
        failed = [self._size(t) for t in trials if t.status != "measured"]
        if failed:
            said.append(f"batch_size={min(failed)} did not run ({trials[-1].reason or trials[-1].status})")
        return "; ".join(said) or None

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        budget = values.get("memory_budget_bytes")
        measured = [
            t for t in trials
            if t.status == "measured" and t.samples_per_s
            and (budget is None or _fits(trial_peak(t), budget))
        ]  # fmt: skip
        if not measured:
            return None
        best = max(measured, key=lambda t: t.samples_per_s or 0.0)
        baseline = float(values.get(self.metric) or 0.0)
        return best if (best.samples_per_s or 0.0) >= KEEP_MIN_SPEEDUP * baseline else None

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        return codechange.loader_change(source, script, overrides)

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        size = self._size(trial)
        changed = [
            lo for lo in (trial.raw.loaders if trial.raw else []) if "batch_size" in lo.overrides_applied
        ]
        base = changed[0].batch_size if changed else None
        text = f"batch_size={size}"
        if base and size != base:
            factor = size / base
            text += (
                f" (from {base}): scale the learning rate by {factor:g} (linear rule, SGD) or "
                f"{math.sqrt(factor):.2g} (square-root rule, Adam) and warm it up"
            )
        return text
