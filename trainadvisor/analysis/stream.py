"""Streaming reader of Kineto (torch.profiler) Chrome traces, in bounded memory.

The file (`.json` or `.json.gz`) is read in blocks. The `traceEvents` array is cut into chunks
at `}, {` boundaries and each chunk is decoded with msgspec into small typed structs, keeping
only the fields the analysis uses; a cut that falls inside a string or a nested object makes the
chunk fail to parse, and the chunk is then extended, so a successful parse is always a correct
cut. The events of a chunk are handed to a callback and dropped: memory stays at a few blocks
plus whatever the callback keeps."""

from __future__ import annotations

import gzip
import json
import re
import typing
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from trainadvisor.errors import UsageError

BLOCK_BYTES = 4 << 20
_CUT = re.compile(rb"\}\s*,\s*\Z")  # `}, ` just before an event's `{`
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')


class Args(msgspec.Struct, gc=False):
    correlation: Any = None
    bytes: Any = None
    total_allocated: Any = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Any = msgspec.field(name="Total Reserved", default=None)
    device_id: Any = msgspec.field(name="Device Id", default=None)
    device_type: Any = msgspec.field(name="Device Type", default=None)
    # The op a kernel or runtime call belongs to; 2021-era traces spell it in lower case.
    external_id: Any = msgspec.field(name="External id", default=None)
    external_id_2021: Any = msgspec.field(name="external id", default=None)
    input_type: Any = msgspec.field(name="Input type", default=None)  # with record_shapes


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    tid: Any = None
    args: Args | None = None


_decode_events = msgspec.json.Decoder(list[Event]).decode


def _loose(items: Any) -> list[Event]:
    """Events from decoded JSON items whose fields have unexpected types (a string `ts`, say)."""
    events = []
    for item in items:
        if not isinstance(item, dict):
            continue
        try:
            args: dict[str, Any] = item["args"] if isinstance(item.get("args"), dict) else {}
            events.append(
                Event(
                    ph=str(item.get("ph", "")),
                    cat=str(item.get("cat", "")),
                    name=str(item.get("name", "")),
                    ts=float(item.get("ts", 0.0)),
                    dur=float(item.get("dur", 0.0) or 0.0),
                    tid=item.get("tid"),
                    args=Args(
                        args.get("correlation"),
                        args.get("bytes"),
                        args.get("Total Allocated"),
                        args.get("Total Reserved"),
                        args.get("Device Id"),
                        args.get("Device Type"),
                        args.get("External id"),
                        args.get("external id"),
                        args.get("Input type"),
                    ),
                )
            )
        except (TypeError, ValueError):
            continue  # an event with a non-numeric time is unusable; skip it
    return events


def _decode(raw: bytes) -> list[Event]:
    """Events of a chunk; msgspec.DecodeError when the chunk is not a JSON array of events."""
    try:
        return _decode_events(raw)
    except msgspec.ValidationError:
        try:
            items = json.loads(raw)
        except ValueError as exc:  # the chunk itself is malformed (a wrong cut): say so alike
            raise msgspec.DecodeError(str(exc)) from None
        if not isinstance(items, list):
            raise msgspec.DecodeError("not an array") from None
        return _loose(items)


def _blocks(stream: IO[bytes]) -> Iterator[bytes]:
    while block := stream.read(BLOCK_BYTES):
        yield block


def _open(path: Path) -> IO[bytes]:
    if not path.exists():
        raise UsageError(f"{path}: no such trace file")
    if path.is_dir():
        raise UsageError(f"{path}: a folder, not a trace file")
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    return typing.cast(IO[bytes], gzip.open(path, "rb") if gzipped else open(path, "rb"))


def read_trace(path: Path, on_events: Callable[[list[Event]], None]) -> dict[str, Any]:
    """Feed every event of the trace to `on_events` in chunks; return the trace's other
    top-level keys (deviceProperties, distributedInfo, ...)."""
    try:
        with _open(path) as stream:
            return _read(stream, on_events, path)
    except (OSError, EOFError, zlib.error) as exc:
        raise UsageError(f"{path}: cannot read the trace ({exc}); is the file complete?") from None


def _read(stream: IO[bytes], on_events: Callable[[list[Event]], None], path: Path) -> dict[str, Any]:
    blocks = _blocks(stream)
    buffer = b""
    head = None
    for block in blocks:
        buffer += block
        match = _ARRAY_START.search(buffer)
        if match:
            head, buffer = buffer[: match.start()], buffer[match.end() :]
            break
        if len(buffer) > 4 * BLOCK_BYTES:
            break
    if head is None:
        return _whole_document(buffer + b"".join(blocks), path, on_events)
    events = 0
    for block in blocks:
        buffer += block
        buffer, decoded = _drain(buffer, final=False)
        events += _feed(decoded or [], on_events)
    while True:  # leave only the last event for the final cut, which tries `]` by `]`
        buffer, decoded = _drain(buffer, final=False)
        if not decoded:
            break
        events += _feed(decoded, on_events)
    tail, decoded = _drain(buffer, final=True)
    if decoded is None:
        raise UsageError(f"{path}: the trace's event list is cut off or malformed; is the file complete?")
    events += _feed(decoded, on_events)
    meta = _metadata(head, tail)
    meta["_events"] = events
    return meta


def _feed(events: list[Event], on_events: Callable[[list[Event]], None]) -> int:
    if events:
        on_events(events)
    return len(events)


def _drain(buffer: bytes, final: bool) -> tuple[bytes, list[Event] | None]:
    """Decode as many whole events from the front of `buffer` as a clean cut allows.
    Returns (the undecoded rest, the events); with `final`, the rest is what follows the array."""
    if final:
        # What is left is the last event(s), `]`, and the document's other keys (Kineto writes
        # log arrays there, full of `]`). The first `]` from the front at which the events parse
        # ends the array: a `]` inside an event leaves it unbalanced.
        end = buffer.find(b"]")
        while end >= 0:
            try:
                return buffer[end + 1 :], _decode(b"[" + buffer[:end] + b"]")
            except msgspec.DecodeError:
                end = buffer.find(b"]", end + 1)
        return b"", None
    for cut in _last_cuts(buffer, 8):
        try:
            return buffer[cut + 1 :].lstrip().lstrip(b","), _decode(b"[" + buffer[: cut + 1] + b"]")
        except msgspec.DecodeError:
            continue  # the cut fell inside a string or a nested object: try an earlier one
    return buffer, []  # no clean cut yet: read more


def _last_cuts(buffer: bytes, count: int) -> Iterator[int]:
    """Positions of the last `count` `}, {` boundaries, from the end backwards (the position of
    the `}`), found without scanning the whole buffer."""
    end = len(buffer)
    while count and end > 0:
        brace = buffer.rfind(b"{", 0, end)
        if brace < 0:
            return
        match = _CUT.search(buffer, max(0, brace - 256), brace)
        if match is not None:
            yield match.start()
            count -= 1
        end = brace


def _metadata(head: bytes, tail: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for text in (head + b'"traceEvents": []}', b"{" + tail.lstrip().lstrip(b",")):
        try:
            part = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(part, dict):
            meta.update(part)
    meta.pop("traceEvents", None)
    return meta


def _whole_document(raw: bytes, path: Path, on_events: Callable[[list[Event]], None]) -> dict[str, Any]:
    """A trace without a `"traceEvents": [` head: a bare event array, or not a trace at all."""
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
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
