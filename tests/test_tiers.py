"""The tiers: a test that starts a process is found from its code (`tiers`), so `--fast` never
runs one by mistake."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tiers import starting_functions, starts_processes


def test_a_helper_that_runs_the_cli_makes_every_helper_calling_it_start_processes(tmp_path: Path) -> None:
    module = tmp_path / "test_example.py"
    module.write_text(
        "def _run(x):\n    return run_cli('profile', x)\n\n"
        "def _twice(x):\n    return [_run(x), _run(x)]\n\n"
        "def _child():\n    return subprocess.run([sys.executable, '-c', 'pass'])\n\n"
        "def pure(x):\n    return x + 1\n"
    )
    assert starting_functions([module]) == {"_run", "_twice", "_child"}


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
