"""The command line's shared option types and texts: exit codes, durations, options whose
default `--help` shows, the report folder and rule folders, and torchrun's options."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

EXIT_CODES = """\b
Exit codes:
  0  the report was written
  2  a usage problem: no such script, no training step seen, bad --out or rule file
  3  the script failed (its error is shown; what was measured is still reported)
  1  trainadvisor itself failed (please report it)"""


rules_option = click.option(
    "--rules",
    "rule_dirs",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A folder of extra rule files (*.toml); may be given several times; a rule with a "
    "built-in id replaces the built-in rule.",
)


def option(name: str, default: Any, kind: Any, help_text: str, *names: str) -> Any:
    """An option whose default `--help` shows."""
    return click.option(name, *names, default=default, show_default=True, type=kind, help=help_text)


def out_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--out",
        "out_dir",
        default="trainadvisor-report",
        show_default=True,
        type=click.Path(file_okay=False, path_type=Path),
        help=help_text + " A folder of yours that is not a report is never written into.",
    )


ANALYZE_EXIT_CODES = """\b
Exit codes:
  0  the report was written
  2  a usage problem: a missing path, a folder without traces, a file that is not a complete
     trace, an empty trace, a bad --out or rule file
  1  trainadvisor itself failed (please report it)"""


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
        from trainadvisor.analyze.sources import is_url

        text = str(value)
        return text if is_url(text) else Path(text)


def torchrun_options(nproc_per_node: int | None, launcher: dict[str, Any]) -> list[str]:
    """The torch.distributed.run options given, in its own spelling; none: no torchrun. A
    single node without rendezvous options gets --standalone (a free local port)."""
    given = {key: value for key, value in launcher.items() if value is not None}
    if nproc_per_node is None and not given:
        return []
    options = ["--nproc-per-node", str(nproc_per_node or 1)]
    for key, value in given.items():
        options += [f"--{key.replace('_', '-')}", str(value)]
    if not given:
        options.append("--standalone")
    return options
