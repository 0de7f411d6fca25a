"""Reports in a Jupyter notebook, tested by executing a real notebook headless (nbclient, an
ipykernel kernel): `trainadvisor.load_report` renders a saved report in a sandboxed iframe, and
`with advise():` in a cell shows its report when the window ends."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from conftest import DATA

nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat: pip install -e '.[dev]'")


nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient: pip install -e '.[dev]'")


pytest.importorskip("ipykernel", reason="the notebook test runs an ipykernel kernel: pip install -e '.[dev]'")


TRAIN = """\
import torch, torch.nn as nn
from trainadvisor import advise
torch.manual_seed(0)
model = nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with advise(warmup=2, steps=4, out={out!r}, min_time=0.0, max_warmup=None) as advisor:
    for _ in range(12):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        advisor.step(loss)
"""


def _frames(outputs: list) -> list[str]:  # type: ignore[type-arg]
    return [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]


def test_a_notebook_shows_a_saved_report_and_an_advised_window(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(f"import trainadvisor\ntrainadvisor.load_report({str(DATA / 'report')!r})"),
        nbformat.v4.new_code_cell(TRAIN.format(out=str(tmp_path / "advised"))),
    ]
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    saved, advised = (_frames(cell.outputs) for cell in notebook.cells)
    assert len(saved) == 1 and len(advised) == 1
    for frame in (*saved, *advised):
        assert frame.startswith('<iframe sandbox="" title="trainadvisor report" srcdoc="')
        page = html.unescape(re.search(r'srcdoc="([^"]*)"', frame)[1])  # type: ignore[index]
        assert "<html" in page and not re.search(r"<script\b", page)
    assert "6.70x faster" in html.unescape(saved[0])
    assert (tmp_path / "advised" / "report.html").is_file()
