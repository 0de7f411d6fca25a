"""Measurements from a Kineto trace: a per-step breakdown of wall time that adds up to the step,
copies, syncs, kernels and memory. Both schemas (2021: Operator/Runtime/Kernel/Memcpy; current:
cpu_op/user_annotation/cuda_runtime/cuda_driver/kernel/gpu_memcpy/gpu_memset), CUDA and ROCm.

The breakdown follows the TensorBoard profiler plugin's definition, so its numbers can be
checked against that tool: every instant of a step is given to the first of kernel, memcpy,
memset, communication, runtime, data wait, other host work that covers it, and to idle when none
does; a step's span is extended to the end of the device work its runtime calls launched."""

from __future__ import annotations

import bisect
import gc
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainadvisor.analysis import callsites, copies
from trainadvisor.analysis import intervals as iv
from trainadvisor.analysis.kernels import classify
from trainadvisor.analysis.stream import Event, read_trace
from trainadvisor.errors import UsageError

ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "data_wait", "other_host")
BREAKDOWN = (*ROLES, "idle")

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_HOST_OPS = {"cpu_op", "operator", "user_annotation", "python"}
_RUNTIME = {"cuda_runtime", "runtime", "cuda_driver", "hip_runtime"}
_KERNEL = {"kernel"}
_MEMCPY = {"gpu_memcpy", "memcpy"}
_MEMSET = {"gpu_memset", "memset"}
_SYNCS = {
    "cudaStreamSynchronize": "stream_sync", "hipStreamSynchronize": "stream_sync",
    "cudaDeviceSynchronize": "device_sync", "hipDeviceSynchronize": "device_sync",
    "aten::_local_scalar_dense": "item",
    # ROCm: a blocking copy (`.item()`, `.cpu()`, a pageable upload) is one synchronous
    # hipMemcpyWithStream, with no stream sync after it. Inside a host-to-device copy op it is
    # the copy's own wait (`copies.copy_syncs`); elsewhere the host waited for the device.
    "hipMemcpyWithStream": "stream_sync", "hipMemcpy": "stream_sync",
}  # fmt: skip
# Runtime calls that copy synchronously: ROCm names no source memory ("Memcpy HtoD (Host ->
# Device)"), so a host-to-device copy they make counts as pageable: the host waits for it as for
# a pageable copy, and the fix (pinned memory, non-blocking copy) is the same.
_SYNC_COPIES = {"hipMemcpyWithStream", "hipMemcpy"}
SHORT_KERNEL_US = 10.0


@dataclass
class StepBreakdown:
    number: int
    start_us: float
    dur_us: float
    ms: dict[str, float]  # BREAKDOWN -> milliseconds; they add up to dur_us / 1000
    h2d_ms: float = 0.0
    h2d_pageable: int = 0
    h2d_pinned: int = 0
    h2d_unknown: int = 0
    h2d_bytes: int = 0
    syncs: dict[str, int] = field(default_factory=dict)
    sync_ms: float = 0.0  # host time blocked in stream/device synchronisation calls
    cpu_tensor_copies: int = 0  # tensors made on the host, then copied to the device


@dataclass
class TraceAnalysis:
    path: str
    events: int
    rank: int | None
    world_size: int | None
    gpu_name: str | None
    gpu_memory_bytes: int | None
    steps_marked: bool  # False: no ProfilerStep#N, the whole trace is one window
    steps: list[StepBreakdown]
    breakdown_pct: dict[str, float]
    step_time_ms_mean: float | None
    gpu_busy_pct: float | None
    tensor_core_pct: float | None
    kernels: int
    short_kernels: int
    kernel_us_median: float | None
    launch_delay_us_median: float | None
    h2d_pageable: int
    h2d_pinned: int
    h2d_unknown: int
    h2d_pageable_bytes: int
    syncs: dict[str, int]
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    loader_iterators: list[str] = field(default_factory=list)
    compute_capability: int | None = None  # major version (NVIDIA), or the GCN/CDNA generation
    matmul_pct: float | None = None  # share of compute-kernel time in matmul/conv/attention kernels
    fp32_matmul_pct: float | None = None  # ... in those whose names show the FP32 units (kernels.py)
    conv_pct: float | None = None  # ... in convolution kernels
    sync_sites: list[str] = field(default_factory=list)  # user code where syncs happened
    cpu_tensor_ops: dict[str, int] = field(default_factory=dict)  # creating op -> count
    cpu_tensor_sites: list[str] = field(default_factory=list)  # user code that made them
    communication_overlap_pct: float | None = None  # of communication time, under compute kernels


