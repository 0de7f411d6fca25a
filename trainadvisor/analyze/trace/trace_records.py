"""The plain records of a trace's analysis: what the host-side pass gathers (`Facts`), each
step's breakdown (`StepBreakdown`) and the whole trace's measurements (`TraceAnalysis`). Data
only: the modules that fill them import this one, never each other for their types."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainadvisor.analyze.trace import intervals as iv
from trainadvisor.records.compute import Utilization


@dataclass
class Facts:
    source_dirs: tuple[Path, ...]
    syncs: list[tuple[float, str, float, Any]] = field(default_factory=list)  # (ts, kind, dur, tid)
    named_ops: list[tuple[Any, float, float, str]] = field(default_factory=list)  # (tid, start, end, name)
    h2d: list[tuple[float, float, str, int, Any]] = field(
        default_factory=list
    )  # (ts, dur, kind, bytes, corr)
    sync_copies: set[Any] = field(default_factory=set)  # correlations of synchronous copy calls
    runtime_start: dict[Any, float] = field(default_factory=dict)  # of the copies' launches
    host_starts: dict[Any, np.ndarray] = field(default_factory=dict)  # tid -> sorted op starts
    data_wait: iv.Intervals = field(default_factory=list)  # merged DataLoader waits
    frames: dict[Any, list[tuple[float, float, str]]] = field(default_factory=dict)  # "file|line|func"
    builtins: dict[Any, list[tuple[float, float, str]]] = field(default_factory=dict)
    kernels_seen: bool = False


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
    allocator_calls: int = 0  # device malloc/free runtime calls (cudaMalloc, hipFree, ...)
    allocator_ms: float = 0.0  # host time in them
    # aten ops of the model (forward, loss, backward) the host dispatched in the step, on any
    # thread, nested ones too: not those of the optimizer's step and zero_grad or the data wait
    model_aten_ops: int = 0
    # the step's host time by phase (`phases.PHASES`: data, forward, backward, optimizer,
    # other), ms; they add up to its host span
    phase_ms: dict[str, float] = field(default_factory=dict)
    compute_ms: float = 0.0  # compute in the step: kernels, or on a host-only trace its aten ops
    collective_ms: float = 0.0  # collectives in the step (waits for other ranks included)
    exposed_ms: float = 0.0  # of them, with no compute beside them


@dataclass
class CommAttribution:
    """A trace's communication (`phases`): ms per step and, of it, exposed (no compute beside
    it), in all and by collective kind, by the phase that launched it and by process group."""

    source: str  # "NCCL/RCCL kernels" or "the host backend's collectives (gloo)"
    ms_per_step: float
    exposed_ms_per_step: float
    # torchtitan's definition (PR #3020): (compute + communication - their union) / communication
    overlap_efficiency_pct: float | None
    by_kind: dict[str, list[float]] = field(default_factory=dict)  # kind -> [ms, exposed ms]
    by_phase: dict[str, list[float]] = field(default_factory=dict)  # forward/backward/optimizer/...
    by_group: dict[str, list[float]] = field(default_factory=dict)  # "default_pg, 8 ranks" -> ...


@dataclass
class TraceAnalysis:
    path: str
    events: int
    rank: int | None
    world_size: int | None
    gpu_name: str | None
    gpu_memory_bytes: int | None
    steps_marked: bool  # ProfilerStep#N markers are the steps
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
    fp32_matmul_pct: float | None = None  # ... in those shown to run on the FP32 units
    conv_pct: float | None = None  # ... in convolution kernels
    sync_sites: list[str] = field(default_factory=list)  # user code where syncs happened
    cpu_tensor_ops: dict[str, int] = field(default_factory=dict)  # creating op -> count
    cpu_tensor_sites: list[str] = field(default_factory=list)  # user code that made them
    communication_overlap_pct: float | None = None  # of communication time, under compute kernels
    # by collective (all_reduce, all_gather, ...): [ms per step, of it exposed: no compute
    # kernel running at the same time]
    collectives: dict[str, list[float]] = field(default_factory=dict)
    steps_found: bool = False  # steps are iterations (markers, or found from the loop's events)
    step_method: str = ""  # how the steps were found, for the report
    warmup_ms: float | None = None  # the first iteration, set apart from the steps
    loop: str = "unknown"  # training | inference | unknown
    loop_evidence: str = ""
    host_events: bool = True  # False: a GPU-only trace (no CPU ops)
    tensor_core_unknown_pct: float | None = None  # of matrix time, precision not known
    precision_source: str = ""  # kernel names, and input dtypes where recorded
    graph_launches: int = 0  # CUDA/HIP graph launches
    graph_kernels: int = 0  # kernels those launches ran
    allocator_calls: int = 0  # device malloc/free calls inside the steps
    host_busy_pct: float | None = None  # of step time, the loop's threads in their own work (`host`)
    time_unit_note: str = ""
    # FLOPs per step from the trace's ops and MFU against the GPU's peak (`trace_flops`): None
    # where the trace carries neither FLOPs nor shapes; flops_source "trace flops"/"trace shapes"
    utilization: Utilization | None = None
    communication: CommAttribution | None = None  # by phase and process group (`phases`)
    flops_source: str = ""
