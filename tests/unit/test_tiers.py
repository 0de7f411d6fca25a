"""The tiers: a test that starts a process is found from its code (`tiers`), so `--fast` never
runs one by mistake."""

from __future__ import annotations

from pathlib import Path

from tiers import starting_functions


def test_a_helper_that_runs_the_cli_makes_every_helper_calling_it_start_processes(tmp_path: Path) -> None:
    module = tmp_path / "test_example.py"
    module.write_text(
        "def _run(x):\n    return run_cli('profile', x)\n\n"
        "def _twice(x):\n    return [_run(x), _run(x)]\n\n"
        "def _child():\n    return subprocess.run([sys.executable, '-c', 'pass'])\n\n"
        "def pure(x):\n    return x + 1\n"
    )
    assert starting_functions([module]) == {"_run", "_twice", "_child"}
