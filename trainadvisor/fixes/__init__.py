"""Fixes: what a rule proposes, turned into settings the rerun applies without editing the
script. A fix is a search policy over candidate settings; the pipeline measures each candidate
and hands the results back (`next_candidate`), then `choose` picks the one to keep. Policies
are pure: only the pipeline runs processes."""

from __future__ import annotations

from typing import Any, Protocol

from trainadvisor.fixes.batch_size import BatchSize
from trainadvisor.fixes.dataloader_workers import DataLoaderWorkers
from trainadvisor.fixes.grad_accumulation import GradAccumulation, peak_reserved
from trainadvisor.fixes.switches import Amp, CudnnBenchmark, FusedOptimizer, PinMemory, Tf32
from trainadvisor.model import Finding, PlannedFix, Trial


class Fix(Protocol):
    id: str
    metric: str  # what a candidate must improve: steps_per_s, samples_per_s, peak_reserved_bytes
    loss_tolerance_rel: float  # how far the loss may move for training to count as the same

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        """Why the fix cannot be tried on this run, or None."""

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Any:
        """The next setting to measure given the trials so far, or None when done."""

    def choose(self, trials: list[Trial], baseline: float) -> Trial | None:
        """The trial worth keeping (baseline: the baseline's `metric`), or None when none is."""

    def describe(self, trial: Trial) -> str:
        """The chosen settings in words, e.g. 'num_workers=8, persistent_workers=True'."""


REGISTRY: dict[str, Fix] = {
    fix.id: fix
    for fix in (
        DataLoaderWorkers(), PinMemory(), BatchSize(), Amp(), Tf32(), FusedOptimizer(), CudnnBenchmark(),
        GradAccumulation(),
    )
}  # fmt: skip


NO_GAIN = "no candidate was at least 5% faster than the baseline"


def no_gain(fix: Fix) -> str:
    """Why none of a fix's measured candidates was kept, in the terms of what it improves."""
    return str(getattr(fix, "no_gain", NO_GAIN))


def goal(fix_id: str) -> str:
    """throughput (kept when confirmed faster) or memory (recommended from its own trials)."""
    return getattr(REGISTRY.get(fix_id), "goal", "throughput")


def trial_value(trial: Trial, metric: str) -> float | None:
    if metric == "peak_reserved_bytes":
        peak = peak_reserved(trial)
        return float(peak) if peak is not None else None
    value = getattr(trial, metric, None)
    return float(value) if value is not None else None


def plan(findings: list[Finding], values: dict[str, Any]) -> list[PlannedFix]:
    """One planned fix per fix id proposed by the findings, in finding order."""
    planned: dict[str, PlannedFix] = {}
    for finding in findings:
        for fix_id in finding.fixes:
            if fix_id in planned:
                continue
            fix = REGISTRY.get(fix_id)
            if fix is None:
                planned[fix_id] = PlannedFix(
                    fix_id, finding.rule, False, "no fix of this id is known to trainadvisor"
                )
                continue
            reason = fix.not_applicable(values)
            planned[fix_id] = PlannedFix(fix_id, finding.rule, reason is None, reason or "")
    return list(planned.values())


def merge_overrides(settings: list[dict[str, Any]]) -> dict[str, Any]:
    """The overrides of several kept fixes as one rerun configuration."""
    merged: dict[str, Any] = {"loaders": {}, "non_blocking_h2d": False, "runtime": {}}
    for overrides in settings:
        for index, loader in overrides.get("loaders", {}).items():
            merged["loaders"].setdefault(index, {}).update(loader)
        merged["non_blocking_h2d"] |= bool(overrides.get("non_blocking_h2d"))
        merged["runtime"].update(overrides.get("runtime", {}))
    return merged
