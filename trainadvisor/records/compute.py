"""What the compute stage records of a run (plain data; imports nothing of the package)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Utilization:
    """How much of the hardware's peak the timed steps used: the FLOPs of one counted step
    times the timed steps per second, against the dense peak of the device and of the dtype
    the step's matmuls ran in. `status` says why a figure is missing (never a guessed peak)."""

    status: str  # "measured", or why MFU is not given
    flops_per_step: float | None = None
    achieved_tflops: float | None = None  # TFLOP/s over the timed steps
    mfu_pct: float | None = None
    peak_tflops: float | None = None
    peak_dtype: str = ""  # fp32, tf32, bf16, fp16, fp8
    peak_device: str = ""  # the peak table's device, or the CPU measured
    peak_source: str = ""  # the datasheet, or how the CPU's peak was measured
    peak_how: str = ""  # "datasheet" or "measured"
    # the FLOPs are the baseline's: this run's compiled code dispatched no operators to count
    flops_from_baseline: bool = False
    # the counted step recomputed checkpointed activations: its FLOPs are hardware FLOPs, and
    # `mfu_pct` is the hardware FLOPs utilisation (HFU), above the model's MFU
    hardware_flops: bool = False

    @property
    def label(self) -> str:
        return "HFU" if self.hardware_flops else "MFU"
