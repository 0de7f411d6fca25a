"""Per-rank measurements of a run launched through torchrun: each rank's step time, the time it
spends before its backward pass (its data and forward: its own work, before the gradient
all-reduce makes it wait for the others), and the rank that holds the others back. Pure."""

from __future__ import annotations

import statistics
from typing import Any

from trainadvisor.analyze.trace.phases import on_host
from trainadvisor.analyze.trace.trace_records import TraceAnalysis
from trainadvisor.memory.oom import oom_measurements
from trainadvisor.records import RankStats, RawRun, timed_steps


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _communication_pct(trace: TraceAnalysis | None) -> float | None:
    """Collectives' share of the rank's traced step: NCCL kernels' outside compute kernels (the
    breakdown's), or a host backend's (gloo) collectives'."""
    if trace is None:
        return None
    if not on_host(trace):
        return trace.breakdown_pct.get("communication")
    comm, step_ms = trace.communication, trace.step_time_ms_mean
    return 100.0 * comm.ms_per_step / step_ms if comm is not None and step_ms else None


def _overlap_pct(trace: TraceAnalysis | None) -> float | None:
    if trace is None:
        return None
    if trace.communication is None or not on_host(trace):
        return trace.communication_overlap_pct
    return trace.communication.overlap_efficiency_pct


def _memory(run: RawRun) -> dict[str, int | None]:
    """The rank's counted step's peak, and under FSDP its sharded and gathered parameters."""
    memory = run.runtime.get("memory") or {}
    parts = memory.get("breakdown") or {}
    fsdp = "gathered_parameters" in parts
    return {
        "peak_bytes": memory.get("peak_bytes"),
        "sharded_parameter_bytes": parts.get("parameters") if fsdp else None,
        "gathered_parameter_bytes": parts.get("gathered_parameters"),
    }


def rank_stats(raw: RawRun, traces: dict[int, TraceAnalysis] | None = None) -> list[RankStats]:
    """Each rank's timed steps summarised, with its trace's communication (`traces`: each
    rank's trace analysed)."""
    stats = []
    for run in raw.ranks:
        steps = timed_steps(run)
        trace = (traces or {}).get(run.rank or 0)
        comm = trace.communication if trace is not None else None
        share = _communication_pct(trace)
        stats.append(
            RankStats(
                rank=run.rank or 0,
                status=run.status,
                error=run.error,
                steps=len(steps),
                step_time_ms_mean=_mean([s.step_ms for s in steps]),
                pre_backward_ms_mean=_mean(
                    [s.pre_backward_ms for s in steps if s.pre_backward_ms is not None]
                ),
                data_wait_ms_mean=_mean([s.data_wait_ms for s in steps]),
                communication_pct=share,
                communication_overlap_pct=_overlap_pct(trace),
                collective_ms_per_step=comm.ms_per_step if comm else None,
                collective_exposed_ms_per_step=comm.exposed_ms_per_step if comm else None,
                overlap_efficiency_pct=comm.overlap_efficiency_pct if comm else None,
                collectives_by_kind=comm.by_kind if comm else {},
                collectives_by_phase=comm.by_phase if comm else {},
                collectives_by_group=comm.by_group if comm else {},
                **_memory(run),
            )
        )
    return stats


def rank_measurements(stats: list[RankStats]) -> dict[str, Any]:
    """`ranks`, the slowest rank and the skew between ranks, for the rules."""
    measured = [s for s in stats if s.pre_backward_ms_mean is not None and s.step_time_ms_mean]
    table: dict[str, Any] = {"ranks": len(stats), **_memory_spread(stats)} if stats else {}
    if len(measured) < 2:
        return table
    slowest = max(measured, key=lambda s: s.pre_backward_ms_mean or 0.0)
    # against the other ranks' median: one straggler among many, or one of two
    median = statistics.median(s.pre_backward_ms_mean or 0.0 for s in measured if s is not slowest)
    step = statistics.fmean(s.step_time_ms_mean or 0.0 for s in measured)
    table.update(
        slowest_rank=slowest.rank,
        slowest_rank_pre_backward_ms=slowest.pre_backward_ms_mean,
        others_pre_backward_ms=median,
        rank_skew_pct=100.0 * ((slowest.pre_backward_ms_mean or 0.0) - median) / step,
        rank_step_time_ms_max=max(s.step_time_ms_mean or 0.0 for s in measured),
        rank_step_time_ms_min=min(s.step_time_ms_mean or 0.0 for s in measured),
    )
    table["straggler_evidence"] = (
        f"it spends {slowest.pre_backward_ms_mean or 0.0:.1f} ms per step before its backward pass "
        f"against {median:.1f} ms on the other ranks, which wait for it in the gradient all-reduce "
        f"({table['rank_skew_pct']:.0f}% of every step)"
    )
    return table | _gating_rank_communication(measured)


def _memory_spread(stats: list[RankStats]) -> dict[str, Any]:
    """The ranks' peaks: the largest, which rank, and how far above the smallest it is."""
    peaks = [(s.peak_bytes, s.rank) for s in stats if s.peak_bytes]
    if len(peaks) < 2:
        return {}
    (high, rank), low = max(peaks), min(p for p, _ in peaks)
    return {
        "rank_peak_bytes_max": high,
        "rank_peak_max_rank": rank,
        "rank_peak_imbalance_pct": 100.0 * (high - low) / low,
    }


def rank_oom(raw: RawRun) -> dict[str, Any]:
    """Under torchrun, the first rank that died of out-of-memory: its request, what it held and
    its largest holders (`memory.oom`), named with its rank."""
    failed = next((r for r in raw.ranks if r.runtime.get("oom")), None)
    if failed is None:
        return {}
    table = oom_measurements(failed.runtime["oom"])
    table["oom_rank"] = failed.rank or 0
    table["oom_summary"] = f"on rank {failed.rank or 0}, {table['oom_summary']}"
    return table


def least_waiting(stats: list[RankStats]) -> RankStats | None:
    """The rank that spends least time in its collectives (the one the others wait for), where
    every rank's trace measured some: a rank whose trace shows none was cut short, not fast."""
    known = [s for s in stats if s.collective_ms_per_step]
    if len(known) < 2 or len(known) < len(stats):
        return None
    return min(known, key=lambda s: s.collective_ms_per_step or 0.0)


def _gating_rank_communication(stats: list[RankStats]) -> dict[str, Any]:
    """Communication's share of the step as the rank that waits least in its collectives sees
    it (the others' include their wait for it: a straggler, not the link), where every rank's
    trace measured its collectives."""
    least = least_waiting(stats)
    if least is None or least.communication_pct is None:
        return {}
    return {
        "communication_pct": least.communication_pct,
        "communication_overlap_pct": least.communication_overlap_pct,
    }
