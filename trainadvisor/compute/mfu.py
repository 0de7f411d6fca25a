"""MFU of a run from what its child recorded: the FLOPs of one counted step (`compute.flops`),
the timed steps per second, and the peak of the device in the dtype the matmuls ran in: the
datasheet table for a known GPU (`compute.peaks`), the CPU's own measured matmul rate, and no
MFU at all for a GPU the table does not know. Pure: a report re-rendered gives the same."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainadvisor.compute.peaks import matmul_dtype, peak_for
from trainadvisor.records import Run
from trainadvisor.records.compute import Utilization


def utilization(
    runtime: dict[str, Any], gpu_name: str | None, steps_per_s: float | None
) -> Utilization | None:
    """None where the run recorded nothing of FLOPs (a run saved before they were counted)."""
    status = runtime.get("flops_status")
    if status is None:
        return None
    flops = runtime.get("flops_per_step")
    if not flops:
        return Utilization(status=status)
    if not steps_per_s:
        return Utilization(status="no timed steps", flops_per_step=flops)
    achieved_flops_per_s = flops * steps_per_s
    figures = Utilization(
        status="measured",
        flops_per_step=flops,
        achieved_tflops=achieved_flops_per_s / 1e12,
        hardware_flops=bool(runtime.get("flops_recomputed")),
    )
    by_dtype = runtime.get("flops_by_dtype") or {}
    if runtime.get("cuda_used"):
        if not gpu_name:
            figures.status = "no MFU: the GPU's name is unknown"
            return figures
        # a run saved before cuDNN's flag was read: its convolutions were counted with the matmuls
        dtype = matmul_dtype(
            by_dtype, bool(runtime.get("tf32_enabled")), bool(runtime.get("cudnn_tf32_enabled"))
        )
        # TF32 asked for on a card without it (V100, AMD): the matmuls run in plain fp32
        peak = peak_for(gpu_name, dtype) or (peak_for(gpu_name, "fp32") if dtype == "tf32" else None)
        if peak is None:
            figures.status = f"no MFU: no datasheet peak for {gpu_name} in {dtype} (never guessed)"
            return figures
        figures.peak_tflops, figures.peak_dtype = peak.flops_per_s / 1e12, peak.dtype
        figures.peak_device, figures.peak_source, figures.peak_how = peak.device, peak.source, peak.how
    else:
        cpu = runtime.get("cpu_peak") or {}
        if not cpu.get("flops_per_s"):
            figures.status = f"no MFU: the CPU's peak was {cpu.get('status', 'not measured')}"
            return figures
        figures.peak_tflops, figures.peak_dtype = cpu["flops_per_s"] / 1e12, cpu.get("dtype", "")
        figures.peak_device, figures.peak_source = cpu.get("device", "CPU"), cpu.get("source", "")
        figures.peak_how = cpu.get("how", "measured")
    if figures.peak_tflops:
        figures.mfu_pct = 100.0 * achieved_flops_per_s / (figures.peak_tflops * 1e12)
    return figures


def with_baseline_flops(after: Run, baseline: Run) -> Run:
    """`after` with the baseline's FLOPs per step where its own step ran compiled code that
    dispatched no operators to count (the work per step is the model's, compiled or not)."""
    mine, base = after.utilization, baseline.utilization
    if mine is None or mine.flops_per_step or base is None or not base.flops_per_step:
        return after
    if "compile" not in mine.status:
        return after
    runtime = {**after.raw.runtime, "flops_status": "counted", "flops_per_step": base.flops_per_step}
    runtime["flops_by_dtype"] = baseline.raw.runtime.get("flops_by_dtype") or {}
    if "cpu_peak" not in runtime and "cpu_peak" in baseline.raw.runtime:
        runtime["cpu_peak"] = baseline.raw.runtime["cpu_peak"]
    gpu_name = after.raw.device.gpu_name if after.raw.device is not None else None
    figures = utilization(runtime, gpu_name, after.steps_per_s)
    if figures is not None:
        figures.flops_from_baseline = True
    return replace(after, utilization=figures)
