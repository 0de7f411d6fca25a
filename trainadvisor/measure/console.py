"""The script's error stream, passed on as it comes without the profiler's own chatter.

Kineto prints `USDT:... profiler_start` / `profiler_stop` and `STAGE:... Completed Stage` lines
to stderr whatever its log level; they say nothing to the user and bury the script's output.
The child's stderr is read from a pipe and copied byte for byte, as it arrives (a progress
bar's `\\r` updates are not held back), except whole lines in Kineto's format with those
prefixes. Kineto's warnings and errors (`W`, `ERROR:`) pass."""

from __future__ import annotations

import os
import re
import threading
import warnings
from typing import IO

NOISE = re.compile(rb"(?:USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] [^\n]*\n")
_PREFIXES = (b"USDT:", b"STAGE:")
_HOLD_BYTES = 4096  # a line starting like noise is held until its end, up to this


class NoiseFilter:
    """Bytes in, bytes out, with Kineto's chatter lines left out; state across chunks."""

    def __init__(self) -> None:
        self.pending = b""  # the start of a line that may be noise
        self.line_start = True

    def feed(self, data: bytes) -> bytes:
        data, self.pending = self.pending + data, b""
        out = []
        while data:
            if not self.line_start:
                end = data.find(b"\n")
                if end < 0:
                    out.append(data)
                    break
                out.append(data[: end + 1])
                data, self.line_start = data[end + 1 :], True
                continue
            if not _may_be_noise(data):
                self.line_start = False
                continue
            end = data.find(b"\n")
            if end < 0:
                if len(data) < _HOLD_BYTES:
                    self.pending = data
                else:
                    out.append(data)
                    self.line_start = False
                break
            line, data = data[: end + 1], data[end + 1 :]
            if not NOISE.fullmatch(line):
                out.append(line)
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest


def _may_be_noise(data: bytes) -> bool:
    return any(data.startswith(p) or p.startswith(data) for p in _PREFIXES)


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
