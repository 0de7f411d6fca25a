"""Reports in a Jupyter notebook, tested by executing a real notebook headless (nbclient, an
ipykernel kernel): `trainadvisor.load_report` renders a saved report in a sandboxed iframe, and
`with advise():` in a cell shows its report when the window ends."""

from __future__ import annotations

from pathlib import Path

from conftest import DATA, require

require("ipykernel", "the notebook test runs an ipykernel kernel: pip install -e '.[dev]'")


from trainadvisor.report.notebook import ReportView, in_notebook, load_report  # noqa: E402


def test_the_view_is_the_report_and_outside_a_kernel_nothing_is_shown(tmp_path: Path) -> None:
    view = load_report(DATA / "report" / "report.json")
    assert isinstance(view, ReportView) and view.headline.startswith("6.70x faster in steps/s")
    assert repr(view).startswith("trainadvisor: 6.70x faster") and not in_notebook()
    hostile = load_report(DATA / "report")
    hostile.report.script = '"><script>alert(1)</script>'
    frame = hostile._repr_html_()
    assert "<script>" not in frame and frame.count("<iframe") == 1
