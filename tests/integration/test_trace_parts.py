"""The parts `analyze_trace` is made of, each called on its own on a recorded trace's columns: where
the steps are and what kind of loop it is (`steps`), what is read one event at a time (`facts.gather`),
the host-to-device copies, the syncs that are a copy's own wait and the host-made tensors copied
(`copies`), and the FLOPs per step of given step spans (`trace_flops.trace_utilization`). Our own CPU
traces (tests/data/traces/README.md, tests/data/own/SOURCE.md), and GPU traces recorded by others
(../shared/traces, skipped where absent) for what only a device shows: copies, device syncs, kernels."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA, gpu_run, shared_trace
from support.trace_mfu import H100_STACK
from support.trace_steps import OWN

from trainadvisor.analyze.read.columns import HOST_KINDS, Table
from trainadvisor.analyze.read.reading import read_table
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.analyze.trace.copies import (
    copy_syncs,
    cpu_tensor_copies,
    h2d_copy_ops,
    resolve_unnamed_copies,
)
from trainadvisor.analyze.trace.facts import gather
from trainadvisor.analyze.trace.steps import STEP_MARKER, find_steps, is_loader_call, loop_kind
from trainadvisor.analyze.trace.trace_flops import SHAPES, trace_utilization
from trainadvisor.analyze.trace.trace_records import Facts

LINEAR = DATA / "own" / "linear_flops_cpu.pt.trace.json.gz"
# PARAM's AlexNet benchmark on an A100: the model moved to the GPU, one pageable copy per parameter
ALEXNET = "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
# A toy training loop on an MI250 (ROCm 6.2): two copies made by synchronous hipMemcpyWithStream calls
MI250 = "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
GPU_ONLY = "more/tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz"
CPU_STATUS = (
    "no MFU: the CPU's peak was not measured "
    "(a trace holds none; `trainadvisor profile` measures this machine's)"
)
SGD = "optimizer steps (Optimizer.step#SGD.step)"


def table(path: Path) -> Table:
    """The trace's columns, read in this process (one worker: no process is started)."""
    return read_table(path, workers=1)[0]


def loader_rows(t: Table) -> np.ndarray:
    host = t.rows(*HOST_KINDS)
    return host[t.matching(host, is_loader_call)]


def facts_of(t: Table) -> Facts:
    """`gather` as `analyze_trace` calls it: the host ops that are neither step markers nor
    DataLoader calls, and the DataLoader calls."""
    host = t.rows(*HOST_KINDS)
    loader, marker = t.matching(host, is_loader_call), t.matching(host, STEP_MARKER.match)
    return gather(t, (), host[~loader & ~marker], host[loader])


def ms(span: tuple[float, float]) -> float:
    return round((span[1] - span[0]) / 1e3, 3)


# steps: is_loader_call, find_steps, loop_kind


@pytest.mark.parametrize(
    ("name", "iterator"),
    [
        ("no_schedule_workers0", "_SingleProcessDataLoaderIter"),
        ("no_schedule_workers2", "_MultiProcessingDataLoaderIter"),
    ],
)
def test_the_dataloader_calls_are_the_seven_next_calls_of_a_six_batch_loop(name: str, iterator: str) -> None:
    t = table(OWN / f"{name}.json.gz")
    # the only loader name of the trace is its iterator's __next__; 6 batches and the StopIteration
    assert [n for n in t.names if is_loader_call(n)] == [f"enumerate(DataLoader)#{iterator}.__next__"]
    assert len(loader_rows(t)) == 7
    # the step's own annotations and a marker are not loader calls
    assert not any(
        is_loader_call(n) for n in ("Optimizer.step#SGD.step", "ProfilerStep#2", "enumerate(DataLoader)")
    )


