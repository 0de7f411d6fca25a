"""Communication by phase and process group, overlap efficiency (39.2), and the critical path
across ranks (39.3): hand-built traces with exact expected values, the recorded NCCL job of
Holistic Trace Analysis, and steps built by hand for the cross-rank part."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import shared_trace

from trainadvisor.analyze.run.critical_path import critical_measurements, critical_path
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.analyze.trace.phases import host_collective_kind, job_from_collectives, on_host
from trainadvisor.analyze.trace.trace_records import CommAttribution, StepBreakdown

NCCL_ALL_REDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _event(name: str, cat: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0, "tid": tid, "args": args}


def _write(tmp_path: Path, events: list[dict[str, Any]], **meta: Any) -> Path:
    path = tmp_path / "rank0.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events, **meta}, f)
    return path


def _launch(name: str, ts: float, corr: int) -> dict[str, Any]:
    return _event("cudaLaunchKernel", "cuda_runtime", ts, 2, correlation=corr)


def _kernel(name: str, ts: float, dur: float, corr: int, **args: Any) -> dict[str, Any]:
    return _event(name, "kernel", ts, dur, tid=7, device=0, stream=7, correlation=corr, **args)


def test_collectives_by_phase_and_group_with_their_exposed_part(tmp_path: Path) -> None:
    """One step of 100 us: forward 0-40 (an all-gather launched at 5, kernel 10-30, a gemm
    20-40 beside it), backward 40-80 (an all-reduce launched at 50, kernel 60-90 of which a gemm
    covers 60-70), optimizer step 80-100. The all-gather is in a group the kernel names; the
    all-reduce only the trace's one listed group tells."""
    tp = {"Process Group Name": "1", "Process Group Description": "tp_group", "Group size": 4}
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 100),
        _event("aten::linear", "cpu_op", 2, 30),
        _launch("all_gather", 5, 1),
        _kernel(NCCL_ALL_GATHER, 10, 20, 1, **tp),
        _launch("gemm", 15, 2),
        _kernel("sm90_gemm_kernel", 20, 20, 2),
        _event("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 40, 40),
        _launch("all_reduce", 50, 3),
        _kernel(NCCL_ALL_REDUCE, 60, 30, 3),
        _launch("gemm", 55, 4),
        _kernel("sm90_gemm_kernel", 60, 10, 4),
        _event("Optimizer.step#AdamW.step", "user_annotation", 80, 20),
    ]
    dist = {
        "rank": 0,
        "world_size": 8,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8}],
    }
    a = analyze_trace(_write(tmp_path, events, distributedInfo=dist))
    c = a.communication
    assert c is not None and c.source == "NCCL/RCCL kernels"
    # all-gather 20 us, 10 of it beside the gemm; all-reduce 30 us, 10 beside the other gemm
    assert c.by_phase == {"forward": [0.02, 0.01], "backward": [0.03, 0.02]}
    assert c.by_kind == {"all_gather": [0.02, 0.01], "all_reduce": [0.03, 0.02]}
    assert c.by_group == {"tp_group, 4 ranks": [0.02, 0.01], "default_pg, 8 ranks": [0.03, 0.02]}
    assert (c.ms_per_step, c.exposed_ms_per_step) == (0.05, 0.03)
    # torchtitan's: overlap = compute 30 + comm 50 - union 60 = 20 us; 20 / 50
    assert c.overlap_efficiency_pct == pytest.approx(40.0)
    step = a.steps[0]
    assert step.phase_ms == pytest.approx(
        {"data": 0.0, "forward": 0.04, "backward": 0.04, "optimizer": 0.02, "other": 0.0}
    )
    assert (step.compute_ms, step.collective_ms, step.exposed_ms) == pytest.approx((0.03, 0.05, 0.03))


def test_a_host_backends_collectives_by_the_op_that_issued_them(tmp_path: Path) -> None:
    """gloo runs a collective on its worker thread (tid 9) when the training thread (tid 1)
    issues it: a reduce-scatter issued in the backward pass at 45 runs as `gloo:all_reduce`
    at 82-92, after the last autograd op: the backward pass lasts until it is done, and the
    main thread's compute (aten ops) at 82-86 hides 4 us of it."""
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 100),
        _event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 0, 10),
        _event("c10d::_allgather_base_", "cpu_op", 12, 2),
        _event("gloo:all_gather", "user_annotation", 14, 6, tid=9),
        _event("aten::linear", "cpu_op", 20, 20),
        _event("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 40, 40),
        _event("c10d::_reduce_scatter_base_", "cpu_op", 45, 2),
        _event("aten::mm", "cpu_op", 50, 20),
        _event("aten::copy_", "cpu_op", 82, 4),
        _event("gloo:all_reduce", "user_annotation", 82, 10, tid=9),
        _event("aten::copy_", "cpu_op", 84, 1, tid=9),  # the worker's own ops are not compute
        _event("Optimizer.step#SGD.step", "user_annotation", 92, 8),
        _event("aten::add_", "cpu_op", 93, 5),
    ]
    a = analyze_trace(_write(tmp_path, events))
    c = a.communication
    assert c is not None and c.source == "the host backend's collectives (gloo)"
    assert c.by_kind == {"all_gather": [0.006, 0.006], "reduce_scatter": [0.01, 0.006]}
    assert c.by_phase == {"forward": [0.006, 0.006], "backward": [0.01, 0.006]}
    assert c.by_group == {}  # neither the trace nor its ops name a group
    assert a.collectives == c.by_kind
    assert a.steps[0].phase_ms == pytest.approx(
        {"data": 0.01, "forward": 0.03, "backward": 0.052, "optimizer": 0.008, "other": 0.0}
    )


