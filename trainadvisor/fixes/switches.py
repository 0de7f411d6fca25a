"""Fixes that are one setting each: measured once against the baseline and kept only if they
gain (`pin-memory`, `tf32`, `amp`, `fused-optimizer`, `cudnn-benchmark`). Each says why it
cannot be tried on a run (no GPU, already on, unsupported hardware) and how far the loss may
move: bit-for-bit for changes of transfer only, looser for changes of arithmetic."""

from __future__ import annotations

from typing import Any

from trainadvisor.compare import KEEP_MIN_SPEEDUP, LOSS_TOLERANCE_REL
from trainadvisor.fixes.common import NO_GPU, Setting, overrides
from trainadvisor.model import Trial


class _Switch:
    """One candidate; kept when it is at least KEEP_MIN_SPEEDUP faster."""

    id = ""
    metric = "steps_per_s"
    loss_tolerance_rel = LOSS_TOLERANCE_REL

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def setting(self, values: dict[str, Any]) -> Setting:
        raise NotImplementedError

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        return None if trials else self.setting(values)

    def choose(self, trials: list[Trial], baseline: float) -> Trial | None:
        measured = [t for t in trials if t.status == "measured" and t.steps_per_s]
        if not measured or (measured[0].steps_per_s or 0.0) < KEEP_MIN_SPEEDUP * baseline:
            return None
        return measured[0]

    def describe(self, trial: Trial) -> str:
        return trial.label


class PinMemory(_Switch):
    id = "pin-memory"

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("cuda_used"):
            return NO_GPU
        if "dataloader_call_site" not in values:
            return "the copies do not come from a torch DataLoader: pin the source tensors in your code"
        if values.get("pin_memory"):
            return "the DataLoader already pins memory; the pageable copies come from your own tensors"
        return None

    def setting(self, values: dict[str, Any]) -> Setting:
        pinned = overrides({values["dataloader_call_site"]: {"pin_memory": True}}, non_blocking_h2d=True)
        return Setting("pin_memory=True, non_blocking=True host-to-device copies", pinned)


class Tf32(_Switch):
    id = "tf32"
    # TF32 keeps 10 mantissa bits in matmul inputs: losses agree to about 1e-3.
    loss_tolerance_rel = 1e-2

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("cuda_used"):
            return NO_GPU
        if not values.get("tf32_supported"):
            return "TF32 needs an NVIDIA GPU of compute capability 8.0 (Ampere) or newer"
        if values.get("tf32_enabled"):
            return "TF32 is already on for matmuls"
        return None

    def setting(self, values: dict[str, Any]) -> Setting:
        if values.get("tf32_api") == "new":  # the script uses torch >= 2.9's API: so does the fix
            return Setting('fp32_precision = "tf32" for matmuls and cuDNN convolutions', overrides(tf32=True))
        return Setting("torch.backends.cuda.matmul.allow_tf32 = True (and cudnn)", overrides(tf32=True))


class Amp(_Switch):
    id = "amp"
    # bf16 keeps 8 mantissa bits: over a few dozen steps losses move by up to a few percent.
    loss_tolerance_rel = 5e-2

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("cuda_used"):
            return NO_GPU
        if values.get("amp_override"):
            return "autocast is already applied to this run"
        if not values.get("bf16_supported") and values.get("optimizers", 1) != 1:
            return (
                "this GPU has no bf16, and fp16 needs one GradScaler per training step, which "
                "trainadvisor injects only for a script with one optimizer"
            )
        return None

    def setting(self, values: dict[str, Any]) -> Setting:
        if values.get("bf16_supported"):
            return Setting(
                "torch.autocast(dtype=torch.bfloat16) around the forward pass", overrides(amp="bf16")
            )
        return Setting("torch.autocast(dtype=torch.float16) with a GradScaler", overrides(amp="fp16"))


class FusedOptimizer(_Switch):
    id = "fused-optimizer"
    # A fused kernel computes the same update in another order: agreement to about 1e-6.
    loss_tolerance_rel = 1e-3

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("cuda_used"):
            return NO_GPU
        if "optimizer" not in values:
            return "no torch.optim optimizer stepped in the window"
        if values.get("optimizer_fused"):
            return f"{values['optimizer']} is already fused"
        if not values.get("optimizer_fusable"):
            return f"{values['optimizer']} has no fused implementation in torch"
        return None

    def setting(self, values: dict[str, Any]) -> Setting:
        return Setting(f"{values['optimizer']}(..., fused=True)", overrides(fused_optimizer=True))


class CudnnBenchmark(_Switch):
    id = "cudnn-benchmark"
    # Another convolution algorithm sums in another order.
    loss_tolerance_rel = 1e-3

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("cuda_used"):
            return NO_GPU
        if values.get("cudnn_benchmark"):
            return "torch.backends.cudnn.benchmark is already on"
        return None

    def setting(self, values: dict[str, Any]) -> Setting:
        return Setting("torch.backends.cudnn.benchmark = True", overrides(cudnn_benchmark=True))
