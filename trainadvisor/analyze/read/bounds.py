"""Bounds on what reading an input may cost: files that never end (a named pipe, a device) are
refused before they are opened, and compressed files (a .json.gz trace, an archive) are read
only up to a multiple of their size on disk, so a compression bomb is refused once that much is
decompressed, not after it all is."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Protocol

from trainadvisor.errors import UsageError

# Kineto traces compress 10 to 30 times (gzip: 4x to 30x over the real traces in ../shared and
# tests/data); a compressed trace or archive that expands more than this many times its size is
# a bomb. The floor keeps small files of any ratio readable.
EXPANSION_RATIO = 100
EXPANSION_FLOOR_BYTES = 64 << 20

_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def refuse_special(path: Path) -> None:
    """A UsageError for a named pipe, a device or a socket, before it is opened: opening a
    pipe waits for a writer, and reading one or a device may never end."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # missing: said where it is opened
    for kind, what in _SPECIAL_FILES:
        if kind(mode):
            raise UsageError(
                f"{path}: {what}, not a trace file; trainadvisor reads only regular files (a pipe or a "
                "device may never end): write the trace to a file and pass that"
            )


def regular_file(path: Path) -> bool:
    """Whether `path` (a link followed) is a regular file; a UsageError for a special one."""
    refuse_special(path)
    return path.is_file()


def expansion_limit_bytes(compressed_bytes: int) -> int:
    """The most a compressed file of this size may expand to (EXPANSION_RATIO)."""
    return max(EXPANSION_FLOOR_BYTES, EXPANSION_RATIO * compressed_bytes)


def too_expanded(path: Path | str, what: str, limit_bytes: int, verdict: str) -> UsageError:
    return UsageError(
        f"{path}: {what} past {limit_bytes >> 20} MB, more than {EXPANSION_RATIO} times its size on "
        f"disk (traces compress 10 to 30 times): {verdict}"
    )


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class Capped:
    """A decompressing stream that stops with `refusal` once it has yielded more than
    `limit_bytes`: a bomb is refused after the limit is decompressed, not after it all is.
    `source`: the compressed stream under it, closed with it."""

    def __init__(
        self, stream: Readable, limit_bytes: int, refusal: UsageError, source: Readable | None = None
    ) -> None:
        self._stream, self._limit_bytes, self._refusal = stream, limit_bytes, refusal
        self._source = source
        self._read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        left = self._limit_bytes - self._read_bytes + 1  # one past the limit tells it was passed
        block = self._stream.read(left if size < 0 else min(size, left))
        self._read_bytes += len(block)
        if self._read_bytes > self._limit_bytes:
            raise self._refusal
        return block

    def close(self) -> None:
        self._stream.close()
        if self._source is not None:
            self._source.close()

    def __enter__(self) -> Capped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