def test_a_gloo_jobs_collectives_beside_its_compute_kernels(tmp_path: Path) -> None:
    """DDP on gloo with CUDA tensors: the trace holds compute kernels (gemms at 10-40 and
    60-70) and no NCCL kernel; its all-reduce runs as gloo's span at 60-90. The collectives are
    gloo's, the compute the kernels' (not the host's aten::mm at 50-85, which waits on them):
    10 of the all-reduce's 30 us are beside a gemm."""
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 100),
        _event("aten::linear", "cpu_op", 2, 38),
        _launch("gemm", 5, 1),
        _kernel("sm90_gemm_kernel", 10, 30, 1),
        _event("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 40, 40),
        _event("c10d::allreduce_", "cpu_op", 50, 2),
        _event("aten::mm", "cpu_op", 50, 35),
        _launch("gemm", 55, 2),
        _kernel("sm90_gemm_kernel", 60, 10, 2),
        _event("gloo:all_reduce", "user_annotation", 60, 30, tid=9),
        _event("Optimizer.step#SGD.step", "user_annotation", 90, 10),
    ]
    a = analyze_trace(_write(tmp_path, events))
    c = a.communication
    assert c is not None and c.source == "the host backend's collectives (gloo)" and on_host(a)
    assert c.by_kind == {"all_reduce": [0.03, 0.02]}
    assert (c.ms_per_step, c.exposed_ms_per_step) == pytest.approx((0.03, 0.02))
    assert c.overlap_efficiency_pct == pytest.approx(100 / 3)
    assert a.steps[0].compute_ms == pytest.approx(0.04)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("gloo:all_reduce", "all_reduce"),
        ("gloo:all_gather", "all_gather"),
        ("gloo:broadcast", "broadcast"),
        ("c10d::_reduce_scatter_base_", "reduce_scatter"),
        ("c10d::allgather_into_tensor_coalesced_", "all_gather"),
        ("c10d::alltoall_base_", "all_to_all"),
        ("c10d::send", "send_recv"),
        ("gloo:barrier", "barrier"),
    ],
)
def test_a_host_collectives_kind(name: str, kind: str) -> None:
    assert host_collective_kind(name) == kind


def test_the_recorded_ddp_jobs_all_reduce_is_launched_in_the_backward_pass() -> None:
    a = analyze_trace(shared_trace("hta/nccl_parser_config/nccl_data.json.gz"))
    c = a.communication
    assert c is not None
    rounded = {phase: [round(v, 3) for v in ms] for phase, ms in c.by_phase.items()}
    assert rounded == {"backward": [15.587, 13.148], "forward": [0.038, 0.038]}  # DDP's broadcast
    assert list(c.by_group) == ["default_pg, 2 ranks"]
    assert c.overlap_efficiency_pct == pytest.approx(15.61, abs=0.01)


def _step(
    number: int, data: float, forward: float, comm: float, compute: float, step: float = 30.0
) -> StepBreakdown:
    phases = {"data": data, "forward": forward, "backward": step - data - forward - 1.0, "optimizer": 1.0}
    s = StepBreakdown(number, 0.0, step * 1e3, {"data_wait": data})
    s.phase_ms, s.compute_ms, s.collective_ms, s.exposed_ms = phases, compute, comm, comm
    return s


def test_the_rank_slow_in_its_data_gates_the_steps() -> None:
    """Four ranks, five steps: rank 2 waits 12 ms more in its DataLoader, so it spends 12 ms
    less in the all-reduce, which the others wait in for it."""
    ranks = {
        r: [
            _step(n, 2.0 + (12.0 if r == 2 else 0.0), 5.0, 16.0 - (12.0 if r == 2 else 0.0), 8.0)
            for n in range(5)
        ]
        for r in range(4)
    }
    path = critical_path(ranks)
    assert path is not None
    assert (path.gating_rank, path.gated_steps, path.steps, path.by) == (2, 5, 5, "collectives")
    assert (path.cause, path.phase) == ("data", "data")
    assert path.excess_ms["data"] == pytest.approx(12.0)
    assert path.wait_ms == pytest.approx(12.0)
    said = critical_measurements(path)
    assert said["straggler_cause"] == "data"
    assert said["critical_path"] == (
        "rank 2 gates 5 of 5 steps: its data loading is 12.0 ms longer than the other ranks' and it is slow "
        "in its data loading (+12.0 ms per step); the others wait 12.0 ms per step for it"
    )


