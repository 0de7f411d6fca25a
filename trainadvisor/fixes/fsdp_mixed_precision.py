"""Fix `fsdp-mixed-precision`: an FSDP2 job on a GPU that trains in float32 gathers, computes
and reduce-scatters its parameters and gradients in float32. `MixedPrecisionPolicy(param_dtype=
torch.bfloat16, reduce_dtype=torch.float32)` on every `fully_shard` gathers the parameters in
bfloat16 (half the all-gather traffic, the matmuls on the tensor cores) and keeps the gradients'
reduction and the sharded parameters in float32. FSDP's own counterpart of the `amp` fix, proposed
where the amp rules apply (`no-mixed-precision`): a torchrun trial of the script as it is, kept
only if faster and the loss of the same seeded steps stays within mixed precision's tolerance on
every rank; the policy is written at each `fully_shard(...)` call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes.amp import Amp
from trainadvisor.fixes.common import NO_GPU, Setting, Switch, overrides
from trainadvisor.fixes.fsdp_settings import NAMES, patch_fully_shard
from trainadvisor.records import Overrides

POLICY = "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"


class _Source:
    """A keyword's value written as this code (not as a literal) by the code change."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class FsdpMixedPrecision(Switch):
    id = "fsdp-mixed-precision"
    restarts_because = "FSDP reads its mixed-precision policy when the script calls fully_shard"
    loss_tolerance_rel = Amp.loss_tolerance_rel  # bfloat16 parameters: mixed precision's tolerance

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("fsdp_units") or values.get("fsdp_version") != "FSDP2":
            return "the script builds no FSDP2 units (fully_shard): the amp fix is the one to measure"
        if not values.get("cuda_used"):
            return NO_GPU
        if not values.get("bf16_supported"):
            return "this GPU computes in no bfloat16"
        if values.get("fsdp_param_dtype"):
            return f"FSDP already gathers its parameters in {values['fsdp_param_dtype']}"
        if values.get("fsdp_mp_policy_set"):
            return (
                "the script gives fully_shard a MixedPrecisionPolicy of its own, without param_dtype: "
                "this fix leaves it alone; add param_dtype=torch.bfloat16 to it and profile again"
            )
        return None

    def setting(self, values: dict[str, Any]) -> Setting:
        return Setting(f"fully_shard(..., mp_policy={POLICY})", overrides(fsdp_mp="bfloat16"))

    def install(self, recorder: Any, overrides: Overrides) -> None:
        if overrides.runtime.get("fsdp_mp") != "bfloat16":
            return
        import torch

        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy
        except ImportError:  # torch 2.4-2.5: FSDP2 lived in _composable
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        patch_fully_shard(recorder, {"mp_policy": policy}, None)

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        if overrides.runtime.get("fsdp_mp") != "bfloat16":
            return None
        changed = codechange.edit_calls(source, NAMES, None, {"mp_policy": _Source(POLICY)})
        if changed is None or "MixedPrecisionPolicy" in _imported(source):
            return changed
        return codechange.after_imports(
            changed, [f"from {_policy_module(source)} import MixedPrecisionPolicy"]
        )


PACKAGES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")  # 2.6+, 2.4-2.5


def _imported(source: str) -> dict[str, str]:
    """The names a script imports with `from X import ...`, each with its module X."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {
        alias.asname or alias.name: node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def _policy_module(source: str) -> str:
    """Where the script's torch exports MixedPrecisionPolicy: the FSDP package the script takes
    fully_shard from, or else the first of PACKAGES this torch has it in."""
    import importlib

    module = _imported(source).get("fully_shard", "")
    package = next((p for p in PACKAGES if module == p or module.startswith(p + ".")), None)
    candidates = ([package] if package else []) + list(PACKAGES)
    for name in candidates:
        try:
            if hasattr(importlib.import_module(name), "MixedPrecisionPolicy"):
                return name
        except ImportError:
            continue
    return PACKAGES[0]
