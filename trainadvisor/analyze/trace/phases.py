"""Where a step's time goes by phase, and its communication attributed (39.2).

Each step's host span is cut into its phases, read from the ops torch records on the host:
  data       inside the DataLoader's `__next__`;
  backward   from the first autograd engine op (`autograd::engine::evaluate_function: ...`, or
             FSDP's backward hooks) to the last, DDP's and FSDP's end-of-backward callbacks
             included;
  optimizer  inside `Optimizer.step#...` and `Optimizer.zero_grad#...`;
  forward    the rest before the backward pass (the forward, the loss);
  other      the rest after it (logging, clipping, a checkpoint).

A collective belongs to the phase its launch fell in: a NCCL/RCCL kernel's runtime launch call
(by correlation id), or, in a CPU run (gloo), the collective's own span on gloo's worker
thread (`gloo:all_reduce`), which runs it when issued. Its **exposed** part is the part no
compute ran beside it: compute kernels on a GPU; on a host-only trace, the `aten::` ops of the
threads that run no collective. Overlap efficiency is defined as torchtitan's
CommsComputeOverlapAnalyzer defines it (pytorch/torchtitan PR #3020, from RFC #2408): overlap =
compute + communication - their union, and efficiency = overlap / communication; the exposed
part is communication - overlap. Pure, on columns."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainadvisor.analyze.read.columns import HOST, HOST_KINDS, KERNEL, RUNTIME, Table, positions
from trainadvisor.analyze.trace import device
from trainadvisor.analyze.trace import intervals as iv
from trainadvisor.analyze.trace.steps import is_loader_call
from trainadvisor.analyze.trace.trace_records import CommAttribution, StepBreakdown, TraceAnalysis

PHASES = ("data", "forward", "backward", "optimizer", "other")
DEVICE_SOURCE, HOST_SOURCE = "NCCL/RCCL kernels", "the host backend's collectives (gloo)"
HOST_COLLECTIVE = re.compile(r"^(gloo|ucc|mpi):([a-z_]+)")
_BACKWARD = re.compile(
    r"^(autograd::engine::evaluate_function|FSDP::(pre_backward|post_backward|root_post_backward)"
    r"|## backward|DistributedDataParallel\.backward)"
)
OPTIMIZER_CALL = re.compile(r"^Optimizer\.(step|zero_grad)#")
_HOST_KINDS = {
    "allreduce": "all_reduce", "allgather": "all_gather",
    "reducescatter": "reduce_scatter", "broadcast": "broadcast", "send": "send_recv",
    "recv": "send_recv", "alltoall": "all_to_all", "barrier": "barrier", "reduce": "reduce",
    "gather": "gather", "scatter": "scatter",
}  # fmt: skip


def host_collective_kind(name: str) -> str:
    """`gloo:all_reduce`, `c10d::_reduce_scatter_base_` -> all_reduce, reduce_scatter; the
    kinds are those of NCCL kernels (`device`)."""
    found = HOST_COLLECTIVE.match(name)
    word = found.group(2) if found else name.removeprefix("c10d::")
    word = word.replace("_", "").removesuffix("base").removesuffix("coalesced").removesuffix("intotensor")
    return _HOST_KINDS.get(word, "other")


@dataclass
class _Bounds:
    """Per step (host spans): the backward pass's first start and last end (nan: none), and
    the unions of the data waits and optimizer calls."""

    starts: np.ndarray
    ends: np.ndarray
    backward_start: np.ndarray
    backward_end: np.ndarray
    data: iv.Union
    optimizer: iv.Union


def _bounds(t: Table, host_spans: list[tuple[float, float]]) -> _Bounds:
    starts = np.array([s for s, _ in host_spans], float)
    ends = np.array([e for _, e in host_spans], float)
    host = t.rows(*HOST_KINDS)
    backward = host[t.matching(host, _BACKWARD.match)]
    step = np.searchsorted(starts, t.ts[backward], side="right") - 1
    inside = (step >= 0) & (t.ts[backward] < ends[np.maximum(step, 0)])
    first = np.full(len(starts), np.inf)
    last = np.full(len(starts), -np.inf)
    np.minimum.at(first, step[inside], t.ts[backward][inside])
    np.maximum.at(last, step[inside], t.end[backward][inside])
    none = ~np.isfinite(first)
    first[none], last[none] = np.nan, np.nan
    last = np.minimum(last, ends)
    data = host[t.matching(host, is_loader_call)]
    optimizer = host[t.matching(host, OPTIMIZER_CALL.match)]
    return _Bounds(
        starts,
        ends,
        first,
        last,
        iv.Union(t.ts[data], t.end[data]),
        iv.Union(t.ts[optimizer], t.end[optimizer]),
    )


def _phase_ms(b: _Bounds) -> np.ndarray:
    """Per step and phase (PHASES' order), milliseconds of host wall time; they add up to the
    host span."""
    has_backward = np.isfinite(b.backward_start)
    cut = np.where(has_backward, b.backward_start, b.ends)
    cut_end = np.where(has_backward, b.backward_end, b.ends)

    def free(start: np.ndarray, end: np.ndarray) -> np.ndarray:  # neither data nor optimizer
        return (end - start) - b.data.within(start, end) - b.optimizer.within(start, end)

    data = b.data.within(b.starts, b.ends)
    optimizer = b.optimizer.within(b.starts, b.ends)
    forward = free(b.starts, cut)
    backward = free(cut, cut_end)
    other = (b.ends - b.starts) - data - optimizer - forward - backward
    return np.stack([data, forward, backward, optimizer, np.maximum(other, 0.0)], axis=1) / 1e3


def phase_at(b: _Bounds, times: np.ndarray) -> np.ndarray:
    """The phase (index into PHASES) each host time fell in; -1 outside the steps."""
    step = np.searchsorted(b.starts, times, side="right") - 1
    safe = np.maximum(step, 0)
    inside = (step >= 0) & (times < b.ends[safe])
    found = np.full(len(times), PHASES.index("other"))
    before = ~(times >= b.backward_start[safe])  # nan (no backward pass): all before it
    found[before] = PHASES.index("forward")
    found[(times >= b.backward_start[safe]) & (times <= b.backward_end[safe])] = PHASES.index("backward")
    found[b.optimizer.within(times, times + 1e-3) > 0] = PHASES.index("optimizer")
    found[b.data.within(times, times + 1e-3) > 0] = PHASES.index("data")
    return np.where(inside, found, -1)


def _launch_times(t: Table, rows: np.ndarray) -> np.ndarray:
    """Each kernel's launch time on the host (its runtime call, by correlation id); its own
    start where no launch is recorded."""
    runtime = np.flatnonzero((t.kind == RUNTIME) & (t.corr >= 0))
    if not len(runtime) or not len(rows):
        return t.ts[rows]
    order = np.argsort(t.corr[runtime], kind="stable")
    keys = t.corr[runtime][order]
    pos, found = positions(keys, t.corr[rows])
    return np.where(found, t.ts[runtime[order][pos]], t.ts[rows])


_ISSUE = re.compile(r"^c10d::")


def _issue(t: Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """When each host-backend collective was issued, and the issuing op's row: gloo runs its
    queue first in, first out on its worker threads, so the k-th to start is the k-th `c10d::`
    op the training threads called (gloo runs a reduce-scatter as `gloo:all_reduce`: the
    `c10d::_reduce_scatter_base_` that issued it tells). Its own start, and no op, where the
    counts differ (a trace cut between the two)."""
    ops = t.rows(HOST)
    ops = ops[t.matching(ops, _ISSUE.match)]
    ops = ops[np.argsort(t.ts[ops], kind="stable")]
    times = t.ts[rows].copy()
    if len(ops) != len(rows):
        return times, None
    order = np.argsort(t.ts[rows], kind="stable")
    times[order] = t.ts[ops]
    issuer = np.empty(len(rows), np.int64)
    issuer[order] = ops
    return times, issuer


def collective_rows(t: Table) -> tuple[np.ndarray, str]:
    """The rows that are collectives, and where they were found: NCCL/RCCL kernels where the
    trace has any, or else the host backend's own spans (gloo; a gloo job's trace may hold
    kernels of its compute, on CUDA tensors, and none of its collectives)."""
    kernels = t.rows(KERNEL)
    on_device = kernels[t.matching(kernels, device.is_communication)] if len(kernels) else kernels
    if len(on_device):
        return on_device, "device"
    host = t.rows(*HOST_KINDS)
    spans = host[t.matching(host, HOST_COLLECTIVE.match)]
    return (spans, "host") if len(spans) or not len(kernels) else (on_device, "device")


def on_host(a: TraceAnalysis) -> bool:
    """Whether a trace's collectives ran on the host backend (gloo), not as kernels: then they,
    not the kernels' breakdown, give the rank's communication share and overlap."""
    return a.communication.source == HOST_SOURCE if a.communication is not None else not a.kernels


def host_compute(t: Table, collectives: np.ndarray) -> iv.Union:
    """A host-only trace's compute: the `aten::` ops of the threads that run no collective."""
    ops = t.rows(HOST)
    ops = ops[t.matching(ops, lambda name: name.startswith("aten::"))]
    busy_threads = np.unique(t.tid[collectives])
    ops = ops[~np.isin(t.tid[ops], busy_threads)]
    return iv.Union(t.ts[ops], t.end[ops])


