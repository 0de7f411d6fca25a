"""The ranks of a multi-rank set of traces side by side, and the straggler among them.

In synchronous data-parallel training every collective ends when the last rank arrives, so the
ranks that arrive early wait inside it: their communication time grows by the wait. The rank
the others wait for is therefore the one with the *least* communication time, whatever the
step times say (every rank's step is as long as the slowest one's, waits included). Without
collectives in the traces, the rank with the longest steps is named instead. Pure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainadvisor.analyze.rank_overview import TABLE_UP_TO, RankOverview, rank_overview
from trainadvisor.analyze.run.critical_path import (
    CriticalPath,
    critical_measurements,
    critical_path,
    with_cause,
)

if TYPE_CHECKING:
    from trainadvisor.analyze.trace.analysis import TraceAnalysis


STRAGGLER_PCT = 10.0  # the straggler rule's medium level: below it no rank is marked


@dataclass
class RankRow:
    rank: int
    traces: int  # files of this rank (tensorboard_trace_handler writes one per span)
    steps: int
    step_ms: float  # mean step time
    compute_ms: float  # per step: kernels, copies and memsets
    communication_ms: float  # per step: collective kernels (NCCL/RCCL), waits included
    wait_ms: float  # per step: nothing ran (the device idle, the host not in a traced op)
    data_ms: float  # per step: in the DataLoader
    overlap_pct: float | None = None  # of communication time, under compute kernels
    findings: list[str] = field(default_factory=list)  # the rules that fired on its traces


@dataclass
class RankTable:
    rows: list[RankRow]
    straggler: int | None
    straggler_by: str  # "communication" (least time in collectives) or "step time"
    skew_pct: float  # how much of the mean step the others lose to it
    straggler_ms: float  # the straggler's communication (or step) time per step
    others_ms: float  # the other ranks' median of the same
    overview: RankOverview | None = None  # past TABLE_UP_TO ranks (`rank_overview`)
    critical: CriticalPath | None = None  # who gates the steps, where and why (`critical_path`)


def _per_step(analyses: list[TraceAnalysis], *keys: str) -> float:
    steps = [s for a in analyses for s in a.steps]
    return sum(s.ms[k] for s in steps for k in keys) / len(steps) if steps else 0.0


def rank_table(analyses: list[TraceAnalysis], fired: dict[int, set[str]] | None = None) -> RankTable | None:
    """Per distinct rank (its traces' steps together), when the traces hold two ranks or more;
    `fired`: the rules that fired on each rank's traces."""
    by_rank: dict[int, list[TraceAnalysis]] = {}
    for a in analyses:
        if a.rank is not None and a.steps:
            by_rank.setdefault(int(a.rank), []).append(a)
    world_sizes = {a.world_size for group in by_rank.values() for a in group if a.world_size is not None}
    if len(by_rank) < 2 or len(world_sizes) > 1:  # traces of different jobs are not one job's ranks
        return None
    rows = []
    device = any(a.kernels for group in by_rank.values() for a in group)  # else a host backend's
    for rank in sorted(by_rank):
        mine = by_rank[rank]
        steps = [s for a in mine for s in a.steps]
        rows.append(
            RankRow(
                rank=rank,
                traces=len(mine),
                steps=len(steps),
                step_ms=sum(s.dur_us for s in steps) / len(steps) / 1e3,
                # kernels, copies and memsets; on host-only traces the aten ops (`trace.phases`)
                compute_ms=_per_step(mine, "kernel", "memcpy", "memset")
                if device
                else _mean_of(mine, "compute_ms"),
                # NCCL kernels' time outside compute kernels; or a host backend's (gloo) collectives
                communication_ms=_per_step(mine, "communication")
                if device
                else _mean_of(mine, "collective_ms"),
                wait_ms=_per_step(mine, "idle"),
                data_ms=_per_step(mine, "data_wait"),
                overlap_pct=_overlap_pct(mine),
                findings=sorted((fired or {}).get(rank, ())),
            )
        )
    table = _straggler(rows)
    table.critical = critical_path({rank: [s for a in by_rank[rank] for s in a.steps] for rank in by_rank})
    if len(rows) > TABLE_UP_TO:
        table.overview = rank_overview(rows, table.straggler_by)
    return table


def _mean_of(analyses: list[TraceAnalysis], field: str) -> float:
    steps = [s for a in analyses for s in a.steps]
    return sum(getattr(s, field) for s in steps) / len(steps) if steps else 0.0


def _overlap_pct(analyses: list[TraceAnalysis]) -> float | None:
    """The rank's traces' overlap, each weighted by its communication time."""
    weighted = [
        (a.communication_overlap_pct, sum(s.ms["communication"] for s in a.steps))
        for a in analyses
        if a.communication_overlap_pct is not None
    ]
    total_ms = sum(ms for _, ms in weighted)
    if not weighted or not total_ms:
        return None
    return sum(pct * ms for pct, ms in weighted) / total_ms


def _straggler(rows: list[RankRow]) -> RankTable:
    mean_step = statistics.fmean(r.step_ms for r in rows)
    if all(r.communication_ms > 0 for r in rows):
        straggler = min(rows, key=lambda r: r.communication_ms)
        others = statistics.median(r.communication_ms for r in rows if r is not straggler)
        lost = others - straggler.communication_ms
        return RankTable(
            rows,
            straggler.rank,
            "communication",
            100.0 * lost / mean_step,
            straggler.communication_ms,
            others,
        )
    straggler = max(rows, key=lambda r: r.step_ms)
    others = statistics.median(r.step_ms for r in rows if r is not straggler)
    lost = straggler.step_ms - others
    return RankTable(rows, straggler.rank, "step time", 100.0 * lost / mean_step, straggler.step_ms, others)


def rank_values(table: RankTable) -> dict[str, Any]:
    """The measurements the straggler rule reads."""
    values: dict[str, Any] = {
        "ranks": len(table.rows),
        "slowest_rank": table.straggler,
        "rank_skew_pct": table.skew_pct,
        "rank_step_time_ms_max": max(r.step_ms for r in table.rows),
        "rank_step_time_ms_min": min(r.step_ms for r in table.rows),
    }
    values.update(critical_measurements(table.critical))
    if table.straggler_by == "communication":
        values["straggler_communication_ms"] = table.straggler_ms
        values["others_communication_ms"] = table.others_ms
        values["straggler_evidence"] = (
            f"it spends {table.straggler_ms:.1f} ms per step in collectives against "
            f"{table.others_ms:.1f} ms on the other ranks, which wait there for it "
            f"({table.skew_pct:.0f}% of every step)"
        )
    else:
        values["straggler_evidence"] = (
            f"its steps take {table.straggler_ms:.1f} ms against {table.others_ms:.1f} ms on the "
            f"other ranks ({table.skew_pct:.0f}% of the mean step; the traces hold no collectives)"
        )
    with_cause(values, table.critical)
    return values


def table_lines(table: RankTable) -> list[str]:
    """The rank table as fixed-width lines for a terminal (ms per step)."""
    lines = ["  rank   step  compute  comm.   wait   data"]
    for r in table.rows:
        mark = "  <- straggler" if r.rank == table.straggler and table.skew_pct >= STRAGGLER_PCT else ""
        lines.append(
            f"  {r.rank:>4} {r.step_ms:6.1f} {r.compute_ms:8.1f} {r.communication_ms:6.1f} "
            f"{r.wait_ms:6.1f} {r.data_ms:6.1f}{mark}"
        )
    return lines
