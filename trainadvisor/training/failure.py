"""What the child records of a script that died of out-of-memory (`memory.oom` summarises it):
on a GPU the allocator's statistics and snapshot at the failing point and the storages the
optimizer owns; on the host what the process held. The exception's traceback keeps the failing
frames' tensors alive until it is caught, so what the snapshot shows is what was live when the
request failed.

Where the live blocks were allocated is known only from the allocator's history. It is recorded
from CUDA's start until the run's own window begins timing (`record_history`, `stop_history`):
no timed step pays for it (torch documents about 2 us per allocation for Python stacks), only
the warm-up. A script that dies in its first steps, as most out-of-memory deaths do, has a line
for every live block; one that dies later has lines for what the warm-up allocated (parameters,
optimizer state) and counts the rest as unattributed."""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from typing import Any

import torch

from trainadvisor.memory import oom
from trainadvisor.memory.step import optimizer_tensors
from trainadvisor.training import gpu

# The allocation trace kept beside the live blocks' stacks: its last entry is the refused
# request (exact bytes, where the message rounds them); older ones are not read.
HISTORY_ENTRIES = 1000


def _not_user() -> tuple[str, ...]:
    """The folders of code that is not the user's, on this machine."""
    paths = sysconfig.get_paths()
    folders = {
        os.path.dirname(torch.__file__),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # trainadvisor
        paths["stdlib"], paths["purelib"], paths["platlib"],
    }  # fmt: skip
    return tuple(os.path.normpath(p) + os.sep for p in folders)


def record_history() -> None:
    """Record the allocator's history from the moment this process starts CUDA (at once where it
    has); nothing happens in a process that never does."""

    def start() -> None:
        try:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="alloc", stacks="python", max_entries=HISTORY_ENTRIES
            )
        except Exception:  # an allocator without history: no lines, nothing else lost
            pass

    try:
        torch.cuda._lazy_call(start)
    except Exception:  # private API gone in a later torch: no lines
        pass


def stop_history() -> None:
    """Stop recording (before timed steps): the stacks of blocks allocated so far are kept."""
    if not gpu.cuda_in_use():
        return
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except Exception:
        pass


def failed_site(exc: BaseException, not_user: tuple[str, ...]) -> str:
    """'train.py:42' of the innermost frame of the user's code the error passed through."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if oom.is_user_file(frame.filename, not_user):
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return ""


def _owned(optimizer: torch.optim.Optimizer | None, device_type: str) -> dict[int, tuple[str, int]]:
    """Each storage the optimizer owns on that kind of device: address -> (what, bytes)."""
    if optimizer is None:
        return {}
    found: dict[int, tuple[str, int]] = {}
    for what, tensors in zip(("parameters", "gradients", "optimizer_state"), optimizer_tensors(optimizer)):
        for tensor in tensors:
            if tensor.device.type != device_type:
                continue
            storage = tensor.untyped_storage()
            found.setdefault(storage.data_ptr(), (what, storage.nbytes()))
    return found


def _host_limit() -> tuple[int, str]:
    import resource

    import psutil

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return soft, "the address-space limit (ulimit -v)"
    return psutil.virtual_memory().total, "the machine's memory"


def oom_facts(
    exc: BaseException, optimizer: torch.optim.Optimizer | None, device: int | None
) -> dict[str, Any] | None:
    """The out-of-memory's facts (`memory.oom`), or None for any other error. Never raises: a
    failure here must not hide the script's own error."""
    message = str(exc)
    kind = oom.kind_of(type(exc).__name__, message)
    if kind is None:
        return None
    not_user = _not_user()
    try:
        if kind == "cuda" and gpu.cuda_in_use():
            facts = _cuda_facts(message, optimizer, device, not_user)
        else:
            facts = _host_facts(message, optimizer)
    except Exception as exc_here:  # the figures the message states, at least
        facts = {"kind": kind, "message_figures": oom.message_figures(message)}
        facts["request_bytes"] = facts["message_figures"].get("request_bytes")
        facts["note"] = f"the allocator's state could not be read: {type(exc_here).__name__}: {exc_here}"
    facts["failed_site"] = failed_site(exc, not_user)
    return facts


def _cuda_facts(
    message: str, optimizer: torch.optim.Optimizer | None, device: int | None, not_user: tuple[str, ...]
) -> dict[str, Any]:
    device = device if device is not None else torch.cuda.current_device()
    stats = dict(torch.cuda.memory_stats(device))
    total = int(torch.cuda.get_device_properties(device).total_memory)
    limit = gpu.allocator_limit(device, total, int(stats.get("reserved_bytes.all.current", 0)))
    snapshot = torch.cuda.memory._snapshot()
    facts = oom.summarise_cuda(message, stats, snapshot, device, _owned(optimizer, "cuda"), limit, not_user)
    facts["device"] = device
    return facts


def _host_facts(message: str, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    import psutil

    owned: dict[str, int] = {}
    for what, size in _owned(optimizer, "cpu").values():
        owned[what] = owned.get(what, 0) + size
    rss = int(psutil.Process().memory_info().rss)
    return oom.summarise_host(message, owned, rss, _host_limit())


def runtime_at_death(
    optimizer: torch.optim.Optimizer | None, device: int | None, data_parallel_modules: int, amp: str | None
) -> dict[str, Any]:
    """torch's facts where the script died before its window began timing (the window reads
    them when it opens): the switches, the optimizer, and on a GPU its memory peaks since the
    process started. What the fixes' planning reads (bf16, the peak reserved)."""
    facts = gpu.torch_facts(data_parallel_modules, amp, device)
    facts.update(gpu.optimizer_facts(optimizer))
    if not facts.get("cuda_used"):
        return facts
    device = device if device is not None else torch.cuda.current_device()
    stats = torch.cuda.memory_stats(device)
    total = int(torch.cuda.get_device_properties(device).total_memory)
    limit, source = gpu.allocator_limit(device, total, int(stats.get("reserved_bytes.all.current", 0)))
    facts["cuda_memory"] = {
        "device": device,
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
        "total_bytes": total,
        "limit_bytes": limit,
        "limit_source": source,
        "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "ooms": int(stats.get("num_ooms", 0)),
        "since": "the process started (it died before its window)",
    }
    return facts


def died(exc: BaseException, recorder: Any) -> dict[str, Any]:
    """The runtime facts to record for a script that raised `exc`: {} unless it was an
    out-of-memory; then `oom`, and torch's facts where the window had not read them."""
    optimizer = recorder.window.facts.optimizer or recorder.first_optimizer_built()
    device = recorder.window.device
    try:
        facts = oom_facts(exc, optimizer, device)
        if facts is None:
            return {}
        found: dict[str, Any] = {"oom": facts}
        if not recorder.window.facts.runtime:  # never opened
            amp = recorder.config.overrides.runtime.get("amp")
            found.update(runtime_at_death(optimizer, device, recorder.data_parallel_modules, amp))
        return found
    except Exception as exc_here:
        print(f"[trainadvisor] could not read the memory at the failure: {exc_here!r}", file=sys.stderr)
        return {}
