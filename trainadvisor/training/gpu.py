"""The GPU side of a measuring window, inside the training process (profile's child and
`@advise`): the device the loop trains on, the window's edges synchronised and its steps timed
with CUDA events as well as host clocks, memory statistics counted from the window's start,
torch's facts (its TF32 flags read through `fixes.flags`), and native bf16.
Everything here does nothing on a run that uses no GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainadvisor.fixes.flags import cudnn_tf32_enabled, float32_matmul_precision, tf32_api, tf32_enabled
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


def native_bf16(device: int) -> bool:
    """bf16 in hardware on the training device. NVIDIA: Ampere and newer, from the device's
    compute capability (torch.cuda.is_bf16_supported() asks about the current device, which a
    rank training on cuda:1 without set_device does not use, and counts emulation, true on Volta
    and Turing and slower than fp32 there). ROCm: by the device's architecture."""
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        return str(getattr(props, "gcnArchName", "")).startswith(_ROCM_BF16)
    return int(props.major) >= 8


def torch_facts(
    data_parallel_modules: int | None, amp_override: str | None, device: int | None = None
) -> dict[str, Any]:
    """torch's switches as the training loop runs with them (read at the window's start);
    `device`: the GPU the loop trains on (None: the current one)."""
    cuda_used = cuda_in_use()
    facts: dict[str, Any] = {
        "cuda_used": cuda_used,
        "anomaly_detection": torch.is_anomaly_enabled(),
        "float32_matmul_precision": float32_matmul_precision(),
        "tf32_api": tf32_api(),
        "data_parallel_modules": data_parallel_modules,
        "amp_override": amp_override,
        "intra_op_threads": torch.get_num_threads(),
    }
    if cuda_used:
        facts.update(
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            tf32_enabled=tf32_enabled(),
            cudnn_tf32_enabled=cudnn_tf32_enabled(),
            cuda_device_count=torch.cuda.device_count(),
            bf16_supported=native_bf16(device if device is not None else torch.cuda.current_device()),
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
        "optimizer_has_foreach": "foreach" in defaults,  # its class takes `foreach`
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
        self.kept_allocated_bytes = self.kept_reserved_bytes = 0  # peaks kept before a reset

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

    def keep_peaks(self) -> None:
        """The allocator's peaks so far, kept before another measurement resets its statistics
        (the memory step's): the window's peak is then the timed steps' too, not that step's."""
        if self.device is None:
            return
        self.kept_allocated_bytes = max(
            self.kept_allocated_bytes, int(torch.cuda.max_memory_allocated(self.device))
        )
        self.kept_reserved_bytes = max(
            self.kept_reserved_bytes, int(torch.cuda.max_memory_reserved(self.device))
        )

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
        """Peaks since the window started, allocator retries and OOMs during it, and what this
        process's allocator may use (`allocator_limit`)."""
        if self.device is None:
            return {}
        stats = torch.cuda.memory_stats(self.device)
        total = int(torch.cuda.get_device_properties(self.device).total_memory)
        limit, source = allocator_limit(self.device, total, int(stats.get("reserved_bytes.all.current", 0)))
        return {
            "device": self.device,
            "peak_allocated_bytes": max(
                self.kept_allocated_bytes, int(torch.cuda.max_memory_allocated(self.device))
            ),
            "peak_reserved_bytes": max(
                self.kept_reserved_bytes, int(torch.cuda.max_memory_reserved(self.device))
            ),
            "total_bytes": total,
            "limit_bytes": limit,
            "limit_source": source,
            "alloc_retries": int(stats.get("num_alloc_retries", 0)) - self.retries_at_start,
            "ooms": int(stats.get("num_ooms", 0)) - self.ooms_at_start,
        }


def allocator_limit(device: int, total_bytes: int, reserved_bytes: int) -> tuple[int, str]:
    """What this process's caching allocator may hold on `device`, and which bound it is: the
    card's total times the per-process fraction (`set_per_process_memory_fraction`: the
    allocator refuses beyond it, "3.17 GiB allowed" on an 80 GB H100 at 0.04), or what it holds
    now plus what is free now (CUDA contexts and other processes hold the rest)."""
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.5
    fraction = float(get_fraction(device)) if get_fraction is not None else 1.0
    capped = int(fraction * total_bytes)  # as the allocator rounds it
    free_bytes, _ = torch.cuda.mem_get_info(device)
    available = reserved_bytes + int(free_bytes)
    if available < capped:
        held = total_bytes - available
        return available, f"free device memory (other processes and CUDA contexts hold {held / 1e9:.1f} GB)"
    if fraction < 1.0:
        return capped, f"per-process memory fraction {fraction:g}"
    return total_bytes, "device total"


def announce_device(path: Path, device: int) -> None:
    """Tell the parent's sampler which GPU this process trains on (a small JSON file)."""
    import json

    path.write_text(json.dumps(device_identity(device)))
