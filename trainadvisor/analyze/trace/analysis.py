"""Measurements from a Kineto trace: a per-step breakdown of wall time that adds up to the step,
copies, syncs, kernels, allocator calls and memory. Both schemas (2021: Operator/Runtime/Kernel/
Memcpy; current: cpu_op/user_annotation/cuda_runtime/cuda_driver/kernel/gpu_memcpy/gpu_memset),
CUDA and ROCm, with or without host events.

The breakdown follows the TensorBoard profiler plugin's definition, so its numbers can be
checked against that tool: every instant of a step is given to the first of kernel, memcpy,
memset, communication, runtime, data wait, other host work that covers it, and to idle when none
does; a step's span is extended to the end of the device work its runtime calls launched.
Everything runs on columns (`columns.Table`); see `steps` for where steps come from."""

from __future__ import annotations

import bisect
import gc
import re
from pathlib import Path
from typing import Any

import numpy as np

from trainadvisor.analyze.read.columns import (
    DEVICE_KINDS,
    HOST,
    HOST_KINDS,
    KERNEL,
    MEMCPY,
    MEMSET,
    RUNTIME,
    Table,
    group_label,
)
from trainadvisor.analyze.read.reading import read_table
from trainadvisor.analyze.read.sources import Location, file_name, shown
from trainadvisor.analyze.trace import callsites, copies, device, host, phases
from trainadvisor.analyze.trace import intervals as iv
from trainadvisor.analyze.trace.facts import HOST_ITEM, gather
from trainadvisor.analyze.trace.phases import OPTIMIZER_CALL
from trainadvisor.analyze.trace.steps import STEP_MARKER, Steps, find_steps, is_loader_call, loop_kind
from trainadvisor.analyze.trace.trace_flops import trace_utilization
from trainadvisor.analyze.trace.trace_records import Facts, StepBreakdown, TraceAnalysis
from trainadvisor.errors import UsageError

ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "data_wait", "other_host")
BREAKDOWN = (*ROLES, "idle")
SHORT_KERNEL_US = device.SHORT_KERNEL_US