def kinds_of(t: Table, rows: np.ndarray, source: str) -> np.ndarray:
    names, inverse = np.unique(t.name[rows], return_inverse=True)
    kind_of = device.collective_kind if source == "device" else host_collective_kind
    return np.array([kind_of(t.names[int(i)]) for i in names] or ["other"])[inverse]


def attribute(
    t: Table,
    steps: list[StepBreakdown],
    spans: list[tuple[int, float, float, float, float]],
    compute: iv.Union,
    groups_in_trace: list[str],
) -> CommAttribution | None:
    """Fills each step's phases, compute and collective time, and returns the trace's
    communication by kind, phase and process group (ms per step; of it, exposed). `compute`:
    the compute kernels' union (a device trace); `groups_in_trace`: the process groups the
    trace's distributedInfo lists (one: every collective is in it)."""
    if not spans:
        return None
    bounds = _bounds(t, [(hs, he) for *_, hs, he in spans])
    starts = np.array([s[1] for s in spans])
    ends = np.array([s[2] for s in spans])
    rows, source = collective_rows(t)
    launched, issuer = (_launch_times(t, rows), None) if source == "device" else _issue(t, rows)
    phase = phase_at(bounds, launched)
    if source == "host":
        if not len(t.rows(KERNEL)):  # a trace with kernels computes in them
            compute = host_compute(t, rows)
        _wait_in_backward(bounds, t, rows, phase)
    phase_ms = _phase_ms(bounds)
    compute_ms = compute.within(starts, ends)
    comm = iv.Union(t.ts[rows], t.end[rows])
    comm_ms = comm.within(starts, ends)
    exposed = comm.plus(compute.starts, compute.ends).within(starts, ends) - compute_ms
    for i, step in enumerate(steps):
        step.phase_ms = {phase: float(phase_ms[i, j]) for j, phase in enumerate(PHASES)}
        step.compute_ms = float(compute_ms[i]) / 1e3
        step.collective_ms = float(comm_ms[i]) / 1e3
        step.exposed_ms = float(exposed[i]) / 1e3
    if not len(rows):
        return None
    n = len(spans)

    def split(labels: np.ndarray) -> dict[str, list[float]]:
        found: dict[str, list[float]] = {}
        for label in sorted(set(labels.tolist()) - {""}):
            mine = rows[labels == label]
            union = iv.Union(t.ts[mine], t.end[mine])
            total = float(union.within(starts, ends).sum())
            either = float(union.plus(compute.starts, compute.ends).within(starts, ends).sum())
            found[label] = [total / 1e3 / n, (either - float(compute_ms.sum())) / 1e3 / n]
        return {label: ms for label, ms in found.items() if ms[0] > 0}

    phase_names = np.array([PHASES[p] if p >= 0 else "" for p in phase.tolist()] or [""])
    total = float(comm_ms.sum())
    return CommAttribution(
        source=DEVICE_SOURCE if source == "device" else HOST_SOURCE,
        ms_per_step=total / 1e3 / n,
        exposed_ms_per_step=float(exposed.sum()) / 1e3 / n,
        overlap_efficiency_pct=min(max(100.0 * (total - float(exposed.sum())) / total, 0.0), 100.0)
        if total
        else None,
        by_kind=split(kinds_of(t, rows if issuer is None else issuer, source)),
        by_phase=split(phase_names[: len(rows)] if len(rows) else phase_names[:0]),
        by_group=split(_groups(t, rows, groups_in_trace)),
    )


