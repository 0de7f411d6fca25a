"""Reports in a Jupyter notebook: `trainadvisor.load_report(path)` gives a view that renders the
report where the notebook shows a cell's output, inside a sandboxed iframe (`sandbox=""`: no
script, form, popup or same-origin access, so nothing of the report touches the notebook's page,
whatever a script's name or a finding's text holds); `@advise` and `with advise():` show the
same view when their window ends in a notebook's kernel."""

from __future__ import annotations

import html
import sys
from pathlib import Path
from typing import Any

from trainadvisor.records import Report
from trainadvisor.report.paths import published
from trainadvisor.report.render import headline, render_html, report_folder, terminal_summary
from trainadvisor.report.render import load_report as _load
from trainadvisor.resources import templates_dir

FRAME_HEIGHT_PX = 640


class ReportView:
    """A saved report in a notebook: `_repr_html_` renders it (sandboxed), `repr` is the
    terminal's summary; `.report` is the report itself (records.Report), `.folder` its folder."""

    def __init__(self, report: Report, folder: Path) -> None:
        self.report = report
        self.folder = folder

    @property
    def headline(self) -> str:
        return headline(self.report)

    def _repr_html_(self) -> str:
        page = render_html(self.report, templates_dir())
        return (
            f'<iframe sandbox="" title="trainadvisor report" srcdoc="{html.escape(page, quote=True)}" '
            f'style="width:100%;height:{FRAME_HEIGHT_PX}px;border:1px solid #ddd"></iframe>'
        )

    def __repr__(self) -> str:
        return terminal_summary(self.report, self.folder)


def load_report(path: str | Path) -> ReportView:
    """The report in PATH (a report folder or its report.json), of any version this one reads,
    with paths relative to the repository around the working directory."""
    folder = report_folder(Path(path))
    return ReportView(published(_load(folder)), folder)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell), not a terminal IPython
    or a plain script."""
    ipython = sys.modules.get("IPython")
    shell: Any = ipython.get_ipython() if ipython is not None else None  # type: ignore[attr-defined]
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def show(report: Report, folder: Path) -> None:
    """The report as a cell's output, where this is a notebook's kernel; nothing elsewhere."""
    if in_notebook():
        from IPython.display import display

        display(ReportView(report, folder))
