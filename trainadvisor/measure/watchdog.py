"""The stall watchdog: a run whose training steps stop for much longer than its slowest step
(a deadlocked DataLoader worker, a collective waiting forever) is ended without a --timeout,
and the report says where each process was stuck.

Each training process (each torchrun rank) counts its progress in a small heartbeat file
(`Heartbeat`, written in place: a few bytes per training step and per batch any DataLoader
hands over, so an evaluation loop counts as progress; marked busy while trainadvisor itself
works, exporting a trace, say) and has faulthandler dump every thread's
Python stack to a file of its own on DUMP_SIGNAL. The parent (`Watchdog`) reads the counts as it
polls; when none has moved for `limit_s`, it asks each process for its stacks, and names the
innermost frame of the user's script in each."""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path

# The signal that asks a training process for its stacks: a real-time one, which neither
# scripts nor frameworks use (Lightning and Slurm use SIGUSR1, Kineto's on-demand SIGUSR2).
DUMP_SIGNAL = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else None
PACKAGE = str(Path(__file__).resolve().parent.parent)  # trainadvisor's own frames are skipped
STALL_MIN_S = 600.0  # never sooner: a checkpoint or an evaluation without a DataLoader is no stall
STALL_STEPS = 20  # ... and not before this many times the longest gap between progress seen
DUMP_WAIT_S = 2.0
_LAYOUT = struct.Struct("<qqq")  # progress, pid, busy (trainadvisor's own work under way)
_STEPS = struct.Struct("<q")  # then the training steps seen, exact however the process ends


class Heartbeat:
    """The child's side: its progress, in a file mapped into memory, so a beat on the training
    loop's path is a store of a few bytes, not a system call."""

    def __init__(self, path: str) -> None:
        self.pid = os.getpid()
        self.progress = 0
        self.steps = 0  # set by the child before each beat (`measure.journal`)
        self.shared: mmap.mmap | None = None
        try:
            with open(path, "wb+") as file:
                file.write(_LAYOUT.pack(0, self.pid, 0) + _STEPS.pack(0))
                file.flush()
                self.shared = mmap.mmap(file.fileno(), _LAYOUT.size + _STEPS.size)
        except OSError:  # a full disk: the watchdog then sees no progress, as --timeout would
            pass

    def beat(self) -> None:
        """A training step or a batch: progress."""
        self.progress += 1
        self._write(busy=False)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """trainadvisor's own work (the window's trace export): no stall while it lasts."""
        self._write(busy=True)
        try:
            yield
        finally:
            self.beat()

    def _write(self, busy: bool) -> None:
        if self.shared is not None:
            _LAYOUT.pack_into(self.shared, 0, self.progress, self.pid, int(busy))
            _STEPS.pack_into(self.shared, _LAYOUT.size, self.steps)


def read_beat(path: Path) -> tuple[int, int, int] | None:
    """Progress, pid and busy, as the process last wrote them."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return _LAYOUT.unpack_from(data) if len(data) >= _LAYOUT.size else None


def read_steps(path: Path) -> int | None:
    """The training steps the process had seen at its last beat (kept in the file after its
    end, whatever ended it), or None where it wrote none."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return _STEPS.unpack_from(data, _LAYOUT.size)[0] if len(data) >= _LAYOUT.size + _STEPS.size else None


