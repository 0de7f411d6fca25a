"""The columnar reader and what it measures (issue 14, items 2, 3, 4, 6, 7): precision from kernel
names and their ops' input dtypes, allocator calls per step, reading a large trace in parts on
worker processes, and the straggler among ranks. Traces built here use real event and kernel
names from public traces; the arithmetic under test is ours."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import shared_trace

from trainadvisor import rulebook
from trainadvisor._serial import to_plain
from trainadvisor.analyze.command import to_run
from trainadvisor.analyze.rank_table import RankRow, _straggler, rank_values
from trainadvisor.analyze.read import reading
from trainadvisor.analyze.read.columns import FLOAT32, REDUCED
from trainadvisor.analyze.read.stream import split_points
from trainadvisor.analyze.run.summary import named_measurements
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.analyze.trace.device import combined
from trainadvisor.resources import rules_dir

NVJET = "nvjet_sm103_tst_384x16_64x4_4x1_v_bz_TNT"  # B300 decode trace
SM90 = (  # H100 Qwen trace
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
    "kernel__5x_cublas"
)
TRITON_TEMPLATE = "triton_tem_fused_mm_0"  # a torch.compile matmul template: no precision in its name
SGEMM = "ampere_sgemm_128x64_nn"


def span(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": 7 if cat == "kernel" else 1,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


@pytest.mark.parametrize(
    ("name_says", "inputs", "expected"),
    [
        ("tensor_core", REDUCED, "tensor_core"),
        ("unknown", REDUCED, "tensor_core"),  # a Triton template on bf16 inputs
        ("fp32", REDUCED, "unknown"),  # they disagree
        ("tensor_core", FLOAT32, "tensor_core"),  # TF32 (s1688, tf32) or AMD's fp32 MFMA
        ("fp32", FLOAT32, "fp32"),
        ("unknown", FLOAT32, "unknown"),  # fp32 inputs may still run as TF32
        ("unknown", 0, "unknown"),  # neither source speaks
    ],
)
def test_name_and_inputs_combined(name_says: str, inputs: int, expected: str) -> None:
    assert combined(name_says, inputs, "some_kernel") == expected


def test_a_reduced_precision_name_on_fp32_inputs_is_unknown() -> None:
    assert combined("tensor_core", FLOAT32, SM90) == "unknown"


@pytest.mark.parametrize("external_key", ["External id", "external id"])  # 2021 traces: lower case
def test_kernels_take_their_ops_input_dtypes(tmp_path: Path, external_key: str) -> None:
    bf16, fp32 = ["c10::BFloat16", "c10::BFloat16"], ["float", "float"]
    events = [span("cpu_op", "ProfilerStep#1", 0, 1000)]
    for i, (op, types, kernel, dur) in enumerate(
        [
            ("aten::mm", bf16, NVJET, 100),
            ("aten::mm", fp32, SM90, 50),
            ("aten::addmm", bf16, TRITON_TEMPLATE, 30),
        ]
    ):
        ts = 100 + 200 * i
        events += [
            span("cpu_op", op, ts, 20, **{"External id": i + 1, "Input type": types}),
            span("cuda_runtime", "cudaLaunchKernel", ts + 5, 5, correlation=10 + i, **{external_key: i + 1}),
            span("kernel", kernel, ts + 20, dur, correlation=10 + i, **{external_key: i + 1}),
        ]
    a = analyze_trace(write(tmp_path / "t.json", events))
    # 100 us on Tensor Cores by both sources, 30 by dtype alone; 50 where they disagree
    assert round(a.tensor_core_pct or 0, 2) == round(100 * 130 / 180, 2)
    assert round(a.tensor_core_unknown_pct or 0, 2) == round(100 * 50 / 180, 2)
    assert (
        a.precision_source
        == "kernel names and the input dtypes of their ops (3 kernels linked, record_shapes)"
    )


def test_our_bf16_trace_records_the_dtypes_kernels_would_be_linked_to() -> None:
    """CPU autocast to bf16 (tests/data/traces/record_shapes_bf16): the matrix ops carry
    c10::BFloat16 inputs; no kernels on a CPU, so nothing is linked."""
    from conftest import DATA

    from trainadvisor.analyze.read.reading import read_table

    table, _ = read_table(DATA / "traces" / "record_shapes_bf16.json.gz")
    assert sorted(set(table.op_precision.values())) == [REDUCED, FLOAT32]
    # per iteration: 2 inner linear, 2 addmm and 3 mm (backward) on bf16 inputs, and the second
    # layer's outer linear, whose input is already bf16 (its weight is fp32 until autocast casts it)
    assert sum(1 for v in table.op_precision.values() if v == REDUCED) == 32


def test_allocator_calls_in_steady_steps_fire_allocator_churn(tmp_path: Path) -> None:
    """An MI300X-style loop with the caching allocator off: hipMalloc and hipFree in every
    step around its kernel."""
    events = []
    for step in range(3):
        t0 = 1000.0 * step
        events += [
            span("cpu_op", f"ProfilerStep#{step + 1}", t0, 1000),
            span("cuda_runtime", "hipMalloc", t0 + 10, 80, correlation=100 + 3 * step),
            span("cuda_runtime", "hipLaunchKernel", t0 + 100, 10, correlation=101 + 3 * step),
            span(
                "kernel",
                "Cijk_Ailk_Bljk_BBS_BH_MT128x64x64_MI32x32x8x1_SN",
                t0 + 120,
                600,
                correlation=101 + 3 * step,
            ),
            span("cuda_runtime", "hipFree", t0 + 800, 70, correlation=102 + 3 * step),
        ]
    a = analyze_trace(write(tmp_path / "churn.json", events))
    assert [s.allocator_calls for s in a.steps] == [2, 2, 2]
    assert [round(s.allocator_ms, 3) for s in a.steps] == [0.15, 0.15, 0.15]
    values = named_measurements(to_run(a))
    assert values["allocator_calls_per_step"] == 2 and round(values["allocator_pct"], 1) == 15.0
    rules = rulebook.load_rules([rules_dir()])
    churn = [f for f in rulebook.diagnose(values, rules).findings if f.rule == "allocator-churn"]
    assert [f.severity for f in churn] == ["high"]
    assert churn[0].message.startswith(
        "Steady-state steps called the device allocator 2.0 times per step (0.15 ms"
    )


def _same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-6), where
    else:
        assert a == b, where


def test_a_large_trace_read_in_parts_gives_the_same_analysis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTA's df_index_resolver trace (54 MB of JSON, 216k events) read by three worker processes
    against one: the same analysis, to rounding."""
    plain = tmp_path / "trace.json"
    plain.write_bytes(
        gzip.decompress(shared_trace("hta/df_index_resolver/df_index_resolver.json.gz").read_bytes())
    )
    split = split_points(plain, 3)
    assert split is not None and len(split[0]) == 4 and split[1]["distributedInfo"]["rank"] == 1
    monkeypatch.setattr(reading, "PARALLEL_MIN_BYTES", 0)
    parts = to_plain(analyze_trace(plain, workers=3))
    whole = to_plain(analyze_trace(plain, workers=1))
    assert parts["events"] == whole["events"] == 216092
    _same(parts, whole)


