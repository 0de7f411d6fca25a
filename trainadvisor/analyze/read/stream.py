"""Streaming reader of Kineto (torch.profiler) Chrome traces, in bounded memory.

The file (`.json` or `.json.gz`) is read in blocks. The `traceEvents` array is cut into chunks
at `}, {` boundaries and each chunk is decoded with msgspec into small typed structs, keeping
only the fields the analysis uses; a cut that falls inside a string or a nested object makes the
chunk fail to parse, and the chunk is then extended, so a successful parse is always a correct
cut. The events of a chunk are handed to a callback and dropped: memory stays at a few blocks
plus whatever the callback keeps. The bytes come from `sources` (a file or a URL, inflated where
gzipped); `pipeline` reads a large gzipped trace with the pieces below parsed on workers."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from trainadvisor.analyze.read.kineto_json import (
    LONE_SURROGATE_HINT,
    kineto_json,
    kineto_spelling,
    lenient_loads,
)
from trainadvisor.analyze.read.sources import READ_ERRORS, Location, open_trace, shown
from trainadvisor.errors import UsageError

BLOCK_BYTES = 4 << 20
# No event torch.profiler writes comes near this; a trace whose event does not end within it is
# damaged or hostile (a gzip "bomb" of one endless string) and is refused before memory grows.
MAX_EVENT_BYTES = 32 << 20
HEAD_BYTES = 4 * BLOCK_BYTES  # the keys before the event array are read within this
_CUT = re.compile(rb"\}\s*,\s*\Z")  # `}, ` just before an event's `{`
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')


class Args(msgspec.Struct, gc=False):
    """The arguments the analysis reads, typed so that columns can be taken without Python code
    per event; a chunk with other types (a string id) is read loosely (`_loose`)."""

    correlation: int = -1
    bytes: int = 0
    total_allocated: float = msgspec.field(name="Total Allocated", default=-1.0)  # memory events
    total_reserved: float = msgspec.field(name="Total Reserved", default=-1.0)
    device_type: int = msgspec.field(name="Device Type", default=-1)
    # The op a kernel or runtime call belongs to; 2021-era traces spell it in lower case.
    external_id: int = msgspec.field(name="External id", default=-1)
    external_id_2021: int = msgspec.field(name="external id", default=-1)
    input_type: Any = msgspec.field(name="Input type", default=None)  # with record_shapes
    device: int = -1  # the GPU a kernel, copy or memset ran on
    # An op's shapes and scalar arguments (record_shapes), kept undecoded: only the few ops whose
    # FLOPs they give are decoded (`trace_flops`). `flops`: an op's FLOPs where a tool wrote them
    # (torch.profiler's with_flops counts them, but its Chrome trace export writes none).
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw())
    concrete_inputs: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=msgspec.Raw())
    flops: float = -1.0
    # A collective's process group (NCCL kernels and record_param_comms, torch 2.2+)
    pg_name: str = msgspec.field(name="Process Group Name", default="")
    pg_desc: str = msgspec.field(name="Process Group Description", default="")
    group_size: int = msgspec.field(name="Group size", default=-1)
    # A copy's size on the call that launched it, where its device event has no `bytes` (ROCm's
    # hipMemcpy* calls write "size": "2560")
    size: Any = None


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    tid: Any = None
    args: Args = msgspec.field(default_factory=Args)


_decode_events = msgspec.json.Decoder(list[Event]).decode


def _int(value: Any, default: int = -1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _number(value: Any) -> float:
    usable = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if usable else -1.0


def _loose_args(args: dict[str, Any]) -> Args:
    return Args(
        correlation=_int(args.get("correlation")),
        bytes=_int(args.get("bytes"), 0),
        total_allocated=_number(args.get("Total Allocated")),
        total_reserved=_number(args.get("Total Reserved")),
        device_type=_int(args.get("Device Type")),
        external_id=_int(args.get("External id")),
        external_id_2021=_int(args.get("external id")),
        input_type=args.get("Input type"),
        device=_int(args.get("device")),
        input_dims=_raw(args.get("Input Dims")),
        concrete_inputs=_raw(args.get("Concrete Inputs")),
        flops=_number(args.get("flops")),
        pg_name=_text(args.get("Process Group Name")),
        pg_desc=_text(args.get("Process Group Description")),
        group_size=_int(args.get("Group size")),
        size=args.get("size"),
    )


def _text(value: Any) -> str:
    return value[:200] if isinstance(value, str) else "" if value is None else str(value)[:200]


def _raw(value: Any) -> msgspec.Raw:
    return msgspec.Raw() if value is None else msgspec.Raw(msgspec.json.encode(value))


def _loose(items: Any) -> list[Event]:
    """Events from decoded JSON items whose fields have unexpected types (a string `ts`, say)
    or values (Kineto's `inf` and `nan`: an event without a finite start is dropped, one
    without a finite duration has none)."""
    events = []
    for item in items:
        if not isinstance(item, dict):
            continue
        try:
            args: dict[str, Any] = item["args"] if isinstance(item.get("args"), dict) else {}
            ts, dur = float(item.get("ts", 0.0)), float(item.get("dur", 0.0) or 0.0)
            if not math.isfinite(ts):
                continue
            events.append(
                Event(
                    ph=str(item.get("ph", "")),
                    cat=str(item.get("cat", "")),
                    name=str(item.get("name", "")),
                    ts=ts,
                    dur=dur if math.isfinite(dur) else 0.0,
                    tid=item.get("tid"),
                    args=_loose_args(args),
                )
            )
        except (TypeError, ValueError):
            continue  # an event with a non-numeric time is unusable; skip it
    return events


def _decode(raw: bytes) -> list[Event]:
    """Events of a chunk; msgspec.DecodeError when the chunk is not a JSON array of events.
    Strict JSON is read by msgspec alone; what Kineto writes that JSON has not (see
    `kineto_json`) is read by a slower path, taken only where msgspec stopped on it."""
    try:
        return _decode_events(raw)
    except RecursionError:
        raise _TooDeep() from None
    except msgspec.ValidationError:
        return _loose(_items(raw, lenient=LONE_SURROGATE_HINT.search(raw) is not None))
    except msgspec.DecodeError as exc:
        if not kineto_spelling(raw, str(exc)):
            raise  # a wrong cut, or a damaged file
        return _loose(_items(raw, lenient=True))
    except UnicodeDecodeError:  # a name cut inside a character, say
        return _loose(_items(raw, lenient=True))


def _items(raw: bytes, lenient: bool) -> list[Any]:
    """The JSON array `raw`, decoded by Python's json (which reads NaN and Infinity);
    `lenient`: after `kineto_json`. msgspec.DecodeError when it is not a JSON array."""
    try:
        items = json.loads(kineto_json(raw.decode("utf-8", "replace")) if lenient else raw)
    except RecursionError:
        raise _TooDeep() from None
    except ValueError as exc:
        if not lenient:
            return _items(raw, lenient=True)
        raise msgspec.DecodeError(str(exc)) from None  # malformed (a wrong cut): say so alike
    if not isinstance(items, list):
        raise msgspec.DecodeError("not an array") from None
    return items


class _TooDeep(Exception):
    """An event nested deeper than a decoder's recursion limit (a hostile file)."""