@pytest.mark.parametrize(
    ("name", "warmup_ms"),
    [
        ("no_schedule_workers0", 13.062),
        # the first __next__ starts the 2 workers: a 41.6 ms warm-up
        ("no_schedule_workers2", 41.570),
        ("annotated_steps", 11.760),
    ],
)
def test_each_iteration_ends_where_the_next_batch_is_asked_for(name: str, warmup_ms: float) -> None:
    t = table(OWN / f"{name}.json.gz")
    steps = find_steps(t)
    assert steps.method == f"{SGD}: 6 iterations, the first (warm-up) set apart" and not steps.marked
    assert [n for n, _, _ in steps.all_spans] == [1, 2, 3, 4, 5, 6] and len(steps.spans) == 5
    # each of the 6 optimizer steps closes an iteration, its end moved to the next __next__ call
    # (the 2nd to the 7th, the StopIteration one): the first iteration starts with the host's first
    # event, before the first __next__
    host = t.rows(*HOST_KINDS)
    calls = np.sort(t.ts[loader_rows(t)]).tolist()
    assert [e for _, _, e in steps.all_spans] == calls[1:]
    assert [s for _, s, _ in steps.all_spans] == [float(t.ts[host].min()), *calls[1:6]]
    assert steps.warmup == steps.all_spans[0][1:] and ms(steps.warmup) == warmup_ms


def test_a_schedule_without_prof_step_has_its_iterations_found_inside_its_one_marker() -> None:
    t = table(OWN / "schedule_no_step.json.gz")
    steps = find_steps(t)
    assert steps.method == (
        f"one ProfilerStep#0 marker holds 6 iterations, found from {SGD}: "
        "6 iterations, the first (warm-up) set apart"
    )
    host = t.rows(*HOST_KINDS)
    marker = host[t.matching(host, STEP_MARKER.match)]
    assert len(marker) == 1  # ProfilerStep#0 spans the whole loop: the first iteration starts with it
    assert steps.all_spans[0][1] == float(t.ts[marker[0]])
    assert steps.all_spans[-1][2] == float(np.sort(t.ts[loader_rows(t)])[-1]) <= float(t.end[marker[0]])
    assert (len(steps.spans), ms(steps.all_spans[0][1:])) == (5, 10.105)


def test_profiler_step_markers_are_the_steps_and_a_cut_last_marker_is_left_out() -> None:
    t = table(OWN / "profiler_steps.json.gz")
    # schedule(wait=1, warmup=1, active=4): ProfilerStep#2..#5 recorded, each ~9.5 ms
    steps = find_steps(t)
    assert (steps.method, steps.marked, steps.warmup) == ("4 ProfilerStep#N markers", True, None)
    assert [n for n, _, _ in steps.spans] == [2, 3, 4, 5]
    assert [ms(s[1:]) for s in steps.spans] == [9.599, 9.400, 9.419, 9.502]
    # a run that says it recorded up to ProfilerStep#4 whole: #5 holds only the script's end
    cut = find_steps(t, last_step=4)
    assert cut.method == "3 ProfilerStep#N markers (ProfilerStep#5 left out: the script ended inside it)"
    assert cut.spans == steps.spans[:3]
    # nothing to leave out, or nothing left: the markers as they are
    assert find_steps(t, last_step=5).spans == find_steps(t, last_step=1).spans == steps.spans


def test_backward_passes_are_the_iterations_of_a_loop_without_an_optimizer() -> None:
    # 5 hand-updated iterations on torch.randn batches: no optimizer and no DataLoader call
    steps = find_steps(table(OWN / "backward_only.json.gz"))
    assert steps.method == "backward passes (MseLossBackward0): 5 iterations, the first (warm-up) set apart"
    assert len(steps.spans) == 4 and steps.warmup is not None and ms(steps.warmup) == 0.602


def test_an_inference_loop_is_cut_at_its_dataloader_calls() -> None:
    t = table(OWN / "inference.json.gz")
    steps = find_steps(t)
    assert steps.method == "DataLoader __next__ calls: 6 iterations, the first (warm-up) set apart"
    # each iteration runs from one __next__ to the next; the 7th call (StopIteration, 49 us) starts
    # none: what follows it is far shorter than half an iteration
    calls = np.sort(t.ts[loader_rows(t)]).tolist()
    assert [(s, e) for _, s, e in steps.all_spans] == list(zip(calls[:6], calls[1:]))


