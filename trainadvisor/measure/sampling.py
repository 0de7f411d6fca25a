"""Host sampling (psutil: the script's process and its DataLoader workers) and GPU sampling
(NVML through nvidia-ml-py, `measure.nvml`) from the parent process, so sampling costs the script
nothing."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from trainadvisor.measure.nvml import NvmlSampler, Stamped
from trainadvisor.records import GpuSample, HostSample

# The GPUs the training processes train on, as they name them: label -> device identity.
DeviceSource = Callable[[], dict[str, dict[str, Any]]]


@dataclass
class Sampler:
    """Samples a process tree every `interval_s` on a background thread until `stop()`."""

    pid: int
    devices: DeviceSource | None = None
    interval_s: float = 0.1
    host: list[Stamped[HostSample]] = field(default_factory=list)
    gpu: list[Stamped[GpuSample]] = field(default_factory=list)
    nvml_status: str = "not sampled: the run used no NVIDIA GPU"
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)  # seconds

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._nvml: NvmlSampler | None = None
        self._last_busy: tuple[float, float] | None = None  # (clock s, the machine's busy CPU s)
        self._thread = threading.Thread(target=self._loop, name="trainadvisor-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def status_now(self) -> str:
        """What was and was not sampled so far (while sampling goes on: a live run's window)."""
        nvml = self._nvml
        if nvml is None or self._stop.is_set():
            return self.nvml_status
        return nvml.status(len(self.gpu))

    def _loop(self) -> None:
        nvml: NvmlSampler | None = None
        try:
            while not self._stop.is_set():
                host = self._host_tick()
                if host is not None:
                    self.host.append(host)
                named = self.devices() if self.devices is not None else {}
                if named and nvml is None:
                    nvml = self._nvml = NvmlSampler()  # only once a process trains on a GPU
                for label, identity in named.items():
                    nvml.add(label, identity)  # type: ignore[union-attr]
                if nvml is not None:
                    self.gpu.extend(nvml.tick(set(self._procs)))
                self._stop.wait(self.interval_s)
        finally:
            if nvml is not None:  # said once, when sampling ends (before stop() returns)
                self.nvml_status = nvml.status(len(self.gpu))
                nvml.close()

    def _process(self, pid: int) -> psutil.Process:
        if pid not in self._procs:
            self._procs[pid] = psutil.Process(pid)
            self._procs[pid].cpu_percent(None)  # the first reading only starts the interval
        return self._procs[pid]

    def _host_tick(self) -> Stamped[HostSample] | None:
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
        tree_pids = {self.pid, *(child.pid for child in children)}
        other_cpu = self._other_cpu_pct(main_cpu + workers_cpu, tree_pids)
        return time.time(), HostSample(
            0.0, main_cpu, workers_cpu, main_rss, workers_rss, len(children), other_cpu
        )

    def _other_cpu_pct(self, tree_cpu_pct: float, tree_pids: set[int]) -> float:
        """The CPU the machine spent since the last tick outside the profiled tree and
        trainadvisor's own processes (this one, and its other children: a confirmation run
        started beside the baseline), in percent of one core. The first tick only starts the
        interval (0.0)."""
        now_s, busy_s = self.clock(), _busy_cpu_s()
        own_pct = self._own_cpu_pct(tree_pids)
        last, self._last_busy = self._last_busy, (now_s, busy_s)
        if last is None or now_s <= last[0]:
            return 0.0
        machine_pct = 100.0 * (busy_s - last[1]) / (now_s - last[0])
        return max(0.0, machine_pct - tree_cpu_pct - own_pct)

    def _own_cpu_pct(self, tree_pids: set[int]) -> float:
        """This (trainadvisor's) process and its children outside the profiled tree."""
        total_pct = 0.0
        try:
            own = self._process(os.getpid())
            total_pct += own.cpu_percent(None)
            children = own.children(recursive=True)
        except psutil.Error:
            return total_pct
        for child in children:
            if child.pid in tree_pids:
                continue
            try:
                total_pct += self._process(child.pid).cpu_percent(None)
            except psutil.Error:
                continue
        return total_pct


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy, over all cores: total - idle - iowait (as
    psutil counts it: guest time is already in user time)."""
    times = psutil.cpu_times()
    total_s = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total_s - times.idle - getattr(times, "iowait", 0.0)
