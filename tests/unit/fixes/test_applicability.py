"""When each switch-like fix is tried, and what the report says where it is not: every reason
each fix gives, from the measurements that decide it (those a GPU run measures given as a GPU
run gives them), and the setting a trial measures where it applies."""

from __future__ import annotations

from typing import Any

import pytest

from trainadvisor.fixes.common import NO_GPU, Fix, Switch
from trainadvisor.fixes.cudnn_benchmark import CudnnBenchmark
from trainadvisor.fixes.fused_optimizer import FusedOptimizer
from trainadvisor.fixes.grad_accumulation import GradAccumulation
from trainadvisor.fixes.pin_memory import PinMemory
from trainadvisor.fixes.tf32 import Tf32

GPU: dict[str, Any] = {
    "cuda_used": True,
    "tf32_supported": True,
    "optimizer": "AdamW",
    "optimizer_fusable": True,
}
LOADER: dict[str, Any] = {
    "dataloader_call_site": "train.py:40",
    "batch_size": 64,
    "step_peak_bytes": 4_000_000,
}


@pytest.mark.parametrize(
    ("fix", "values", "why"),
    [
        (Tf32(), {"cuda_used": False}, NO_GPU),
        (
            Tf32(),
            {**GPU, "tf32_supported": False},
            "TF32 needs an NVIDIA GPU of compute capability 8.0 (Ampere) or newer",
        ),
        (Tf32(), {**GPU, "tf32_enabled": True}, "TF32 is already on for matmuls"),
        (Tf32(), GPU, None),
        (CudnnBenchmark(), {"cuda_used": False}, NO_GPU),
        (CudnnBenchmark(), {**GPU, "cudnn_benchmark": True}, "torch.backends.cudnn.benchmark is already on"),
        (CudnnBenchmark(), GPU, None),
        (FusedOptimizer(), {"cuda_used": False}, NO_GPU),
        (FusedOptimizer(), {"cuda_used": True}, "no torch.optim optimizer stepped in the window"),
        (FusedOptimizer(), {**GPU, "optimizer_fused": True}, "AdamW is already fused"),
        (FusedOptimizer(), {**GPU, "optimizer_fusable": False}, "AdamW has no fused implementation in torch"),
        (FusedOptimizer(), GPU, None),
        (PinMemory(), {"cuda_used": False, **LOADER}, NO_GPU),
        (
            PinMemory(),
            {"cuda_used": True},
            "the copies do not come from a torch DataLoader: pin the source tensors in your code",
        ),
        (
            PinMemory(),
            {"cuda_used": True, **LOADER, "pin_memory": True},
            "the DataLoader already pins memory; the pageable copies come from your own tensors",
        ),
        (PinMemory(), {"cuda_used": True, **LOADER}, None),
        (
            GradAccumulation(),
            {},
            "the batches do not come from a DataLoader with a batch_size trainadvisor can divide",
        ),
        (
            GradAccumulation(),
            {**LOADER, "batch_size": 63},
            "batch_size=63 is odd: it cannot be split into equal micro-batches",
        ),
        (
            GradAccumulation(),
            {**LOADER, "optimizers": 2},
            "the script steps several optimizers; accumulate gradients in your loop",
        ),
        (
            GradAccumulation(),
            {**LOADER, "lr_scheduler": "OneCycleLR"},
            "an LR scheduler steps with every optimizer.step(); accumulate gradients in your loop",
        ),
        (
            GradAccumulation(),
            {**LOADER, "step_peak_bytes": None},
            "the baseline's peak memory was not measured",
        ),
        (GradAccumulation(), LOADER, None),
    ],
)
def test_each_fix_says_why_it_is_not_tried(fix: Fix, values: dict[str, Any], why: str | None) -> None:
    assert fix.not_applicable(values) == why


def test_the_switches_set_what_their_trial_measures() -> None:
    assert Tf32().setting({**GPU, "tf32_api": "new"}).label == (
        'fp32_precision = "tf32" for matmuls and cuDNN convolutions'
    )
    assert Tf32().setting(GPU).overrides.runtime == {"tf32": True}
    assert FusedOptimizer().setting(GPU).label == "AdamW(..., fused=True)"
    pinned = PinMemory().setting({"cuda_used": True, **LOADER}).overrides
    assert (pinned.loaders, pinned.non_blocking_h2d) == ({"train.py:40": {"pin_memory": True}}, True)
    assert all(isinstance(fix, Switch) for fix in (Tf32(), CudnnBenchmark(), FusedOptimizer(), PinMemory()))
