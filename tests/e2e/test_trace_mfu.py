"""FLOPs per step and MFU that `analyze` reads off a trace (`analyze.trace.trace_flops`, `op_flops`):
exact counts on this project's own CPU traces (tests/data/own/SOURCE.md) and on real GPU traces
recorded by others (../shared), against torch's own FLOP formulas."""

from __future__ import annotations

from pathlib import Path

from conftest import gpu_run, load_report, run_cli
from support.trace_mfu import H100_STACK


def test_analyze_prints_and_reports_mfu_with_the_peaks_source(tmp_path: Path) -> None:
    result = run_cli("analyze", "--out", tmp_path / "out", gpu_run(H100_STACK), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    printed = " ".join(result.stdout.split())
    assert (
        "MFU 52.7% of 66.9 TFLOP/s, the H100 SXM fp32 peak (1.24 TFLOP/step from the trace shapes" in printed
    )
    assert "peak (datasheet): NVIDIA H100 Tensor Core GPU Architecture whitepaper" in printed
    report = load_report(tmp_path / "out")
    assert report["traces"][0]["utilization"]["flops_per_step"] == 1_236_975_747_072
    assert report["baseline"]["utilization"]["peak_source"].startswith("NVIDIA H100 Tensor Core GPU")
    assert (
        "| MFU (of the peak) | 52.7% of 66.9 TFLOP/s (fp32, datasheet) |"
        in (tmp_path / "out" / "report.md").read_text()
    )
    # busy GPU, no data wait, 52.7% of the FP32 peak, but 88% of GPU time in fp32 matmuls on
    # the FP32 units: TF32 or bf16 is the lever (no-mixed-precision), not compiling
    assert [f["rule"] for f in report["findings"] if f["rule"] == "compute-bound"] == []
