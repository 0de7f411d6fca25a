"""Fix `cudnn-benchmark`: cuDNN times its convolution algorithms for each input shape once and
keeps the fastest (worth it when the shapes stay fixed). Another algorithm sums in another
order: the loss may move by a little."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import GpuFlag, Setting, overrides
from trainadvisor.records import Overrides


class CudnnBenchmark(GpuFlag):
    id = "cudnn-benchmark"
    bound_by = "conv_pct"
    # Another convolution algorithm sums in another order.
    loss_tolerance_rel = 1e-3

    def flag_problem(self, values: dict[str, Any]) -> str | None:
        if values.get("cudnn_benchmark"):
            return "torch.backends.cudnn.benchmark is already on"
        return None

    def setting(self, values: dict[str, Any]) -> Setting:
        return Setting("torch.backends.cudnn.benchmark = True", overrides(cudnn_benchmark=True))

    def install(self, recorder: Any, overrides: Overrides) -> None:
        if overrides.runtime.get("cudnn_benchmark"):
            from trainadvisor.fixes import flags

            recorder.on_uninstall(flags.switch_flags(cudnn_benchmark=True))

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        return codechange.after_imports(source, ["torch.backends.cudnn.benchmark = True"])