def _refused(path: Location, what: str, offset: int) -> UsageError:
    return UsageError(
        f"{path}: {what} at byte {offset}; torch.profiler writes no such trace: the file is damaged "
        "or was not made by a profiler, and is not read further"
    )


def _too_deep(path: Location) -> UsageError:
    return UsageError(
        f"{path}: an event nested deeper than any trace's (thousands of arrays or objects in one "
        "another); the file is damaged or was not made by a profiler, and is not read further"
    )


def _blocks(stream: IO[bytes]) -> Iterator[bytes]:
    while block := stream.read(BLOCK_BYTES):
        yield block


def read_trace(location: Location, on_events: Callable[[list[Event]], None]) -> dict[str, Any]:
    """Feed every event of the trace (a path or a URL, `sources`) to `on_events` in chunks;
    return the trace's other top-level keys (deviceProperties, distributedInfo, ...)."""
    where = shown(location)
    try:
        with open_trace(location) as stream:
            return _read(stream, on_events, where)
    except _TooDeep:
        raise _too_deep(where) from None
    except READ_ERRORS as exc:
        raise unreadable(where, exc) from None


def unreadable(where: str, exc: BaseException) -> UsageError:
    return UsageError(f"{where}: cannot read the trace ({exc}); is the file complete?")


def _read(stream: IO[bytes], on_events: Callable[[list[Event]], None], path: str) -> dict[str, Any]:
    blocks = _blocks(stream)
    found = _array_start(blocks, path)
    if isinstance(found, bytes):
        return _whole_document(found, path, on_events)
    head, rest, offset = found
    return _events_to_end(blocks, rest, on_events, path, head, offset)


