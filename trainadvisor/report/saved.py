"""A saved report, read for a command or an agent: its folder or its report.json, refused with
what to do next where it is not one this version can read."""

from __future__ import annotations

from pathlib import Path

from trainadvisor.errors import UsageError
from trainadvisor.records import Report
from trainadvisor.records.upgrade import UnreadableVersion
from trainadvisor.report.render import load_report, report_folder


def saved_report(path: Path) -> Report:
    """The report saved at `path` (its folder, or its report.json): UsageError, naming the file,
    where there is none, or one this version cannot read (a newer schema, a damaged file)."""
    folder = report_folder(path)
    if not (folder / "report.json").is_file():
        raise UsageError(f"{path}: no report.json here; give a report folder written by trainadvisor")
    try:
        return load_report(folder)
    except UnreadableVersion as exc:
        raise UsageError(f"{folder / 'report.json'}: {exc}") from None
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise UsageError(f"{folder / 'report.json'}: not a report this version can read ({exc})") from None
