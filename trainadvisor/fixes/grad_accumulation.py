"""Fix `grad-accumulation`: the same effective batch in `k` micro-batches, to lower peak memory.

The DataLoader's batch size is divided by `k` and the script's loop is left as it is: the loss
is divided by `k` before backward, the optimizer applies its update on every `k`-th `step()`
only, and `zero_grad()` clears gradients only after an update (see
`measure.switches.install_step_control`). So one trainadvisor step is still one update over the same
number of samples. The step structure allows it only with one optimizer, no LR scheduler (it
would step `k` times per update), and a batch size divisible by `k`; a loss that is a mean over
the batch is assumed, and the loss check (mean over the window, the micro-batches differ from
the batches) verifies it. The goal is memory: a candidate is worth keeping when peak reserved
memory drops by at least `MIN_RELIEF` while throughput stays above `MIN_SPEED` of the baseline.
It is not merged into the speed fixes' confirmation run, since it trades some speed for memory;
the report lists it as recommended, with both figures."""

from __future__ import annotations

from typing import Any

from trainadvisor.fixes.common import MEAN_LOSS_TOLERANCE_REL, NO_GPU, Fix, Setting, cuda_memory, overrides
from trainadvisor.records import Overrides, Trial

MIN_RELIEF = 0.10  # peak reserved memory must drop by a tenth
MIN_SPEED = 0.80  # and steps/s stay above 80% of the baseline's
STEPS = (2, 4)


def peak_reserved(trial: Trial) -> int | None:
    value = cuda_memory(trial).get("peak_reserved_bytes")
    return int(value) if value is not None else None


class GradAccumulation(Fix):
    id = "grad-accumulation"
    restarts_because = "accumulation changes what one optimizer step is, from the first step on"
    metric = "peak_reserved_bytes"
    goal = "memory"
    loss_tolerance_rel = MEAN_LOSS_TOLERANCE_REL
    no_gain = (
        f"no candidate lowered peak reserved memory by {MIN_RELIEF:.0%} at {MIN_SPEED:.0%} of the "
        "baseline's speed or better"
    )

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("cuda_used"):
            return NO_GPU
        if "dataloader_call_site" not in values or not isinstance(values.get("batch_size"), int):
            return "the batches do not come from a DataLoader with a batch_size trainadvisor can divide"
        if values["batch_size"] % 2:
            return f"batch_size={values['batch_size']} is odd: it cannot be split into equal micro-batches"
        if values.get("optimizers", 1) != 1:
            return "the script steps several optimizers; accumulate gradients in your loop"
        if values.get("lr_scheduler"):
            return "an LR scheduler steps with every optimizer.step(); accumulate gradients in your loop"
        if "peak_reserved_bytes" not in values:
            return "the baseline's peak GPU memory was not measured"
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
        if len(trials) >= len(STEPS) or last.status != "measured":
            return None
        if self._relieved(last, values) or int(values["batch_size"]) % STEPS[len(trials)]:
            return None
        return self._setting(values, STEPS[len(trials)])

    @staticmethod
    def _relieved(trial: Trial, values: dict[str, Any]) -> bool:
        """Peak reserved memory a tenth lower than the baseline's, at 80% of its speed or more."""
        peak = peak_reserved(trial)
        speed = values.get("steps_per_s")
        speed_ok = not speed or (trial.steps_per_s or 0.0) >= MIN_SPEED * speed
        return peak is not None and peak <= (1 - MIN_RELIEF) * values["peak_reserved_bytes"] and speed_ok

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        fitting = [t for t in trials if t.status == "measured" and self._relieved(t, values)]
        return fitting[0] if fitting else None  # the fewest micro-batches that relieve memory

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        peak = peak_reserved(trial) or 0
        text = (
            f"{trial.label}: peak reserved {values['peak_reserved_bytes'] / 1e9:.2f} -> {peak / 1e9:.2f} GB"
        )
        if values.get("steps_per_s") and trial.steps_per_s:
            text += f" at {trial.steps_per_s / values['steps_per_s']:.2f}x the throughput"
        return text

    def install(self, recorder: Any, overrides: Overrides) -> None:
        """Micro-batches: the update on every k-th step() (with fp16, `amp` installs both)."""
        k = int(overrides.runtime.get("grad_accumulation") or 1)
        if k > 1 and overrides.runtime.get("amp") != "fp16":
            from trainadvisor.measure import switches

            switches.install_step_control(recorder, None, k)
