"""A trace file into columns: a large uncompressed trace is cut at event boundaries and its parts
read by worker processes, one per core, each building columns of its part; the parts' columns
are then joined (names and threads re-interned). Decoding JSON is most of the cost, and it is
the part that spreads over cores. Compressed and small traces are read in this process."""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np

from trainadvisor.analysis.columns import Table, TableReader
from trainadvisor.analysis.stream import read_range, read_trace, split_points

PARALLEL_MIN_BYTES = 96 << 20  # below this, starting workers costs more than they save
_COLUMNS = ("kind", "ts", "dur", "name", "tid", "corr", "ext")


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def read_table(path: Path, workers: int | None = None) -> tuple[Table, dict[str, Any]]:
    """The trace's columns and its top-level keys (with `_events`, the events read)."""
    workers = workers or min(cores(), 8)
    split = None
    if workers > 1 and path.is_file() and path.stat().st_size >= PARALLEL_MIN_BYTES:
        split = split_points(path, workers)
    if split is not None:
        cuts, meta = split
        try:
            return _read_in_parts(path, cuts, meta)
        except BrokenProcessPool:  # a worker was killed (memory): read it here instead
            pass
    reader = TableReader()
    meta = read_trace(path, reader)
    return reader.table(), meta


def _read_in_parts(path: Path, cuts: list[int], meta: dict[str, Any]) -> tuple[Table, dict[str, Any]]:
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    parts = len(cuts) - 1
    with ProcessPoolExecutor(parts, mp_context=context) as pool:
        results = list(pool.map(_read_part, [path] * parts, cuts[:-1], cuts[1:]))
    events = 0
    for _, part_meta in results:
        events += part_meta.pop("_events", 0)
        meta.update(part_meta)
    meta["_events"] = events
    return join([table for table, _ in results]), meta


def _read_part(path: Path, start: int, end: int) -> tuple[Table, dict[str, Any]]:
    import gc

    gc.disable()  # millions of short-lived acyclic objects (see kineto.analyze_trace)
    reader = TableReader()
    meta = read_range(path, start, end, reader)
    return reader.table(), meta


def join(tables: list[Table]) -> Table:
    """One table of several parts' rows, in order; each column is joined and its parts freed
    before the next, so memory holds the rows about once."""
    names: dict[str, int] = {}
    tids: dict[Any, int] = {}
    name_maps = [np.array([names.setdefault(n, len(names)) for n in t.names], np.int32) for t in tables]
    tid_maps = [np.array([tids.setdefault(x, len(tids)) for x in t.tids], np.int32) for t in tables]
    offsets = np.cumsum([0] + [len(t.kind) for t in tables]).tolist()
    columns: dict[str, np.ndarray] = {}
    for column in _COLUMNS:
        pieces = []
        for i, t in enumerate(tables):
            piece = getattr(t, column)
            if column == "name" and len(name_maps[i]):
                piece = name_maps[i][piece]
            elif column == "tid" and len(tid_maps[i]):
                piece = tid_maps[i][piece]
            pieces.append(piece)
            setattr(t, column, None)
        columns[column] = np.concatenate(pieces)
        del pieces
    joined = Table(**columns, names=list(names), tids=list(tids))
    for t, offset in zip(tables, offsets):
        joined.copy_bytes.update({row + offset: n for row, n in t.copy_bytes.items()})
        joined.op_precision.update(t.op_precision)
        for peak in ("peak_allocated", "peak_reserved"):
            value = getattr(t, peak)
            if value is not None:
                setattr(joined, peak, max(getattr(joined, peak) or 0.0, value))
    return joined
