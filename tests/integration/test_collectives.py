"""Communication by collective (39.2): each NCCL/RCCL kernel's collective from its name (real
names from public traces), and each collective's time per step with its exposed part (no compute
kernel running at the same time), on hand-built and recorded traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import shared_trace

from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.analyze.trace.device import collective_kind


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # HTA's nccl_parser_config and trace_filter traces (NCCL 2.x kernel names)
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "all_reduce"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),
        # NCCL >= 2.19 names its kernels ncclDevKernel_<Collective>_...
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
        ("ncclDevKernel_Reduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce"),
        ("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", "other"),
    ],
)
def test_the_collective_a_kernel_runs_is_read_from_its_name(name: str, kind: str) -> None:
    assert collective_kind(name) == kind


def _event(name: str, cat: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0, "tid": 7, "args": args}


def test_each_collectives_exposed_time_is_what_no_compute_kernel_covers(tmp_path: Path) -> None:
    """Two steps of 100 us. Step 1: an all-reduce of 40 us, 10 of it under a compute kernel;
    step 2: an all-reduce of 20 us under compute throughout and a broadcast of 10 us alone."""
    gpu = {"device": 0, "stream": 7}
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 100),
        _event("ProfilerStep#2", "user_annotation", 100, 100),
        _event("gemm_kernel", "kernel", 0, 40, **gpu),
        _event("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "kernel", 30, 40, **gpu),
        _event("gemm_kernel", "kernel", 100, 50, **gpu),
        _event("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "kernel", 110, 20, **gpu),
        _event("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)", "kernel", 160, 10, **gpu),
    ]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    a = analyze_trace(path)
    # all_reduce: (40 + 20) / 2 = 30 us a step, exposed (30 + 0) / 2 = 15; broadcast 5, exposed 5
    assert a.collectives == {"all_reduce": [0.03, 0.015], "broadcast": [0.005, 0.005]}


def test_a_recorded_jobs_collectives_per_step() -> None:
    a = analyze_trace(shared_trace("hta/nccl_parser_config/nccl_data.json.gz"))
    assert {k: [round(v, 3) for v in pair] for k, pair in a.collectives.items()} == {
        "all_reduce": [15.587, 13.148],
        "broadcast": [0.038, 0.038],
    }
    ms, exposed = a.collectives["all_reduce"]
    assert 100 * (1 - exposed / ms) == pytest.approx(a.communication_overlap_pct, abs=0.1)  # one collective