@pytest.mark.parametrize(
    ("name", "kind", "evidence"),
    [
        ("no_schedule_workers0", "training", SGD),
        ("autograd_profiler", "training", "optimizer steps (Optimizer.step#Adam.step)"),
        # a schedule records the optimizer steps of its active iterations only: still training
        ("profiler_steps", "training", SGD),
        ("backward_only", "training", "backward passes"),
        # under torch.inference_mode(): no evaluate_function event at all
        ("inference", "inference", "no backward pass and no optimizer step in the trace"),
    ],
)
def test_the_loop_kind_follows_the_strongest_evidence(name: str, kind: str, evidence: str) -> None:
    assert loop_kind(table(OWN / f"{name}.json.gz")) == (kind, evidence)


def test_a_gpu_only_trace_is_one_window_and_training_by_its_backward_kernels() -> None:
    # no host event at all: MIOpen's igemm_wrw/igemm_bwd and batch_norm_backward kernels show training
    t = table(shared_trace(GPU_ONLY))
    steps = find_steps(t)
    assert (steps.all_spans, steps.marked) == ([], False)
    assert steps.method == "no host events: the device's work is one window"
    assert loop_kind(t) == ("training", "backward kernels")


# facts.gather


def test_the_facts_of_a_cpu_trace_are_its_host_items_copy_ops_and_dataloader_waits() -> None:
    t = table(OWN / "autograd_profiler.json.gz")
    f = facts_of(t)
    # no device: every .item() is of a host tensor. One by the DataLoader iterator's base seed
    # (before the first __next__), and Adam's step count of each of the 4 parameters in 6 steps
    assert Counter(kind for _, kind, _, _ in f.syncs) == {"host_item": 1 + 4 * 6}
    first_call = float(np.sort(t.ts[loader_rows(t)])[0])
    assert f.syncs[0][0] < first_call < f.syncs[1][0]
    assert Counter(name for *_, name in f.named_ops) == {
        "aten::copy_": 114, "aten::to": 106, "aten::_to_copy": 102, "aten::detach": 24, "detach": 24,
        "aten::lift_fresh": 4, "aten::detach_": 4, "detach_": 4,
    }  # fmt: skip
    # the 7 __next__ calls do not overlap: 7 waits, each a call's own span
    calls = loader_rows(t)
    order = np.argsort(t.ts[calls])
    assert f.data_wait == list(zip(t.ts[calls][order].tolist(), t.end[calls][order].tolist()))
    assert (f.h2d, f.sync_copies, f.runtime_start, f.host_starts) == ([], set(), {}, {})
    assert not f.kernels_seen and f.frames == {} and f.builtins == {}


def test_the_facts_of_alexnet_are_its_sixteen_parameter_uploads_and_their_syncs() -> None:
    t = table(shared_trace(ALEXNET))
    f = facts_of(t)
    assert f.kernels_seen
    # cudaStreamSynchronize after each pageable copy, cudaDeviceSynchronize by the benchmark's timer
    assert Counter(kind for _, kind, _, _ in f.syncs) == {"stream_sync": 16, "device_sync": 5}
    assert Counter(kind for _, _, kind, _, _ in f.h2d) == {"pageable": 16}
    # AlexNet's 16 parameter tensors (61,100,840 float32 values): conv1's weight first,
    # 64x3x11x11 floats, then its 64 biases, then conv2's 192x64x5x5 weight
    assert sum(nbytes for *_, nbytes, _ in f.h2d) == 4 * 61_100_840 == 244_403_360
    assert [nbytes for *_, nbytes, _ in f.h2d[:3]] == [4 * 64 * 3 * 11 * 11, 4 * 64, 4 * 192 * 64 * 5 * 5]
    # each copy's launch is known, and comes before the copy
    assert sorted(f.runtime_start) == sorted(corr for *_, corr in f.h2d)
    assert all(f.runtime_start[corr] <= ts for ts, *_, corr in f.h2d)
    assert Counter(name for *_, name in f.named_ops) == {
        "aten::to": 20, "aten::_to_copy": 18, "aten::copy_": 18, "aten::detach": 16, "detach": 16,
        "aten::zeros": 2, "aten::rand": 1,
    }  # fmt: skip


# copies: resolve_unnamed_copies, h2d_copy_ops, cpu_tensor_copies, copy_syncs