def test_cuts_are_never_made_inside_a_string(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Event names that hold the boundary text itself (`}, {"ph": "X"`) do not fool the cut."""
    decoy = 'x}, {"ph": "X", "ts": 1}, {"ph": "X"'
    events = [span("cpu_op", f"ProfilerStep#{i}", 100.0 * i, 90) for i in range(200)]
    events += [span("cpu_op", decoy, 100.0 * i + 10, 5) for i in range(200)]
    path = write(tmp_path / "decoy.json", sorted(events, key=lambda e: e["ts"]))
    monkeypatch.setattr(reading, "PARALLEL_MIN_BYTES", 0)
    parts, whole = analyze_trace(path, workers=4), analyze_trace(path, workers=1)
    assert parts.events == whole.events == 400 and len(parts.steps) == len(whole.steps) == 200


def _row(rank: int, step_ms: float, comm_ms: float) -> RankRow:
    return RankRow(rank, 1, 5, step_ms, 40.0, comm_ms, 2.0, 1.0)


def test_the_straggler_is_the_rank_with_the_least_time_in_collectives() -> None:
    """Every rank's step is as long as the slowest's (waits included), so step time cannot
    tell; the others wait for the straggler inside the all-reduce."""
    table = _straggler([_row(0, 100.0, 30.0), _row(1, 99.0, 5.0), _row(2, 101.0, 28.0), _row(3, 100.0, 31.0)])
    assert table.straggler == 1 and table.straggler_by == "communication"
    assert table.skew_pct == pytest.approx(100 * (30.0 - 5.0) / 100.0)
    values = rank_values(table)
    straggler = rulebook.load_rule(rules_dir() / "straggler.toml")
    finding = rulebook.evaluate_rule(straggler, values)
    assert finding is not None and finding.severity == "high"
    assert finding.message == (
        "Rank 1 holds the others back: it spends 5.0 ms per step in collectives against 30.0 ms on "
        "the other ranks, which wait there for it (25% of every step)."
    )


def test_without_collectives_the_longest_steps_name_the_straggler() -> None:
    table = _straggler([_row(0, 100.0, 0.0), _row(1, 130.0, 0.0), _row(2, 101.0, 0.0)])
    assert table.straggler == 1 and table.straggler_by == "step time"
    assert table.skew_pct == pytest.approx(100 * (130.0 - 100.5) / (331.0 / 3))  # the others: median 100.5


def test_ranks_without_distributed_info_are_named_by_their_files(tmp_path: Path) -> None:
    """Older Kineto wrote no distributedInfo: rank0.json and rank1.json are still two ranks, and
    rank 1, with the shorter all-reduce (the others wait there for it), is the straggler."""
    from trainadvisor.analyze.command import analyze

    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    for rank, allreduce_us in ((0, 400.0), (1, 100.0)):
        events = []
        for step in range(3):
            t0 = 1000.0 * step
            events += [
                span("cpu_op", f"ProfilerStep#{step + 1}", t0, 1000),
                span("cuda_runtime", "cudaLaunchKernel", t0 + 10, 5, correlation=10 * step + 1),
                span("kernel", "volta_sgemm_128x64_nn", t0 + 20, 400, correlation=10 * step + 1),
                span("cuda_runtime", "ncclKernel", t0 + 30, 5, correlation=10 * step + 2),
                span("kernel", nccl, t0 + 900 - allreduce_us, allreduce_us, correlation=10 * step + 2),
                span("user_annotation", "Optimizer.step#SGD.step", t0 + 950, 20),  # a training loop
            ]
        write(tmp_path / f"rank{rank}.json", events)
    report, _ = analyze([tmp_path], [], ["trainadvisor", "analyze"])
    table = report.ranks
    assert [row["rank"] for row in table["rows"]] == [0, 1]
    assert [round(row["communication_ms"], 6) for row in table["rows"]] == [0.4, 0.1]
    assert table["straggler"] == 1 and round(table["skew_pct"], 1) == 30.0
    [straggler] = [f for f in report.findings if f.rule == "straggler"]
    assert straggler.severity == "high" and straggler.message.startswith("Rank 1 holds the others back")


@pytest.mark.parametrize(
    ("gpu", "tensor_core_pct", "matmul_pct", "unknown_pct"),
    [("h100", 36.64, 36.65, 0.0), ("mi300", 48.29, 52.44, 7.91)],
)
def test_precision_of_real_traces_with_recorded_shapes(
    gpu: str, tensor_core_pct: float, matmul_pct: float, unknown_pct: float
) -> None:
    """The same Qwen1.5-0.5B inference on an H100 and an MI300X (record_shapes on): 193 matrix
    kernels linked to their ops' bf16 inputs. On the MI300X, 7.9% of the matrix time stays
    unknown: the Triton attention kernel `attn_fwd`, whose name gives no type and which carries no
    external id to link it to an op."""
    a = analyze_trace(
        shared_trace(f"more/tracelens/{gpu}/Qwen_Qwen1.5-0.5B-Chat__1016005.hf_token_redacted.json.gz")
    )
    assert (
        a.precision_source
        == "kernel names and the input dtypes of their ops (193 kernels linked, record_shapes)"
    )
    assert (round(a.tensor_core_pct or 0, 2), round(a.matmul_pct or 0, 2)) == (tensor_core_pct, matmul_pct)
    assert round(a.tensor_core_unknown_pct or 0, 2) == unknown_pct