def analyze_trace(
    path: Location,
    source_dirs: tuple[Path, ...] = (),
    workers: int | None = None,
    last_step: int | None = None,
) -> TraceAnalysis:
    """Measure one trace file: a path, or a URL of object storage (`sources`; its name in the
    analysis holds no credentials). The cyclic garbage collector is paused meanwhile: reading
    allocates millions of short-lived acyclic objects, and collecting over them repeatedly
    would cost about a third of the time. `last_step`: the last ProfilerStep#N the run that
    wrote the trace recorded whole (`analyze.trace.steps.find_steps`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _analyze(path, source_dirs, workers, last_step)
    finally:
        if enabled:
            gc.enable()


def _analyze(
    path: Location, source_dirs: tuple[Path, ...], workers: int | None, last_step: int | None
) -> TraceAnalysis:
    t, meta = read_table(path, workers)
    steps = find_steps(t, last_step)
    if not steps.spans:
        steps = _device_window(t, path)
    roles = _role_rows(t)
    work = device.DeviceWork(t)
    spans = _extended(steps, t, work)
    step_list, merged = _breakdown(t, roles, spans)
    facts = gather(t, source_dirs, roles["other_host"], roles["data_wait"])
    copies.resolve_unnamed_copies(facts)
    h2d_ops = copies.h2d_copy_ops(facts)
    creations = copies.cpu_tensor_copies(facts, h2d_ops)
    copies.copy_syncs(facts, h2d_ops)
    host_spans = [(host_start, host_end) for *_, host_start, host_end in spans]
    _per_step_counts(step_list, host_spans, facts, creations, device.allocator_calls(t))
    _count_model_ops(t, step_list, host_spans, roles["data_wait"])
    analysis = _summarize(path, meta, t, step_list, steps, merged, facts, creations)
    device.describe(analysis, t, work, roles["kernel"], merged["device"])
    analysis.host_busy_pct = host.host_busy_pct(t, step_list)
    analysis.communication = phases.attribute(t, step_list, spans, merged["kernel"], _groups_listed(meta))
    analysis.collectives = analysis.communication.by_kind if analysis.communication is not None else {}
    analysis.utilization, analysis.flops_source = trace_utilization(t, host_spans, analysis)
    return analysis


def _device_window(t: Table, path: Location) -> Steps:
    """A trace without host events (a GPU-only trace): its runtime and device work as one window."""
    rows = t.rows(RUNTIME, *DEVICE_KINDS)
    if not len(rows):
        raise UsageError(
            f"{shown(path)}: the trace has no host or device events to analyse (an empty trace?)"
        )
    window = [(0, float(t.ts[rows].min()), float(t.end[rows].max()))]
    return Steps(window, False, "no host events (a GPU-only trace): the device's work is one window")


def _role_rows(t: Table) -> dict[str, np.ndarray]:
    """The rows that make up each role of the breakdown."""
    host = t.rows(*HOST_KINDS)
    is_marker, is_loader = t.matching(host, STEP_MARKER.match), t.matching(host, is_loader_call)
    kernels = t.rows(KERNEL)
    comm = t.matching(kernels, device.is_communication)
    rows = {
        "kernel": kernels[~comm],
        "memcpy": t.rows(MEMCPY),
        "memset": t.rows(MEMSET),
        "communication": kernels[comm],
        "runtime": t.rows(RUNTIME),
        "data_wait": host[is_loader],
        "other_host": host[~is_loader & ~is_marker],
    }
    return {role: index.astype(np.int32) if len(t.kind) < 2**31 else index for role, index in rows.items()}


def _extended(
    steps: Steps, t: Table, work: device.DeviceWork
) -> list[tuple[int, float, float, float, float]]:
    """Host step spans extended to the device work launched inside them (the plugin's rule),
    the warm-up iteration dropped after extending, and trailing steps whose device work was
    not fully captured dropped. Each: (number, start, end, host start, host end)."""
    spans = sorted(steps.all_spans, key=lambda s: s[1])
    if not work.corrs.size:
        return [(n, s, e, s, e) for n, s, e in (spans[1:] if steps.warmup is not None else spans)]
    device_end, launched = work.launched_within([(s, e) for _, s, e in spans])
    extended, previous_end = [], spans[0][1]
    for (number, host_start, host_end), step_device_end in zip(spans, device_end.tolist()):
        start = max(previous_end, host_start)
        end = max(host_end, step_device_end, start)
        extended.append((number, start, end, host_start, host_end))
        previous_end = end
    counts = launched.tolist()
    if steps.warmup is not None:
        extended, counts = extended[1:], counts[1:]
    keep = len(extended)
    while keep > 0 and counts[keep - 1] == 0:
        keep -= 1
    if keep > 1 and counts[keep - 2] * 0.8 > counts[keep - 1]:
        keep -= 1
    return extended[:keep] or extended


def _breakdown(
    t: Table, roles: dict[str, np.ndarray], spans: list[tuple[int, float, float, float, float]]
) -> tuple[list[StepBreakdown], dict[str, iv.Union]]:
    """Each step's time by the first role covering each instant: the length of the union of
    roles up to r inside the step, less that of the roles before r. Also the unions the
    device measurements read: compute kernels, collectives, and all device work."""
    starts = np.array([span[1] for span in spans])
    ends = np.array([span[2] for span in spans])
    kept: dict[str, iv.Union] = {}
    covered = iv.Union(np.empty(0), np.empty(0))
    before = np.zeros(len(spans))
    per_role: dict[str, np.ndarray] = {}
    for role in ROLES:  # one role's spans at a time: memory holds one role's copy
        rows = roles[role]
        union = iv.Union(t.ts[rows], t.end[rows])
        if role in ("communication", "kernel"):
            kept[role] = union
        covered = covered.plus(union.starts, union.ends)
        if role == "communication":  # the device's roles come first: this is all its work
            kept["device"] = covered
        del union
        now = covered.within(starts, ends)
        per_role[role] = now - before
        before = now
    per_role["idle"] = (ends - starts) - before
    steps = [
        StepBreakdown(number, start, end - start, {key: float(per_role[key][i]) / 1e3 for key in BREAKDOWN})
        for i, (number, start, end, _, _) in enumerate(spans)
    ]
    return steps, kept


def _per_step_counts(
    steps: list[StepBreakdown],
    host: list[tuple[float, float]],
    f: Facts,
    creations: list[Any],
    allocator: list[tuple[float, float]],
) -> None:
    """Copies, syncs, host-made tensors and allocator calls per step, by the host-side step
    spans (host events belong to the step the host was in, not to the previous step whose
    device work was still running)."""
    spans = sorted((span, i) for i, span in enumerate(host))
    step_starts = [start for (start, _), _ in spans]

    def step_at(ts: float) -> StepBreakdown | None:
        i = bisect.bisect_right(step_starts, ts) - 1
        return steps[spans[i][1]] if i >= 0 and ts < spans[i][0][1] else None

    for ts, dur, kind, nbytes, _ in f.h2d:
        if (step := step_at(ts)) is not None:
            step.h2d_ms += dur / 1e3
            step.h2d_bytes += nbytes
            setattr(step, f"h2d_{kind}", getattr(step, f"h2d_{kind}") + 1)
    for ts, kind, dur, _ in f.syncs:
        if (step := step_at(ts)) is not None:
            step.syncs[kind] = step.syncs.get(kind, 0) + 1
            if kind in ("stream_sync", "device_sync"):  # an item's wait is the stream sync in it
                step.sync_ms += dur / 1e3
    for ts, *_ in creations:
        if (step := step_at(ts)) is not None:
            step.cpu_tensor_copies += 1
    for ts, dur in allocator:
        if (step := step_at(ts)) is not None:
            step.allocator_calls += 1
            step.allocator_ms += dur / 1e3


def _count_model_ops(
    t: Table, steps: list[StepBreakdown], host: list[tuple[float, float]], data_wait: np.ndarray
) -> None:
    """The aten ops that start in each step's host span, on any thread (autograd's backward
    runs on threads of its own), nested ones counted too, less those inside the optimizer's
    step and zero_grad and the data wait: the model's work, what the compile fix compiles
    (the H200 check's AdamW step held 169 of its step's 580)."""
    calls = t.rows(*HOST_KINDS)
    apart = np.concatenate([calls[t.matching(calls, OPTIMIZER_CALL.match)], data_wait])
    outside = iv.Union(t.ts[apart], t.end[apart])
    rows = t.rows(HOST)
    starts = t.ts[rows[t.matching(rows, lambda name: name.startswith("aten::"))]]
    starts = np.sort(starts[outside.within(starts, starts + 1e-3) == 0])
    for step, (start, end) in zip(steps, host, strict=True):
        step.model_aten_ops = int(np.searchsorted(starts, end) - np.searchsorted(starts, start))


def _sync_sites(f: Facts) -> list[str]:
    """Where the host waited for the device. With a device, .item() of a host tensor (Adam's
    step count) is no sync: only waits count. Without one, where .item() is called (the calls
    that wait once the run moves to a GPU)."""
    waits = [
        (tid, ts)
        for ts, kind, _, tid in f.syncs
        if kind in ("stream_sync", "device_sync") or (kind == HOST_ITEM and not f.kernels_seen)
    ]
    return callsites.sites(f, waits)


def _summarize(
    path: Location,
    meta: dict[str, Any],
    t: Table,
    steps: list[StepBreakdown],
    found: Steps,
    merged: dict[str, iv.Union],
    f: Facts,
    creations: list[tuple[float, str, Any, float]],
) -> TraceAnalysis:
    wall_ms = sum(s.dur_us for s in steps) / 1e3
    totals = {key: sum(s.ms[key] for s in steps) for key in BREAKDOWN}
    kinds = [kind for _, _, kind, _, _ in f.h2d]
    loop, evidence = loop_kind(t)
    loaders = sorted(
        {n[len("enumerate(DataLoader)#") : -len(".__next__")] for n in t.names if is_loader_call(n)}
    )
    return TraceAnalysis(
        **_identity(path, meta, t.device_events),
        steps_marked=found.marked,
        steps=steps,
        breakdown_pct={k: 100.0 * v / wall_ms for k, v in totals.items()} if wall_ms else {},
        step_time_ms_mean=wall_ms / len(steps) if steps else None,
        gpu_busy_pct=None,
        tensor_core_pct=None,
        kernels=0,
        short_kernels=0,
        kernel_us_median=None,
        launch_delay_us_median=None,
        h2d_pageable=kinds.count("pageable"),
        h2d_pinned=kinds.count("pinned"),
        h2d_unknown=kinds.count("unknown"),
        h2d_pageable_bytes=sum(b for _, _, kind, b, _ in f.h2d if kind == "pageable"),
        syncs=_counted(kind for _, kind, _, _ in f.syncs),
        peak_allocated_bytes=int(t.peak_allocated) if t.peak_allocated is not None else None,
        peak_reserved_bytes=int(t.peak_reserved) if t.peak_reserved is not None else None,
        loader_iterators=loaders,
        sync_sites=_sync_sites(f),
        cpu_tensor_ops=_counted(name for _, name, _, _ in creations),
        communication_overlap_pct=_overlap_pct(merged["communication"], merged["kernel"]),
        cpu_tensor_sites=callsites.sites(f, [(tid, f_start) for _, _, tid, f_start in creations]),
        steps_found=found.marked or found.warmup is not None,
        step_method=found.method,
        warmup_ms=(found.warmup[1] - found.warmup[0]) / 1e3 if found.warmup else None,
        loop=loop,
        loop_evidence=evidence,
        host_events=bool(len(t.rows(*HOST_KINDS))),
        allocator_calls=sum(s.allocator_calls for s in steps),
    )


def _identity(path: Location, meta: dict[str, Any], device_events: dict[int, int]) -> dict[str, Any]:
    """Which trace, rank and GPU, from the trace's top-level keys and the device its kernels,
    copies and memsets ran on."""
    gpu = _rank_gpu(meta.get("deviceProperties"), device_events)
    dist: dict[str, Any] = meta["distributedInfo"] if isinstance(meta.get("distributedInfo"), dict) else {}
    major = gpu.get("computeMajor")
    return {
        "path": shown(path),
        "events": int(meta.get("_events", 0)),
        "rank": dist.get("rank") if isinstance(dist.get("rank"), int) else _rank_in_name(path),
        "world_size": dist.get("world_size"),
        "gpu_name": gpu.get("name"),
        "gpu_memory_bytes": gpu.get("totalGlobalMem"),
        "compute_capability": major if isinstance(major, int) else None,
    }


def _rank_gpu(props: Any, device_events: dict[int, int]) -> dict[str, Any]:
    """The rank's GPU among those the trace lists: deviceProperties holds every device the
    process could see (8 on an 8-GPU node, for each rank), and the rank's is the one its device
    work ran on (the most of it). The first entry when nothing tells: no device work with a
    device index, or no entry of that id (ROCm traces may list one device, id 0, and number
    the device work otherwise)."""
    entries = [entry for entry in props if isinstance(entry, dict)] if isinstance(props, list) else []
    known = {index: count for index, count in device_events.items() if index >= 0}
    if known:
        busiest = max(known, key=lambda index: (known[index], -index))
        found = next((entry for entry in entries if entry.get("id") == busiest), None)
        if found is not None:
            return found
    return entries[0] if entries else {}


def _counted(keys: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return counts


def _groups_listed(meta: dict[str, Any]) -> list[str]:
    """The process groups distributedInfo lists ("default_pg, 2 ranks")."""
    dist = meta.get("distributedInfo")
    listed = dist.get("pg_config") if isinstance(dist, dict) else None
    return [
        group_label(str(g.get("pg_desc") or "")[:200], str(g.get("pg_name") or "")[:200], g.get("pg_size"))
        for g in (listed if isinstance(listed, list) else [])
        if isinstance(g, dict)
    ]


def _rank_in_name(path: Location) -> int | None:
    """A rank named by the file (`rank5.json`, `trace_rank-3.pt.trace.json.gz`) when the trace has
    no distributedInfo (older Kineto versions wrote none)."""
    found = re.search(r"(?:^|[^a-z])rank[-_]?(\d+)(?!\d)", file_name(path), re.I)
    return int(found.group(1)) if found else None


def _overlap_pct(communication: iv.Union, compute: iv.Union) -> float | None:
    total = float((communication.ends - communication.starts).sum())
    if not total:
        return None
    inside = compute.within(communication.starts, communication.ends)
    return 100.0 * float(inside.sum()) / total
