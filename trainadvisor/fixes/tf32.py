"""Fix `tf32`: matmuls and cuDNN convolutions in TF32 on Ampere and newer (10 mantissa bits in
the inputs, fp32 accumulation). Switched in the API the script uses: torch >= 2.9's
`fp32_precision` or the legacy `allow_tf32` flags (mixing them makes torch raise)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import GpuFlag, Setting, overrides
from trainadvisor.records import Overrides


class Tf32(GpuFlag):
    id = "tf32"
    bound_by = "gpu_busy_pct"
    # TF32 keeps 10 mantissa bits in matmul inputs: losses agree to about 1e-3.
    loss_tolerance_rel = 1e-2

    def flag_problem(self, values: dict[str, Any]) -> str | None:
        if not values.get("tf32_supported"):
            return "TF32 needs an NVIDIA GPU of compute capability 8.0 (Ampere) or newer"
        if values.get("tf32_enabled"):
            return "TF32 is already on for matmuls"
        return None

    def setting(self, values: dict[str, Any]) -> Setting:
        if values.get("tf32_api") == "new":  # the script uses torch >= 2.9's API: so does the fix
            return Setting('fp32_precision = "tf32" for matmuls and cuDNN convolutions', overrides(tf32=True))
        return Setting("torch.backends.cuda.matmul.allow_tf32 = True (and cudnn)", overrides(tf32=True))

    def install(self, recorder: Any, overrides: Overrides) -> None:
        if overrides.runtime.get("tf32"):
            from trainadvisor.fixes import flags

            recorder.on_uninstall(flags.switch_flags(tf32=True))

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        return codechange.after_imports(source, tf32_lines(source))


def tf32_lines(source: str) -> list[str]:
    """TF32 in the API the script already uses: torch >= 2.9's `fp32_precision` (mixing it with
    the legacy `allow_tf32` flags makes torch raise when the flags are read), else the legacy
    flags, which every torch version reads."""
    if "fp32_precision" in source:
        return [
            'torch.backends.cuda.matmul.fp32_precision = "tf32"',
            'torch.backends.cudnn.conv.fp32_precision = "tf32"',
        ]
    return ["torch.backends.cuda.matmul.allow_tf32 = True", "torch.backends.cudnn.allow_tf32 = True"]
