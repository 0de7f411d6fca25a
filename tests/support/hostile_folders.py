"""What e2e/test_hostile_folders.py and integration/test_hostile_folders.py share."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from conftest import DATA

EARLIER = {  # an earlier report's files, beside its report.json
    "traces/baseline/trainadvisor.pt.trace.json.gz": "the earlier baseline trace",
    "traces/after/trainadvisor.pt.trace.json.gz": "the earlier after trace",
    "logs/after.log": "the earlier after log",
}


def _earlier_report(out: Path) -> dict[str, str]:
    """A report folder holding an earlier report (report.json and its traces and logs); its
    files and their text."""
    shutil.copytree(DATA / "report", out)
    for name, text in EARLIER.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return _files(out)


def _files(folder: Path) -> dict[str, str]:
    """Every file under `folder` (links not followed) and its text; a link as '-> target'."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            found[name] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[name] = path.read_bytes().decode("utf-8", "replace")
    return found


def _victim(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder of the user's outside the report folder, and its files."""
    victim = tmp_path / "mine"
    victim.mkdir()
    (victim / "trainadvisor.pt.trace.json.gz").write_text("my own trace")
    (victim / "notes.txt").write_text("my notes")
    return victim, _files(victim)
