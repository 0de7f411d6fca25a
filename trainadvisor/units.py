"""Quantities written for people: a value in the largest decimal prefix of its unit it reaches
(reports and the fixes' reasons alike), a duration on a clock, and a signal by its name.

May import: nothing of the package."""

from __future__ import annotations

import signal


def scaled(value: float, unit: str, prefixes: str = "kMGTP") -> str:
    """`value` in its largest decimal prefix of `unit` it reaches, three figures: 154 MFLOP,
    7.16 MB, 512 B."""
    for power, prefix in reversed(list(enumerate(prefixes, start=1))):
        if value >= 1000.0**power:
            return f"{value / 1000.0**power:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def clock(seconds: float) -> str:
    """A duration on a clock: 45s, 2m05s."""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def signal_name(number: int) -> str:
    """`SIGKILL` for 9; the number itself for one Python has no name for (a real-time signal,
    SIGRTMIN+3, is 37 on Linux), where `signal.Signals(number)` would raise."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
