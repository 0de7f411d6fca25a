"""Named measurements from a trace analysis and from the facts the child process read off torch
at the window (flags, memory statistics, optimizers). Rules are written against these names; a
name that is absent was not measured, and a rule that needs it stays quiet. Pure."""

from __future__ import annotations

import statistics
from typing import Any

from trainadvisor.analyze.trace.analysis import TraceAnalysis
from trainadvisor.analyze.trace.phases import on_host
from trainadvisor.compute.dynamo import compile_measurements
from trainadvisor.memory.oom import oom_measurements

# GPUs whose name says AMD: ROCm reports a GCN/CDNA generation in computeMajor, not a CUDA
# compute capability, so the NVIDIA capability thresholds do not apply to them.
_AMD = ("AMD", "Radeon", "Instinct")


def trace_measurements(a: TraceAnalysis) -> dict[str, Any]:
    """What one trace tells, per step where it is a count (counts from the host-side steps)."""
    steps = a.steps
    n = len(steps)
    step_ms = statistics.fmean(s.dur_us / 1e3 for s in steps) if steps else None
    table: dict[str, Any] = {
        "gpu_busy_pct": a.gpu_busy_pct,
        "host_busy_pct": a.host_busy_pct,
        "tensor_core_pct": a.tensor_core_pct,
        "matmul_pct": a.matmul_pct,
        "fp32_matmul_pct": a.fp32_matmul_pct,
        "conv_pct": a.conv_pct,
        "launch_delay_us_median": a.launch_delay_us_median,
        "kernel_us_median": a.kernel_us_median,
        "communication_overlap_pct": a.communication_overlap_pct,
    }
    if a.kernels:  # the share of the step in NCCL/RCCL kernels
        table["communication_pct"] = a.breakdown_pct.get("communication")
    table.update(communication_measurements(a, step_ms))
    table.update(_gpu_facts(a))
    launched = a.kernels - a.graph_kernels  # a graph's kernels are not launched by the host
    if launched and n:
        table["short_kernel_pct"] = 100.0 * a.short_kernels / launched
    # Counts per step only where steps were found (markers, or iterations the loop's events
    # show): a trace that is one window of unknown length gives its totals per window.
    if launched and n and a.steps_found:
        table["kernels_per_step"] = launched / n
    if n and step_ms:
        table.update(_per_step(a, step_ms))
    if a.steps_found and n:
        table.update(allocator_measurements(a, step_ms))
        if any(s.model_aten_ops for s in steps):  # a trace without host ops (GPU-only) counts none
            table["model_aten_ops_per_step"] = sum(s.model_aten_ops for s in steps) / n
    if a.graph_launches:
        table["graph_launches"] = a.graph_launches
        table["graph_kernels"] = a.graph_kernels
    table["step_unit"] = "step" if a.steps_found else "window"
    table["training_loop"] = a.loop == "training"
    table["inference_loop"] = a.loop == "inference"
    if a.tensor_core_unknown_pct is not None:
        table["tensor_core_unknown_pct"] = a.tensor_core_unknown_pct
    if a.sync_sites:
        table["sync_site"] = a.sync_sites[0]
        table["sync_sites"] = "; ".join(a.sync_sites[:3])
    if a.cpu_tensor_ops:
        table["cpu_tensor_op"] = max(a.cpu_tensor_ops, key=lambda op: a.cpu_tensor_ops[op])
    if a.cpu_tensor_sites:
        table["cpu_tensor_site"] = a.cpu_tensor_sites[0]
        table["cpu_tensor_sites"] = "; ".join(a.cpu_tensor_sites[:3])
    table.update(memory_measurements(a.peak_allocated_bytes, a.peak_reserved_bytes, a.gpu_memory_bytes))
    table.update(utilization_measurements(a))
    return {k: v for k, v in table.items() if v is not None}


