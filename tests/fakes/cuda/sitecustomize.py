"""With FAKE_CUDA set (JSON), make this CPU process believe a GPU is there: `torch.cuda` is
patched as soon as torch is imported. Only the boundary is faked (availability, device
properties, memory statistics, events, synchronize); the script's tensors stay on the CPU and
trainadvisor's own code runs unchanged. Keys of FAKE_CUDA (all optional):

    name, major, minor, total_memory, uuid, device_count, bf16, hip (a ROCm version: torch.version.hip),
    gcnArchName, current_device, alloc_retries_before (allocator retries counted before the window),
    free_memory (bytes `mem_get_info` reports free; default total_memory less 1 GiB, held by the
    CUDA context), memory_fraction (what `get_per_process_memory_fraction` answers until
    `set_per_process_memory_fraction` changes it; default 1.0),
    log (a file: one JSON line per synchronize/reset/event call, to check the window's edges),
    memory_stats (a JSON file: what `memory_stats` answers, e.g. one recorded at an OOM on a GPU),
    snapshot (a pickle: what `torch.cuda.memory._snapshot()` answers, e.g. one recorded on a GPU;
    default: no segments). `torch.cuda.memory._record_memory_history` logs its `enabled`.
"""

from __future__ import annotations

import json
import os
import sys

_SPEC = os.environ.get("FAKE_CUDA")


def _install(torch) -> None:  # noqa: ANN001 - torch itself
    import time
    from types import SimpleNamespace

    spec = json.loads(_SPEC or "{}")
    state = {"current": int(spec.get("current_device", 0)), "peak": 0, "retries": 0, "ooms": 0}
    state["retries"] = int(spec.get("alloc_retries_before", 0))
    total_memory = int(spec.get("total_memory", 80 * 2**30))
    fraction = {"value": float(spec.get("memory_fraction", 1.0))}
    log_path = spec.get("log")

    def log(event: str, **fields: object) -> None:
        if log_path:
            with open(log_path, "a") as f:
                f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")

    class Uuid:
        def __str__(self) -> str:
            return spec.get("uuid", "2f5e8c3a-0d1b-4b7e-9a55-0c1d2e3f4a5b")

    def properties(device: object = None) -> SimpleNamespace:
        return SimpleNamespace(
            name=spec.get("name", "NVIDIA A100-SXM4-80GB"),
            total_memory=total_memory,
            major=int(spec.get("major", 8)),
            minor=int(spec.get("minor", 0)),
            multi_processor_count=108,
            uuid=Uuid(),
            gcnArchName=spec.get("gcnArchName", ""),
        )

    def index(device: object) -> int:
        return state["current"] if device is None else int(getattr(device, "index", device) or 0)

    class Event:
        def __init__(self, enable_timing: bool = False, **_: object) -> None:
            self.t = None

        def record(self, stream: object = None) -> None:
            self.t = time.perf_counter()
            log("event_record")

        def elapsed_time(self, end: Event) -> float:
            return (end.t - self.t) * 1e3

        def synchronize(self) -> None:
            pass

    def synchronize(device: object = None) -> None:
        log("synchronize", device=index(device))

    def reset_peak_memory_stats(device: object = None) -> None:
        state["peak"] = 0
        log("reset_peak_memory_stats", device=index(device))

    def memory_stats(device: object = None) -> dict:
        # the peak grows with each read, like an allocator under load; retries stay as they were
        state["peak"] += 2**20
        if spec.get("memory_stats"):
            with open(spec["memory_stats"]) as f:
                return json.load(f)
        return {
            "num_alloc_retries": state["retries"],
            "num_ooms": state["ooms"],
            "reserved_bytes.all.current": state["peak"],
        }

    def snapshot(*_: object, **__: object) -> dict:
        if not spec.get("snapshot"):
            return {"segments": [], "device_traces": [[]]}
        import pickle

        with open(spec["snapshot"], "rb") as f:
            return pickle.load(f)

    def record_memory_history(enabled: object = "all", *_: object, **__: object) -> None:
        log("record_memory_history", enabled=enabled)

    def mem_get_info(device: object = None) -> tuple[int, int]:
        return int(spec.get("free_memory", total_memory - 2**30)), total_memory

    def set_fraction(value: float, device: object = None) -> None:
        fraction["value"] = float(value)

    def set_device(device: object) -> None:
        state["current"] = index(device)

    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: True
    cuda.device_count = lambda: int(spec.get("device_count", 1))
    cuda.current_device = lambda: state["current"]
    cuda.set_device = set_device
    cuda.get_device_name = lambda device=None: properties(device).name
    cuda.get_device_properties = properties
    cuda.get_device_capability = lambda device=None: (properties().major, properties().minor)
    cuda.is_bf16_supported = lambda including_emulation=True: bool(spec.get("bf16", True))
    cuda.synchronize = synchronize
    cuda.Event = Event
    cuda.current_stream = lambda device=None: SimpleNamespace(device=index(device))
    cuda.memory_stats = memory_stats
    cuda.reset_peak_memory_stats = reset_peak_memory_stats
    cuda.max_memory_allocated = lambda device=None: state["peak"] // 2
    cuda.max_memory_reserved = lambda device=None: state["peak"]
    cuda.mem_get_info = mem_get_info
    cuda.get_per_process_memory_fraction = lambda device=None: fraction["value"]
    cuda.set_per_process_memory_fraction = set_fraction
    cuda.memory._snapshot = snapshot
    cuda.memory._record_memory_history = record_memory_history
    _profile_without_cuda(torch, log)
    torch.version.cuda = None if spec.get("hip") else spec.get("cuda", "12.4")
    torch.version.hip = spec.get("hip")


def _profile_without_cuda(torch, log) -> None:  # noqa: ANN001
    """A CPU build of kineto cannot trace a GPU that is not there: the CUDA activity asked for
    is logged (tests check it was asked) and dropped."""
    import torch.profiler as profiler

    original = profiler.profile.__init__

    def init(self, *args, activities=None, **kwargs):  # noqa: ANN001
        if activities and profiler.ProfilerActivity.CUDA in activities:
            log("profiler_cuda_requested")
            activities = [a for a in activities if a != profiler.ProfilerActivity.CUDA]
        original(self, *args, activities=activities, **kwargs)

    profiler.profile.__init__ = init


class _PatchTorchOnImport:
    """A meta-path finder that lets torch import as usual, then patches torch.cuda."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):  # noqa: ANN001
            original_exec(module)
            _install(module)

        loader.exec_module = exec_module
        return spec


if _SPEC:
    sys.meta_path.insert(0, _PatchTorchOnImport())
