"""Quantities written for people: a value in the largest decimal prefix of its unit it reaches
(reports and the fixes' reasons alike).

May import: nothing of the package."""

from __future__ import annotations


def scaled(value: float, unit: str, prefixes: str = "kMGTP") -> str:
    """`value` in its largest decimal prefix of `unit` it reaches, three figures: 154 MFLOP,
    7.16 MB, 512 B."""
    for power, prefix in reversed(list(enumerate(prefixes, start=1))):
        if value >= 1000.0**power:
            return f"{value / 1000.0**power:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
