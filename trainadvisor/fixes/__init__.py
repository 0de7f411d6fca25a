"""Fixes: what a rule proposes, turned into settings a run applies without editing the script.
Each fix is one module here (see `common.Fix`): when it applies, its candidate settings and its
choice among their measured trials, its run-time switch, and its code change. Adding a fix means
one module, its entry in REGISTRY, one rule file listing it and one case in the tests. Policies
are pure: only `profile` runs processes. Their run-time switches share `switches` (autocast, the
optimizer step's control, non-blocking copies) and `flags` (TF32, cuDNN autotuning).

May import: memory (the model's repeated blocks), records, units."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainadvisor.fixes.activation_checkpointing import ActivationCheckpointing
from trainadvisor.fixes.amp import Amp
from trainadvisor.fixes.batch_size import BatchSize
from trainadvisor.fixes.common import NO_GAIN, Fix, Setting, trial_peak
from trainadvisor.fixes.compile import Compile
from trainadvisor.fixes.cudnn_benchmark import CudnnBenchmark
from trainadvisor.fixes.dataloader_workers import DataLoaderWorkers
from trainadvisor.fixes.ddp_settings import DdpSettings
from trainadvisor.fixes.fsdp_mixed_precision import FsdpMixedPrecision
from trainadvisor.fixes.fsdp_settings import FsdpSettings
from trainadvisor.fixes.fused_optimizer import FusedOptimizer
from trainadvisor.fixes.grad_accumulation import GradAccumulation
from trainadvisor.fixes.optimizer_foreach import OptimizerForeach
from trainadvisor.fixes.pin_memory import PinMemory
from trainadvisor.fixes.tf32 import Tf32
from trainadvisor.records import Finding, FixOutcome, Overrides, PlannedFix, Trial, merge_overrides

REGISTRY: dict[str, Fix] = {
    fix.id: fix
    for fix in (
        DataLoaderWorkers(), PinMemory(), BatchSize(), Amp(), Tf32(), FusedOptimizer(), CudnnBenchmark(),
        GradAccumulation(), Compile(), ActivationCheckpointing(), OptimizerForeach(), DdpSettings(),
        FsdpSettings(), FsdpMixedPrecision(),
    )
}  # fmt: skip

__all__ = ["NO_GAIN", "REGISTRY", "Fix", "Overrides", "Setting", "merge_overrides"]


def goal(fix_id: str) -> str:
    """throughput (kept when confirmed faster) or memory (recommended from its own trials)."""
    fix = REGISTRY.get(fix_id)
    return fix.goal if fix is not None else "throughput"


def trial_value(trial: Trial, metric: str) -> float | None:
    if metric == "peak_bytes":
        peak = trial_peak(trial)
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


def install(recorder: Any, overrides: Overrides) -> None:
    """Every fix's run-time switch that these overrides ask for, in the script's process."""
    for fix in REGISTRY.values():
        fix.install(recorder, overrides)


def with_claims(findings: list[Finding], outcomes: list[FixOutcome]) -> list[Finding]:
    """The findings with their best-practice snippets after the fixes' outcomes: a value this
    run measured best in place of the snippet's example (`Fix.practice`)."""
    claimed = []
    for finding in findings:
        snippet = finding.best_practice
        for outcome in outcomes:
            fix = REGISTRY.get(outcome.fix)
            if fix is not None and outcome.fix in finding.fixes:
                snippet = fix.practice(snippet, outcome)
        changed = snippet != finding.best_practice
        claimed.append(replace(finding, best_practice=snippet) if changed else finding)
    return claimed