def communication_measurements(a: TraceAnalysis, step_ms: float | None) -> dict[str, Any]:
    """Collectives per step, exposed, by phase and process group (`trace.phases`); on a trace
    whose collectives ran on the host (gloo: no kernels), their share of the step too."""
    c = a.communication
    if c is None or not step_ms:
        return {}
    table: dict[str, Any] = {
        "collective_ms_per_step": c.ms_per_step,
        "collective_exposed_ms_per_step": c.exposed_ms_per_step,
        "communication_exposed_pct": 100.0 * c.exposed_ms_per_step / step_ms,
        "overlap_efficiency_pct": c.overlap_efficiency_pct,
        "communication_phases": split_text(c.by_phase),
        "communication_kinds": split_text(c.by_kind),
    }
    if c.by_group:
        table["communication_groups"] = split_text(c.by_group)
    if on_host(a):  # a host backend's collectives stand in for the kernels' share
        table["communication_pct"] = 100.0 * c.ms_per_step / step_ms
        table["communication_overlap_pct"] = c.overlap_efficiency_pct
    return table


def split_text(split: dict[str, list[float]]) -> str:
    """'backward 9.5 ms (7.7 ms exposed), forward 2.5 ms (2.5 ms exposed)', largest first."""
    ordered = sorted(split.items(), key=lambda item: -item[1][0])
    return ", ".join(f"{label} {ms:.3g} ms ({exposed:.3g} ms exposed)" for label, (ms, exposed) in ordered)


def traced_only(a: TraceAnalysis) -> dict[str, Any]:
    """What a trace alone must stand in for where no process of the script was watched
    (`analyze`): whether a GPU ran, the host-to-device copies, and the DataLoader's workers as
    far as its iterator's class tells them (0, or some: a multi-process loader is its own
    measurement, not a count)."""
    table: dict[str, Any] = {
        "cuda_used": a.gpu_name is not None or bool(a.kernels),
        "h2d_pageable": a.h2d_pageable,
        "h2d_pinned": a.h2d_pinned,
    }
    if a.loader_iterators == ["_SingleProcessDataLoaderIter"]:
        table["num_workers"] = 0
    elif a.loader_iterators:
        table["multiprocess_loader"] = True
    return {k: v for k, v in table.items() if v is not None}


def utilization_measurements(a: TraceAnalysis) -> dict[str, Any]:
    """FLOPs per step (per window where no steps were found) from the trace's own ops, the FLOP/s
    they ran at, and MFU where the device's peak is known (`trace_flops`); nothing where the
    trace does not give the FLOPs. A profiled run's own count replaces these (`named_measurements`)."""
    use = a.utilization
    if use is None or use.flops_per_step is None:
        return {}
    return {
        "flops_per_step": use.flops_per_step,
        "flops_source": a.flops_source,
        "achieved_tflops": use.achieved_tflops,
        "mfu_pct": use.mfu_pct,
        "peak_tflops": use.peak_tflops,
    }


def allocator_measurements(a: TraceAnalysis, step_ms: float | None) -> dict[str, Any]:
    """Device malloc/free calls in the steps (the caching allocator's job is to avoid them)."""
    steps = a.steps
    calls = sum(s.allocator_calls for s in steps)
    spent_ms = sum(s.allocator_ms for s in steps)
    table: dict[str, Any] = {"allocator_calls_per_step": calls / len(steps)}
    table["allocator_ms_per_step"] = spent_ms / len(steps)
    if step_ms:
        table["allocator_pct"] = 100.0 * table["allocator_ms_per_step"] / step_ms
    table["allocator_steps_with_calls"] = sum(1 for s in steps if s.allocator_calls)
    return table


def memory_measurements(
    allocated: int | None,
    reserved: int | None,
    total: int | None,
    limit: int | None = None,
    limit_source: str | None = None,
) -> dict[str, Any]:
    """Peak memory against what this process's allocator may use: `limit` (a per-process
    fraction, or what other processes left free; `gpu.allocator_limit`) where the run measured
    it, else the card's `total` (a trace tells no more)."""
    table: dict[str, Any] = {}
    if total:
        table["gpu_memory_bytes"] = total
    usable = limit or total
    if usable:
        table["memory_limit_bytes"] = usable
        table["memory_limit_source"] = limit_source if limit else "device total"
    if reserved is not None:
        table["peak_reserved_bytes"] = reserved
        if usable:
            table["peak_reserved_pct"] = 100.0 * reserved / usable
            table["memory_headroom_pct"] = 100.0 - table["peak_reserved_pct"]
        if allocated is not None and reserved:
            table["peak_allocated_bytes"] = allocated
            table["reserved_unused_pct"] = 100.0 * (reserved - allocated) / reserved
    return table