def _array_start(blocks: Iterator[bytes], path: str) -> tuple[bytes, bytes, int] | bytes:
    """(the keys before the event array, what follows its `[` in the blocks read, the offset of
    that), or the whole document where it ends before any such array."""
    buffer = b""
    for block in blocks:
        buffer += block
        if buffer.lstrip()[:1] == b"[":  # a bare event array
            rest = buffer.lstrip()[1:]
            return b"", rest, len(buffer) - len(rest)
        match = _ARRAY_START.search(buffer)
        if match:
            return buffer[: match.start()], buffer[match.end() :], match.end()
        if len(buffer) > HEAD_BYTES:
            raise UsageError(
                f'{path}: no "traceEvents" list in its first {HEAD_BYTES >> 20} MB; not a profiler '
                "trace (write traces with torch.profiler's export_chrome_trace or tensorboard_trace_handler)"
            )
    return buffer


def _events_to_end(
    blocks: Iterator[bytes],
    buffer: bytes,
    on_events: Callable[[list[Event]], None],
    path: Location,
    head: bytes,
    offset: int,
) -> dict[str, Any]:
    """The events from `buffer` (at byte `offset` of the file) and `blocks` to the end of the
    array, and the keys after it."""
    buffer, events = _whole_events(blocks, buffer, on_events, path, offset)
    last = read_piece(buffer, True, on_events)
    if last is None:
        raise UsageError(f"{path}: the trace's event list is cut off or malformed; is the file complete?")
    meta = metadata(head, last[1])
    meta["_events"] = events + last[0]
    return meta


# ---- a stream cut into pieces here, parsed in other processes (`pipeline`) ----


def start_events(
    stream: IO[bytes], path: str, on_events: Callable[[list[Event]], None], enough: Callable[[], bool]
) -> tuple[bytes, bytes, int] | None:
    """Read the trace's first events as `read_trace` does (the same blocks, the same cuts),
    feeding them to `on_events` until `enough()`: (the keys before the event array, the bytes
    read and not yet decoded, from an event's start, the events fed). None for a document
    without an event array, or too short to be worth cutting: `read_trace` reads it whole."""
    blocks = _blocks(stream)
    found = _array_start(blocks, path)
    if isinstance(found, bytes):
        return None
    head, rest, offset = found
    try:
        buffer, events = _whole_events(blocks, rest, on_events, path, offset, enough)
    except _TooDeep:
        raise _too_deep(path) from None
    return head, buffer, events


def cut_after_event(buffer: bytes) -> int | None:
    """Where `buffer` (events, from an event's start) may be cut after a whole event: after the
    event that ends at one of its last `}, {` boundaries and decodes alone as an event (a
    boundary inside a string never does: its slice would end inside that string). None where
    no boundary near the end is one."""
    boundaries = [*_boundaries(buffer, 9), (-1, len(buffer) - len(buffer.lstrip()))]
    for (end, _), (_, start) in zip(boundaries, boundaries[1:]):
        if _event_at(buffer[start : end + 1]) is not None:
            return end + 1
    return None


def _event_at(raw: bytes) -> dict[str, Any] | None:
    """`raw` decoded as one trace event (an object with "ph"); None where it is not one (a slice
    cut at a boundary inside a string or a nested object)."""
    try:
        event = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    return event if isinstance(event, dict) and "ph" in event else None


