"""The rank table at scale: past `TABLE_UP_TO` ranks a report shows no row per rank (a 1,024-row
table reads as nothing) but the distribution over the ranks, the worst and the best ranks, how
long the ranks wait in collectives, and groups of alike ranks; every row stays in report.json.

Ranks are ordered the way the straggler is found (`rank_table`): with collectives, the rank with
the *least* time in them is the one the others wait for, the worst; without, the longest steps.
Ranks are alike when their ordering time is close (no jump between them of more than
`GAP_PCT` of the mean step) and the same rules fired on their traces: a slow node's 8 ranks
come out as one group, apart from the 1,016 others. Pure; a few milliseconds at 1,024 ranks."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from trainadvisor.analyze.run.summary import percentile

TABLE_UP_TO = 16  # ranks shown row by row; more get the overview
SHOWN = 3  # worst and best ranks shown
GROUPS_UP_TO = 8  # groups shown; the rest are counted
RANGES_SHOWN = 6  # runs of rank numbers a group's label names
GAP_PCT = 2.0  # of the mean step: a larger jump in the ordering time starts a new group
PERCENTILES = (("min", 0.0), ("p10", 10.0), ("median", 50.0), ("p90", 90.0), ("p99", 99.0), ("max", 100.0))


class RankRow(Protocol):
    """What the overview reads of a rank table's row (`rank_table.RankRow`, which imports
    this module)."""

    rank: int
    step_ms: float
    compute_ms: float
    communication_ms: float
    wait_ms: float
    data_ms: float
    overlap_pct: float | None
    findings: list[str]


@dataclass
class Spread:
    """One percentile over the ranks, of each column on its own (not one rank's row)."""

    label: str  # min, p10, median, p90, p99, max
    step_ms: float
    compute_ms: float
    communication_ms: float
    wait_ms: float
    data_ms: float
    overlap_pct: float | None  # of communication time, under compute kernels


@dataclass
class RankGroup:
    ranks: list[int]
    label: str  # "ranks 512-519", or "ranks 0-3, 8-11, ... (40 ranks)"
    key_ms_min: float  # the ordering time (communication, or step time) per step
    key_ms_max: float
    step_ms_min: float
    step_ms_max: float
    findings: list[str] = field(default_factory=list)  # rules that fired on each of these ranks


@dataclass
class RankOverview:
    key: str  # "communication" or "step time": what orders the ranks
    distribution: list[Spread]
    worst: list[int]  # ranks the others wait for (or: the longest steps), worst first
    best: list[int]  # ranks the most time waiting in collectives (or: the shortest steps), best first
    groups: list[RankGroup]  # worst first
    groups_left: int  # groups not shown (past GROUPS_UP_TO)
    ranks_left: int  # their ranks
    # per step, how long the ranks wait in collectives for the one that arrives last (their
    # communication time less the straggler's): median, p90 and max over the ranks
    collective_wait_ms: dict[str, float] | None = None


def ranges(numbers: list[int], up_to: int | None = None) -> str:
    """0, 2-5, 7; with `up_to`, the first runs of that many and "..."."""
    parts: list[str] = []
    for n in sorted(set(numbers)):
        if parts and n == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    if up_to is not None and len(parts) > up_to:
        parts = [*parts[:up_to], "..."]
    return ", ".join(parts)


def rank_overview(rows: Sequence[RankRow], key: str) -> RankOverview:
    """The overview of `rows` ordered by `key` ("communication" or "step time")."""
    by_comm = key == "communication"  # the least time in collectives: the others wait for it
    ordered = sorted(rows, key=lambda r: (r.communication_ms, r.rank) if by_comm else (-r.step_ms, r.rank))
    worst = [r.rank for r in ordered[:SHOWN]]
    best = [
        r.rank
        for r in sorted(rows, key=lambda r: (-r.communication_ms, r.rank) if by_comm else (r.step_ms, r.rank))
        if r.rank not in worst
    ][:SHOWN]
    groups = _groups(ordered, key, GAP_PCT / 100.0 * statistics.fmean(r.step_ms for r in rows))
    shown = groups[:GROUPS_UP_TO]
    return RankOverview(
        key=key,
        distribution=[_spread(rows, label, pct) for label, pct in PERCENTILES],
        worst=worst,
        best=best,
        groups=shown,
        groups_left=len(groups) - len(shown),
        ranks_left=sum(len(g.ranks) for g in groups[GROUPS_UP_TO:]),
        collective_wait_ms=_collective_wait(rows) if key == "communication" else None,
    )


def _key_ms(row: RankRow, key: str) -> float:
    return row.communication_ms if key == "communication" else row.step_ms


def _spread(rows: Sequence[RankRow], label: str, pct: float) -> Spread:
    def at(values: list[float]) -> float:
        return float(percentile(values, pct) or 0.0)

    overlaps = [r.overlap_pct for r in rows if r.overlap_pct is not None]
    return Spread(
        label,
        at([r.step_ms for r in rows]),
        at([r.compute_ms for r in rows]),
        at([r.communication_ms for r in rows]),
        at([r.wait_ms for r in rows]),
        at([r.data_ms for r in rows]),
        at(overlaps) if overlaps else None,
    )


def _collective_wait(rows: Sequence[RankRow]) -> dict[str, float]:
    least = min(r.communication_ms for r in rows)
    waits = [r.communication_ms - least for r in rows]
    return {
        "median": float(percentile(waits, 50) or 0.0),
        "p90": float(percentile(waits, 90) or 0.0),
        "max": max(waits),
    }


def _groups(ordered: list[RankRow], key: str, gap_ms: float) -> list[RankGroup]:
    """Runs of ranks without a jump of more than `gap_ms` in the ordering time, each split by
    the rules that fired; in the order of `ordered` (worst first), a band's largest group first."""
    bands: list[list[RankRow]] = []
    for row in ordered:
        if bands and abs(_key_ms(row, key) - _key_ms(bands[-1][-1], key)) <= gap_ms:
            bands[-1].append(row)
        else:
            bands.append([row])
    groups: list[RankGroup] = []
    for band in bands:
        by_findings: dict[tuple[str, ...], list[RankRow]] = {}
        for row in band:
            by_findings.setdefault(tuple(sorted(row.findings)), []).append(row)
        alike = sorted(by_findings.items(), key=lambda item: (-len(item[1]), min(r.rank for r in item[1])))
        groups += [_group(members, list(found), key) for found, members in alike]
    return groups


def _group(members: list[RankRow], findings: list[str], key: str) -> RankGroup:
    keys = [_key_ms(r, key) for r in members]
    steps = [r.step_ms for r in members]
    ranks = sorted(r.rank for r in members)
    label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks, RANGES_SHOWN)}"
    if label.endswith("..."):
        label += f" ({len(ranks)} ranks)"
    return RankGroup(ranks, label, min(keys), max(keys), min(steps), max(steps), findings)
