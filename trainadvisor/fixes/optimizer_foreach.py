"""Fix `optimizer-foreach`: torch's optimizers stepping one parameter at a time (`foreach=False`).

Where every parameter is a CUDA tensor, torch's Adam, AdamW, SGD and the others default to
their multi-tensor ("foreach") step, which makes each temporary for all parameters at once
(Adam's denominators: as large as the parameters) and so raises the step's peak by up to the
size of the model; one tensor at a time, a temporary is only ever as large as one parameter,
at the cost of a slower optimizer step (a few kernels per parameter instead of per list).

Applied at run time without editing the script: every optimizer the script builds gets
`foreach=False` in its defaults and its param groups (the step reads it there each time), except
one built with `fused=True` (one kernel, no such temporaries) and one whose class has no foreach
implementation. Its trials restart the script. It is a memory fix (`MemoryFix`): recommended from
its own runs, with its peak and its cost in speed. The code change adds `foreach=False` to the
optimizer's constructor call, as `fused-optimizer` adds `fused=True`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import LOSS_TOLERANCE_REL, MemoryFix, Setting, overrides
from trainadvisor.records import Overrides, Trial

# torch.optim's optimizers whose constructor takes `foreach` (the code change edits their calls;
# the run-time switch reads the optimizer's own defaults, so subclasses are covered too).
FOREACH = (
    "Adam", "AdamW", "SGD", "Adagrad", "Adadelta", "Adafactor", "Adamax", "ASGD", "NAdam", "RAdam",
    "RMSprop", "Rprop",
)  # fmt: skip

CPU_DEFAULT = (
    "on a CPU torch's optimizers already step one tensor at a time (foreach is their default "
    "for CUDA tensors only)"
)


class OptimizerForeach(MemoryFix):
    id = "optimizer-foreach"
    restarts_because = "the setting is put in the optimizer's param groups as the script builds it"
    # Both implementations compute the same update of each element; the multi-tensor kernels may
    # round in another order (a fused multiply-add on a GPU), so the loss agrees to rounding only.
    loss_tolerance_rel = LOSS_TOLERANCE_REL
    no_gain = (
        "stepping one tensor at a time did not lower the peak by 10% at 80% of the baseline's "
        "speed or better, nor fit the run into its memory budget (where the peak is in backward, "
        "the optimizer step's temporaries do not set it)"
    )

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        name = values.get("optimizer")
        if name is None:
            return "no torch.optim optimizer stepped in the window"
        if values.get("optimizer_fused"):
            return f"{name} is built with fused=True: its one-kernel step makes no per-list temporaries"
        if not values.get("optimizer_has_foreach"):
            return f"{name} has no foreach implementation in torch"
        if values.get("optimizer_foreach") is False:
            return f"{name} is already built with foreach=False"
        if not values.get("cuda_used") and values.get("optimizer_foreach") is not True:
            return CPU_DEFAULT
        return None

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        if trials:
            return None
        return Setting(f"{values['optimizer']}(..., foreach=False)", overrides(optimizer_foreach_off=True))

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        return f"{trial.label}: {self.cost(trial, values)}"

    def install(self, recorder: Any, overrides: Overrides) -> None:
        if not overrides.runtime.get("optimizer_foreach_off"):
            return
        import torch

        original = torch.optim.Optimizer.__dict__["__init__"]

        def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            step_per_tensor(self)

        recorder.patch(torch.optim.Optimizer, "__init__", init)

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        if not overrides.runtime.get("optimizer_foreach_off"):
            return None
        # an explicit foreach=True is replaced; a call that chose fused is left as it is
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        return codechange.edit_calls(source, set(FOREACH), None, {"foreach": False}, conflicts=("fused",))


def step_per_tensor(optimizer: Any) -> None:
    """`foreach=False` in the optimizer's defaults (param groups added later take it) and in
    each param group, unless it is fused or its class has no foreach implementation."""
    defaults = optimizer.defaults
    if "foreach" not in defaults or defaults.get("fused"):
        return
    defaults["foreach"] = False
    for group in optimizer.param_groups:
        group["foreach"] = False
