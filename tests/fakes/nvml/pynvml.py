"""A stand-in for nvidia-ml-py's `pynvml` with the calls trainadvisor makes and the real error
classes, for tests on machines without a GPU. Driven by FAKE_NVML (JSON):

    {"init_error": "NVMLError_LibraryNotFound" | null,
     "devices": [{"uuid": "GPU-...", "util": 70, "used": 1e9, "total": 8e10, "power_mw": 250000,
                  "sm_clock": 1410, "energy_mj": [5000000, 5061900],
                  "unsupported": ["utilisation", "power", "energy"]}]}

A MIG instance's UUID starts with "MIG-"; as on real MIG, utilisation raises NotSupported there.
The energy counter (millijoules since the driver loaded) reads `energy_mj`; "power" makes it a
counter that grows at the device's power_mw with the wall clock. A device without `energy_mj`
has no counter (NotSupported, as on a GPU older than Volta). Where `power_mw` or `energy_mj` is
a list, the device's handle reads its values in turn, one a call, the last one again once they
run out."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

NVML_CLOCK_SM = 1
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
}


class NVMLError(Exception):
    """As in pynvml: `NVMLError(code)` builds the subclass of that code."""

    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value: int):  # noqa: D102
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, code: int) -> type:
    cls = type(name, (NVMLError,), {})
    NVMLError._valClassMapping[code] = cls
    return cls


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_LibRmVersionMismatch = _error_class(
    "NVMLError_LibRmVersionMismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH
)

_state: dict = {"initialized": False, "calls": []}


def _config() -> dict:
    return json.loads(os.environ.get("FAKE_NVML") or "{}")


def _check() -> None:
    if not _state["initialized"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def nvmlInit() -> None:
    error = _config().get("init_error")
    if error:
        raise globals()[error](
            next(code for code, cls in NVMLError._valClassMapping.items() if cls.__name__ == error)
        )
    _state["initialized"] = True


def nvmlShutdown() -> None:
    _check()
    _state["initialized"] = False


def nvmlDeviceGetCount() -> int:
    _check()
    return len(_config().get("devices", []))


def nvmlDeviceGetHandleByIndex(index: int) -> SimpleNamespace:
    _check()
    devices = _config().get("devices", [])
    if not 0 <= index < len(devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return SimpleNamespace(**devices[index])


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> SimpleNamespace:
    _check()
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    _state["calls"].append(("nvmlDeviceGetHandleByUUID", text))
    for device in _config().get("devices", []):
        if device["uuid"] == text:
            return SimpleNamespace(**device)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def _field(handle: SimpleNamespace, name: str) -> None:
    _check()
    if name in getattr(handle, "unsupported", []) or (
        name == "utilisation" and handle.uuid.startswith("MIG-")
    ):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetUtilizationRates(handle: SimpleNamespace) -> SimpleNamespace:
    _field(handle, "utilisation")
    return SimpleNamespace(gpu=handle.util, memory=0)


def nvmlDeviceGetMemoryInfo(handle: SimpleNamespace) -> SimpleNamespace:
    _field(handle, "memory")
    return SimpleNamespace(
        used=int(handle.used), total=int(handle.total), free=int(handle.total - handle.used)
    )


def _scripted(handle: SimpleNamespace, name: str) -> float:
    """A device's value, or where the config gives a list, its readings in turn (the last one
    again once they run out), counted on the handle."""
    value = getattr(handle, name)
    if not isinstance(value, list):
        return value
    read = getattr(handle, f"{name}_reads", 0)
    setattr(handle, f"{name}_reads", read + 1)
    return value[min(read, len(value) - 1)]


def nvmlDeviceGetPowerUsage(handle: SimpleNamespace) -> int:
    _field(handle, "power")
    return int(_scripted(handle, "power_mw"))


def nvmlDeviceGetTotalEnergyConsumption(handle: SimpleNamespace) -> int:
    _field(handle, "energy")
    if getattr(handle, "energy_mj", None) is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if handle.energy_mj == "power":
        return int(handle.power_mw * time.time())  # mW x s = mJ
    return int(_scripted(handle, "energy_mj"))


def nvmlDeviceGetClockInfo(handle: SimpleNamespace, clock: int) -> int:
    _field(handle, "SM clock")
    if clock != NVML_CLOCK_SM:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(handle.sm_clock)


def nvmlDeviceGetComputeRunningProcesses(handle: SimpleNamespace) -> list:
    """The processes using the GPU: `processes` in the device's config, [[pid, bytes], ...]."""
    _field(handle, "processes")
    return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in getattr(handle, "processes", [])]
