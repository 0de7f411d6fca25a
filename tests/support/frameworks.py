"""What e2e/test_frameworks.py and unit/frameworks/test_frameworks.py share."""

from __future__ import annotations

from pathlib import Path

from conftest import EXAMPLES

LIGHTNING = (EXAMPLES / "lightning_slow_data.py").resolve()


def _line(path: Path, text: str) -> int:
    """The line of the script where `text` first appears."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
