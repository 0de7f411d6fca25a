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
IMPORT = "from torch.distributed.fsdp import MixedPrecisionPolicy"


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
        if changed is None or IMPORT in changed:
            return changed
        return codechange.after_imports(changed, [IMPORT])
