"""Fix `amp`: automatic mixed precision. Every outermost module call (the model's forward, a
loss module) runs under autocast, bf16 where the GPU has it in hardware, else fp16 with a
GradScaler injected around backward and the optimizer step (one optimizer only). Backward runs
outside autocast, and the module's outputs come back in fp32, as torch.amp recommends. No code
change: autocast has no single place in a script; the finding carries the code to write."""

from __future__ import annotations

from typing import Any

from trainadvisor.fixes.common import NO_GPU, Setting, Switch, overrides
from trainadvisor.records import Overrides


class Amp(Switch):
    id = "amp"
    # bf16 keeps 8 mantissa bits: over a few dozen steps losses move by up to a few percent.
    loss_tolerance_rel = 5e-2
    bound_by = "gpu_busy_pct"
    restarts_because = ""

    def in_process_problem(self, values: dict[str, Any]) -> str | None:
        if not values.get("bf16_supported"):
            return "fp16 needs a GradScaler around backward and the optimizer step, added when they are built"
        return None

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

    def install(self, recorder: Any, overrides: Overrides) -> None:
        amp = overrides.runtime.get("amp")
        if not amp:
            return
        import torch

        from trainadvisor.fixes import switches

        switches.install_autocast(recorder, torch.bfloat16 if amp == "bf16" else torch.float16)
        if amp == "fp16":  # the scaler steps with gradient accumulation when both are asked for
            scaler = switches.grad_scaler()
            switches.install_step_control(
                recorder, scaler, int(overrides.runtime.get("grad_accumulation") or 1)
            )
