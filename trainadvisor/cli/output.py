"""What a command prints on stdout (`--format`), and the paths a published report shows.

terminal is the diagnosis for a person; markdown, json and sarif are for a program, so nothing
else may reach stdout meanwhile: while the command runs, file descriptor 1 (which the script's
own runs inherit) points at stderr, and the one document is written to the real stdout at the
end. Every format, and every file of the report folder, names paths relative to the repository
root (`report.paths`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from trainadvisor.records import Report
from trainadvisor.report.mdtext import terminal
from trainadvisor.report.paths import relative_text, repository_root
from trainadvisor.report.render import render_markdown, report_json
from trainadvisor.report.sarif import sarif_json
from trainadvisor.resources import templates_dir


def root() -> Path:
    return repository_root(Path.cwd())


@contextmanager
def stdout_kept_for(output_format: str) -> Iterator[None]:
    """For a machine-readable format, everything written to stdout while the block runs (the
    script's own prints, a library's) goes to stderr instead."""
    if output_format == "terminal":
        yield
        return
    sys.stdout.flush()
    try:
        kept = os.dup(1)
    except OSError:  # no real descriptor (an embedding host): nothing to redirect
        yield
        return
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(kept, 1)
        os.close(kept)


def print_as(output_format: str, report: Report, terminal_text: Callable[[], str]) -> None:
    """The one document `--format` asks for, on stdout."""
    if output_format == "terminal":
        click.echo(terminal(relative_text(terminal_text(), root())))
    elif output_format == "markdown":
        click.echo(render_markdown(report, templates_dir()), nl=False)
    elif output_format == "json":
        click.echo(report_json(report), nl=False)
    else:
        click.echo(sarif_json(report, root()), nl=False)
