"""Fix `fsdp-settings`: FSDP2 units that reshard their parameters after the forward pass
(`fully_shard`'s default for every unit but the root) all-gather them again in the backward
pass: one all-gather more per unit and step. `reshard_after_forward=False` keeps each unit's
parameters gathered from its forward to its backward, at the cost of holding them meanwhile.
The candidate is a torchrun trial of the script as it is, with the step's peak memory measured:
kept only if faster, the loss of the same seeded steps unchanged on every rank, and its peak
within the memory budget (`--memory-budget`, or on a GPU the card's usable memory); the kept
setting is written at each `fully_shard(...)` call. Then explicit prefetching, on top of the
better of the two: each unit (in the order the script shards them, the root apart) all-gathers
the next unit's parameters as its forward starts and the previous unit's as its backward starts
(`set_modules_to_forward_prefetch`, `set_modules_to_backward_prefetch`), so that a unit's
all-gather overlaps the compute before it; its code goes after the `fully_shard` calls, in words.
(FSDP1's counterparts, its `sharding_strategy` and `forward_prefetch`, are not tried here.)"""

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
PREFETCH = "fsdp_prefetch"  # the overrides' key of explicit prefetching
PREFETCH_UNITS = 3  # units at least (two beside the root) for a neighbour to prefetch


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
        if not values.get("fsdp_resharding_units") and int(values.get("fsdp_units") or 0) < PREFETCH_UNITS:
            return (
                "every FSDP unit keeps its parameters gathered after forward already, and too few to prefetch"
            )
        return None

    def expected_trials(self, values: dict[str, Any]) -> int:
        return int(bool(values.get("fsdp_resharding_units"))) + int(_can_prefetch(values))

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        if not trials and values.get("fsdp_resharding_units"):
            return Setting("reshard_after_forward=False", overrides(fsdp=dict(CANDIDATE)))
        if not _can_prefetch(values) or any(t.overrides.runtime.get(PREFETCH) for t in trials):
            return None
        best = self.choose(trials, values)
        settings = dict(best.overrides.runtime.get("fsdp") or {}) if best is not None else {}
        label = ", ".join([*(f"{k}={v}" for k, v in settings.items()), "prefetch the next unit"])
        runtime: dict[str, Any] = {PREFETCH: 1, **({"fsdp": settings} if settings else {})}
        return Setting(label, Overrides(runtime=runtime))

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

    def loop_change(self, overrides: Overrides) -> str:
        if not overrides.runtime.get(PREFETCH):
            return ""
        return (
            "after the fully_shard calls, have each unit prefetch its neighbours: "
            "units[i].set_modules_to_forward_prefetch([units[i + 1]]) and "
            "units[i].set_modules_to_backward_prefetch([units[i - 1]]) over the units in the order "
            "their forward runs (the root apart)"
        )

    def install(self, recorder: Any, overrides: Overrides) -> None:
        """Every fully_shard call made with the candidate's settings, wherever the script
        imports it from; with PREFETCH, the units linked to their neighbours as they are made."""
        settings, prefetch = dict(overrides.runtime.get("fsdp") or {}), overrides.runtime.get(PREFETCH)
        if not settings and not prefetch:
            return
        patch_fully_shard(recorder, settings, [] if prefetch else None)

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        settings = overrides.runtime.get("fsdp") or {}
        return codechange.edit_calls(source, NAMES, None, dict(settings)) if settings else None


def patch_fully_shard(recorder: Any, settings: dict[str, Any], units: list[Any] | None) -> None:
    """fully_shard with `settings` wherever the script imports it from (and, with `units`, each
    unit made linked to its neighbours for prefetching) until the recorder undoes it. Where a fix
    installed before this one patched it already (fsdp-settings and fsdp-mixed-precision in one
    run), its wrapper takes these settings too, and gives them back when the recorder undoes it."""
    import importlib

    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        current = getattr(module, "fully_shard", None)
        state = getattr(current, "_trainadvisor_fsdp", None)
        if isinstance(state, dict):
            recorder.on_uninstall(_merge(state, settings, units))
        elif callable(current):
            recorder.patch(
                module, "fully_shard", _forcing(current, {"settings": dict(settings), "units": units})
            )


def _merge(state: dict[str, Any], settings: dict[str, Any], units: list[Any] | None) -> Any:
    """`settings` (and `units`) added to a wrapper's state; returns what puts the state back."""
    before = {"settings": dict(state["settings"]), "units": state["units"]}
    state["settings"].update(settings)
    if units is not None and state["units"] is None:
        state["units"] = units

    def undo() -> None:
        state.update(before)

    return undo


def _forcing(original: Any, state: dict[str, Any]) -> Any:
    """fully_shard with `state["settings"]`, keeping what torch hangs on the function (`.state`,
    read by FSDP's own code through the name this replaces); with `state["units"]`, each unit
    made is linked to its neighbours for prefetching."""

    @functools.wraps(original)
    def fully_shard(*args: Any, **kwargs: Any) -> Any:
        made = original(*args, **{**kwargs, **state["settings"]})
        units = state["units"]
        if units is not None:
            try:  # prefetching is the trial's; the script's call must never fail for it
                units.extend(m for m in (made if isinstance(made, list) else [made]) if hasattr(m, "modules"))
                _link(units)
            except Exception:  # noqa: BLE001 - a torch without the prefetch API: no prefetching
                units.clear()
        return made

    fully_shard._trainadvisor_fsdp = state  # type: ignore[attr-defined]
    return fully_shard


def _link(units: list[Any]) -> None:
    """Each unit but a root (one that holds other units) prefetches the next for its forward
    and the previous for its backward, in the order they were made."""
    inner = [u for u in units if not any(o is not u and _holds(u, o) for o in units)]
    for i, unit in enumerate(inner):
        if i + 1 < len(inner):
            unit.set_modules_to_forward_prefetch([inner[i + 1]])
        if i > 0:
            unit.set_modules_to_backward_prefetch([inner[i - 1]])


def _holds(outer: Any, inner: Any) -> bool:
    return any(m is inner for m in outer.modules())


def _can_prefetch(values: dict[str, Any]) -> bool:
    return int(values.get("fsdp_units") or 0) >= PREFETCH_UNITS


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
