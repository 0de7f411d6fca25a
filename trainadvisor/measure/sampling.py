"""Host sampling (psutil: the script's process and its DataLoader workers) and GPU sampling
(NVML through nvidia-ml-py, `measure.nvml`) from the parent process, so sampling costs the script
nothing."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from trainadvisor.measure.nvml import NvmlSampler, Stamped
from trainadvisor.measure.proctable import PROC, ProcessTable, read_table, read_tree
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
    proc: Path = field(default=PROC, repr=False)  # where the process table is read (`proctable`)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._nvml: NvmlSampler | None = None
        self._last_busy: tuple[float, float] | None = None  # (clock s, the machine's busy CPU s)
        self._ours = TreeCpu(os.getpid())  # trainadvisor, the script and everything they started
        self._strangers = Strangers()
        self._queue = QueueWait(self.pid, self.proc)
        self._own_memory = OwnMemory()
        self._thread = threading.Thread(target=self._loop, name="trainadvisor-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._nvml is None and self.devices is not None and self.devices():
            # a GPU run shorter than the sampling interval named its GPU after the last tick
            self.nvml_status = (
                f"not sampled: the run ended before NVML's first sample of its GPU (one every "
                f"{self.interval_s:g} s)"
            )

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
        table = self._read_ours()  # once a tick: the script's tree and ours
        try:
            main = self._process(self.pid)
            with main.oneshot():
                main_cpu, main_rss = main.cpu_percent(None), main.memory_info().rss
        except psutil.Error:
            return None
        children = table.tree(self.pid)[1:]
        workers_cpu, workers_rss, workers = 0.0, 0, []
        for pid in children:
            try:
                proc = self._process(pid)
                workers_cpu += proc.cpu_percent(None)
                workers_rss += proc.memory_info().rss
            except psutil.Error:
                continue
            workers.append(proc)
        other_cpu, strangers = self._others(table)
        now_s = self.clock()
        queued, own = self._queue.pct(now_s), self._own_memory.read(now_s, workers)
        return time.time(), HostSample(
            0.0, main_cpu, workers_cpu, main_rss, workers_rss, len(children), other_cpu, strangers,
            main_queued_pct=queued, worker_uss_bytes=own,
        )  # fmt: skip

    def _read_ours(self) -> ProcessTable:
        """trainadvisor's tree and the script's (in it, where trainadvisor started the script):
        those alone where the kernel lists each thread's children, else the whole table."""
        ours = read_tree([os.getpid(), self.pid], self.proc, known=self._ours.members)
        return ours if ours is not None else read_table(self.proc)

    def _others(self, table: ProcessTable) -> tuple[float, dict[str, float]]:
        """The CPU the machine spent since the last tick outside trainadvisor's own process tree
        (this process, the profiled script and its workers, a confirmation run started beside the
        baseline), in percent of one core; and, where that is half a core or more, the processes
        that spent it. The first tick only starts the interval (0.0)."""
        now_s, busy_s = self.clock(), _busy_cpu_s()
        ours_s = self._ours.spent_s(table)
        last, self._last_busy = self._last_busy, (now_s, busy_s)
        if last is None or now_s <= last[0]:
            return 0.0, {}
        other_pct = max(0.0, 100.0 * (busy_s - last[1] - ours_s) / (now_s - last[0]))
        strangers = (
            self._strangers.busiest(now_s, lambda: read_table(self.proc))
            if other_pct >= NAME_FROM_PCT
            else {}
        )
        return other_pct, strangers


# From this share of one core spent outside trainadvisor's processes, the sampler names the
# processes that spent it (`Strangers`): half a core is where a window counts as disturbed.
NAME_FROM_PCT = 50.0


class TreeCpu:
    """CPU seconds spent by a process and all its descendants, tick to tick, counting the
    processes that start and end between two ticks: a DataLoader worker started for a trial
    window and ended before the next tick (or read for the first time) would otherwise pass
    for another process's CPU. A process's own times include those of its children once it
    has waited for them, so a child's last reading is taken back when it is gone."""

    def __init__(self, root: int) -> None:
        self.root = root
        self._last: dict[int, float] = {}

    @property
    def members(self) -> list[int]:
        """The tree's processes at the last reading."""
        return list(self._last)

    def spent_s(self, table: ProcessTable) -> float:
        """CPU seconds the tree spent since the last call (0.0 at the first)."""
        first = not self._last
        members = table.tree(self.root)
        if not members:
            return 0.0
        now = {pid: table.own_s[pid] + table.reaped_s[pid] for pid in members}
        gone = sum(spent for pid, spent in self._last.items() if pid not in now)
        grown = sum(spent - self._last.get(pid, 0.0) for pid, spent in now.items())
        self._last = now
        return 0.0 if first else max(0.0, grown - gone)


