"""Fix `fused-optimizer`: torch's Adam, AdamW, SGD and Adagrad built with `fused=True`, one
kernel per update instead of several per parameter (what a launch-bound loop needs). The fused
kernel computes the same update in another order: agreement to about 1e-6."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import NO_GPU, Setting, Switch, overrides
from trainadvisor.records import Overrides

# Optimizers with a fused (single-kernel) implementation in torch (the window's facts read it too).
FUSABLE = ("Adam", "AdamW", "SGD", "Adagrad")
# Arguments of the script's own that a fused=True would contradict.
_CHOSEN = ("fused", "foreach", "differentiable")


class FusedOptimizer(Switch):
    id = "fused-optimizer"
    restarts_because = (
        "the optimizer's state is created for the implementation it was built with (the fused "
        "step keeps its step counters on the GPU)"
    )
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

    def install(self, recorder: Any, overrides: Overrides) -> None:
        """Construct torch's fusable optimizers with `fused=True` unless the script chose `fused`
        or `foreach` itself."""
        if not overrides.runtime.get("fused_optimizer"):
            return
        import torch

        for name in FUSABLE:
            cls = getattr(torch.optim, name)
            original = cls.__dict__["__init__"]

            def init(self: Any, params: Any, *args: Any, __original: Any = original, **kwargs: Any) -> None:
                explicit = any(key in kwargs for key in ("fused", "foreach")) or kwargs.get("differentiable")
                if not explicit:
                    kwargs["fused"] = True
                __original(self, params, *args, **kwargs)

            recorder.patch(cls, "__init__", init)

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        return codechange.edit_calls(source, set(FUSABLE), None, {"fused": True}, conflicts=_CHOSEN)
