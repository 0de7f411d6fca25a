"""A trace that can only be read front to back (gzipped, or an object in storage) read as one
stream here and parsed on worker processes: this process inflates (`sources`: python-isal) and
cuts the stream at event boundaries into pieces of PIECE_BYTES; the workers decode the pieces
into columns, a few pieces in flight at a time, so memory holds the columns and a bounded number
of pieces, never the trace. The pieces' columns are joined in the stream's order.

The result is the one `stream.read_trace` gives in one process: the first events are read here
exactly as it reads them (so the times are measured from the same base), and the columns of a
piece do not depend on where it was cut. Whatever the pipeline cannot read as it expects (a cut
that does not parse, an event longer than a piece, a worker lost) returns None: the caller then
reads the trace in one process, which also says what is wrong with a damaged file."""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import IO, Any

from trainadvisor.analyze.read.columns import Pieces, Table, TableReader, join
from trainadvisor.analyze.read.sources import READ_ERRORS, Location, open_trace, shown
from trainadvisor.analyze.read.stream import (
    MAX_EVENT_BYTES,
    cut_after_event,
    metadata,
    read_piece,
    start_events,
    unreadable,
)

PIECE_BYTES = 4 << 20  # what a worker decodes at a time (larger pieces decode slower: caches)
IN_FLIGHT_PER_WORKER = 4  # pieces sent ahead of the results read: workers seldom wait, memory stays bounded

Parsed = tuple[Pieces, int, bytes]  # a piece's columns, its events, the text after the array (last piece)


def read_piped(
    location: Location, workers: int, context: Any, piece_bytes: int = PIECE_BYTES
) -> tuple[Table, dict[str, Any]] | None:
    """The trace's columns and top-level keys (with `_events`), its pieces parsed on `workers`
    processes started from `context` (a multiprocessing context); None where the caller must
    read it in one process (see the module's docstring)."""
    first = TableReader()
    try:
        with open_trace(location) as stream:
            started = start_events(stream, shown(location), first, lambda: first.base_us is not None)
            if started is None:
                return None
            head, buffer, events = started
            with ProcessPoolExecutor(workers, mp_context=context) as pool:
                parsed = _parsed_in_order(pool, _pieces(stream, buffer, piece_bytes), first.base_us, workers)
    except BrokenProcessPool:
        return None
    except READ_ERRORS as exc:
        raise unreadable(shown(location), exc) from None
    if parsed is None:
        return None
    results = [(first.pieces(), events, b""), *parsed]
    meta = metadata(head, results[-1][2])
    meta["_events"] = sum(count for _, count, _ in results)
    table = join([pieces for pieces, _, _ in results])
    return table, meta


def _pieces(stream: IO[bytes], buffer: bytes, piece_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """(piece, last?) from `buffer` (from an event's start) and the rest of the stream: whole
    events cut at `cut_after_event`, then the stream's end; a piece that finds no cut within
    MAX_EVENT_BYTES ends the pipeline (the single read refuses the event, naming its place)."""
    while block := stream.read(piece_bytes):
        buffer += block
        if len(buffer) < piece_bytes:
            continue
        cut = cut_after_event(buffer)
        if cut is None:
            if len(buffer) > piece_bytes + MAX_EVENT_BYTES:
                raise _CannotCut()
            continue
        piece, buffer = buffer[:cut], buffer[cut:].lstrip().lstrip(b",")
        yield piece, False
        del piece
    yield buffer, True


def _parsed_in_order(
    pool: ProcessPoolExecutor, pieces: Iterator[tuple[bytes, bool]], base_us: float | None, workers: int
) -> list[Parsed] | None:
    """Each piece's parse, in the stream's order, with at most IN_FLIGHT_PER_WORKER pieces per
    worker sent and not yet read back; None when a piece did not parse (or could not be cut)."""
    pending: deque[Future[Parsed | None]] = deque()
    parsed: list[Parsed] = []
    try:
        for piece, last in pieces:
            pending.append(pool.submit(_parse, piece, base_us, last))
            del piece
            while len(pending) >= IN_FLIGHT_PER_WORKER * workers or (last and pending):
                result = pending.popleft().result()
                if result is None:
                    return None
                parsed.append(result)
    except _CannotCut:
        return None
    finally:
        for future in pending:
            future.cancel()
    return parsed


class _CannotCut(Exception):
    """No event boundary within MAX_EVENT_BYTES of a piece's end."""


def _parse(piece: bytes, base_us: float | None, last: bool) -> Parsed | None:
    """In a worker: the piece's columns, measured from the trace's base time."""
    gc.disable()  # millions of short-lived acyclic objects (see kineto.analyze_trace)
    reader = TableReader(base_us)
    try:
        read = read_piece(piece, last, reader)
    except Exception:  # a piece nested too deep, say: the single read names the problem
        return None
    return None if read is None else (reader.pieces(), read[0], read[1])
