"""GPU sampling through NVML (nvidia-ml-py), from the parent process or the advisor's thread.

The GPUs sampled are the ones the training processes say they train on, found by UUID: CUDA's
device order is not NVML's (CUDA puts the fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID),
and CUDA_VISIBLE_DEVICES may hold UUIDs or MIG instances. Each field is read on its own: a MIG
instance reports memory but no utilisation, some boards no power or clocks, GPUs before Volta
no energy counter. `status` says in words what was sampled and what was not, and why."""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psutil

from trainadvisor.records import GpuSample

# NVML's errors at initialisation, in words a user can act on (pynvml's NVMLError_* names).
_INIT_ERRORS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver library (libnvidia-ml.so) on this machine",
    "NVMLError_DriverNotLoaded": "the NVIDIA driver is installed but not loaded",
    "NVMLError_NoPermission": "no permission to query the NVIDIA driver",
    "NVMLError_LibRmVersionMismatch": (
        "the NVIDIA driver and its library differ in version (reboot after a driver update)"
    ),
}
# The fields `status` names when missing; not the energy counter: a run's `Energy` says how its
# energy was measured instead.
_FIELDS = ("utilisation", "memory", "power", "SM clock", "processes")


T = TypeVar("T")
# A sample and the wall-clock time it was taken; its t_ms is set when a run's window is known.
Stamped = tuple[float, T]


@dataclass
class _Device:
    label: str
    handle: Any
    missing: set[str] = field(default_factory=set)  # fields the device does not report


class NvmlSampler:
    """The NVIDIA GPUs named to it (`add`), sampled on each `tick`."""

    def __init__(self) -> None:
        self.devices: dict[str, _Device] = {}
        self.refused: dict[str, str] = {}  # label -> why it could not be sampled
        self.nvml: Any = None
        self.error: str | None = None
        try:
            import pynvml
        except ImportError:
            self.error = "nvidia-ml-py is not installed"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # pynvml raises its own NVMLError family
            self.error = _INIT_ERRORS.get(type(exc).__name__, f"NVML could not start: {exc}")
            return
        self.nvml = pynvml

    def add(self, label: str, identity: dict[str, Any]) -> None:
        """Sample the GPU a training process named (`training.gpu.device_identity`)."""
        if label in self.devices or label in self.refused:
            return
        if identity.get("rocm"):
            self.refused[label] = "an AMD GPU (NVML samples NVIDIA GPUs only)"
            return
        if self.nvml is None:
            return
        handle, why = self._handle(identity)
        if handle is None:
            self.refused[label] = why
        else:
            self.devices[label] = _Device(label, handle)

    def _handle(self, identity: dict[str, Any]) -> tuple[Any, str]:
        uuid = identity.get("uuid")
        if not uuid:
            return None, "torch did not report the device's UUID"
        tried = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
        for candidate in tried:
            try:
                return self.nvml.nvmlDeviceGetHandleByUUID(candidate), ""
            except Exception:  # NotFound: try the next spelling
                continue
        return None, f"NVML knows no GPU with UUID {uuid}"

    def tick(self, ours: Collection[int] = ()) -> list[Stamped[GpuSample]]:
        """One sample of each GPU; `ours`: the run's processes (the others on a GPU are named)."""
        now = time.time()
        return [self._read(device, now, ours) for device in self.devices.values()]

    def _others(self, device: _Device, ours: Collection[int]) -> list[int] | None:
        """Processes on the GPU that are not the run's and not trainadvisor, among those this
        machine's process namespace shows (in a container NVML may give the host's pids,
        which match nothing here: those are not counted)."""
        handle = device.handle
        running = self._field(
            device, "processes", lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        )
        if running is None:
            return None
        me = os.getpid()
        return sorted(
            {p.pid for p in running if p.pid not in ours and p.pid != me and psutil.pid_exists(p.pid)}
        )

    def _read(self, device: _Device, now: float, ours: Collection[int] = ()) -> Stamped[GpuSample]:
        nv, handle = self.nvml, device.handle
        # first, nearest the tick's time: the counter's differences between ticks are the energy
        energy = self._field(device, "energy", lambda: int(nv.nvmlDeviceGetTotalEnergyConsumption(handle)))
        util = self._field(device, "utilisation", lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu))
        memory = self._field(device, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        return now, GpuSample(
            t_ms=0.0,
            device=device.label,
            util_pct=util,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            power_w=self._field(device, "power", lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0),
            sm_clock_mhz=self._field(
                device, "SM clock", lambda: int(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
            ),
            other_pids=self._others(device, ours),
            energy_mj=energy,
        )

    def _field(self, device: _Device, name: str, read: Any) -> Any:
        """One field; a field the device does not support is not asked again."""
        if name in device.missing:
            return None
        try:
            return read()
        except Exception as exc:
            if type(exc).__name__ == "NVMLError_NotSupported":
                device.missing.add(name)
            return None

    def status(self, samples: int) -> str:
        """What was sampled, in words: 'sampled GPU 0 (no utilisation: not supported)'."""
        if self.error is not None:
            return f"not sampled: {self.error}"
        parts = []
        for device in self.devices.values():
            missing = [f for f in _FIELDS if f in device.missing]
            parts.append(device.label + (f" (no {', '.join(missing)}: not supported)" if missing else ""))
        refused = [f"{label} not sampled: {why}" for label, why in self.refused.items()]
        if not self.devices:
            return "; ".join(refused) if refused else "not sampled: the run used no NVIDIA GPU"
        sampled = "sampled " + ", ".join(parts) + ("" if samples else ", but no sample was read")
        return "; ".join([sampled, *refused])

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
