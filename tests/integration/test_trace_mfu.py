"""FLOPs per step and MFU that `analyze` reads off a trace (`analyze.trace.trace_flops`, `op_flops`):
exact counts on this project's own CPU traces (tests/data/own/SOURCE.md) and on real GPU traces
recorded by others (../shared), against torch's own FLOP formulas."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from conftest import DATA, gpu_run, shared_trace
from support.trace_mfu import H100_STACK
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from trainadvisor.analyze.read.op_flops import op_flops
from trainadvisor.analyze.run.measures import trace_measurements
from trainadvisor.analyze.trace.analysis import analyze_trace

LINEAR = DATA / "own" / "linear_flops_cpu.pt.trace.json.gz"


CONV_ATTENTION = DATA / "own" / "conv_attention_flops_cpu.pt.trace.json.gz"


QWEN = "more/tracelens/{}/Qwen_Qwen1.5-0.5B-Chat__1016005.hf_token_redacted.json.gz"


# The H100's dense FP32 peak (compute/peaks.toml): the residual stack's matmuls ran in fp32 on
# the FP32 units (cuBLAS `..._ffma_...` and CUTLASS `simt_sgemm` kernels).
H100_FP32_FLOPS_PER_S = 66.9e12


def test_a_linear_layer_counts_its_forward_and_weight_gradient_matmuls_once() -> None:
    a = analyze_trace(LINEAR)
    use = a.utilization
    assert use is not None and a.flops_source == "trace shapes"
    # addmm 16x64 @ 64x32 forward (inside aten::linear, counted once), mm 32x16 @ 16x64 for the
    # weight's gradient; the input needs no gradient. FlopCounterMode counts the same.
    assert use.flops_per_step == 2 * 16 * 64 * 32 + 2 * 32 * 16 * 64 == 131_072
    assert use.achieved_tflops == pytest.approx(131_072 / (a.step_time_ms_mean / 1e3) / 1e12, rel=1e-12)
    # a CPU trace: no peak to compare with (analyze measures no CPU), so no MFU
    assert use.mfu_pct is None and use.peak_tflops is None
    assert "CPU's peak was not measured" in use.status
    table = trace_measurements(a)
    assert table["flops_per_step"] == 131_072 and table["flops_source"] == "trace shapes"
    assert "mfu_pct" not in table and "peak_tflops" not in table


def test_convolution_attention_and_bmm_forward_and_backward() -> None:
    use = analyze_trace(CONV_ATTENTION).utilization
    assert use is not None
    conv = 2 * 4 * (8 * 8) * (8 * 3 * 3 * 3)  # forward, and again for the weight's gradient
    bmm = 3 * (2 * 3 * 5 * 7 * 6)  # forward, both gradients
    attention = 2 * 2 * 4 * 10 * 12 * (8 + 8) + 2 * 2 * 4 * 10 * 12 * (3 * 8 + 2 * 8)
    # FlopCounterMode counted 224,964 when the trace was recorded: all but the CPU's flash
    # attention, which torch's formula registry lacks
    assert 2 * conv + bmm == 224_964
    assert use.flops_per_step == 2 * conv + bmm + attention == 332_484


def _shape_args(x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int],
                transposed: bool, output_padding: list[int], groups: int) -> tuple[list, list]:  # fmt: skip
    """Input Dims and Concrete Inputs of aten::convolution as torch.profiler writes them."""
    dims = [list(x.shape), list(w.shape), [], [], [], [], [], [], []]
    concrete = ["", "", "", str(stride), str(padding), str(dilation), str(transposed), str(output_padding),
                str(groups)]  # fmt: skip
    return dims, concrete


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "stride", "padding", "dilation", "transposed", "output_padding", "groups"),
    [
        ((2, 6, 11, 9), (4, 3, 3, 2), [2, 1], [1, 0], [1, 2], False, [0, 0], 2),
        ((2, 4, 7, 7), (4, 3, 3, 3), [2, 2], [1, 1], [1, 1], True, [1, 1], 1),
        ((3, 5, 20), (7, 5, 4), [3], [2], [2], False, [0], 1),
    ],
)
def test_convolution_formulas_match_torch(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
) -> None:
    x = torch.randn(x_shape, requires_grad=True)
    w = torch.randn(w_shape, requires_grad=True)
    args = (stride, padding, dilation, transposed, output_padding, groups)
    with FlopCounterMode(display=False) as forward:
        out = torch.ops.aten.convolution(x, w, None, *args)
    dims, concrete = _shape_args(x, w, *args)
    assert op_flops("aten::convolution", dims, concrete) == forward.get_total_flops() > 0
    for mask in ([True, True, False], [False, True, False], [True, False, False]):
        with FlopCounterMode(display=False) as backward:
            torch.ops.aten.convolution_backward(out, x, w, None, *args, mask)
        backward_dims = [list(out.shape), list(x.shape), list(w.shape), *[[]] * 8]
        backward_concrete = ["", "", "", "None", *concrete[3:], str(mask)]
        counted = op_flops("aten::convolution_backward", backward_dims, backward_concrete)
        assert counted == backward.get_total_flops()


def test_attention_and_matmul_formulas_match_torch() -> None:
    aten = torch.ops.aten
    q, k, v, grad = (
        [2, 8, 100, 64],
        [2, 4, 120, 64],
        [2, 4, 120, 32],
        [2, 8, 100, 32],
    )  # 2 query heads a KV head
    cases = [
        ("aten::mm", aten.mm, [[5, 7], [7, 3]]),
        ("aten::addmm", aten.addmm, [[3], [5, 7], [7, 3]]),
        ("aten::bmm", aten.bmm, [[2, 5, 7], [2, 7, 3]]),
        ("aten::baddbmm", aten.baddbmm, [[2, 5, 3], [2, 5, 7], [2, 7, 3]]),
        ("aten::_scaled_mm", aten._scaled_mm, [[16, 32], [32, 8], [], []]),  # per-tensor scales
    ]
    for kind in ("flash", "efficient", "cudnn"):
        name = f"_scaled_dot_product_{kind}_attention"
        cases += [
            (f"aten::{name}", getattr(aten, name), [q, k, v]),
            (f"aten::{name}_backward", getattr(aten, f"{name}_backward"), [grad, q, k, v]),
        ]
    for name, op, dims in cases:
        assert op_flops(name, dims, []) == flop_registry[op](*dims), name
    assert op_flops("aten::mm", [[5, 7], [6, 3]], []) is None  # shapes that do not multiply
    assert op_flops("aten::convolution", [[1, 3, 8, 8], [4, 3, 3, 3]], ["", "", ""]) is None  # no strides


def test_flops_written_into_a_trace_are_counted_at_the_innermost_op(tmp_path: Path) -> None:
    """No torch writes per-op FLOPs into its Chrome trace (with_flops keeps them in key_averages);
    a tool that adds them may put them on aten::linear and on the aten::addmm inside it alike:
    the recorded linear trace with such FLOPs added."""
    document = json.loads(gzip.decompress(LINEAR.read_bytes()))
    for event in document["traceEvents"]:
        if event.get("name") in ("aten::linear", "aten::addmm", "aten::mm"):
            event["args"]["flops"] = 1000
        elif event.get("name") == "aten::add_":  # an elementwise op's FLOPs: no MFU convention counts them
            event["args"]["flops"] = 7
    written = tmp_path / "with_flops.json"
    written.write_text(json.dumps(document))
    a = analyze_trace(written)
    assert a.flops_source == "trace flops"
    assert a.utilization is not None and a.utilization.flops_per_step == 2000  # addmm and mm, not linear


def test_h100_fp32_residual_stack_gives_mfu_against_the_fp32_peak() -> None:
    a = analyze_trace(gpu_run(H100_STACK))
    use = a.utilization
    assert use is not None and a.flops_source == "trace shapes"
    # per step: 2 x 4096^2 x 1024 in each of the blocks' matmuls, forward and backward
    assert use.flops_per_step == 1_236_975_747_072
    assert (use.peak_dtype, use.peak_device, use.peak_how) == ("fp32", "H100 SXM", "datasheet")
    assert use.peak_tflops == 66.9
    assert a.step_time_ms_mean == pytest.approx(35.09431343359375, rel=1e-12)
    expected = 100 * 1_236_975_747_072 / (a.step_time_ms_mean / 1e3) / H100_FP32_FLOPS_PER_S
    assert use.mfu_pct == pytest.approx(expected, rel=1e-12) and round(use.mfu_pct, 2) == 52.69
    table = trace_measurements(a)
    assert table["mfu_pct"] == use.mfu_pct and table["peak_tflops"] == 66.9
    assert table["achieved_tflops"] == pytest.approx(35.2472, rel=1e-5)


def test_the_same_model_counts_the_same_flops_on_an_h100_and_an_mi300x() -> None:
    """Qwen1.5-0.5B inference traced on both vendors' GPUs (TraceLens): bf16 matmuls and flash
    attention, each against its own card's bf16 peak."""
    h100 = analyze_trace(shared_trace(QWEN.format("h100"))).utilization
    mi300 = analyze_trace(shared_trace(QWEN.format("mi300"))).utilization
    assert h100 is not None and mi300 is not None
    assert h100.flops_per_step == mi300.flops_per_step == 6_006_026_832_832
    assert (h100.peak_device, h100.peak_dtype, h100.peak_tflops) == ("H100 SXM", "bf16", 989.4)
    assert (mi300.peak_device, mi300.peak_dtype, mi300.peak_tflops) == ("Instinct MI300X", "bf16", 1307.4)