class _Collector:
    """Reduces the stream of events to what the analysis needs, chunk by chunk."""

    def __init__(self, source_dirs: tuple[Path, ...] = ()) -> None:
        self.source_dirs = source_dirs  # where the traced code's files may be read
        self.steps: list[tuple[int, float, float]] = []
        self.roles: dict[str, list[tuple[float, float]]] = {role: [] for role in ROLES}
        self.runtimes: list[tuple[float, float, Any]] = []
        self.device: dict[Any, list[float]] = {}  # correlation -> [first start, last end, count]
        self.runtime_start: dict[Any, float] = {}
        self.sync_copies: set[Any] = set()  # correlations of synchronous copy calls (ROCm)
        self.kernel_durations: list[float] = []
        self.kernel_starts: list[tuple[Any, float]] = []
        self.tensor_core_us = 0.0
        self.compute_kernel_us = 0.0  # kernels other than communication
        self.h2d: list[tuple[float, float, str, int, Any]] = []  # (ts, dur, kind, bytes, corr)
        self.syncs: list[tuple[float, str, float, Any]] = []  # (ts, kind, dur, tid)
        self.matmul_us = 0.0
        self.fp32_matmul_us = 0.0
        self.conv_us = 0.0
        self.named_ops: list[tuple[Any, float, float, str]] = []  # factory/copy/glue host ops
        self.host_starts: dict[Any, list[float]] = {}  # tid -> start of every host op
        self.frames: dict[Any, list[tuple[float, float, str]]] = {}  # tid -> "file|line|func"
        self.builtins: dict[Any, list[tuple[float, float, str]]] = {}  # tid -> torch built-in calls
        self.categories: dict[str, str] = {}  # category as written -> lower case
        self.loader_iterators: set[str] = set()  # DataLoader iterator classes seen
        self.peak_allocated: float | None = None
        self.peak_reserved: float | None = None

    def __call__(self, events: list[Event]) -> None:
        for e in events:
            if e.ph == "X":
                self._span(e)
            elif e.ph == "i" and e.name == "[memory]" and e.args is not None:
                self._memory(e)

    def _span(self, e: Event) -> None:
        cat = self.categories.get(e.cat)
        if cat is None:
            cat = self.categories[e.cat] = e.cat.lower()
        name, start = e.name, e.ts
        end = start + e.dur
        if cat in _HOST_OPS:
            step = _STEP.match(name) if name.startswith("ProfilerStep#") else None
            if step:
                self.steps.append((int(step.group(1)), start, end))
            elif name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__"):
                self.roles["data_wait"].append((start, end))
                self.loader_iterators.add(name[len("enumerate(DataLoader)#") : -len(".__next__")])
            else:
                self.roles["other_host"].append((start, end))
                self.host_starts.setdefault(e.tid, []).append(start)
                if name in _SYNCS:
                    self.syncs.append((start, _SYNCS[name], e.dur, e.tid))
                elif name in copies.FACTORY or name in copies.COPY or name in copies.GLUE:
                    self.named_ops.append((e.tid, start, end, name))
        elif cat == "python_function":
            self._frame(e)
        elif cat in _RUNTIME:
            self.roles["runtime"].append((start, end))
            corr = e.args.correlation if e.args else None
            if corr is not None:
                self.runtimes.append((start, end, corr))
                self.runtime_start[corr] = start
            if name in _SYNCS:
                self.syncs.append((start, _SYNCS[name], e.dur, e.tid))
            if name in _SYNC_COPIES and corr is not None:
                self.sync_copies.add(corr)
        elif cat in _KERNEL:
            lowered = name.lower()
            if "nccl" in lowered or "rccl" in lowered:
                self.roles["communication"].append((start, end))
            else:
                self.roles["kernel"].append((start, end))
                self.compute_kernel_us += e.dur
                kind = classify(name)
                if kind.matrix:
                    self.matmul_us += e.dur
                    self.tensor_core_us += e.dur if kind.tensor_core else 0.0
                    self.fp32_matmul_us += e.dur if kind.fp32_matrix else 0.0
                    self.conv_us += e.dur if kind.kind == "conv" else 0.0
            self.kernel_durations.append(e.dur)
            self._device(e, start, end, kernel=True)
        elif cat in _MEMCPY:
            self.roles["memcpy"].append((start, end))
            if "HtoD" in name or "HostToDevice" in name:
                kind = "pageable" if "Pageable" in name else "pinned" if "Pinned" in name else "unknown"
                nbytes = e.args.bytes if e.args and isinstance(e.args.bytes, int) else 0
                self.h2d.append((start, e.dur, kind, nbytes, e.args.correlation if e.args else None))
            self._device(e, start, end)
        elif cat in _MEMSET:
            self.roles["memset"].append((start, end))
            self._device(e, start, end)

    def _frame(self, e: Event) -> None:
        """Keep the Python frames of the user's own code (traces recorded with_stack=True), and
        the calls of torch built-ins that sync or create tensors, to name the call."""
        if e.name.startswith("<built-in"):
            callee = callsites.BUILTIN.match(e.name)
            if callee and callee["name"] in callsites.CALLEES:
                self.builtins.setdefault(e.tid, []).append((e.ts, e.ts + e.dur, callee["name"]))
            return
        if e.name.startswith(("<", "nn.Module:")) or e.name.startswith(callsites.LIBRARIES):
            return
        match = callsites.FRAME.match(e.name)
        if match is None or "site-packages" in match["file"] or match["file"].startswith("/usr/lib"):
            return
        module = match["file"].split("/")[0].removesuffix(".py")
        if module in sys.stdlib_module_names:
            return
        label = f"{match['file']}|{match['line']}|{match['func']}"
        self.frames.setdefault(e.tid, []).append((e.ts, e.ts + e.dur, label))

    def _device(self, e: Event, start: float, end: float, kernel: bool = False) -> None:
        corr = e.args.correlation if e.args else None
        if corr is None:
            return
        seen = self.device.get(corr)
        if seen is None:
            self.device[corr] = [start, end, 1]
        else:
            seen[0], seen[1], seen[2] = min(seen[0], start), max(seen[1], end), seen[2] + 1
        if kernel:
            self.kernel_starts.append((corr, start))

    def _memory(self, e: Event) -> None:
        args = e.args
        if args is None or args.device_type not in (1, 6):  # CUDA (ROCm reports it too) / HIP
            return
        if isinstance(args.total_allocated, (int, float)):
            self.peak_allocated = max(self.peak_allocated or 0, args.total_allocated)
        if isinstance(args.total_reserved, (int, float)):
            self.peak_reserved = max(self.peak_reserved or 0, args.total_reserved)


