"""A trace file into columns: a large uncompressed trace is cut at event boundaries and its parts
read by worker processes, one per core, each building columns of its part; the parts' columns
are then joined (names and threads re-interned). Decoding JSON is most of the cost, and it is
the part that spreads over cores. A large gzipped trace, or one in object storage, can only be
read front to back: it is read here and parsed on the workers as it streams (`pipeline`).
Small traces are read in this process."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

from trainadvisor.analyze.read.columns import Pieces, Table, TableReader, join
from trainadvisor.analyze.read.pipeline import read_piped
from trainadvisor.analyze.read.sources import Location, file_name, is_url, size_bytes
from trainadvisor.analyze.read.stream import read_range, read_trace, split_points

T = TypeVar("T")
PARALLEL_MIN_BYTES = 96 << 20  # below this, starting workers costs more than they save
# The same for a gzipped trace's size on disk (traces compress about 10 times; 4 MB of
# gzipped HTA trace takes 1 s in one process): streamed to the workers from this size on.
PIPED_MIN_GZIP_BYTES = 8 << 20


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def on_workers(workers: int, function: Callable[..., T], *arguments: list[Any]) -> list[T] | None:
    """`function` over the arguments on `workers` processes (forked on Linux, so they start at
    once); None when a worker was killed (out of memory, say): the caller then does the work
    in this process."""
    try:
        with ProcessPoolExecutor(workers, mp_context=_context()) as pool:
            return list(pool.map(function, *arguments))
    except BrokenProcessPool:
        return None


def _context() -> Any:
    return multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")


def read_table(
    location: Location, workers: int | None = None, piped_min_gzip_bytes: int | None = None
) -> tuple[Table, dict[str, Any]]:
    """The trace's columns and its top-level keys (with `_events`, the events read).
    `location`: a path or a URL (`sources`); `piped_min_gzip_bytes`: the size from which a
    gzipped trace is streamed to workers (PIPED_MIN_GZIP_BYTES)."""
    workers = workers or min(cores(), 8)
    read = None
    if workers > 1 and _piped(location, piped_min_gzip_bytes):
        read = read_piped(location, workers, _context())
        _return_freed_memory()
    elif workers > 1 and isinstance(location, Path) and _large(location):
        split = split_points(location, workers)
        read = _read_in_parts(location, *split) if split is not None else None
    if read is not None:
        return read
    reader = TableReader()
    meta = read_trace(location, reader)
    table = reader.table()
    _return_freed_memory()
    return table, meta


def _large(path: Path) -> bool:
    return path.is_file() and path.stat().st_size >= PARALLEL_MIN_BYTES


def _piped(location: Location, min_gzip_bytes: int | None) -> bool:
    """Whether the trace is read as a stream parsed on workers: a large gzipped file, or a
    large object in storage (compressed or not: a URL is read front to back either way)."""
    if min_gzip_bytes is None:
        min_gzip_bytes = PIPED_MIN_GZIP_BYTES
    if is_url(location):
        gzipped = file_name(location).endswith(".gz")
        return size_bytes(str(location)) >= (min_gzip_bytes if gzipped else PARALLEL_MIN_BYTES)
    path = Path(location)
    if not path.is_file() or path.stat().st_size < min_gzip_bytes:
        return False
    with open(path, "rb") as probe:
        return probe.read(2) == b"\x1f\x8b"


def _read_in_parts(path: Path, cuts: list[int], meta: dict[str, Any]) -> tuple[Table, dict[str, Any]] | None:
    parts = len(cuts) - 1
    results = on_workers(parts, _read_part, [path] * parts, cuts[:-1], cuts[1:])
    if results is None:
        return None
    events = 0
    for _, part_meta in results:
        events += part_meta.pop("_events", 0)
        meta.update(part_meta)
    meta["_events"] = events
    table = join([pieces for pieces, _ in results])
    del results
    _return_freed_memory()
    return table, meta


def _read_part(path: Path, start: int, end: int) -> tuple[Pieces, dict[str, Any]]:
    import gc

    gc.disable()  # millions of short-lived acyclic objects (see kineto.analyze_trace)
    reader = TableReader()
    meta = read_range(path, start, end, reader)
    return reader.pieces(), meta


def _return_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc keeps them otherwise, and the
    analysis after reading would count on top of them)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
