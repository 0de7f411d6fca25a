"""TensorBoard: event files with the summary metrics (`figures`, at step 0) and the findings and
fixes as text, in TRAINADVISOR_TENSORBOARD_DIR (the training's own log folder, so that they
show beside its curves), else in the report folder's `tensorboard/`. Written with
TensorBoard's own event writer: no torch, no TensorFlow in trainadvisor's process."""

from __future__ import annotations

import os
import time
from pathlib import Path

from trainadvisor.records import Report
from trainadvisor.trackers.figures import FINDING_COLUMNS, FIX_COLUMNS, figures, finding_rows, fix_rows

DIR_ENV = "TRAINADVISOR_TENSORBOARD_DIR"


def _cell(value: object) -> str:
    """A table cell: a value not measured is left empty (not "None"); `|` and line breaks kept
    from breaking the table."""
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def _table(columns: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def log(report: Report, files: Path, folder: Path, logdir: str | None = None) -> str:
    """`files`: the report's report.json and report.html as published; `folder`: where it is kept."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    where = Path(logdir or os.environ.get(DIR_ENV) or folder / "tensorboard")
    writer = EventFileWriter(str(where), filename_suffix=".trainadvisor")
    now = time.time()
    values = [Summary.Value(tag=name, simple_value=value) for name, value in figures(report).items()]
    writer.add_event(Event(wall_time=now, step=0, summary=Summary(value=values)))
    texts = {
        "trainadvisor/findings": _table(FINDING_COLUMNS, finding_rows(report)),
        "trainadvisor/fixes": _table(FIX_COLUMNS, fix_rows(report)),
        "trainadvisor/report": f"{folder / 'report.html'} (run {report.run_id})",
    }
    for tag, text in texts.items():
        writer.add_event(Event(wall_time=now, step=0, summary=text_pb(tag, text)))
    writer.close()
    return str(where)