class Watchdog:
    """The parent's side, polled by the loops that wait for a child."""

    def __init__(
        self, heartbeats: list[Path], stacks: list[Path], keep_in: Path, limit_s: float | None = None
    ) -> None:
        self.heartbeats, self.stacks = heartbeats, stacks  # `*` in a name: one per rank
        self.keep_in = keep_in  # where the stacks of a stuck run are copied, for the user
        self.limit_s = limit_s  # None: STALL_MIN_S or STALL_STEPS slowest steps, whichever is longer
        self.steps: dict[Path, int] = {}
        self.moved_at: float | None = None  # when a count last moved; None: no step yet
        self.slowest_s = 0.0

    def restart(self, now: float | None = None) -> None:
        """The training processes were waiting for the parent (its next trial window's
        command): the time without a step counts from now."""
        if self.moved_at is not None:
            self.moved_at = time.monotonic() if now is None else now

    def _beats(self) -> dict[Path, tuple[int, int, int]]:
        found = {}
        for pattern in self.heartbeats:
            for path in pattern.parent.glob(pattern.name) if "*" in pattern.name else [pattern]:
                beat = read_beat(path)
                if beat is not None:
                    found[path] = beat
        return found

    def stalled(self, now: float | None = None) -> str | None:
        """Why the run counts as stuck, or None while steps go on (or none has been taken yet:
        start-up is --timeout's to bound)."""
        now = time.monotonic() if now is None else now
        beats = self._beats()
        moved = any(self.steps.get(path) != steps for path, (steps, _, _) in beats.items())
        if moved:
            if self.moved_at is not None:
                self.slowest_s = max(self.slowest_s, now - self.moved_at)
            self.steps = {path: steps for path, (steps, _, _) in beats.items()}
            self.moved_at = now if any(self.steps.values()) else None
        if any(busy for _, _, busy in beats.values()) and self.moved_at is not None:
            self.moved_at = now  # trainadvisor's own work in a training process
        if self.moved_at is None:
            return None
        limit_s = self.limit_s or max(STALL_MIN_S, STALL_STEPS * self.slowest_s)
        idle_s = now - self.moved_at
        if idle_s <= limit_s:
            return None
        where = self._dump([pid for _, pid, _ in beats.values()])
        slowest = f"{self.slowest_s:.1f} s" if self.slowest_s >= 1 else f"{self.slowest_s * 1000:.0f} ms"
        return (
            f"no training step or batch for {idle_s:.0f} s (the longest gap before was {slowest}): "
            f"the script looks stuck and was stopped; {where}"
        )

    def _dump(self, pids: list[int]) -> str:
        """Each process's Python stacks, through faulthandler; where in the script each was."""
        signalled = False
        for pid in pids:
            if DUMP_SIGNAL is None:
                break
            try:
                os.kill(pid, DUMP_SIGNAL)
            except (ProcessLookupError, PermissionError):
                continue
            signalled = True
        if signalled:  # no process left to dump its stacks: nothing to wait for
            time.sleep(DUMP_WAIT_S)
        places, kept = [], []
        for pattern in self.stacks:
            for path in sorted(pattern.parent.glob(pattern.name)):
                dump = path.read_text(errors="replace")
                if not dump:
                    continue
                rank = re.search(r"rank(\d+)", path.name)
                who = f"rank {rank.group(1)}" if rank else "the script"
                place = innermost_script_frame(dump)
                places.append(f"{who} at {place}" if place else f"{who} outside the script's own code")
                kept.append(self._keep(path, dump))
        if not places:
            return "no Python stacks could be taken"
        return "; ".join(places) + f" (every thread's stack: {', '.join(kept)})"

    def _keep(self, path: Path, dump: str) -> str:
        try:
            self.keep_in.mkdir(parents=True, exist_ok=True)
            (self.keep_in / path.name).write_text(dump)
        except OSError:
            return str(path)
        return f"{self.keep_in.name}/{path.name}"


_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)', re.M)


def innermost_script_frame(dump: str, installed: tuple[str, ...] = ("site-packages", "/lib/python")) -> str:
    """The most recent frame outside installed packages in a faulthandler dump (the current
    thread's first), as `train.py:42 in step`."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump)
    blocks.sort(key=lambda block: not block.lstrip().startswith("Current thread"))
    for block in blocks:
        for frame in _FRAME.finditer(block):
            path = frame["file"]
            if path.startswith(PACKAGE) or any(marker in path for marker in installed):
                continue
            return f"{Path(path).name}:{frame['line']} in {frame['function']}"
    return ""


def dump_stacks_on_signal(path: str) -> None:
    """In a training process: every thread's Python stack into `path` when the parent asks."""
    import faulthandler

    if DUMP_SIGNAL is not None:
        faulthandler.register(DUMP_SIGNAL, file=open(path, "w"), all_threads=True)  # noqa: SIM115