def test_the_rank_slow_in_its_compute_and_balanced_ranks() -> None:
    slow = {
        r: [
            _step(
                n,
                2.0,
                5.0 + (9.0 if r == 1 else 0),
                10.0 - (9.0 if r == 1 else 0),
                8.0 + (9.0 if r == 1 else 0),
            )
            for n in range(3)
        ]
        for r in range(2)
    }
    path = critical_path(slow)
    assert path is not None and (path.gating_rank, path.cause, path.phase) == (1, "compute", "forward")
    even = {r: [_step(n, 2.0, 5.0, 10.0 + 0.1 * r, 8.0) for n in range(3)] for r in range(3)}
    balanced = critical_path(even)
    assert balanced is not None and balanced.sentence().startswith("no rank holds the others back")
    assert critical_path({0: even[0]}) is None  # one rank: no path across ranks


@pytest.mark.parametrize(
    ("kinds", "phases", "said"),
    [
        ({"all_gather", "reduce_scatter"}, {"forward", "backward"}, "FSDP-like: parameters all-gathered"),
        (
            {"all_gather", "reduce_scatter"},
            {"backward", "optimizer"},
            "sharded gradients and optimizer state",
        ),
        (
            {"all_reduce", "broadcast"},
            {"backward", "forward"},
            "DDP-like data parallel: gradients all-reduced",
        ),
        ({"send_recv"}, {"forward", "backward"}, "point-to-point (send/recv"),
        ({"broadcast"}, {"forward"}, "collectives: broadcast"),
    ],
)
def test_the_job_is_said_from_its_collectives_alone(kinds: set[str], phases: set[str], said: str) -> None:
    c = CommAttribution(
        "NCCL/RCCL kernels", 1.0, 1.0, 0.0, {k: [1.0, 1.0] for k in kinds}, {p: [1.0, 1.0] for p in phases},
        {"default_pg, 8 ranks": [1.0, 1.0]},
    )  # fmt: skip
    text = job_from_collectives(c, 8)
    assert text is not None
    assert text.startswith(said) and text.endswith(
        " over 8 ranks; process groups: default_pg, 8 ranks (from the trace's collectives)"
    )


def test_no_straggler_is_made_of_noise_or_a_step_without_collectives() -> None:
    """Without collectives, ranks 0.01 ms apart: no one gates. A step whose trace holds no
    collective on one rank is gated by the longest step, not by that rank's zero."""
    close = {r: [_step(n, 2.0, 5.0, 0.0, 8.0, step=30.0 + 0.01 * r) for n in range(3)] for r in range(2)}
    path = critical_path(close)
    assert path is not None and path.by == "step time" and not path.notable()
    assert path.sentence().startswith("no rank holds the others back: the longest steps are 0.0 ms longer")
    cut = {
        0: [_step(n, 2.0, 5.0, 5.0, 8.0) for n in range(3)],
        1: [_step(0, 2.0, 5.0, 20.0, 8.0), _step(1, 2.0, 5.0, 0.0, 8.0), _step(2, 2.0, 5.0, 0.0, 8.0)],
    }
    gated = critical_path(cut)
    # step 0 by collectives (rank 1 waits 15 ms), 1-2 by step time (equal steps): by step time
    assert gated is not None and gated.gates == [(0, 3)] and gated.by == "step time"
    assert gated.wait_ms == 0.0 and not gated.notable()
    assert "wait -" not in gated.sentence() and "longer than the others'" in gated.sentence()


def test_a_wait_its_own_work_does_not_explain_is_communication() -> None:
    """Rank 0 waits 6 ms less in its collectives, but its own work is 1 ms longer in all (its
    traced step is shorter): what the others wait for is not its work, but communication."""
    ranks = {
        0: [_step(n, 2.5, 5.0, 14.0, 8.5, step=24.0) for n in range(4)],
        1: [_step(n, 2.0, 5.0, 20.0, 8.0) for n in range(4)],
        2: [_step(n, 2.0, 5.0, 20.0, 8.0) for n in range(4)],
    }
    path = critical_path(ranks)
    assert path is not None and (path.gating_rank, path.cause) == (0, "communication")
    assert path.wait_ms == pytest.approx(6.0)
    assert (
        "slow in communication (its own work explains less than half of the others' wait)" in path.sentence()
    )
    assert "+-" not in path.sentence() + path.cause_text()


def test_process_groups_without_a_description_keep_their_names_apart() -> None:
    from trainadvisor.analyze.read.columns import group_label

    assert group_label("default_pg", "0", 8) == "default_pg, 8 ranks"
    # torch's new_group() describes every group it makes as "undefined": a TP and a DP group
    assert group_label("undefined", "1", 4) != group_label("undefined", "2", 4) == "group 2, 4 ranks"
    assert group_label("", "3", "8") == "group 3"  # a size that is not a count is left out