def test_tf32_is_read_from_the_kernels_of_fp32_matmuls() -> None:
    """A100 fp32 matmuls on CUTLASS `tensorop_s1688gemm` kernels (TF32); the card's name is one
    the datasheet table does not know, so there is no MFU, and the reason says so."""
    use = analyze_trace(shared_trace("hta/trace_diff/control/control.json.gz")).utilization
    assert use is not None and use.flops_per_step == 344_701_016_064
    assert use.status == "no MFU: no datasheet peak for NVIDIA A100-PG509-200 in tf32 (never guessed)"


def test_no_flops_where_convolutions_have_no_recorded_strides() -> None:
    """A 2021 ResNet-50 trace records shapes but not the scalar arguments: its convolutions'
    FLOPs are unknown, and a count of its one matmul alone would read as a tiny MFU."""
    a = analyze_trace(shared_trace("tb_plugin/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz"))
    assert a.utilization is not None and a.utilization.flops_per_step is None
    assert "318 aten::cudnn_convolution" in a.utilization.status
    assert "flops_per_step" not in trace_measurements(a) and "mfu_pct" not in trace_measurements(a)


def test_no_flops_for_steps_that_run_compiled_code() -> None:
    use = analyze_trace(shared_trace("hta/negative_queue_length_values_check/rank0.json.gz")).utilization
    assert use is not None and use.flops_per_step is None
    assert use.status.startswith("not counted: the steps run code torch.compile compiled")
