"""Host sampling (psutil: the script's process and its DataLoader workers) and GPU sampling
(NVML through nvidia-ml-py) from the parent process, so sampling costs the script nothing."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil


@dataclass
class HostTick:
    unix_s: float
    main_cpu_pct: float
    workers_cpu_pct: float
    main_rss_bytes: int
    workers_rss_bytes: int
    workers: int


@dataclass
class GpuTick:
    unix_s: float
    util_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_w: float | None
    sm_clock_mhz: int | None


class _Nvml:
    """One NVIDIA device through NVML; `status` says why nothing is sampled when it is not."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.status = "not sampled"
        try:
            import pynvml

            pynvml.nvmlInit()
        except ImportError:
            self.status = "unavailable: nvidia-ml-py is not installed"
            return
        except Exception as exc:  # pynvml raises its own NVMLError family
            self.status = f"unavailable: {exc} (no NVIDIA driver on this machine)"
            return
        self.nvml = pynvml
        try:
            if pynvml.nvmlDeviceGetCount() == 0:
                self.status = "unavailable: NVML sees no GPU"
                return
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            index = int(visible) if visible.isdigit() else 0
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.status = f"sampled GPU {index}"
        except Exception as exc:
            self.status = f"unavailable: {exc}"

    def tick(self) -> GpuTick | None:
        if self.handle is None:
            return None
        nv = self.nvml
        try:
            util = nv.nvmlDeviceGetUtilizationRates(self.handle)
            memory = nv.nvmlDeviceGetMemoryInfo(self.handle)
        except Exception:
            return None
        return GpuTick(
            unix_s=time.time(),
            util_pct=float(util.gpu),
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            power_w=self._optional(lambda: nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0),
            sm_clock_mhz=self._optional(
                lambda: int(nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM))
            ),
        )

    @staticmethod
    def _optional(read: Any) -> Any:
        try:
            return read()
        except Exception:  # not every GPU reports power or clocks
            return None

    def close(self) -> None:
        if self.handle is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass


@dataclass
class Sampler:
    """Samples a process tree every `interval_s` on a background thread until `stop()`."""

    pid: int
    interval_s: float = 0.1
    host: list[HostTick] = field(default_factory=list)
    gpu: list[GpuTick] = field(default_factory=list)
    nvml_status: str = "not sampled"

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._thread = threading.Thread(target=self._loop, name="trainadvisor-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        nvml = _Nvml()
        self.nvml_status = nvml.status
        try:
            while not self._stop.is_set():
                host = self._host_tick()
                if host is not None:
                    self.host.append(host)
                gpu = nvml.tick()
                if gpu is not None:
                    self.gpu.append(gpu)
                self._stop.wait(self.interval_s)
        finally:
            nvml.close()

    def _process(self, pid: int) -> psutil.Process:
        if pid not in self._procs:
            self._procs[pid] = psutil.Process(pid)
            self._procs[pid].cpu_percent(None)  # the first reading only starts the interval
        return self._procs[pid]

    def _host_tick(self) -> HostTick | None:
        try:
            main = self._process(self.pid)
            with main.oneshot():
                main_cpu, main_rss = main.cpu_percent(None), main.memory_info().rss
            children = main.children(recursive=True)
        except psutil.Error:
            return None
        workers_cpu, workers_rss = 0.0, 0
        for child in children:
            try:
                proc = self._process(child.pid)
                workers_cpu += proc.cpu_percent(None)
                workers_rss += proc.memory_info().rss
            except psutil.Error:
                continue
        return HostTick(time.time(), main_cpu, workers_cpu, main_rss, workers_rss, len(children))