def test_alexnet_copies_are_launched_by_sixteen_to_calls_whose_syncs_are_the_copies_own() -> None:
    f = facts_of(table(shared_trace(ALEXNET)))
    resolve_unnamed_copies(f)  # CUDA names the source memory: nothing to resolve
    assert Counter(kind for _, _, kind, _, _ in f.h2d) == {"pageable": 16}
    ops = h2d_copy_ops(f)
    # one `param.to(device)` per parameter; the first also waits out CUDA's start-up (29.9 s)
    assert len(ops) == 16 and {tid for *_, tid in ops} == {ops[0][2]}
    assert ops[0][1] - ops[0][0] == 29_937_799
    assert all(start <= f.runtime_start[corr] <= end for (start, end, _), (*_, corr) in zip(ops, f.h2d))
    # the parameters were made by nn.Module's constructors long before: no host tensor just created
    assert cpu_tensor_copies(f, ops) == []
    copy_syncs(f, ops)
    # every stream sync is inside its copy's aten::to: the pageable copy's wait, not the code's
    assert Counter(kind for _, kind, _, _ in f.syncs) == {"copy_sync": 16, "device_sync": 5}


def test_rocm_synchronous_copies_count_as_pageable_and_their_tensors_as_host_made() -> None:
    path = shared_trace(MI250)
    f = facts_of(table(path))
    # "Memcpy HtoD (Host -> Device)" names no source memory; hipMemcpyWithStream made each copy
    assert [kind for _, _, kind, _, _ in f.h2d] == ["unknown", "unknown"]
    assert f.sync_copies == {117, 123} == {corr for *_, corr in f.h2d}
    # each copy's size is on the call that launched it ("size": "2560": a 5 x 128 float32 tensor),
    # not on the copy
    assert [nbytes for _, _, _, nbytes, _ in f.h2d] == [5 * 128 * 4, 5 * 128 * 4]
    resolve_unnamed_copies(f)
    assert [kind for _, _, kind, _, _ in f.h2d] == ["pageable", "pageable"]
    ops = h2d_copy_ops(f)
    assert len(ops) == 2
    # x and y: torch.randn(5, 128) on the host, then .to(device) with no other op between
    created = cpu_tensor_copies(f, ops)
    assert [(copy, name, tid) for copy, name, tid, _ in created] == [
        (s, "aten::randn", tid) for s, _, tid in ops
    ]
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    starts = {
        name: [e["ts"] for e in events if e.get("name") == name] for name in ("aten::randn", "aten::to")
    }
    assert [round(copy - made, 3) for copy, _, _, made in created] == [
        round(to - randn, 3) for randn, to in zip(starts["aten::randn"], starts["aten::to"])
    ]
    # the blocking hipMemcpyWithStream calls are the copies' own waits; hipDeviceSynchronize is not
    assert Counter(kind for _, kind, _, _ in f.syncs) == {"stream_sync": 2, "device_sync": 1}
    copy_syncs(f, ops)
    assert Counter(kind for _, kind, _, _ in f.syncs) == {"copy_sync": 2, "device_sync": 1}


# trace_flops.trace_utilization


def test_a_linear_layer_counts_the_same_flops_in_any_of_its_steps() -> None:
    t = table(LINEAR)
    a = analyze_trace(LINEAR, workers=1)
    spans = [(s, e) for _, s, e in find_steps(t).spans]
    assert len(spans) == 3  # ProfilerStep#1-3
    # addmm 2x16x64x32 forward and mm 2x32x16x64 for the weight's gradient, in every step
    for chosen in (spans, spans[:1], spans[1:]):
        use, source = trace_utilization(t, chosen, a)
        assert source == SHAPES and use is not None
        assert use.flops_per_step == 131_072 and use.status == CPU_STATUS and use.mfu_pct is None
    # a span after the trace's end holds no op: the mean over 4 spans is 3 steps' FLOPs / 4
    end = float(t.end.max())
    use, _ = trace_utilization(t, [*spans, (end + 1, end + 2)], a)
    assert use is not None and use.flops_per_step == 3 * 131_072 / 4
    # no span: no op to count
    assert trace_utilization(t, [], a) == (None, "")


