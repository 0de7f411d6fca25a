"""Per-rank measurements of a run launched through torchrun: each rank's step time, the time it
spends before its backward pass (its data and forward: its own work, before the gradient
all-reduce makes it wait for the others), and the rank that holds the others back. Pure."""

from __future__ import annotations

import statistics
from typing import Any

from trainadvisor.records import RankStats, RawRun, timed_steps


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def rank_stats(
    raw: RawRun, communication: dict[int, tuple[float | None, float | None]] | None = None
) -> list[RankStats]:
    stats = []
    for run in raw.ranks:
        steps = timed_steps(run)
        comm = (communication or {}).get(run.rank or 0, (None, None))
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
                communication_pct=comm[0],
                communication_overlap_pct=comm[1],
            )
        )
    return stats


def rank_measurements(stats: list[RankStats]) -> dict[str, Any]:
    """`ranks`, the slowest rank and the skew between ranks, for the rules."""
    measured = [s for s in stats if s.pre_backward_ms_mean is not None and s.step_time_ms_mean]
    table: dict[str, Any] = {"ranks": len(stats)} if stats else {}
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
    return table
