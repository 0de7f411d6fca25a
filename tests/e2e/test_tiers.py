"""The tiers: a test that starts a process is found from its code (`tiers`), so `--fast` never
runs one by mistake."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tiers import starts_processes


def _asks_for(slow_input_report: Path) -> None:
    assert slow_input_report.exists()


def _spawns() -> None:
    subprocess.run(["true"], check=True)


def _pure() -> None:
    assert sum([1, 2]) == 3


def test_a_test_starts_processes_by_what_it_calls_or_the_fixtures_it_asks_for() -> None:
    assert starts_processes(_asks_for, {"slow_input_report"})
    assert starts_processes(_spawns, set())
    assert not starts_processes(_pure, {"slow_input_report"})
