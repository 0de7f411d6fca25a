"""`trainadvisor baseline save|list|delete`: reports kept under a name, for `compare --against
baseline:NAME` (`report.baselines`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from trainadvisor.cli import exits
from trainadvisor.cli.boundary import echo, load, run
from trainadvisor.errors import UsageError
from trainadvisor.options import table
from trainadvisor.records import Report
from trainadvisor.report.baselines import PREFIX, BaselineStore, checked_name, default_store
from trainadvisor.report.paths import published
from trainadvisor.report.render import report_json


def _store(given: str | None) -> BaselineStore:
    return BaselineStore(given or default_store())


def load_named(spec: str, store: str | None = None) -> Report:
    """The report saved as `baseline:NAME`."""
    if not spec.startswith(PREFIX):
        raise UsageError(
            f"--against {spec[:60]!r}: give baseline:NAME (a name saved with `trainadvisor baseline save`)"
        )
    saved = _store(store).load(checked_name(spec[len(PREFIX) :]))
    with tempfile.TemporaryDirectory(prefix="trainadvisor-baseline-") as folder:
        (Path(folder) / "report.json").write_text(saved)
        return load(Path(folder))


@click.group(epilog=exits.BASELINE)
def baseline() -> None:
    """Keep reports under a name (main, release-2.1) to compare later ones with:
    `trainadvisor compare --against baseline:NAME HEAD`."""


@baseline.command("save", epilog=exits.BASELINE)
@table.decorators(table.BASELINE_SAVE)
@click.argument("name")
@click.argument("report", type=click.Path(path_type=Path))
def save(store: str | None, name: str, report: Path) -> None:
    """Save REPORT (a report folder or its report.json) as baseline NAME, replacing one of that
    name. The report is read first: one this version cannot read is refused.

    \b
    Example (on the main branch's CI job):
      trainadvisor baseline save main trainadvisor-report/
    """

    def work() -> int:
        where = _store(store).save(checked_name(name), report_json(published(load(report))))
        echo(f"trainadvisor: saved {report} as {PREFIX}{name} ({where})", err=False)
        return 0

    run(work)


@baseline.command("list", epilog=exits.BASELINE)
@table.decorators(table.BASELINE_LIST)
def list_(store: str | None) -> None:
    """The baselines saved, one a line: name and size."""

    def work() -> int:
        kept = _store(store)
        saved = kept.names()
        if not saved:
            echo(f"trainadvisor: no baselines in {kept.location}", err=False)
        for entry in saved:
            size = entry.size_bytes
            shown = f"{size} B" if size < 1024 else f"{size / 1024:.0f} KiB"  # a small one is not "0 KiB"
            echo(f"{PREFIX}{entry.name}\t{shown}", err=False)
        return 0

    run(work)


@baseline.command("delete", epilog=exits.BASELINE)
@table.decorators(table.BASELINE_DELETE)
@click.argument("name")
def delete(store: str | None, name: str) -> None:
    """Delete baseline NAME."""

    def work() -> int:
        _store(store).delete(checked_name(name))
        echo(f"trainadvisor: deleted {PREFIX}{name}", err=False)
        return 0

    run(work)
