"""The critical path across ranks (39.3): which rank's work sets each step's time, in which
phase, and why that rank is slow.

In synchronous training every collective ends when the last rank arrives, so the ranks that
arrive early wait inside it. Per step, the rank that waits the least in its collectives is the
one the others wait for: the step's chain is that rank's own work (its data, forward,
backward, optimizer step) up to the collective, then the collectives' exposed time, which no
rank can hide. Reading waits from each rank's own collective times needs no clock shared
between hosts. In a step where some rank's trace holds no collectives (none, or a trace cut
short), the rank with the longest step gates it, and the others lose their shorter steps.

Why the gating rank is slow is read against the other ranks' median, step by step:
  data           it waits longer in its DataLoader;
  compute        its compute (kernels; on a host-only trace its aten ops) takes longer;
  host           the rest of its step (its host work outside compute and data: logging, a
                 checkpoint, Python) takes longer;
  communication  no rank's own work stands out, and the exposed collectives are what the
                 step waits for (a slow link, or a job bound by communication).
Pure; numpy over (steps x ranks): well under a second at 1,024 ranks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trainadvisor.records.across_ranks import CAUSES, PHASES, CriticalPath

if TYPE_CHECKING:
    from trainadvisor.analyze.trace.trace_records import StepBreakdown


def _matrix(per_rank: dict[int, list[StepBreakdown]]) -> tuple[list[int], list[list[StepBreakdown]]]:
    """The ranks, and per step compared its breakdown on each rank: steps by their number where
    every rank has them, else by position."""
    ranks = sorted(per_rank)
    numbers = set.intersection(*({s.number for s in per_rank[r]} for r in ranks))
    if numbers:
        index = {r: {s.number: s for s in per_rank[r]} for r in ranks}
        return ranks, [[index[r][n] for r in ranks] for n in sorted(numbers)]
    length = min(len(per_rank[r]) for r in ranks)
    return ranks, [[per_rank[r][i] for r in ranks] for i in range(length)]


def _causes(s: StepBreakdown) -> list[float]:
    step = s.dur_us / 1e3
    data = s.phase_ms.get("data", s.ms.get("data_wait", 0.0))
    compute = s.compute_ms
    communication = s.exposed_ms
    return [data, compute, max(step - data - compute - communication, 0.0), communication]


def critical_path(per_rank: dict[int, list[StepBreakdown]]) -> CriticalPath | None:
    """The critical path over the steps the ranks traced; None with fewer than two ranks."""
    per_rank = {r: steps for r, steps in per_rank.items() if steps}
    if len(per_rank) < 2:
        return None
    ranks, rows = _matrix(per_rank)
    if not rows:
        return None
    comm = np.array([[s.collective_ms for s in row] for row in rows])  # steps x ranks
    step = np.array([[s.dur_us / 1e3 for s in row] for row in rows])
    causes = np.array([[_causes(s) for s in row] for row in rows])  # steps x ranks x causes
    phases = np.array([[[s.phase_ms.get(p, 0.0) for p in PHASES] for s in row] for row in rows])
    # steps in which every rank spent time in collectives: the least time there (ties: the
    # most work of its own) gates them; in the others (a trace cut short, none), the longest step
    synced: np.ndarray = np.asarray((comm > 0).all(axis=1))
    own = causes[:, :, :3].sum(axis=2)
    gate = np.where(synced, np.lexsort((-own, comm), axis=1)[:, 0], np.argmax(step, axis=1))
    counts = np.bincount(gate, minlength=len(ranks))
    top = int(np.argmax(counts))
    mine = np.flatnonzero(gate == top)
    excess = _excess(causes, top, mine)
    phase_excess = _excess(phases, top, mine)
    by_comm = 2 * int(synced[mine].sum()) >= len(mine)  # how most of its steps were gated
    # what the others lose to it, step by step as each was gated: their wait, or a shorter step
    lost = np.where(synced[:, None], comm, -step)
    others = np.delete(lost[mine] - lost[mine, top][:, None], top, axis=1)
    wait = float(np.median(others)) if others.size else 0.0
    cause = CAUSES[int(np.argmax(excess[:3]))]
    if by_comm and float(np.clip(excess[:3], 0.0, None).sum()) < 0.5 * wait:
        cause = "communication"  # its own work explains less than half of what the others wait
    median_step = mine[np.argsort(step[mine, top])[len(mine) // 2]]
    gated = phases[median_step, top]
    chain = [(p, float(ms)) for p, ms in zip(PHASES, gated) if ms > 0]
    return CriticalPath(
        steps=len(rows),
        by="collectives" if by_comm else "step time",
        gating_rank=ranks[top],
        gated_steps=int(counts[top]),
        cause=cause,
        phase=PHASES[int(np.argmax(phase_excess))],
        excess_ms=dict(zip(CAUSES, map(float, excess))),
        phase_excess_ms=dict(zip(PHASES, map(float, phase_excess))),
        wait_ms=wait,
        step_ms=float(np.median(step[mine, top])),
        chain=chain,
        chain_exposed_ms=float(causes[median_step, top, 3]),
        gates=[(ranks[int(i)], int(counts[i])) for i in np.argsort(-counts, kind="stable")[:5] if counts[i]],
    )


def _excess(values: np.ndarray, rank: int, steps: np.ndarray) -> np.ndarray:
    """Per last axis, the median over `steps` of the rank's value less the other ranks' median."""
    others = np.median(np.delete(values[steps], rank, axis=1), axis=1)
    return np.median(values[steps, rank] - others, axis=0)


def critical_measurements(path: CriticalPath | None) -> dict[str, object]:
    """The measurements the straggler rule reads of the critical path."""
    if path is None:
        return {}
    return {
        "gating_rank": path.gating_rank,
        "straggler_cause": path.cause,
        "straggler_phase": path.phase,
        "critical_path": path.sentence(),
        "critical_path_chain": path.chain_text(),
    }


def with_cause(table: dict[str, object], path: CriticalPath | None) -> None:
    """The straggler's evidence, told why it is slow where the critical path names the same
    rank (and a wait worth naming)."""
    if path is None or table.get("slowest_rank") != path.gating_rank or "straggler_evidence" not in table:
        return
    if not path.notable():
        return
    table["straggler_evidence"] = f"{table['straggler_evidence']}; {path.cause_text()}"