def test_bf16_autocast_steps_count_their_forward_and_backward_matmuls() -> None:
    path = OWN / "record_shapes_bf16.json.gz"
    t = table(path)
    a = analyze_trace(path, workers=1)
    assert a.step_time_ms_mean is not None
    steps = find_steps(t)
    # Linear 64->128 and 128->10 on a batch of 8: forward addmm 2x8x64x128 and 2x8x128x10; backward
    # the second layer's input and weight gradients, the first layer's weight gradient (its input
    # needs none): 3 mm per iteration, 12 in the trace's 4
    per_step = 2 * 8 * 64 * 128 + 2 * 8 * 128 * 10 + 2 * 8 * 10 * 128 + 2 * 10 * 8 * 128 + 2 * 128 * 8 * 64
    for spans in (steps.spans, steps.all_spans):  # the warm-up iteration runs the same ops
        use, source = trace_utilization(t, [(s, e) for _, s, e in spans], a)
        assert source == SHAPES and use is not None
        assert use.flops_per_step == per_step == 323_584
        assert use.achieved_tflops == pytest.approx(per_step / (a.step_time_ms_mean / 1e3) / 1e12, rel=1e-12)
        assert use.status == CPU_STATUS


def test_a_trace_recorded_without_shapes_gives_no_flops() -> None:
    # torch.profiler without record_shapes: no op carries Input Dims
    path = OWN / "no_schedule_workers0.json.gz"
    t = table(path)
    spans = [(s, e) for _, s, e in find_steps(t).spans]
    assert trace_utilization(t, spans, analyze_trace(path, workers=1)) == (None, "")


def test_an_amd_trace_counts_its_one_step_and_reads_its_fp32_matmuls_as_fp32() -> None:
    path = shared_trace(MI250)
    t = table(path)
    a = analyze_trace(path, workers=1)
    markers = [(s, e) for _, s, e in find_steps(t).spans]
    assert len(markers) == 2  # ProfilerStep#2 (49 us) holds only the trace's end: no op with a formula
    one_step = 2 * 5 * 128 * 128 + 2 * 128 * 5 * 128  # addmm of Linear(128, 128) on 5 rows, its weight's mm
    first, _ = trace_utilization(t, markers[:1], a)
    both, _ = trace_utilization(t, markers, a)
    assert first is not None and both is not None
    assert (first.flops_per_step, both.flops_per_step) == (one_step, one_step / 2) == (327_680, 163_840)
    # an AMD card's float32 matmuls run as float32 (no TF32 read from kernel names), and the
    # datasheet table has no card named "AMD Radeon Graphics"
    assert first.status == "no MFU: no datasheet peak for AMD Radeon Graphics in fp32 (never guessed)"


def test_h100_mfu_is_the_steps_flops_per_second_against_the_fp32_peak() -> None:
    path = gpu_run(H100_STACK)
    t = table(path)
    a = analyze_trace(path, workers=1)
    spans = [(s, e) for _, s, e in find_steps(t).spans]
    # at a step time of 40 ms: 1,236,975,747,072 FLOPs per step (the blocks' 4096^2 x 1024 matmuls,
    # forward and backward), 30.924 TFLOP/s: 46.225% of the H100's dense FP32 66.9 TFLOP/s
    use, source = trace_utilization(t, spans, replace(a, step_time_ms_mean=40.0))
    assert source == SHAPES and use is not None
    assert use.flops_per_step == 1_236_975_747_072
    assert (use.peak_dtype, use.peak_tflops, use.peak_device) == ("fp32", 66.9, "H100 SXM")
    assert use.achieved_tflops == pytest.approx(1_236_975_747_072 / 0.040 / 1e12, rel=1e-12)
    assert use.mfu_pct == pytest.approx(100 * 1_236_975_747_072 / 0.040 / 66.9e12, rel=1e-12)
    assert use.mfu_pct is not None and round(use.mfu_pct, 3) == 46.225
    # steps that replay CUDA graphs run kernels no op launched: not counted rather than counted short
    replayed, _ = trace_utilization(t, spans, replace(a, graph_launches=3))
    assert replayed is not None and replayed.flops_per_step is None
    assert (
        replayed.status == "not counted: the steps replay CUDA graphs (3 launches run kernels no op launched)"
    )
