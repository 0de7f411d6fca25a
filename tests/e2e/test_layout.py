"""The package's shape: a newcomer finds each command's code from the tree, and imports point one
way (cli -> commands -> stages -> measure / analyze -> records), without circles."""

from __future__ import annotations


def test_the_measured_run_imports_what_it_measures_with_and_not_what_writes_reports() -> None:
    """The script's process (`training.child`, its hooks and the fixes' switches) starts in every
    run and trial: it must not pay for the libraries that write code changes and reports."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, trainadvisor.training.child, trainadvisor.training.hooks; "
         "print(' '.join(sorted(m for m in ('libcst', 'jinja2', 'click') if m in sys.modules)))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert loaded == []
