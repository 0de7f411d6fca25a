"""The script's error stream, passed on as it comes without the profiler's own chatter.

Kineto prints `USDT:... profiler_start` / `profiler_stop` and `STAGE:... Completed Stage` lines
to stderr whatever its log level; they say nothing to the user and bury the script's output.
The child's stderr is read from a pipe and copied byte for byte, as it arrives (a progress
bar's `\\r` updates are not held back), except Kineto's lines in its format with those
prefixes: from the prefix to the line's end, wherever the prefix starts (after a progress bar's
update, which ends without a newline, it starts mid-line). Kineto's warnings and errors (`W`,
`ERROR:`) pass."""

from __future__ import annotations

import os
import re
import threading
import warnings
from pathlib import Path
from typing import IO, Protocol

NOISE = re.compile(rb"(?:USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] [^\n]*\n")
_PREFIXES = (b"USDT:", b"STAGE:")
_PREFIX = re.compile(b"|".join(_PREFIXES))
_HOLD_BYTES = 4096  # what starts like noise is held until its line's end, up to this


class NoiseFilter:
    """Bytes in, bytes out, with Kineto's chatter left out; state across chunks."""

    def __init__(self) -> None:
        self.pending = b""  # what may be the start of noise
        self.passing = False  # the held bytes turned out not to be noise: pass them on

    def feed(self, data: bytes) -> bytes:
        data, self.pending = self.pending + data, b""
        out = []
        while data:
            if self.passing:  # a long line that only started like noise: on to its end
                end = data.find(b"\n")
                out.append(data if end < 0 else data[: end + 1])
                data, self.passing = (b"", True) if end < 0 else (data[end + 1 :], False)
                continue
            found = _PREFIX.search(data)
            if found is None:
                keep = _partial_prefix(data)  # `USD` at the chunk's end: held for the next
                out.append(data[: len(data) - keep])
                self.pending = data[len(data) - keep :]
                break
            out.append(data[: found.start()])
            data = data[found.start() :]
            end = data.find(b"\n")
            if end < 0:
                if len(data) < _HOLD_BYTES:
                    self.pending = data
                else:
                    out.append(data)
                    self.passing = True
                break
            line, data = data[: end + 1], data[end + 1 :]
            if not NOISE.fullmatch(line):
                prefix = len(found[0])
                out.append(line[:prefix])
                data = line[prefix:] + data  # another prefix may follow in the line
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest


def _partial_prefix(data: bytes) -> int:
    """How many of `data`'s last bytes begin a prefix (0 when none do)."""
    for size in range(min(len(data), max(map(len, _PREFIXES)) - 1), 0, -1):
        if any(p.startswith(data[-size:]) for p in _PREFIXES):
            return size
    return 0


class Sink(Protocol):
    """Where forwarded output goes: a binary stream, or the run's capped log."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


def forward(source: IO[bytes], target: Sink, filtered: bool = True) -> threading.Thread:
    """Copy `source` to `target` on a daemon thread, until end of file; through a NoiseFilter
    where `filtered` (the script's stderr: Kineto's chatter), as it is where not (its stdout)."""

    # into the log that both streams share, whole lines only: another stream's line never lands
    # inside one of this stream's (a line is held until its end, or PENDING_BYTES of it)
    lines = _Lines() if isinstance(target, CappedLog) else None

    def copy() -> None:
        noise, shown = NoiseFilter() if filtered else None, True
        fd = source.fileno()
        try:
            while chunk := os.read(fd, 65536):  # read on to the end even when nothing can be shown,
                data = noise.feed(chunk) if noise else chunk
                shown = shown and _write(target, lines.feed(data) if lines else data)  # or it blocks
            if shown:
                rest = noise.flush() if noise is not None else b""
                _write(target, lines.feed(rest) + lines.flush() if lines else rest)
        except OSError:
            pass
        finally:
            source.close()

    name = "trainadvisor-stderr" if filtered else "trainadvisor-stdout"
    thread = threading.Thread(target=copy, name=name, daemon=True)
    thread.start()
    return thread


PENDING_BYTES = 65536


class _Lines:
    """A stream's bytes handed on in whole lines: what follows its last newline is held."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, data: bytes) -> bytes:
        self.pending += data
        end = self.pending.rfind(b"\n") + 1
        if not end and len(self.pending) < PENDING_BYTES:
            return b""
        end = end or len(self.pending)  # a line that never ends (a progress bar): handed on as it is
        whole, self.pending = self.pending[:end], self.pending[end:]
        return whole

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest


# A script's log keeps the first and the last this many bytes of what it printed, the middle
# cut with a line that says how much: a script that prints a gigabyte (a progress bar that never
# ends its line, a debug dump) filled 490 MB of a report folder.
LOG_HEAD_BYTES = 16 * 2**20
LOG_TAIL_BYTES = 16 * 2**20


class CappedLog:
    """A log file that keeps the first LOG_HEAD_BYTES and the last LOG_TAIL_BYTES written to it
    (the tail held in memory until `close`), and says how much was cut between them. Written to
    from the threads that forward the script's stdout and stderr."""

    def __init__(
        self, path: Path, head_bytes: int = LOG_HEAD_BYTES, tail_bytes: int = LOG_TAIL_BYTES
    ) -> None:
        self.file = open(path, "wb")
        self.name = str(path)
        self._lock = threading.Lock()
        self._head_left, self._tail_bytes = head_bytes, tail_bytes
        self._tail = bytearray()
        self.cut_bytes = 0

    def write(self, data: bytes) -> int:
        with self._lock:
            if self.file.closed:
                raise ValueError("the log is closed")
            rest = data
            if self._head_left > 0:
                head = rest[: self._head_left]
                self.file.write(head)
                self._head_left -= len(head)
                rest = rest[len(head) :]
            if rest:
                self._tail += rest
                extra = len(self._tail) - self._tail_bytes
                if extra > 0:
                    del self._tail[:extra]
                    self.cut_bytes += extra
        return len(data)

    def flush(self) -> None:
        with self._lock:
            if not self.file.closed:
                self.file.flush()

    def close(self) -> None:
        with self._lock:
            if self.file.closed:
                return
            try:
                if self.cut_bytes:
                    self.file.write(
                        f"\n[trainadvisor: {self.cut_bytes:,} bytes of the script's output cut here; the log "
                        "keeps its first and last 16 MiB]\n".encode()
                    )
                self.file.write(bytes(self._tail))
            finally:
                self.file.close()


def _write(target: Sink, data: bytes) -> bool:
    """False once the target cannot take more (closed, or its disk is full)."""
    try:
        if data:
            target.write(data)
            target.flush()
    except (OSError, ValueError):
        return False
    return True


def quiet_numpy_warning() -> None:
    """torch warns at import when numpy cannot be loaded ("Failed to initialize NumPy"), a line
    on every run that says nothing about the script; trainadvisor's own analysis, which needs
    numpy, says so itself where it runs."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
