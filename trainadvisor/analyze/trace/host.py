"""How busy the training loop's own host threads are inside its steps (`host_busy_pct`).

The loop's threads are the one that drives it and those that run its backward passes (on a GPU,
autograd runs them on a thread of its own). They are busy while inside work the profiler
records for them (operators, runtime and driver calls, the optimizer's step and zero_grad),
except while waiting: in a DataLoader `__next__` (the data-stall rule's time), in a call that
waits for the device (a stream, device or event sync; the launch of a copy to the host, where
`.item()`, `.cpu()` and `.tolist()` wait; ROCm's synchronous copies) or in the device allocator
(cudaMalloc/cudaFree, whose free syncs the device: the allocator-churn rule's time).

Python between two recorded ops is not recorded, so this is a lower bound of the host's work.
With the device idle and the host not waiting, the host's own work sets the step's length: the
step is host-bound (Python, dispatch, kernel launches)."""

from __future__ import annotations

import numpy as np

from trainadvisor.analyze.read.columns import ANNOTATION, HOST, MEMCPY, RUNTIME, Table
from trainadvisor.analyze.trace import intervals as iv
from trainadvisor.analyze.trace.device import ALLOCATOR_CALL
from trainadvisor.analyze.trace.facts import SYNCS
from trainadvisor.analyze.trace.steps import BACKWARD_PREFIX, OPTIMIZER_PREFIX, STEP_MARKER, is_loader_call
from trainadvisor.analyze.trace.trace_records import StepBreakdown

# Runtime calls in which the host waits for the device: the syncs `facts` counts (and ROCm's
# synchronous copies), and event syncs (`torch.cuda.Event.synchronize()`, timing loops).
_WAIT_CALLS = frozenset(
    {name for name, kind in SYNCS.items() if kind in ("stream_sync", "device_sync")}
    | {"cudaEventSynchronize", "hipEventSynchronize"}
)


def host_busy_pct(t: Table, steps: list[StepBreakdown]) -> float | None:
    """The share of the steps' wall time (the spans the breakdown and `gpu_busy_pct` use) in
    which a loop thread was in its own work and not waiting. None without host events."""
    threads = loop_threads(t)
    wall_us = sum(s.dur_us for s in steps)
    if not len(threads) or not wall_us:
        return None
    starts = np.array([s.start_us for s in steps])
    ends = starts + np.array([s.dur_us for s in steps])
    mine = np.isin(t.tid, threads)
    waits = _waits(t, mine)
    waiting = iv.Union(t.ts[waits], t.end[waits])
    work = _work(t, mine)
    del mine, waits
    # The work's own union first, its rows put in time order beforehand (the union's sort
    # would hold twice as many copies of millions of rows at once), then the waits added:
    # the same union, at half the peak memory.
    work = work[np.argsort(t.ts[work], kind="stable")]
    working = iv.Union(t.ts[work], t.end[work])
    del work
    either = waiting.plus(working.starts, working.ends)
    busy_us = float((either.within(starts, ends) - waiting.within(starts, ends)).sum())
    return 100.0 * busy_us / wall_us


def loop_threads(t: Table) -> np.ndarray:
    """The thread that drives the loop (where the step markers are, else the optimizer steps
    and DataLoader calls, else the busiest) and the threads that run backward passes."""
    host = t.rows(HOST, ANNOTATION)
    if not len(host):
        return np.empty(0, np.int32)
    drivers = np.unique(t.tid[host[t.matching(host, STEP_MARKER.match)]])
    if not len(drivers):
        anchors = t.matching(host, lambda n: n.startswith(OPTIMIZER_PREFIX) or is_loader_call(n))
        drivers = np.unique(t.tid[host[anchors]])
    if not len(drivers):
        drivers = np.array([np.argmax(np.bincount(t.tid[host], weights=t.duration(host)))])
    backward = np.unique(t.tid[host[t.matching(host, lambda n: n.startswith(BACKWARD_PREFIX))]])
    return np.union1d(drivers, backward).astype(np.int32)


def _work(t: Table, mine: np.ndarray) -> np.ndarray:
    """The loop threads' recorded work: operators and runtime calls (not the step markers or
    DataLoader calls), and the optimizer's annotations, whose per-parameter Python loops run
    between the ops they record. Other annotations may span waits and idle time."""
    ops = np.flatnonzero(mine & ((t.kind == HOST) | (t.kind == RUNTIME)))
    ops = ops[~t.matching(ops, lambda n: bool(STEP_MARKER.match(n)) or is_loader_call(n))]
    annotations = np.flatnonzero(mine & (t.kind == ANNOTATION))
    optimizer = annotations[t.matching(annotations, lambda n: n.startswith(OPTIMIZER_PREFIX))]
    return np.concatenate((ops, optimizer))


def _waits(t: Table, mine: np.ndarray) -> np.ndarray:
    """The loop threads' waits: DataLoader calls, syncs, launches of copies to the host, and
    device allocator calls."""
    host = np.flatnonzero(mine & ((t.kind == HOST) | (t.kind == ANNOTATION)))
    loader = host[t.matching(host, is_loader_call)]
    runtime = np.flatnonzero(mine & (t.kind == RUNTIME))
    blocking = t.matching(runtime, lambda n: n in _WAIT_CALLS or bool(ALLOCATOR_CALL.match(n)))
    memcpy = t.rows(MEMCPY)
    to_host = memcpy[t.matching(memcpy, lambda n: "DtoH" in n or "DeviceToHost" in n)]
    corr = t.corr[runtime]
    copying = np.isin(corr, t.corr[to_host]) & (corr >= 0)
    return np.concatenate((loader, runtime[blocking | copying]))
