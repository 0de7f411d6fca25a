"""Fix `grad-accumulation`: the same effective batch in `k` micro-batches, to lower peak memory.

The DataLoader's batch size is divided by `k` and the script's loop is left as it is: the loss
is divided by `k` before backward, the optimizer applies its update on every `k`-th `step()`
only, and `zero_grad()` clears gradients only after an update (see
`fixes.switches.install_step_control`). So one trainadvisor step is still one update over the same
number of samples. The step structure allows it only with one optimizer, no LR scheduler (it
would step `k` times per update), and a batch size divisible by `k`; a loss that is a mean over
the batch is assumed, and the loss check (mean over the window, the micro-batches differ from
the batches) verifies it. The goal is memory (`MemoryFix`): a candidate is worth keeping when
the peak (reserved on a GPU, the step's measured peak on a CPU) drops by a tenth while
throughput stays above 80% of the baseline's, or, over the memory budget, when it fits it. It is
not merged into the speed fixes' confirmation run, since it trades some speed for memory; the
report lists it as recommended, with both figures."""

from __future__ import annotations

from typing import Any

from trainadvisor.fixes.common import (
    MEAN_LOSS_TOLERANCE_REL,
    MemoryFix,
    Setting,
    baseline_peak,
    overrides,
)
from trainadvisor.records import Overrides, Trial

STEPS = (2, 4)


class GradAccumulation(MemoryFix):
    id = "grad-accumulation"
    restarts_because = "accumulation changes what one optimizer step is, from the first step on"
    loss_tolerance_rel = MEAN_LOSS_TOLERANCE_REL
    no_gain = (
        "no candidate lowered peak memory by 10% at 80% of the baseline's speed or better, nor "
        "fit the run into its memory budget"
    )

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if "dataloader_call_site" not in values or not isinstance(values.get("batch_size"), int):
            return "the batches do not come from a DataLoader with a batch_size trainadvisor can divide"
        if values["batch_size"] % 2:
            return f"batch_size={values['batch_size']} is odd: it cannot be split into equal micro-batches"
        if values.get("optimizers", 1) != 1:
            return "the script steps several optimizers; accumulate gradients in your loop"
        if values.get("lr_scheduler"):
            return "an LR scheduler steps with every optimizer.step(); accumulate gradients in your loop"
        if baseline_peak(values) is None:
            return "the baseline's peak memory was not measured"
        return None

    def _setting(self, values: dict[str, Any], k: int) -> Setting:
        size = int(values["batch_size"]) // k
        return Setting(
            f"{k} micro-batches of {size} (batch_size={size}, one update per {k})",
            overrides({values["dataloader_call_site"]: {"batch_size": size}}, grad_accumulation=k),
        )

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        """k = 2, then 4 if 2 did not relieve enough and the batch divides."""
        if not trials:
            return self._setting(values, STEPS[0])
        last = trials[-1]
        died_of_oom = last.raw is not None and bool(last.raw.runtime.get("oom"))
        if len(trials) >= len(STEPS) or (last.status != "measured" and not died_of_oom):
            return None  # (more micro-batches where the fewer still ran out of memory)
        if self.relieved(last, values) or int(values["batch_size"]) % STEPS[len(trials)]:
            return None
        return self._setting(values, STEPS[len(trials)])

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        return f"{trial.label}: {self.cost(trial, values)}"

    def install(self, recorder: Any, overrides: Overrides) -> None:
        """Micro-batches: the update on every k-th step() (with fp16, `amp` installs both)."""
        k = int(overrides.runtime.get("grad_accumulation") or 1)
        if k > 1 and overrides.runtime.get("amp") != "fp16":
            from trainadvisor.fixes import switches

            switches.install_step_control(recorder, None, k)
