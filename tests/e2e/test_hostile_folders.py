"""Hostile report folders (issue 28): links planted in a folder are never written or deleted
through, an earlier report stays whole until a new one replaces it, every writer respects the
folder's lock, and a report.json with keys this version does not know still renders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import SCRIPTS, run_cli
from support.hostile_folders import _earlier_report, _files, _victim

FAST = ("--no-fix", "--warmup", "1", "--steps", "2", "--min-time", "0", "--max-warmup", "0")


NO_STEPS = (
    f"{SCRIPTS / 'no_steps.py'} ran to the end but no training step was seen. trainadvisor finds steps "
    "through torch.optim optimizers' optimizer.step()"
)


def test_a_run_that_ends_without_a_report_leaves_the_earlier_report_whole(tmp_path: Path) -> None:
    out = tmp_path / "r"
    before = _earlier_report(out)
    done = run_cli("profile", "--out", out, SCRIPTS / "no_steps.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(f"trainadvisor: error: {NO_STEPS}")
    after = _files(out)
    assert {name: after.get(name) for name in before} == before  # report.json, traces, logs
    assert sorted(after) == sorted(before)  # nothing of the failed run is left in the folder
    assert sorted(p.name for p in out.iterdir()) == ["SOURCE.md", "logs", "report.json", "traces"]


def test_a_new_report_replaces_the_earlier_one_and_a_link_in_its_place_not_what_it_points_to(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r"
    _earlier_report(out)
    victim, before = _victim(tmp_path)
    shutil.rmtree(out / "traces" / "baseline")
    (out / "traces" / "baseline").symlink_to(victim)
    done = run_cli(
        "profile", *FAST, "--out", out, SCRIPTS / "short_run.py", "--max-steps", "20", cwd=tmp_path
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert _files(victim) == before
    report = json.loads((out / "report.json").read_text())
    assert report["after"] is None
    assert report["baseline"]["raw"]["trace_file"] == "traces/baseline/trainadvisor.pt.trace.json.gz"
    # The earlier report's traces and logs went with it; the new one's are in their place.
    assert [p.relative_to(out / "traces").as_posix() for p in sorted((out / "traces").rglob("*"))] == [
        "baseline", "baseline/trainadvisor.pt.trace.json.gz",
    ]  # fmt: skip
    assert not (out / "traces" / "baseline").is_symlink()
    assert (out / "traces" / "baseline" / "trainadvisor.pt.trace.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert sorted(p.name for p in out.iterdir()) == [
        "SOURCE.md", "report.html", "report.json", "report.md", "traces",
    ]  # fmt: skip
