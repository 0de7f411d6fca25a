"""The host-bound diagnosis: `host_busy_pct` (the loop's own host threads in their own work, not
waiting) on a made-up step whose every microsecond is known and on real GPU traces, and the
`host-bound` rule over it, from `analyze` and from a `profile` run's report. The rule's case file
(tests/rule_cases/host-bound.toml) holds the traces recorded by others."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import gpu_run, shared_trace

from trainadvisor import rulebook
from trainadvisor.analyze.command import to_run
from trainadvisor.analyze.read.reading import read_table
from trainadvisor.analyze.run.summary import attach_trace, named_measurements
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.analyze.trace.host import loop_threads
from trainadvisor.records import Finding
from trainadvisor.report.render import load_report
from trainadvisor.resources import rules_dir

RULES = rulebook.load_rules([rules_dir()])
BASELINE = "traces/baseline/trainadvisor.pt.trace.json.gz"
AFTER = "traces/after/trainadvisor.pt.trace.json.gz"
SHOWN = ("gpu_busy_pct", "host_busy_pct", "data_wait_pct", "sync_pct", "kernels_per_step", "kernel_us_median")


@cache
def _values(path: Path) -> dict[str, Any]:
    analysis = analyze_trace(path)
    return named_measurements(to_run(analysis))


def _shown(values: dict[str, Any]) -> tuple[float, ...]:
    return tuple(round(values[name], 1) for name in SHOWN)


def _findings(values: dict[str, Any]) -> dict[str, Finding]:
    return {finding.rule: finding for finding in rulebook.evaluate(RULES, values)}


# ---- the measurement, on a step whose every microsecond is known ----


def _event(name: str, cat: str, ts: float, dur: float, tid: int = 1, **args: object) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def test_host_busy_is_the_loop_threads_own_work_less_their_waits(tmp_path: Path) -> None:
    """A 1000 us step: the main thread's forward (200 us), autograd's backward on its own thread
    (200), the optimizer's step (200, its Python loop between the ops included) and an .item()
    outside its copy's wait (20) are busy: 620 us. Not busy: the DataLoader call (and the
    collate inside it), the copy to the host, cudaFree, a stream sync, a pin-memory thread and
    the user's annotation over the whole step."""
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 1000),
        _event("train_step", "user_annotation", 0, 1000),
        _event(loader, "user_annotation", 0, 100),
        _event("aten::stack", "cpu_op", 20, 40),
        _event("aten::linear", "cpu_op", 100, 200),
        _event("cudaLaunchKernel", "cuda_runtime", 150, 10, correlation=1),
        _event("ampere_sgemm_32x32_sliced1x4_tn", "kernel", 170, 30, tid=7, correlation=1, device=0),
        _event("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 300, 200, tid=2),
        _event("Optimizer.step#Adam.step", "user_annotation", 500, 200),
        _event("aten::add_", "cpu_op", 520, 20),
        _event("aten::_local_scalar_dense", "cpu_op", 700, 100),
        _event("cudaMemcpyAsync", "cuda_runtime", 710, 80, correlation=2),
        _event("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 780, 5, tid=8, correlation=2, device=0),
        _event("cudaFree", "cuda_runtime", 800, 50),
        _event("cudaStreamSynchronize", "cuda_runtime", 850, 50),
        _event("aten::pin_memory", "cpu_op", 0, 1000, tid=3),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    table, _ = read_table(path, 1)
    assert sorted(table.tids[i] for i in loop_threads(table)) == [1, 2]
    analysis = analyze_trace(path)
    assert [(s.start_us, s.dur_us) for s in analysis.steps] == [(0.0, 1000.0)]
    assert analysis.host_busy_pct == 62.0


def test_a_trace_without_host_events_has_no_host_busy(tmp_path: Path) -> None:
    events = [_event("ampere_sgemm_32x32_sliced1x4_tn", "kernel", 0, 30, tid=7, correlation=1, device=0)]
    path = tmp_path / "gpu_only.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert analyze_trace(path).host_busy_pct is None
    assert "host_busy_pct" not in _values(path)


# ---- the H100 runs ----


def test_the_h100_small_batch_run_is_host_bound() -> None:
    """examples/small_batch.py on an H100 (batch 16, non-fused Adam): 95 kernels of 2.6 us
    (median) a step keep the GPU busy 3.9% of it, while the main thread's forward and optimizer
    step and autograd's backward thread fill 74.4% (60.5% of the step is host work that no
    device work covers, the breakdown's other_host). 95 kernels are too few for launch-bound."""
    path = gpu_run(f"smallb/{BASELINE}")
    table, _ = read_table(path, 1)
    assert len(loop_threads(table)) == 2  # the loop's thread and autograd's device thread
    values = _values(path)
    assert _shown(values) == (3.9, 74.4, 5.2, 0.0, 95.0, 2.6)
    findings = _findings(values)
    assert findings["host-bound"].severity == "high"
    assert findings["host-bound"].message == (
        "The GPU was busy 4% of each step; the training loop's host threads were busy 74% of it "
        "in their own work, not waiting on data or the GPU."
    )
    assert "launch-bound" not in findings
    evidence = {e.measurement: e.value for e in findings["host-bound"].evidence}
    assert (evidence["kernels_per_step"], round(evidence["kernel_us_median"], 1)) == (95.0, 2.6)
    assert findings["host-bound"].fixes == ["fused-optimizer", "compile", "batch-size"]


def test_a_profile_run_finds_it_from_its_traced_steps() -> None:
    """The same run as `profile` diagnosed it: the traced steps' measurements (host busy among
    them) with the clock-timed steps' data wait (6.1%, the report's 6%)."""
    folder = gpu_run("smallb")
    baseline = load_report(folder).baseline
    assert baseline is not None
    run = dataclasses.replace(baseline, trace=attach_trace(baseline.raw, folder))
    values = named_measurements(run)
    assert (round(values["host_busy_pct"], 1), round(values["data_wait_pct"], 1)) == (74.4, 6.1)
    assert (values["optimizer"], values["optimizer_fused"]) == ("Adam", False)
    assert _findings(values)["host-bound"].severity == "high"


@pytest.mark.parametrize(
    ("run", "shown", "launch_bound"),
    [
        # Hugging Face Trainer once the loader has workers: 174 kernels of 2 us, both rules
        pytest.param("hf", (2.4, 61.9, 0.5, 0.2, 174.0, 2.0), "high", id="transformers"),
        # Lightning once the loader has workers: 37 kernels a step, too few for launch-bound
        pytest.param("lightning", (2.0, 81.8, 1.2, 0.2, 37.0, 2.7), None, id="lightning"),
    ],
)
def test_framework_loops_without_their_data_stall_are_host_bound(
    run: str, shown: tuple[float, ...], launch_bound: str | None
) -> None:
    values = _values(gpu_run(f"{run}/{AFTER}"))
    assert _shown(values) == shown
    findings = _findings(values)
    assert findings["host-bound"].severity == "high"
    assert (findings["launch-bound"].severity if "launch-bound" in findings else None) == launch_bound


def test_quiet_where_the_host_waits_for_the_gpu() -> None:
    """A100 training (HTA's queue-length trace): the GPU busy 36% of the step, launch-bound by
    its kernels, but the loop's thread spends 71% of the step in blocking copies to the host
    queued behind the GPU's work: its own work is 19.3%."""
    values = _values(shared_trace("hta/negative_queue_length_values_check/rank0.json.gz"))
    assert _shown(values) == (35.6, 19.3, 0.0, 0.1, 1189.0, 4.0)
    findings = _findings(values)
    assert "host-bound" not in findings and findings["launch-bound"].severity == "high"


@pytest.mark.parametrize(
    ("trace", "shown", "other"),
    [
        # examples/slow_input_mnist.py: the loop waits on its DataLoader 95% of the step
        pytest.param(f"mnist/{BASELINE}", (0.1, 3.5, 95.0, 0.0, 30.0, 2.7), "data-stall", id="data-stall"),
        # examples/compute_bound.py: compute-bound on a CPU, but on an H100 a tiny step whose
        # loop waits on its DataLoader 56% of the time
        pytest.param(f"compute/{BASELINE}", (3.9, 28.1, 56.3, 0.0, 31.0, 6.9), "data-stall", id="compute"),
        # a residual MLP stack, width 1024: the GPU busy 99% of the step
        pytest.param(
            "artifacts/trace_memory_flops/h100_residual_stack.pt.trace.json.gz",
            (98.9, 31.3, 0.0, 0.0, 158.0, 48.7),
            "no-mixed-precision",
            id="gpu-busy",
        ),
    ],
)
def test_quiet_where_the_gpu_idles_for_another_reason_or_is_busy(
    trace: str, shown: tuple[float, ...], other: str
) -> None:
    values = _values(gpu_run(trace))
    assert _shown(values) == shown
    findings = _findings(values)
    assert "host-bound" not in findings and other in findings