def runtime_measurements(runtime: dict[str, Any]) -> dict[str, Any]:
    """The torch state the child read at the window (see `training.gpu.torch_facts`)."""
    table = {k: v for k, v in runtime.items() if not isinstance(v, dict) and v is not None}
    memory = runtime.get("cuda_memory") or {}
    if memory:
        peaks = (memory.get("peak_allocated_bytes"), memory.get("peak_reserved_bytes"))
        limit = (memory.get("limit_bytes"), memory.get("limit_source"))
        table.update(memory_measurements(*peaks, memory.get("total_bytes"), *limit))
        table["alloc_retries"] = memory.get("alloc_retries", 0)
        table["ooms"] = memory.get("ooms", 0)
    # torch.compile's graph breaks, recompilations and compile time (`compute.dynamo`)
    table.update(compile_measurements(runtime.get("compile") or {}))
    # what an out-of-memory death left (`memory.oom`)
    table.update(oom_measurements(runtime.get("oom") or {}))
    return table


def _gpu_facts(a: TraceAnalysis) -> dict[str, Any]:
    """The GPU the trace ran on and what it has in hardware."""
    if a.gpu_name is None:
        return {}
    facts: dict[str, Any] = {"gpu_name": a.gpu_name}
    amd = any(word in a.gpu_name for word in _AMD)
    major = a.compute_capability
    # ROCm's computeMajor 9 covers both Vega (no matrix cores) and CDNA (matrix cores), so
    # on AMD what the GPU has is left unmeasured and the rules that need it stay quiet.
    if major is not None and not amd:
        facts["compute_capability"] = major
        facts["has_tensor_cores"] = major >= 7  # Volta and newer
        facts["tf32_supported"] = major >= 8  # Ampere and newer
        facts["bf16_supported"] = major >= 8
    return facts


def _per_step(a: TraceAnalysis, step_ms: float) -> dict[str, Any]:
    """Copies, syncs and host-made tensors per step (a trace that marks its steps)."""
    steps = a.steps
    n = len(steps)
    table: dict[str, Any] = {}
    h2d = [s.h2d_pageable + s.h2d_pinned + s.h2d_unknown for s in steps]
    table["h2d_copies_per_step"] = sum(h2d) / n
    table["h2d_pageable_per_step"] = sum(s.h2d_pageable for s in steps) / n
    table["h2d_pinned_per_step"] = sum(s.h2d_pinned for s in steps) / n
    if sum(h2d):
        table["h2d_pageable_pct"] = 100.0 * sum(s.h2d_pageable for s in steps) / sum(h2d)
        table["h2d_ms_per_step"] = sum(s.h2d_ms for s in steps) / n
        table["h2d_pct"] = 100.0 * table["h2d_ms_per_step"] / step_ms
    # The host's waits for the device: an .item() of a GPU tensor is a copy plus a stream sync
    # (counted once, as the sync); an .item() of a host tensor, like Adam's step count, and
    # every .item() of a run without a GPU wait for nothing (`facts.HOST_ITEM`, not counted).
    syncs = [s.syncs.get("stream_sync", 0) + s.syncs.get("device_sync", 0) for s in steps]
    table["syncs_per_step"] = sum(syncs) / n
    table["items_per_step"] = sum(s.syncs.get("item", 0) for s in steps) / n
    table["sync_ms_per_step"] = sum(s.sync_ms for s in steps) / n
    table["sync_pct"] = 100.0 * table["sync_ms_per_step"] / step_ms
    table["cpu_tensor_copies_per_step"] = sum(s.cpu_tensor_copies for s in steps) / n
    return table
