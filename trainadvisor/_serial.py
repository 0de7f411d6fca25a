"""Plain-data (de)serialisation of the pipeline's dataclasses, so every stage can be saved as
JSON and loaded back to re-render a report without rerunning anything.

May import: errors."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import secrets
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from trainadvisor.errors import UsageError

T = TypeVar("T")


def to_plain(obj: Any) -> Any:
    """A dataclass tree as JSON-ready dicts and lists. JSON has no NaN or infinity: such a float
    (a diverged loss, say) is written as the string "NaN", "Infinity" or "-Infinity"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def from_plain(cls: Any, data: Any) -> Any:
    """Rebuild an object of type `cls` (a dataclass or a typing construct) from `to_plain` output.

    Unknown keys are ignored and missing ones take the field's default, so files written by an
    older or newer version of the same schema still load."""
    if data is None:
        return None
    origin = typing.get_origin(cls)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(cls) if a is not type(None)]
        return from_plain(options[0], data) if len(options) == 1 else data
    if origin is list:
        (item,) = typing.get_args(cls) or (Any,)
        return [from_plain(item, v) for v in data]
    if origin is dict:
        _, value = typing.get_args(cls) or (str, Any)
        return {k: from_plain(value, v) for k, v in data.items()}
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        kwargs = {
            f.name: from_plain(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data
        }
        return cls(**kwargs)
    if cls is float and isinstance(data, (int, str)):
        return float(data)  # also "NaN", "Infinity", "-Infinity"
    return data


def write_atomically(path: Path, text: str) -> None:
    """Write beside the file, then rename over it: a reader (or an interruption, or a full
    disk) never sees a half-written file, and an earlier version stays whole. The temporary
    file's name is this writer's own (its process and a random token) and it is created
    exclusively, so writers side by side never share one and a link planted under its name is
    never written through; the rename replaces a link at `path` itself, not what it points to.
    A failed write is a UsageError naming the file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    handle = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = temporary.open("x")  # exclusive: refused where anything, a link too, is there
        with handle:
            _write(handle, text)
        os.replace(temporary, path)
        handle = None
    except OSError as exc:
        raise write_failed(path, exc) from None
    finally:
        if handle is not None:  # made here, and not renamed into place
            temporary.unlink(missing_ok=True)


def _write(handle: typing.TextIO, text: str) -> None:
    handle.write(text)  # its own function: tests fill the disk here


def write_failed(path: Path, exc: OSError) -> UsageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UsageError(f"no space left on device while writing {path}; free space or choose another --out")
    return UsageError(
        f"cannot write {path} ({exc.strerror or exc}); fix the permissions or choose another --out"
    )


def save_json(obj: Any, path: Path) -> None:
    write_atomically(path, json.dumps(to_plain(obj), indent=1, allow_nan=False) + "\n")


def load_json(cls: type[T], path: Path) -> T:
    return typing.cast(T, from_plain(cls, json.loads(path.read_text())))
