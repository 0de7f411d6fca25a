"""The confirmation run started ahead (`measure.kept_alive.Prestarted`, `training.gate`): started
beside the baseline, so that the script's set-up (loading, building the model) overlaps the
baseline's window and the trials instead of coming after them; let into the script once the
baseline has taken its first step; kept after the diagnosis only where every fix it plans is a
DataLoader setting, and cancelled otherwise."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from trainadvisor import fixes
from trainadvisor.measure import priority
from trainadvisor.measure.kept_alive import Prestarted
from trainadvisor.profile.runs import ProfileOptions, spec_for
from trainadvisor.records import PlannedFix

# The longest the trials wait for a run started ahead to import torch and trainadvisor's hooks
# (2.5 s on 2 cores, at 1.3 CPU-s; a first trial window beside it took 2.3 s longer to settle).
# Started beside the baseline, it has imported long before.
PRESTART_IMPORTS_S = 10.0


def start_ahead(options: ProfileOptions) -> Prestarted | None:
    """The confirmation run, started beside the baseline where the trials may choose DataLoader
    settings only (applied when the first loader is built). Its imports run beside the
    baseline's own, then it lowers its priority and waits before the script until `release`
    (the baseline's first step): the script's set-up never runs twice at once (a dataset
    download), and runs at the lowest priority. At its first DataLoader it waits for the
    settings to confirm, and steps aside (exits) if memory runs short. Not where no loader fix
    may be tried (`--fix`), nor where this user may not raise a lowered priority back
    (`priority.restorable`), nor on a machine with a GPU: a second process there would hold GPU
    memory beside the baseline and the trials."""
    named = [fixes.REGISTRY[name] for name in options.only_fixes if name in fixes.REGISTRY]
    if named and not any(fix.switches_loaders for fix in named):
        return None
    if _gpu_here() or not priority.restorable():
        return None
    spec = spec_for(options, "after", show_output=False)
    return Prestarted(replace(spec, gate_file=spec.out_dir / ".work" / "after.gate.json"))


def kept_ahead(ahead: Prestarted | None, plan: list[PlannedFix], values: dict[str, Any]) -> Prestarted | None:
    """The run started ahead, where it can confirm what the diagnosis plans (every applicable
    fix a DataLoader setting, no CUDA used); else cancelled, before any fresh trial run starts.
    The trials start once it has imported torch (at most PRESTART_IMPORTS_S)."""
    if ahead is None:
        return None
    applicable = [p for p in plan if p.applicable]
    loaders_only = applicable and all(fixes.REGISTRY[p.fix].switches_loaders for p in applicable)
    if not loaders_only or values.get("cuda_used"):
        ahead.cancel()
        return None
    ahead.imported(PRESTART_IMPORTS_S)  # not beside the first trial window
    return ahead


def _gpu_here() -> bool:
    """Whether this machine has an NVIDIA or AMD GPU driver loaded (its device files)."""
    dev = Path("/dev")
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists() or (dev / "dxg").exists()
