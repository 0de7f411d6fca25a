"""Fix `pin-memory`: the DataLoader pins its batches (pinned host memory) and their copies to the
GPU become non-blocking, so the copy overlaps compute. Transfer only: the loss is bit-identical.
The measuring hooks apply both (DataLoader arguments, non-blocking copies of its batches); the
code change sets `pin_memory=True` at the DataLoader call and `non_blocking=True` on the batch's
copies in the loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import NO_GPU, LoaderSetting, Setting, Switch, overrides
from trainadvisor.records import Overrides


class PinMemory(LoaderSetting, Switch):
    id = "pin-memory"
    bound_by = "h2d_pct"

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

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        return codechange.loader_change(source, script, overrides)
