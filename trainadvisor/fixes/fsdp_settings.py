"""Fix `fsdp-settings`: FSDP2 units that reshard their parameters after the forward pass
(`fully_shard`'s default for every unit but the root) all-gather them again in the backward
pass: one all-gather more per unit and step. `reshard_after_forward=False` keeps each unit's
parameters gathered from its forward to its backward, at the cost of holding them meanwhile.
The candidate is a torchrun trial of the script as it is, with the step's peak memory measured:
kept only if faster, the loss of the same seeded steps unchanged on every rank, and its peak
within the memory budget (`--memory-budget`, or on a GPU the card's usable memory); the kept
setting is written at each `fully_shard(...)` call. (FSDP1's counterpart is its
`sharding_strategy`, not tried here.)"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import KEEP_MIN_SPEEDUP, Fix, Setting, baseline_peak, overrides, trial_peak
from trainadvisor.records import Overrides, Trial
from trainadvisor.units import scaled

NAMES = {"fully_shard"}
# where torch defines and exports fully_shard (2.4-2.5: _composable.fsdp; 2.6+: fsdp)
MODULES = (
    "torch.distributed.fsdp",
    "torch.distributed.fsdp._fully_shard",
    "torch.distributed.fsdp._fully_shard._fully_shard",
    "torch.distributed._composable.fsdp",
    "torch.distributed._composable.fsdp.fully_shard",
)
CANDIDATE = {"reshard_after_forward": False}


class FsdpSettings(Fix):
    id = "fsdp-settings"
    restarts_because = "FSDP reads its settings when the script calls fully_shard"

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("fsdp_units"):
            return "the script builds no FSDP units (fully_shard)"
        if values.get("fsdp_version") != "FSDP2":
            return "FSDP1 (FullyShardedDataParallel): this fix sets FSDP2's fully_shard"
        if int(values.get("fsdp_world_size") or 0) < 2:
            return "FSDP over one rank communicates nothing"
        if not values.get("fsdp_resharding_units"):
            return "every FSDP unit keeps its parameters gathered after forward already"
        return None

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        return None if trials else Setting("reshard_after_forward=False", overrides(fsdp=dict(CANDIDATE)))

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        baseline = float(values.get("steps_per_s") or 0.0)
        faster = [
            t
            for t in trials
            if t.status == "measured" and (t.steps_per_s or 0.0) >= KEEP_MIN_SPEEDUP * baseline > 0
        ]
        return next((t for t in faster if _fits(t, values)), None)

    def search_note(self, trials: list[Trial], values: dict[str, Any]) -> str | None:
        over = [t for t in trials if t.status == "measured" and not _fits(t, values)]
        if not over:
            return None
        return f"keeping the parameters gathered needs {_peak(over[0], values)}: over the memory budget"

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        return f"{trial.label} ({_peak(trial, values)})"

    def install(self, recorder: Any, overrides: Overrides) -> None:
        """Every fully_shard call made with the candidate's settings, wherever the script
        imports it from."""
        settings = overrides.runtime.get("fsdp")
        if not settings:
            return
        import importlib

        for name in MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            original = getattr(module, "fully_shard", None)
            if callable(original) and not getattr(original, "_trainadvisor_fsdp", False):
                recorder.patch(module, "fully_shard", _forcing(original, dict(settings)))

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        settings = overrides.runtime.get("fsdp") or {}
        return codechange.edit_calls(source, NAMES, None, dict(settings)) if settings else None


def _forcing(original: Any, settings: dict[str, Any]) -> Any:
    """fully_shard with `settings`, keeping what torch hangs on the function (`.state`, read by
    FSDP's own code through the name this replaces)."""

    @functools.wraps(original)
    def fully_shard(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, **settings})

    fully_shard._trainadvisor_fsdp = True  # type: ignore[attr-defined]
    return fully_shard


def _fits(trial: Trial, values: dict[str, Any]) -> bool:
    budget, peak = values.get("memory_budget_bytes"), trial_peak(trial)
    return budget is None or peak is None or peak <= budget


def _peak(trial: Trial, values: dict[str, Any]) -> str:
    """'peak 1.2 MB -> 1.5 MB, within the budget of 2 GB' (the step's measured peaks)."""
    base, peak = baseline_peak(values), trial_peak(trial)
    if peak is None:
        return "its peak memory not measured"
    text = f"peak {scaled(base, 'B', 'kMGT')} -> " if base is not None else "peak "
    text += scaled(peak, "B", "kMGT")
    budget = values.get("memory_budget_bytes")
    if budget:
        text += f", {'within' if peak <= budget else 'over'} the budget of {scaled(budget, 'B', 'kMGT')}"
    return text
