"""The GPU side of a measuring window, inside the training process (profile's child and
`@advise`): the device the loop trains on, the window's edges synchronised and its steps timed
with CUDA events as well as host clocks, memory statistics counted from the window's start,
torch's TF32 switches read and written in whichever API the script uses, and native bf16.
Everything here does nothing on a run that uses no GPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainadvisor.fixes.fused_optimizer import FUSABLE

# AMD architectures with bf16 arithmetic in hardware (MI100 and newer CDNA, RDNA 3 and newer):
# torch.cuda.is_bf16_supported() answers True on every HIP device.
_ROCM_BF16 = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def cuda_in_use() -> bool:
    """Whether the script has used a CUDA (or ROCm) device in this process."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def training_device(tensor: torch.Tensor | None) -> int | None:
    """The index of the GPU a loss was computed on; the current device when not known. A rank
    that moves its model to `cuda:<local rank>` without `set_device` trains there, not on 0."""
    if not cuda_in_use():
        return None
    if tensor is not None and tensor.device.type == "cuda" and tensor.device.index is not None:
        return int(tensor.device.index)
    return int(torch.cuda.current_device())


def native_bf16(device: int | None = None) -> bool:
    """bf16 in hardware. NVIDIA: Ampere and newer (torch's default check also counts emulation,
    true on Volta and Turing and slower than fp32 there). ROCm: by the device's architecture."""
    if torch.version.hip:
        arch = str(getattr(torch.cuda.get_device_properties(device or 0), "gcnArchName", ""))
        return arch.startswith(_ROCM_BF16)
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch before 2.3 had no emulation and no argument
        return bool(torch.cuda.is_bf16_supported())


# ---- TF32: torch >= 2.9 has `fp32_precision`; reading the legacy API after a script set the new
# one raises ("mix of the legacy and new APIs"), so the API in use is found first. ----


def _has_new_tf32_api() -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def tf32_api() -> str:
    """`new` when the script set `fp32_precision` (reading the legacy flags then raises), else
    `legacy` (also when nothing was set: the legacy flags are what older torch reads)."""
    if not _has_new_tf32_api():
        return "legacy"
    try:
        torch.backends.cuda.matmul.allow_tf32  # noqa: B018 - the read is the test
    except RuntimeError:
        return "new"
    return "legacy"


def tf32_enabled() -> bool:
    if _has_new_tf32_api():  # reading the new API is always allowed
        return torch.backends.cuda.matmul.fp32_precision == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)


def float32_matmul_precision() -> str:
    """`highest`/`high` as torch.get_float32_matmul_precision() says, without calling it (it
    raises once the new API is in use)."""
    if tf32_api() == "new":
        return "high" if tf32_enabled() else "highest"
    return torch.get_float32_matmul_precision()


def switch_flags(tf32: bool = False, cudnn_benchmark: bool = False) -> Callable[[], None]:
    """Turn TF32 (matmuls and cuDNN convolutions) and cuDNN autotuning on, in the API the script
    uses; returns what puts every flag back as it was."""
    api = tf32_api()
    if api == "new":
        saved: tuple[Any, ...] = (
            torch.backends.cuda.matmul.fp32_precision,
            torch.backends.cudnn.conv.fp32_precision,
        )
    else:
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    benchmark = torch.backends.cudnn.benchmark
    if tf32:
        _set_tf32(api, (True, True) if api == "legacy" else ("tf32", "tf32"))
    if cudnn_benchmark:
        torch.backends.cudnn.benchmark = True

    def restore() -> None:
        _set_tf32(api, saved)
        torch.backends.cudnn.benchmark = benchmark

    return restore


def _set_tf32(api: str, values: tuple[Any, ...]) -> None:
    if api == "new":
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = values
    else:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = values


def torch_facts(data_parallel_modules: int | None, amp_override: str | None) -> dict[str, Any]:
    """torch's switches as the training loop runs with them (read at the window's start)."""
    cuda_used = cuda_in_use()
    facts: dict[str, Any] = {
        "cuda_used": cuda_used,
        "anomaly_detection": torch.is_anomaly_enabled(),
        "float32_matmul_precision": float32_matmul_precision(),
        "tf32_api": tf32_api(),
        "data_parallel_modules": data_parallel_modules,
        "amp_override": amp_override,
    }
    if cuda_used:
        facts.update(
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            tf32_enabled=tf32_enabled(),
            cuda_device_count=torch.cuda.device_count(),
            bf16_supported=native_bf16(),
        )
    return facts


def optimizer_facts(optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    if optimizer is None:
        return {}
    name = type(optimizer).__name__
    defaults = optimizer.defaults
    return {
        "optimizer": name,
        # torch's LR schedulers wrap the optimizer's step and mark the wrapper.
        "lr_scheduler": bool(getattr(optimizer.step, "_wrapped_by_lr_sched", False)),
        "optimizer_fused": bool(defaults.get("fused")),
        "optimizer_foreach": defaults.get("foreach"),
        "optimizer_fusable": name in FUSABLE and type(optimizer).__module__.startswith("torch.optim"),
    }


def device_identity(device: int) -> dict[str, Any]:
    """What the parent's NVML sampler needs to find this device: its UUID (CUDA's device order
    is not NVML's, and CUDA_VISIBLE_DEVICES may name UUIDs or MIG instances)."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    return {
        "index": device,
        "name": props.name,
        "uuid": str(uuid) if uuid is not None else None,
        "rocm": bool(torch.version.hip),
    }


class GpuWindow:
    """The window's GPU clock and memory. `start` drains the GPU's queue before the first timed
    step and resets the peak statistics (warmup and cuDNN autotuning stay out of the peaks);
    `mark` records a CUDA event at each step boundary; `finish` drains the queue again before
    the last timed step's host clock is read, so a fix that removes syncs cannot look faster
    by leaving work queued."""

    def __init__(self) -> None:
        self.device: int | None = None
        self.events: list[Any] = []
        self.retries_at_start = 0
        self.ooms_at_start = 0

    def start(self, device: int | None) -> None:
        if device is None:
            return
        self.device = device
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        stats = torch.cuda.memory_stats(device)
        self.retries_at_start = int(stats.get("num_alloc_retries", 0))
        self.ooms_at_start = int(stats.get("num_ooms", 0))
        self.mark()

    def mark(self) -> None:
        if self.device is None:
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        self.events.append(event)

    def sync(self) -> None:
        if self.device is not None:
            torch.cuda.synchronize(self.device)

    def step_ms(self) -> list[float]:
        """GPU time between consecutive step boundaries (read after the window: no sync inside)."""
        if self.device is None or len(self.events) < 2:
            return []
        torch.cuda.synchronize(self.device)
        return [float(a.elapsed_time(b)) for a, b in zip(self.events, self.events[1:])]

    def memory(self) -> dict[str, Any]:
        """Peaks since the window started, allocator retries and OOMs during it."""
        if self.device is None:
            return {}
        stats = torch.cuda.memory_stats(self.device)
        return {
            "device": self.device,
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(self.device)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device)),
            "total_bytes": int(torch.cuda.get_device_properties(self.device).total_memory),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)) - self.retries_at_start,
            "ooms": int(stats.get("num_ooms", 0)) - self.ooms_at_start,
        }


def announce_device(path: Path, device: int) -> None:
    """Tell the parent's sampler which GPU this process trains on (a small JSON file)."""
    import json

    path.write_text(json.dumps(device_identity(device)))