def _step_spans(c: _Collector) -> tuple[list[tuple[int, float, float]], bool]:
    """Host step spans extended to the device work launched inside them (the plugin's rule),
    with trailing steps whose device work was not fully captured dropped."""
    if not c.steps:
        host = c.roles["other_host"] + c.roles["data_wait"]
        if not host:
            return [], False
        return [(0, min(s for s, _ in host), max(e for _, e in host))], False
    steps = sorted(c.steps, key=lambda s: s[1])
    if not c.device:
        return steps, True
    runtimes = sorted(c.runtimes)
    starts = [r[0] for r in runtimes]
    device_end, launched = [], []
    for _, host_start, host_end in steps:
        last_end, count = float("-inf"), 0
        i = bisect.bisect_left(starts, host_start)
        while i < len(runtimes) and runtimes[i][0] < host_end:
            _, end, corr = runtimes[i]
            if end <= host_end and corr in c.device:
                _, last, n = c.device[corr]
                last_end, count = max(last_end, last), count + int(n)
            i += 1
        device_end.append(last_end)
        launched.append(count)
    extended, previous_end = [], steps[0][1]
    for (number, host_start, host_end), step_device_end in zip(steps, device_end):
        start = max(previous_end, host_start)
        end = max(host_end, step_device_end, start)
        extended.append((number, start, end))
        previous_end = end
    keep = len(extended)
    while keep > 0 and launched[keep - 1] == 0:
        keep -= 1
    if keep > 1 and launched[keep - 2] * 0.8 > launched[keep - 1]:
        keep -= 1
    return (extended[:keep] or extended), True