# A worker's own memory (its USS: the pages no other process maps, which its exit would free) is
# read from /proc/<pid>/smaps_rollup, which walks each of its mappings: 8-10 ms for a DataLoader
# worker of a torch script on 2 cores, where its RSS takes 0.05 ms (a process with CUDA's
# libraries mapped has many more). One worker is read at a time, in turn, at most once every
# USS_EVERY_S, and never more than USS_CPU_SHARE of a core's time: after a reading of 25 ms, the
# next comes 1.25 s later.
USS_EVERY_S = 0.5
USS_CPU_SHARE = 0.02


class OwnMemory:
    """The DataLoader workers' own memory, one worker a reading, in turn. A worker's RSS counts the
    pages it still shares with the training process it was forked from (torch's libraries, the
    script's heap until written): 283-316 MB resident for 8 MB of its own, in the slow-input
    example's workers, so that twice the workers, counted by RSS, took 35 times the memory they
    would."""

    def __init__(self, every_s: float = USS_EVERY_S, timer: Callable[[], float] = time.perf_counter) -> None:
        self.every_s, self.timer = every_s, timer
        self._due_s: float | None = None  # when the next reading is due (the sampler's clock)
        self._turn = 0

    def read(self, now_s: float, workers: list[psutil.Process]) -> int | None:
        """The next worker's USS in bytes; None where none is due, or where it cannot be read
        (it ended, it is not this user's, or the platform has no such count)."""
        if not workers or (self._due_s is not None and now_s < self._due_s):
            return None
        worker = workers[self._turn % len(workers)]
        self._turn += 1
        started = self.timer()
        try:
            uss = getattr(worker.memory_full_info(), "uss", None)
        except psutil.Error:
            uss = None
        self._due_s = now_s + max(self.every_s, (self.timer() - started) / USS_CPU_SHARE)
        return int(uss) if uss is not None else None


class QueueWait:
    """The share of wall time a thread spent waiting for a CPU (runnable, not running), tick to
    tick: the second field of `/proc/<pid>/task/<tid>/schedstat` (nanoseconds spent on a run
    queue, since the thread started). A loop beside other busy processes waits there: what it
    waits is the time a quiet machine would not have taken (`profile.quiet`)."""

    def __init__(self, pid: int, proc: Path = PROC, tid: int | None = None) -> None:
        self.pid, self.tid, self.proc = pid, tid, proc
        self._last: tuple[float, int] | None = None  # (clock s, queued ns)

    def pct(self, now_s: float) -> float | None:
        """Percent of the time since the last call spent waiting for a CPU (None at the first
        call, or where the kernel keeps no such count)."""
        queued_ns = queued_ns_of(self.pid, self.proc, self.tid)
        if queued_ns is None:
            self._last = None
            return None
        last, self._last = self._last, (now_s, queued_ns)
        if last is None or now_s <= last[0]:
            return None
        share = (queued_ns - last[1]) / 1e9 / (now_s - last[0])
        return round(min(100.0, max(0.0, 100.0 * share)), 2)


class Strangers:
    """The processes outside trainadvisor's tree that spent the most CPU between two readings of
    the process table at least a second apart (shorter spans would name a process for a burst).
    Processes of another container or of the host are not visible here."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self._last: dict[int, float] = {}
        self._read_at: float | None = None
        self._named: dict[str, float] = {}

    def busiest(self, now_s: float, read: Callable[[], ProcessTable], top: int = 3) -> dict[str, float]:
        """ "name (pid N)" -> cores, of the busiest processes since the last reading of the
        whole process table (`read`, at most once every `every_s`)."""
        if self._read_at is not None and now_s - self._read_at < self.every_s:
            return self._named
        table = read()
        ours = set(table.tree(os.getpid()))
        # a process's own CPU only: its children's, once waited for, were counted while they ran
        spent = {pid: (table.name[pid], cpu) for pid, cpu in table.own_s.items() if pid not in ours}
        named: dict[str, float] = {}
        if self._read_at is not None:
            seconds = now_s - self._read_at
            cores = {
                f"{name} (pid {pid})": (cpu - self._last.get(pid, cpu)) / seconds
                for pid, (name, cpu) in spent.items()
            }
            named = dict(sorted(cores.items(), key=lambda item: -item[1])[:top])
            named = {name: round(value, 2) for name, value in named.items() if value >= 0.05}
        self._last = {pid: cpu for pid, (_, cpu) in spent.items()}
        self._read_at, self._named = now_s, named
        return named


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy, over all cores: total - idle - iowait (as
    psutil counts it: guest time is already in user time)."""
    times = psutil.cpu_times()
    total_s = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total_s - times.idle - getattr(times, "iowait", 0.0)


def queued_ns_of(pid: int, proc: Path = PROC, tid: int | None = None) -> int | None:
    """Nanoseconds thread `tid` of process `pid` (its main thread by default) spent waiting for a
    CPU since it started (`QueueWait`); None where it ended or the kernel keeps no such count."""
    path = proc / str(pid) / "task" / str(tid if tid is not None else pid) / "schedstat"
    try:
        return int(path.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