def _wait_in_backward(b: _Bounds, t: Table, rows: np.ndarray, phase: np.ndarray) -> None:
    """A host backend's backward pass lasts until the collectives it issued are done: DDP's
    reducer and FSDP's last reduce-scatter wait for them after the last autograd op."""
    mine = rows[phase == PHASES.index("backward")]
    if not len(mine):
        return
    step = np.clip(np.searchsorted(b.starts, t.ts[mine], side="right") - 1, 0, len(b.starts) - 1)
    last = b.backward_end.copy()
    np.fmax.at(last, step, t.end[mine])
    b.backward_end = np.minimum(last, b.ends)


def job_from_collectives(c: CommAttribution, world_size: int | None) -> str | None:
    """The job as its collectives show it: 'FSDP-like (...) over 8 ranks (default_pg, 8 ranks)'.
    From the kinds and the phases that launched them: all-gathers in the forward pass and
    reduce-scatters in the backward pass shard parameters (FSDP, ZeRO-3); reduce-scatters
    without forward all-gathers shard gradients and optimizer state (ZeRO-2, FSDP's
    SHARD_GRAD_OP); all-reduces in the backward pass are DDP's; send/recv alone, a pipeline or
    all-to-all."""
    kinds, phases = c.by_kind, c.by_phase
    if not kinds:
        return None  # no collective inside the steps: nothing to tell the job by
    forward_gathers = "all_gather" in kinds and "forward" in phases
    if forward_gathers and "reduce_scatter" in kinds:
        said = (
            "FSDP-like: parameters all-gathered for the forward and backward passes, "
            "gradients reduce-scattered"
        )
    elif "reduce_scatter" in kinds:
        said = "sharded gradients and optimizer state (ZeRO-2-like): gradients reduce-scattered"
    elif "all_reduce" in kinds and "backward" in phases:
        said = "DDP-like data parallel: gradients all-reduced in the backward pass"
    elif set(kinds) <= {"send_recv", "all_to_all"}:
        said = "point-to-point (send/recv: a pipeline, or all-to-all)"
    else:
        said = "collectives: " + ", ".join(sorted(kinds))
    over = f" over {world_size} ranks" if world_size else ""
    groups = f"; process groups: {'; '.join(c.by_group)}" if c.by_group else ""
    return f"{said}{over}{groups} (from the trace's collectives)"


def _groups(t: Table, rows: np.ndarray, groups_in_trace: list[str]) -> np.ndarray:
    """Each collective's process group: its kernel's own (torch 2.2+), else the trace's only
    group, else unknown ("")."""
    only = groups_in_trace[0] if len(groups_in_trace) == 1 else ""
    return np.array([t.kernel_groups.get(int(row), only) for row in rows.tolist()] or [""])[: len(rows)]
