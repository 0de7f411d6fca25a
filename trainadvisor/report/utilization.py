"""How a run's FLOPs and MFU read in a report (`records.compute.Utilization`): a table cell,
its tooltip (the peak's source), the headline's words. Pure."""

from __future__ import annotations

from trainadvisor.records import Run
from trainadvisor.units import scaled


def flops(value: float) -> str:
    return scaled(value, "FLOP", "kMGTP")


def mfu_cell(run: Run) -> str:
    """'39.9% of 0.191 TFLOP/s (fp32, measured)', or why there is no MFU."""
    use = run.utilization
    if use is None:
        return "not counted"
    if use.mfu_pct is None or use.peak_tflops is None:
        return use.status
    hfu = ", HFU: its FLOPs count the recomputed activations" if use.hardware_flops else ""
    return f"{use.mfu_pct:.1f}% of {use.peak_tflops:.3g} TFLOP/s ({use.peak_dtype}, {use.peak_how}{hfu})"


def mfu_title(run: Run) -> str:
    """Where the peak comes from (the datasheet, or the CPU benchmark)."""
    use = run.utilization
    if use is None or not use.peak_source:
        return ""
    return f"{use.peak_device}: {use.peak_source}"


def flops_cell(run: Run) -> str:
    """FLOPs per step and what the step achieved: '679 MFLOP/step, 0.0762 TFLOP/s'."""
    use = run.utilization
    if use is None or use.flops_per_step is None:
        return use.status if use is not None else "not counted"
    achieved = f", {use.achieved_tflops:.3g} TFLOP/s" if use.achieved_tflops is not None else ""
    borrowed = " (counted on the baseline)" if use.flops_from_baseline else ""
    return f"{flops(use.flops_per_step)}/step{achieved}{borrowed}"


def mfu_words(run: Run) -> str:
    """The headline's ', MFU 39.9%' (HFU where the step recomputed checkpointed activations;
    '' where there is none)."""
    use = run.utilization
    return f", {use.label} {use.mfu_pct:.1f}%" if use is not None and use.mfu_pct is not None else ""
