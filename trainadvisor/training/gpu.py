"""The GPU side of a measuring window, inside the training process (profile's child and
`@advise`): the device the loop trains on, the window's edges synchronised and its steps timed
with CUDA events as well as host clocks, memory statistics counted from the window's start,
torch's TF32 switches read and written in whichever API the script uses, and native bf16.
Everything here does nothing on a run that uses no GPU."""

from __future__ import annotations

import functools
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


def native_bf16(device: int) -> bool:
    """bf16 in hardware on the training device. NVIDIA: Ampere and newer, from the device's
    compute capability (torch.cuda.is_bf16_supported() asks about the current device, which a
    rank training on cuda:1 without set_device does not use, and counts emulation, true on Volta
    and Turing and slower than fp32 there). ROCm: by the device's architecture."""
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        return str(getattr(props, "gcnArchName", "")).startswith(_ROCM_BF16)
    return int(props.major) >= 8


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


def cudnn_tf32_enabled() -> bool:
    """Whether cuDNN runs float32 convolutions in TF32 (torch's default: on)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if _has_new_tf32_api() and conv is not None and hasattr(conv, "fp32_precision"):
        return str(conv.fp32_precision) == "tf32"
    return bool(torch.backends.cudnn.allow_tf32)


def float32_matmul_precision() -> str:
    """`highest`/`high` as torch.get_float32_matmul_precision() says, without calling it (it
    raises once the new API is in use)."""
    if tf32_api() == "new":
        return "high" if tf32_enabled() else "highest"
    return torch.get_float32_matmul_precision()


def switch_flags(tf32: bool = False, cudnn_benchmark: bool = False) -> Callable[[], None]:
    """Turn TF32 (matmuls and cuDNN convolutions) and cuDNN autotuning on where they are off, in
    the API the script uses; returns what puts every flag it changed back exactly as it was."""
    undo: list[Callable[[], None]] = []
    if tf32:
        undo += _tf32_on() if _has_new_tf32_api() else _legacy_tf32_on()
    benchmark = torch.backends.cudnn.benchmark
    if cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
        undo.append(lambda: setattr(torch.backends.cudnn, "benchmark", benchmark))

    def restore() -> None:
        for step in reversed(undo):
            step()

    return restore


def _legacy_tf32_on() -> list[Callable[[], None]]:
    """torch < 2.9: two booleans, each switched only where off (matmul's True would also turn a
    script's float32_matmul_precision "medium" into "high")."""
    undo: list[Callable[[], None]] = []
    owners: tuple[Any, ...] = (torch.backends.cuda.matmul, torch.backends.cudnn)
    for owner in owners:
        if not owner.allow_tf32:
            owner.allow_tf32 = True
            undo.append(functools.partial(setattr, owner, "allow_tf32", False))
    return undo


# torch >= 2.9 keeps fp32_precision at three levels: an op's (cuBLAS matmul, cuDNN conv and
# rnn) "none" inherits its backend's (`torch.backends.cudnn.fp32_precision`, CUDA's), whose
# "none" inherits the global `torch.backends.fp32_precision`; every read answers the inherited
# value, never "none" below a level that has one. The legacy flags write these too:
# `matmul.allow_tf32 = False` writes "ieee" and `cudnn.allow_tf32` writes conv and rnn, and
# reading a legacy flag raises once it disagrees with them. So an op is switched through the
# legacy flag where that flag still reads (the script uses it: both stay in agreement), else
# through fp32_precision, and is written back through both.


def _tf32_on() -> list[Callable[[], None]]:
    undo: list[Callable[[], None]] = []
    matmul: Any = torch.backends.cuda.matmul
    cudnn: Any = torch.backends.cudnn
    if matmul.fp32_precision != "tf32":
        undo.append(_switched(matmul if _legacy_reads(matmul) else None, (matmul,)))
    if cudnn.conv.fp32_precision != "tf32":
        if _legacy_reads(cudnn):  # its flag writes rnn as well as conv
            undo.append(_switched(cudnn, (cudnn.conv, cudnn.rnn)))
        else:
            undo.append(_switched(None, (cudnn.conv,)))
    return undo


def _legacy_reads(owner: Any) -> bool:
    try:
        owner.allow_tf32  # noqa: B018 - the read is the test
    except RuntimeError:  # the script set fp32_precision: legacy and new flags disagree
        return False
    return True


def _switched(legacy: Any, ops: tuple[Any, ...]) -> Callable[[], None]:
    """Put `ops` on TF32, through `legacy`'s allow_tf32 where given; returns what writes back
    the legacy flag and each op's fp32_precision as read now. An op that reads as its backend
    does is written back "none" (torch does not tell "none" from the same value set again, and
    "none" keeps following the backend as before)."""
    backend = torch.backends.cudnn.fp32_precision
    saved = [(op, op.fp32_precision) for op in ops]
    if legacy is not None:
        legacy.allow_tf32 = True
    else:
        for op in ops:
            op.fp32_precision = "tf32"

    def restore() -> None:
        if legacy is not None:  # the flag's own state (matmul's: float32_matmul_precision "highest")
            legacy.allow_tf32 = False
        for op, value in saved:
            op.fp32_precision = "none" if value == backend else value

    return restore


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
