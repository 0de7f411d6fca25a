"""Steps found in traces as users record them (issue 14, items 1, 5, 6): our own CPU traces of
each way of profiling (tests/data/traces, made by scripts/record_traces.py) and real GPU traces
recorded by others (../shared/traces). Exact figures of the stored files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import DATA, shared_trace
from support.trace_steps import OWN

from trainadvisor import rulebook
from trainadvisor.analyze.command import to_run
from trainadvisor.analyze.run.summary import named_measurements
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.resources import rules_dir

RULES = rulebook.load_rules([rules_dir()])


SGD = "optimizer steps (Optimizer.step#SGD.step): 6 iterations, the first (warm-up) set apart"


def findings(path: Path) -> dict[str, str]:
    a = analyze_trace(path)
    return {f.rule: f.severity for f in rulebook.diagnose(named_measurements(to_run(a)), RULES).findings}


@pytest.mark.parametrize(
    ("name", "method", "steps", "warmup_ms", "data_wait_pct"),
    [
        # a plain `with torch.profiler.profile():` block around the loop
        ("no_schedule_workers0", SGD, 5, 13.062, 92.56),
        # with workers, the first iteration starts them: 41.6 ms against 3.5 ms steady steps
        ("no_schedule_workers2", SGD, 5, 41.570, 74.17),
        # the legacy torch.autograd.profiler API
        ("autograd_profiler", SGD.replace("SGD", "Adam"), 5, 11.159, 89.49),
        # a schedule without prof.step(): one ProfilerStep#0 spans the whole loop
        (
            "schedule_no_step",
            f"one ProfilerStep#0 marker holds 6 iterations, found from {SGD}",
            5,
            10.105,
            92.53,
        ),
        # no optimizer: parameters updated by hand, one backward pass per iteration
        (
            "backward_only",
            "backward passes (MseLossBackward0): 5 iterations, the first (warm-up) set apart",
            4,
            0.602,
            0.0,
        ),
        # a record_function per iteration: the optimizer steps are the stronger evidence
        ("annotated_steps", SGD, 5, 11.760, 92.32),
        # the correct way, for comparison: the markers are the steps
        ("profiler_steps", "4 ProfilerStep#N markers", 4, None, 93.17),
    ],
)
def test_steps_without_markers_in_our_cpu_traces(
    name: str, method: str, steps: int, warmup_ms: float | None, data_wait_pct: float
) -> None:
    a = analyze_trace(OWN / f"{name}.json.gz")
    assert a.step_method == method
    assert len(a.steps) == steps and a.steps_found and a.loop == "training"
    assert (round(a.warmup_ms, 3) if a.warmup_ms else None) == warmup_ms
    assert round(a.breakdown_pct["data_wait"], 2) == data_wait_pct
    # per-step rules read these steps: the data stall is found and measured per steady step
    assert findings(OWN / f"{name}.json.gz").get("data-stall") == ("high" if data_wait_pct >= 20 else None)


def test_a_trace_where_nothing_marks_an_iteration_stays_one_window() -> None:
    """PARAM's AlexNet benchmark: two annotated forwards, but nothing that repeats over the
    trace's time: one window, whose 16 pageable copies are still worth a finding."""
    a = analyze_trace(
        shared_trace("hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    )
    assert a.step_method == "nothing marks an iteration: the trace is one window"
    assert len(a.steps) == 1 and not a.steps_found and a.h2d_pageable == 16
    values = named_measurements(to_run(a))
    assert values["step_unit"] == "window" and values["h2d_pageable_per_step"] == 16
    assert "kernels_per_step" not in values  # launch-bound needs steps, not a window


def test_backward_passes_of_an_mi300x_trace_and_its_warm_up() -> None:
    """TraceLens' normalization test: 3 x (forward, MSE, backward) without markers or optimizer;
    the first pass (1.17 s of MIOpen start-up, all 7 hipMalloc) is set apart."""
    a = analyze_trace(
        shared_trace("more/tracelens/perf_model/normalization/normalization_layer_test.json.gz")
    )
    assert a.step_method == "backward passes (MseLossBackward0): 3 iterations, the first (warm-up) set apart"
    assert [round(s.dur_us, 3) for s in a.steps] == [3627.482, 2518.718]
    assert round(a.warmup_ms or 0, 3) == 1174.295
    assert a.allocator_calls == 0 and [s.allocator_calls for s in a.steps] == [0, 0]
    assert "allocator-churn" not in findings(
        shared_trace("more/tracelens/perf_model/normalization/normalization_layer_test.json.gz")
    )


def test_one_profiler_step_holding_several_iterations_is_split() -> None:
    """OWLv2 on an H100: one ProfilerStep#6 spans 5 forwards and 6 DataLoader calls."""
    a = analyze_trace(
        shared_trace(
            "more/tracelens/h100/google_owlv2-large-patch14-ensemble__1016001.hf_token_redacted.json.gz"
        )
    )
    assert a.step_method == (
        "one ProfilerStep#6 marker holds 5 iterations, found from DataLoader __next__ calls: "
        "5 iterations, the first (warm-up) set apart"
    )
    assert [round(s.dur_us / 1e3, 1) for s in a.steps] == [237.3, 241.5, 241.7, 245.8]
    assert a.loop == "inference" and not a.steps_marked


def test_nanosecond_timestamps_keep_their_precision() -> None:
    """HTA's ns-resolution trace: epoch microseconds with nanosecond fractions (1.7e15), where
    float64 keeps a quarter microsecond; times rebased on the trace's start keep the steps'
    durations as written."""
    a = analyze_trace(shared_trace("hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"))
    assert [round(s.dur_us, 3) for s in a.steps] == [101151.297, 95737.04, 95570.486, 95664.2, 95394.704]
    assert round(a.kernel_us_median or 0, 4) == 28.0315  # half-way between two durations as written


def test_graph_launches_count_their_kernels_once_and_as_the_graphs_work() -> None:
    """vLLM decode (MI300X class) and SGLang decode (B300): one graph launch carries most of
    the kernels. They count in kernel time (the window reaches the end of the graph's work),
    not as host launches (short kernels, launch delay)."""
    vllm = analyze_trace(shared_trace("more/tracelens/inference/vllm_decode_full/graph_execution.json.gz"))
    assert (vllm.graph_launches, vllm.graph_kernels, vllm.kernels, vllm.short_kernels) == (1, 421, 425, 3)
    assert round(vllm.breakdown_pct["kernel"], 2) == 55.85 and round(vllm.steps[0].dur_us, 1) == 19114.1
    b300 = analyze_trace(
        shared_trace(
            "more/tracelens/agent_evals/semantic_purity_qwen3_30b_a3b/B300/1782799835.6885648-TP-0-DECODE.trace.json.gz"
        )
    )
    assert (b300.graph_launches, b300.graph_kernels, b300.kernels, b300.short_kernels) == (1, 676, 713, 36)
    values = named_measurements(to_run(b300))
    assert values["graph_kernels"] == 676 and round(values["short_kernel_pct"], 1) == round(100 * 36 / 37, 1)


@pytest.mark.parametrize(
    ("trace", "shared"),
    [
        ("inference.json.gz", False),
        ("more/tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.hf_token_redacted.json.gz", True),
    ],
)
def test_inference_traces_get_no_training_advice(trace: str, shared: bool) -> None:
    path = shared_trace(trace) if shared else OWN / trace
    a = analyze_trace(path)
    assert a.loop == "inference" and a.loop_evidence == "no backward pass and no optimizer step in the trace"
    fired = findings(path)
    assert "data-stall" not in fired and "no-mixed-precision" not in fired
    if not shared:  # 98% of each step waits on the loader: a training loop would be told so
        assert round(a.breakdown_pct["data_wait"], 2) == 97.66


@pytest.mark.parametrize(
    ("folder", "data_wait_pct"), [("resnet50_num_workers_0", 32.6), ("resnet50_num_workers_4", 0.4)]
)
def test_a_2021_trace_without_markers_or_device_properties(
    tmp_path: Path, folder: str, data_wait_pct: float
) -> None:
    """The TensorBoard plugin's 2021 V100 ResNet-50 samples as the autograd-API profiler wrote
    them: no ProfilerStep#N, no deviceProperties (`external id` in lower case already). Steps come
    from the optimizer; the first iteration is set apart; the steady data wait is that of the
    marked steps (33.4% and 0.8% there); the GPU's generation comes from its kernels' names."""
    [source] = sorted(shared_trace(f"tb_plugin/{folder}").glob("*.json.gz"))[:1]
    document = json.loads(gzip.decompress(source.read_bytes()))
    del document["deviceProperties"]
    document["traceEvents"] = [
        e for e in document["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    path = tmp_path / "autograd_api.json"
    path.write_text(json.dumps(document))
    a = analyze_trace(path)
    assert a.step_method == SGD and len(a.steps) == 5
    assert round(a.breakdown_pct["data_wait"], 1) == data_wait_pct
    assert (a.gpu_name, a.compute_capability) == ("Volta-class GPU (named by its kernels)", 7)
    fired = findings(path)
    assert fired["no-mixed-precision"] == "high" and fired.get("data-stall") == (
        "high" if data_wait_pct > 20 else None
    )


def test_the_models_aten_ops_of_each_step_are_counted_on_every_thread() -> None:
    """What a compile trial's estimate scales with (`fixes.compile.once_s`): the aten ops each
    step dispatched, nested ones too, less those of the optimizer's step and zero_grad and of
    the data wait, which the compile fix does not compile. Our CPU trace: 130 a step, of them
    4 in SGD's step and 38 in the DataLoader's collate. The H200 baseline of the compile fix's
    GPU check, whose backward runs on autograd's own thread: 580 (582 in one step), of them 169
    in AdamW's step and 14 in the data wait."""
    cpu = analyze_trace(OWN / "profiler_steps.json.gz")
    assert [s.model_aten_ops for s in cpu.steps] == [130 - 4 - 38] * 4
    assert named_measurements(to_run(cpu))["model_aten_ops_per_step"] == 88.0
    h200 = (
        DATA
        / "own"
        / "h200-2026-11-30"
        / "compile_fix"
        / "traces"
        / "baseline"
        / "trainadvisor.pt.trace.json.gz"
    )
    gpu = analyze_trace(h200)
    assert [s.model_aten_ops for s in gpu.steps] == [397] * 4 + [399] + [397] * 5
    assert len(_aten_threads(h200)) == 2  # the loop's thread and autograd's
    assert named_measurements(to_run(gpu))["model_aten_ops_per_step"] == 397.2


def _aten_threads(path: Path) -> set[object]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return {
        e.get("tid")
        for e in events
        if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::")
    }
