"""A trace file into columns: a large uncompressed trace is cut at event boundaries and its parts
read by worker processes, one per core, each building columns of its part; the parts' columns
are then joined (names and threads re-interned). Decoding JSON is most of the cost, and it is
the part that spreads over cores. Compressed and small traces are read in this process."""

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

from trainadvisor.analyze.columns import Pieces, Table, TableReader, join
from trainadvisor.analyze.stream import read_range, read_trace, split_points

T = TypeVar("T")
PARALLEL_MIN_BYTES = 96 << 20  # below this, starting workers costs more than they save


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def on_workers(workers: int, function: Callable[..., T], *arguments: list[Any]) -> list[T] | None:
    """`function` over the arguments on `workers` processes (forked on Linux, so they start at
    once); None when a worker was killed (out of memory, say): the caller then does the work
    in this process."""
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    try:
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            return list(pool.map(function, *arguments))
    except BrokenProcessPool:
        return None


def read_table(path: Path, workers: int | None = None) -> tuple[Table, dict[str, Any]]:
    """The trace's columns and its top-level keys (with `_events`, the events read)."""
    workers = workers or min(cores(), 8)
    split = None
    if workers > 1 and path.is_file() and path.stat().st_size >= PARALLEL_MIN_BYTES:
        split = split_points(path, workers)
    if split is not None:
        read = _read_in_parts(path, *split)
        if read is not None:
            return read
    reader = TableReader()
    meta = read_trace(path, reader)
    table = reader.table()
    _return_freed_memory()
    return table, meta


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
