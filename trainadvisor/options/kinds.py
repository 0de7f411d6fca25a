"""The options' own types: durations, amounts of memory, finite numbers and seconds, trace
locations (a path on this machine or a URL of object storage)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click


class Duration(click.ParamType):
    """A length of time: 90, 90s, 10m, 1.5h (seconds when no unit is given)."""

    name = "duration"
    _UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}

    def __init__(self, zero: bool = False) -> None:
        self.zero = zero  # 0 is allowed (it switches something off)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower()
        unit = self._UNITS.get(text[-1:], None)
        number = text[:-1] if unit is not None else text
        try:
            seconds = float(number) * (unit or 1.0)
        except ValueError:
            self.fail(f"{value!r} is not a duration: write it as 90s, 10m or 1.5h", param, ctx)
        if not math.isfinite(seconds):  # nan never ends a window, inf never fires
            self.fail(
                f"{value!r} is not a duration: write a number of seconds, as 90s, 10m or 1.5h", param, ctx
            )
        if seconds < 0 or (seconds == 0 and not self.zero):
            self.fail(f"{value!r}: a duration must be more than zero", param, ctx)
        return seconds


DURATION = Duration()
DURATION_OR_ZERO = Duration(zero=True)


class Size(click.ParamType):
    """An amount of memory: bytes, or with a unit: 24GB, 500MiB, 1.5G (G and GB are 10^9, GiB
    is 2^30, as the cards' datasheets and torch's allocator write them)."""

    name = "size"
    _UNITS = {
        "": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
        "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    }  # fmt: skip

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().replace(" ", "")
        number = text.rstrip("kmgtib")
        unit = self._UNITS.get(text[len(number) :])
        try:
            size = float(number) * unit if unit is not None else None
        except ValueError:
            size = None
        if size is None or not math.isfinite(size) or size <= 0:
            self.fail(f"{value!r} is not an amount of memory: write it as 24GB, 500MiB or 8e9", param, ctx)
        return int(size)


SIZE = Size()


class Finite(click.FloatRange):
    """A number in a range, finite: NaN passes every comparison (`nan < 1` is false), so a range
    alone would take it (a timeout of nan never fires, a gate of nan never fails)."""

    what = "a finite number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not {self.what}", param, ctx)
        return number


class Seconds(Finite):
    what = "a number of seconds"


class TraceLocation(click.ParamType):
    """A trace, folder or archive on this machine (a Path), or a URL of object storage kept as
    written (`s3://bucket/prefix/`: a Path would fold its `//`)."""

    name = "path|url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        from trainadvisor.analyze.read.sources import is_url

        text = str(value)
        return text if is_url(text) else Path(text)
