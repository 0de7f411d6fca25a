"""The device side of a trace, on columns: the work each runtime call launched (by correlation),
kernel statistics, CUDA/HIP graph launches, device allocator calls, and the precision matrix
kernels ran in, from their names and, where the trace recorded shapes, their ops' input dtypes.

Kernels a graph launch runs carry that launch's correlation: they count as the graph's work
(kernel time, busy time), once each, but not as launches of the host (launch delay, short
kernels), since the host launched the graph, not them."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from trainadvisor.analyze.read.columns import (
    DEVICE_KINDS,
    FLOAT32,
    KERNEL,
    REDUCED,
    RUNTIME,
    Table,
    positions,
)
from trainadvisor.analyze.trace.intervals import Union
from trainadvisor.analyze.trace.kernels import classify

if TYPE_CHECKING:
    from trainadvisor.analyze.trace.trace_records import TraceAnalysis

SHORT_KERNEL_US = 10.0
_GRAPH_LAUNCH = re.compile(r"^(?:cuda|hip)GraphLaunch")
# Device memory allocated or freed through the driver: what the caching allocator exists to avoid.
ALLOCATOR_CALL = re.compile(
    r"^(?:(?:cuda|hip)(?:Malloc|Free)(?:Async|Managed|FromPoolAsync)?|hipExtMallocWithFlags"
    r"|cuMem(?:Alloc|Free)(?:Async)?)(?:_v\d+)?$"
)


_REDUCED_NAME = re.compile(r"bf16|bfloat16|fp16|f16|half|h884|h1688|hgemm|fp8|e4m3|e5m2", re.I)


# NVIDIA library kernels name the architecture they were built for; a kernel built for one
# cannot run on an older GPU, so the newest named is a lower bound of the GPU's (sm80 kernels
# do run on Hopper). (major compute capability, family)
_ARCHITECTURES = (
    (re.compile(r"(?:^|[^a-z])volta_|sm70_"), 7, "Volta"),
    (re.compile(r"(?:^|[^a-z])turing_|sm75_"), 7, "Turing"),
    (re.compile(r"(?:^|[^a-z])ampere_|sm8[069]_|cutlass_80_|nvjet_sm8"), 8, "Ampere"),
    (re.compile(r"sm90_|sm90a|nvjet_sm90|nvjet_tst|cutlass3x_sm90"), 9, "Hopper"),
    (re.compile(r"sm10[03]|sm100f|nvjet_sm10"), 10, "Blackwell"),
)


def architecture(kernel_names: list[str]) -> tuple[int, str] | None:
    """The newest NVIDIA architecture the kernels were built for, from their names."""
    found = None
    for major, family in (
        (m, f) for pattern, m, f in _ARCHITECTURES if any(pattern.search(n) for n in kernel_names)
    ):
        found = (major, family)
    return found


def is_communication(name: str) -> bool:
    lowered = name.lower()
    return "nccl" in lowered or "rccl" in lowered


# The collective a NCCL/RCCL kernel runs, from its name (`ncclKernel_AllReduce_RING_LL_Sum_float`,
# `ncclDevKernel_AllGather_RING_LL`, `ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t`): all-to-all
# runs as send/recv kernels, so it is counted there.
_COLLECTIVES = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("alltoall", "send_recv"), ("reduce", "reduce"),
)  # fmt: skip


def collective_kind(name: str) -> str:
    """all_reduce, all_gather, reduce_scatter, broadcast, send_recv, reduce, or other."""
    lowered = name.lower().replace("_", "")
    return next((kind for word, kind in _COLLECTIVES if word in lowered), "other")


class DeviceWork:
    """Per correlation id: the first start, last end and count of the device work (kernels,
    copies, memsets) it launched."""

    def __init__(self, t: Table) -> None:
        rows = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS) & (t.corr >= 0))
        corr = t.corr[rows]
        order = np.argsort(corr, kind="stable")
        self.corrs, heads, self.counts = np.unique(corr[order], return_index=True, return_counts=True)
        if len(rows):
            self.first = np.minimum.reduceat(t.ts[rows][order], heads)
            self.last = np.maximum.reduceat(t.end[rows][order], heads)
        else:
            self.first = self.last = np.empty(0)
        self.table = t
        self.runtime = np.flatnonzero((t.kind == RUNTIME) & (t.corr >= 0)).astype(np.int32)

    def launched_within(self, spans: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
        """Per host span: the last end of the device work launched by runtime calls inside it,
        and how many device events those calls launched."""
        starts = np.array([s for s, _ in spans])
        ends = np.array([e for _, e in spans])
        device_end, launched = np.full(len(spans), -np.inf), np.zeros(len(spans), np.int64)
        t, runtime = self.table, self.runtime
        runtime_start = t.ts[runtime]
        step = np.searchsorted(starts, runtime_start, side="right") - 1
        pos, found = positions(self.corrs, t.corr[runtime])
        inside = found & (step >= 0)
        safe = np.maximum(step, 0)
        inside &= (runtime_start < ends[safe]) & (t.end[runtime] <= ends[safe])
        np.maximum.at(device_end, step[inside], self.last[pos[inside]])
        np.add.at(launched, step[inside], self.counts[pos[inside]])
        return device_end, launched


def allocator_calls(t: Table) -> list[tuple[float, float]]:
    """(start, duration) of every device malloc/free runtime call."""
    runtime = t.rows(RUNTIME)
    rows = runtime[t.matching(runtime, ALLOCATOR_CALL.match)]
    return list(zip(t.ts[rows].tolist(), t.duration(rows).tolist()))


def describe(a: TraceAnalysis, t: Table, work: DeviceWork, compute: np.ndarray, busy: Union) -> None:
    """Fill in the device measurements of an analysis. `compute`: the kernels other than
    collectives; `busy`: the union of all device work (kernels, copies, memsets, collectives)."""
    kernels = np.flatnonzero(t.kind == KERNEL)
    runtime = t.rows(RUNTIME)
    graph_rows = runtime[t.matching(runtime, _GRAPH_LAUNCH.match)]
    in_graph = np.isin(t.corr[kernels], t.corr[graph_rows]) & (t.corr[kernels] >= 0)
    a.graph_launches, a.graph_kernels = len(graph_rows), int(in_graph.sum())
    durations = t.duration(kernels)
    a.kernels = len(kernels)
    a.short_kernels = int((durations[~in_graph] < SHORT_KERNEL_US).sum())
    a.kernel_us_median = float(np.median(durations)) if len(kernels) else None
    a.launch_delay_us_median = _launch_delay(t, kernels, work)
    starts = np.array([s.start_us for s in a.steps])
    ends = starts + np.array([s.dur_us for s in a.steps])
    wall_us = float((ends - starts).sum())
    if len(work.corrs) and wall_us:  # time inside the steps when the device ran anything
        a.gpu_busy_pct = 100.0 * float(busy.within(starts, ends).sum()) / wall_us
    _precision(a, t, compute)
    if a.gpu_name is None and a.compute_capability is None and len(kernels):
        names = [t.names[i] for i in np.unique(t.name[kernels]).tolist()]
        found = architecture(names)
        if found is not None:  # a 2021 trace without deviceProperties, say
            a.compute_capability, a.gpu_name = found[0], f"{found[1]}-class GPU (named by its kernels)"


def _launch_delay(t: Table, kernels: np.ndarray, work: DeviceWork) -> float | None:
    """Median time from a runtime call to the start of the first kernel it launched."""
    corr = t.corr[kernels]
    launched = corr >= 0
    if not launched.any():
        return None
    order = np.argsort(corr[launched], kind="stable")
    corrs, heads = np.unique(corr[launched][order], return_index=True)
    first = np.minimum.reduceat(t.ts[kernels][launched][order], heads)
    runtime_corr, runtime_start = t.corr[work.runtime], t.ts[work.runtime]
    by_corr = np.argsort(runtime_corr, kind="stable")
    pos, found = positions(runtime_corr[by_corr], corrs)
    if not found.any():
        return None
    return float(np.median(first[found] - runtime_start[by_corr][pos[found]]))


def combined(name_precision: str, input_precision: int, name: str) -> str:
    """A matrix kernel's precision from its name and its op's input dtypes: where both speak
    they must agree, where one speaks it decides, where they disagree or neither speaks it is
    unknown. fp32 inputs do reach matrix units (TF32 on NVIDIA, fp32 MFMA on AMD), so they
    disagree only with a name that shows reduced-precision operands."""
    if input_precision == REDUCED:
        return "unknown" if name_precision == "fp32" else "tensor_core"
    if input_precision == FLOAT32 and name_precision == "tensor_core" and _REDUCED_NAME.search(name):
        return "unknown"
    return name_precision


def _precision(a: TraceAnalysis, t: Table, compute: np.ndarray) -> None:
    """Shares of compute-kernel time in matrix work, on Tensor Cores, on the FP32 units, and
    of unknown precision."""
    inputs = np.zeros(len(compute), np.int64)
    if t.op_precision:
        ext_sorted = np.array(sorted(t.op_precision), np.int64)
        values = np.array([t.op_precision[e] for e in ext_sorted.tolist()], np.int64)
        ext = t.external(compute)
        pos, found = positions(ext_sorted, ext)
        hit = found & (ext >= 0)
        inputs[hit] = values[pos[hit]]
    keys = t.name[compute].astype(np.int64) * 3 + inputs
    durations = t.duration(compute)
    totals = np.bincount(keys, weights=durations) if len(compute) else np.empty(0)
    us = {"matrix": 0.0, "tensor_core": 0.0, "fp32": 0.0, "unknown": 0.0, "conv": 0.0}
    for key in np.flatnonzero(totals).tolist():
        name = t.names[key // 3]
        kind = classify(name)
        if not kind.matrix:
            continue
        spent = float(totals[key])
        us["matrix"] += spent
        us[combined(kind.precision, key % 3, name)] += spent
        us["conv"] += spent if kind.kind == "conv" else 0.0
    total = float(durations.sum())
    if total:
        a.tensor_core_pct = 100.0 * us["tensor_core"] / total
        a.matmul_pct = 100.0 * us["matrix"] / total
        a.fp32_matmul_pct = 100.0 * us["fp32"] / total
        a.conv_pct = 100.0 * us["conv"] / total
    if us["matrix"]:
        a.tensor_core_unknown_pct = 100.0 * us["unknown"] / us["matrix"]
    linked = int((inputs > 0).sum())
    a.precision_source = "kernel names" + (
        f" and the input dtypes of their ops ({linked} kernels linked, record_shapes)" if linked else ""
    )