def analyze_trace(path: Path, source_dirs: tuple[Path, ...] = ()) -> TraceAnalysis:
    """Measure one trace file. The cyclic garbage collector is paused meanwhile: the analysis
    allocates millions of small acyclic objects, and collecting over them repeatedly would cost
    about a third of the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _analyze(path, source_dirs)
    finally:
        if enabled:
            gc.enable()


def _analyze(path: Path, source_dirs: tuple[Path, ...]) -> TraceAnalysis:
    collector = _Collector(source_dirs)
    meta = read_trace(path, collector)
    spans, marked = _step_spans(collector)
    if not spans:
        raise UsageError(f"{path}: the trace has no host events to analyse (an empty trace?)")
    merged = {role: iv.merge(collector.roles[role]) for role in ROLES}
    slots = iv.merge([(s, e) for _, s, e in spans])
    costs: dict[str, iv.Intervals] = {}
    for role in ROLES:
        costs[role] = iv.intersect(slots, merged[role])
        slots = iv.subtract(slots, costs[role])
    costs["idle"] = slots
    starts = {key: [s for s, _ in costs[key]] for key in BREAKDOWN}
    steps = [
        StepBreakdown(
            number=number,
            start_us=start,
            dur_us=end - start,
            ms={key: iv.clip_total(costs[key], starts[key], start, end) / 1e3 for key in BREAKDOWN},
        )
        for number, start, end in spans
    ]
    for python_spans in (*collector.frames.values(), *collector.builtins.values()):
        python_spans.sort()
    copies.resolve_unnamed_copies(collector)
    h2d_ops = copies.h2d_copy_ops(collector)
    creations = copies.cpu_tensor_copies(collector, h2d_ops)
    copies.copy_syncs(collector, h2d_ops)
    _per_step_counts(steps, collector, creations)
    return _summarize(path, meta, collector, steps, marked, merged, creations)


def _per_step_counts(steps: list[StepBreakdown], c: _Collector, creations: list[Any]) -> None:
    """Copies, syncs and host-made tensors per step, by the host-side step spans (host events
    belong to the step the host was in, not to the previous step whose device work was still
    running)."""
    host = {number: (start, end) for number, start, end in c.steps}
    spans = sorted(
        (host.get(s.number, (s.start_us, s.start_us + s.dur_us)), s) for s in steps
    )  # fmt: skip
    step_starts = [start for (start, _), _ in spans]

    def step_at(ts: float) -> StepBreakdown | None:
        i = bisect.bisect_right(step_starts, ts) - 1
        return spans[i][1] if i >= 0 and ts < spans[i][0][1] else None

    for ts, dur, kind, nbytes, _ in c.h2d:
        step = step_at(ts)
        if step is not None:
            step.h2d_ms += dur / 1e3
            step.h2d_bytes += nbytes
            setattr(step, f"h2d_{kind}", getattr(step, f"h2d_{kind}") + 1)
    for ts, kind, dur, _ in c.syncs:
        step = step_at(ts)
        if step is not None:
            step.syncs[kind] = step.syncs.get(kind, 0) + 1
            if kind in ("stream_sync", "device_sync"):  # an item's wait is the stream sync in it
                step.sync_ms += dur / 1e3
    for ts, *_ in creations:
        step = step_at(ts)
        if step is not None:
            step.cpu_tensor_copies += 1


def _overlap_pct(communication: iv.Intervals, compute: iv.Intervals) -> float | None:
    total = iv.total(communication)
    if not total:
        return None
    return 100.0 * iv.total(iv.intersect(communication, compute)) / total


def _device_busy_ms(steps: list[StepBreakdown], merged: dict[str, iv.Intervals]) -> float:
    """Time inside the steps when the device ran anything (kernels, copies, collectives)."""
    device = iv.merge(
        [span for role in ("kernel", "memcpy", "memset", "communication") for span in merged[role]]
    )
    device_starts = [start for start, _ in device]
    busy_us = sum(iv.clip_total(device, device_starts, s.start_us, s.start_us + s.dur_us) for s in steps)
    return busy_us / 1e3


def _sync_sites(c: _Collector) -> list[str]:
    """Where the host waited for the device. With a device, .item() of a host tensor (Adam's
    step count) is no sync: only waits count."""
    waits = [
        (tid, ts)
        for ts, kind, _, tid in c.syncs
        if kind in ("stream_sync", "device_sync") or (kind == "item" and not c.kernel_durations)
    ]
    return callsites.sites(c, waits)


def _summarize(
    path: Path,
    meta: dict[str, Any],
    c: _Collector,
    steps: list[StepBreakdown],
    marked: bool,
    merged: dict[str, iv.Intervals],
    creations: list[tuple[float, str, Any, float]],
) -> TraceAnalysis:
    wall_ms = sum(s.dur_us for s in steps) / 1e3
    totals = {key: sum(s.ms[key] for s in steps) for key in BREAKDOWN}
    busy_ms = _device_busy_ms(steps, merged)
    delays = [start - c.runtime_start[corr] for corr, start in c.kernel_starts if corr in c.runtime_start]
    props = meta.get("deviceProperties") or []
    gpu: dict[str, Any] = props[0] if props and isinstance(props[0], dict) else {}
    dist: dict[str, Any] = meta["distributedInfo"] if isinstance(meta.get("distributedInfo"), dict) else {}
    kinds = [kind for _, _, kind, _, _ in c.h2d]
    syncs: dict[str, int] = {}
    for _, kind, _, _ in c.syncs:
        syncs[kind] = syncs.get(kind, 0) + 1
    created: dict[str, int] = {}
    for _, name, _, _ in creations:
        created[name] = created.get(name, 0) + 1
    compute = c.compute_kernel_us
    major = gpu.get("computeMajor")
    return TraceAnalysis(
        path=str(path),
        events=int(meta.get("_events", 0)),
        rank=dist.get("rank"),
        world_size=dist.get("world_size"),
        gpu_name=gpu.get("name"),
        gpu_memory_bytes=gpu.get("totalGlobalMem"),
        steps_marked=marked,
        steps=steps,
        breakdown_pct={k: 100.0 * v / wall_ms for k, v in totals.items()} if wall_ms else {},
        step_time_ms_mean=wall_ms / len(steps) if steps else None,
        gpu_busy_pct=100.0 * busy_ms / wall_ms if c.device and wall_ms else None,
        tensor_core_pct=100.0 * c.tensor_core_us / c.compute_kernel_us if c.compute_kernel_us else None,
        kernels=len(c.kernel_durations),
        short_kernels=sum(d < SHORT_KERNEL_US for d in c.kernel_durations),
        kernel_us_median=statistics.median(c.kernel_durations) if c.kernel_durations else None,
        launch_delay_us_median=statistics.median(delays) if delays else None,
        h2d_pageable=kinds.count("pageable"),
        h2d_pinned=kinds.count("pinned"),
        h2d_unknown=kinds.count("unknown"),
        h2d_pageable_bytes=sum(b for _, _, kind, b, _ in c.h2d if kind == "pageable"),
        syncs=syncs,
        peak_allocated_bytes=int(c.peak_allocated) if c.peak_allocated is not None else None,
        peak_reserved_bytes=int(c.peak_reserved) if c.peak_reserved is not None else None,
        loader_iterators=sorted(c.loader_iterators),
        compute_capability=major if isinstance(major, int) else None,
        matmul_pct=100.0 * c.matmul_us / compute if compute else None,
        fp32_matmul_pct=100.0 * c.fp32_matmul_us / compute if compute else None,
        conv_pct=100.0 * c.conv_us / compute if compute else None,
        sync_sites=_sync_sites(c),
        cpu_tensor_ops=created,
        communication_overlap_pct=_overlap_pct(merged["communication"], merged["kernel"]),
        cpu_tensor_sites=callsites.sites(c, [(tid, f_start) for _, _, tid, f_start in creations]),
    )
