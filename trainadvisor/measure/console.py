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
from typing import IO

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


def forward(source: IO[bytes], target: IO[bytes]) -> threading.Thread:
    """Copy `source` to `target` through a NoiseFilter on a daemon thread, until end of file."""

    def copy() -> None:
        noise, shown = NoiseFilter(), True
        fd = source.fileno()
        try:
            while chunk := os.read(fd, 65536):  # read on to the end even when nothing can be shown,
                shown = shown and _write(target, noise.feed(chunk))  # or the script would block
            if shown:
                _write(target, noise.flush())
        except OSError:
            pass
        finally:
            source.close()

    thread = threading.Thread(target=copy, name="trainadvisor-stderr", daemon=True)
    thread.start()
    return thread


def _write(target: IO[bytes], data: bytes) -> bool:
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