def read_piece(
    piece: bytes, final: bool, on_events: Callable[[list[Event]], None]
) -> tuple[int, bytes] | None:
    """Feed the events of a piece cut by `cut_after_event`, or with `final` of the stream's end
    (its last events, `]` and the keys after the array) to `on_events`: (the events fed, the
    text after the array). None where the piece does not parse (a wrong cut, a damaged file)."""
    if not final:
        try:
            return _feed(_decode(b"[" + piece + b"]"), on_events), b""
        except msgspec.DecodeError:
            return None
    events = 0
    while True:  # leave only the last event for the final cut, which tries `]` by `]`
        piece, decoded = _drain(piece, final=False)
        if not decoded:
            break
        events += _feed(decoded, on_events)
    tail, decoded = _drain(piece, final=True)
    return None if decoded is None else (events + _feed(decoded, on_events), tail)


# ---- reading an uncompressed trace in parts, one per worker process ----

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def split_points(path: Path, parts: int) -> tuple[list[int], dict[str, Any]] | None:
    """Byte offsets that cut an uncompressed trace's event array into `parts` ranges at event
    starts ([first event, cut, ..., end of file]) and the keys before the array; None for a
    compressed file or one where no clean cut is found (it is then read whole)."""
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    match = _ARRAY_START.search(head)
    if head[:2] == b"\x1f\x8b" or match is None:
        return None
    size = path.stat().st_size
    cuts = [match.end()]
    for k in range(1, parts):
        cut = _event_start(path, cuts[0] + (size - cuts[0]) * k // parts)
        if cut is None or cut <= cuts[-1]:
            return None
        cuts.append(cut)
    return [*cuts, size], metadata(head[: match.start()], b"")


def _event_start(path: Path, offset: int) -> int | None:
    """The first offset at or after `offset` where an event of the array starts: a `{` after
    `}, ` whose object, up to the next such boundary, decodes to an event (with "ph")."""
    with open(path, "rb") as f:
        f.seek(offset)
        window = f.read(BLOCK_BYTES)
    for found in _BOUNDARY.finditer(window):
        start = found.end() - 1
        following = _BOUNDARY.search(window, found.end())
        if following is None:
            return None
        event = _event_at(window[start : following.start() + 1])
        if event is not None and ("ts" in event or "name" in event):
            return offset + start
    return None


def read_range(path: Path, start: int, end: int, on_events: Callable[[list[Event]], None]) -> dict[str, Any]:
    """The events in [start, end) of an uncompressed trace (offsets from `split_points`); the
    range that ends the file also returns the keys after the array."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            if end >= path.stat().st_size:
                return _events_to_end(_blocks(f), b"", on_events, path, b"", start)
            return _events_within(_bounded(f, end - start), on_events, path, start)
    except _TooDeep:
        raise _too_deep(path) from None
    except OSError as exc:
        raise unreadable(str(path), exc) from None


def _bounded(stream: IO[bytes], length: int) -> Iterator[bytes]:
    while length > 0 and (block := stream.read(min(BLOCK_BYTES, length))):
        length -= len(block)
        yield block


def _events_within(
    blocks: Iterator[bytes], on_events: Callable[[list[Event]], None], path: Location, offset: int
) -> dict[str, Any]:
    buffer, events = _whole_events(blocks, b"", on_events, path, offset)
    rest = buffer.rstrip().rstrip(b",")
    if rest:
        try:
            events += _feed(_decode(b"[" + rest + b"]"), on_events)
        except msgspec.DecodeError:
            raise UsageError(f"{path}: the trace's event list is malformed; is the file complete?") from None
    return {"_events": events}


def _whole_events(
    blocks: Iterator[bytes],
    buffer: bytes,
    on_events: Callable[[list[Event]], None],
    path: Location,
    offset: int,
    enough: Callable[[], bool] = lambda: False,
) -> tuple[bytes, int]:
    """Feed the events that end before each block's clean cut; return what is left undecoded
    after the last block (or once `enough()`), and how many events were fed. `offset`: where
    `buffer` starts in the file; an event that does not end within MAX_EVENT_BYTES of it is
    refused."""
    events = 0
    for block in blocks:
        buffer += block
        before = len(buffer)
        buffer, decoded = _drain(buffer, final=False)
        offset += before - len(buffer)
        if len(buffer) > MAX_EVENT_BYTES:
            raise _refused(path, f"an event larger than {MAX_EVENT_BYTES >> 20} MB", offset)
        events += _feed(decoded or [], on_events)
        if enough():
            break
    return buffer, events


def _feed(events: list[Event], on_events: Callable[[list[Event]], None]) -> int:
    if events:
        on_events(events)
    return len(events)


def _drain(buffer: bytes, final: bool) -> tuple[bytes, list[Event] | None]:
    """Decode as many whole events from the front of `buffer` as a clean cut allows.
    Returns (the undecoded rest, the events); with `final`, the rest is what follows the array."""
    if final:
        # What is left is the last event(s), `]`, and the document's other keys (Kineto writes
        # log arrays there, full of `]`): the `]` after the last whole event ends the array.
        end = _array_end(buffer)
        if end is None:  # the standard scanner stops at Kineto's `inf`: read it as Kineto wrote it
            buffer = kineto_json(buffer.decode("utf-8", "replace")).encode()
            end = _array_end(buffer)
        if end is None:
            return b"", None
        try:
            return buffer[end + 1 :], _decode(b"[" + buffer[:end] + b"]")
        except msgspec.DecodeError:
            return b"", None
    for cut, _ in _boundaries(buffer, 8):
        try:
            return buffer[cut + 1 :].lstrip().lstrip(b","), _decode(b"[" + buffer[: cut + 1] + b"]")
        except msgspec.DecodeError:
            continue  # the cut fell inside a string or a nested object: try an earlier one
    return buffer, []  # no clean cut yet: read more


_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _array_end(buffer: bytes) -> int | None:
    """Where the `]` closing the event array is in `buffer` (events, then `]`): one pass over
    the events with a JSON scanner, so a file full of `]` costs no more than one without."""
    text = buffer.decode("latin-1")  # one character per byte: positions stay byte offsets
    scan = json.JSONDecoder().raw_decode
    position = 0
    while True:
        position = _WHITESPACE.match(text, position).end()  # type: ignore[union-attr]
        if text.startswith("]", position):
            return position
        if text.startswith(",", position):
            position += 1
            continue
        try:
            _, position = scan(text, position)
        except ValueError:
            return None
        except RecursionError:
            raise _TooDeep() from None


def _boundaries(buffer: bytes, count: int) -> Iterator[tuple[int, int]]:
    """The last `count` `}, {` boundaries, from the end backwards: (the `}`, the `{`)."""
    end = len(buffer)
    while count and end > 0:
        brace = buffer.rfind(b"{", 0, end)
        if brace < 0:
            return
        match = _CUT.search(buffer, max(0, brace - 256), brace)
        if match is not None:
            yield match.start(), brace
            count -= 1
        end = brace


def metadata(head: bytes, tail: bytes) -> dict[str, Any]:
    """The document's keys other than its events: those before the event array and after it."""
    meta: dict[str, Any] = {}
    for text in (head + b'"traceEvents": []}', b"{" + tail.lstrip().lstrip(b",")):
        try:
            part = lenient_loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(part, dict):
            meta.update(part)
    meta.pop("traceEvents", None)
    return meta


def _whole_document(raw: bytes, path: Location, on_events: Callable[[list[Event]], None]) -> dict[str, Any]:
    """A trace without a `"traceEvents": [` head: a bare event array, or not a trace at all."""
    try:
        document = lenient_loads(raw)
    except RecursionError:
        raise _TooDeep() from None
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}); is the file truncated?") from None
    if isinstance(document, dict) and isinstance(document.get("traceEvents"), list):
        events = document.pop("traceEvents")
    elif isinstance(document, list):
        events, document = document, {}
    else:
        raise UsageError(
            f"{path}: a JSON file but not a profiler trace (no 'traceEvents' list); write traces "
            "with torch.profiler's export_chrome_trace or tensorboard_trace_handler"
        )
    document["_events"] = _feed(_loose(events), on_events)
    return document
