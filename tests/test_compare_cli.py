"""`trainadvisor compare` and `trainadvisor report` on a real saved report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import DATA, run_cli

SAVED = DATA / "report" / "report.json"


def _report(folder: Path, run: str) -> Path:
    """A report folder whose baseline is the saved report's `run` (baseline: num_workers=0,
    after: the kept num_workers=8): the same real measurements, as two commits would give."""
    data = json.loads(SAVED.read_text())
    data["baseline"], data["after"] = data[run], None
    data["comparison"] = data["speedup"] = None
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps(data))
    return folder


def test_a_slower_head_fails_the_gate(tmp_path: Path) -> None:
    fast, slow = _report(tmp_path / "fast", "after"), _report(tmp_path / "slow", "baseline")
    result = run_cli("compare", fast, slow, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(
        "### ❌ trainadvisor compare: regression: throughput -85.1% (more than the allowed -5%"
    )
    assert "| Throughput steps/s | 139.3 | 20.8 | -85.1% |" in result.stdout
    assert "| Data wait % of step | 29.6 | 86.6 | +192.5% |  | worse |" in result.stdout


def test_a_faster_head_passes_and_json_says_why(tmp_path: Path) -> None:
    fast, slow = _report(tmp_path / "fast", "after"), _report(tmp_path / "slow", "baseline")
    result = run_cli("compare", "--format", "json", slow, fast / "report.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # the head is the saved report's confirmation run
    assert (data["regressed"], round(data["throughput_change_pct"], 1)) == (False, 569.5)
    assert data["verdict"] == "no regression: throughput +569.5% (better)"
    steps = next(m for m in data["metrics"] if m["name"] == "step_time_ms_median")
    assert steps["verdict"] == "better" and steps["better"] == "lower"


def test_the_same_report_is_unchanged_and_a_missing_one_is_a_usage_error(tmp_path: Path) -> None:
    same = run_cli("compare", SAVED.parent, SAVED.parent, cwd=tmp_path)
    assert same.returncode == 0 and "no regression: throughput +0.0% (unchanged)" in same.stdout
    missing = run_cli("compare", tmp_path / "nope", SAVED.parent, cwd=tmp_path)
    assert missing.returncode == 2
    assert "no report.json here; give a report folder written by trainadvisor" in missing.stderr
    no_after = run_cli(
        "compare", "--run", "after", _report(tmp_path / "b", "baseline"), SAVED.parent, cwd=tmp_path
    )
    assert no_after.returncode == 2 and "has no 'after' run" in no_after.stderr


def test_report_re_renders_a_saved_run_without_rerunning(tmp_path: Path) -> None:
    folder = tmp_path / "saved"
    folder.mkdir()
    shutil.copy(SAVED, folder / "report.json")
    result = run_cli("report", folder, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (folder / "report.html").stat().st_size > 10_000 and (folder / "report.md").is_file()
    assert "trainadvisor: 6.70x faster in steps/s" in result.stdout
    elsewhere = run_cli("report", "--out", tmp_path / "copy", folder, cwd=tmp_path)
    assert elsewhere.returncode == 0
    assert (tmp_path / "copy" / "report.html").read_text() == (folder / "report.html").read_text()


def test_a_head_that_no_longer_completes_fails_the_gate(tmp_path: Path) -> None:
    base = _report(tmp_path / "base", "baseline")
    head = _report(tmp_path / "head", "baseline")
    data = json.loads((head / "report.json").read_text())
    data["baseline"]["raw"]["status"], data["baseline"]["raw"]["error"] = (
        "script_failed",
        "RuntimeError: boom",
    )
    (head / "report.json").write_text(json.dumps(data))
    result = run_cli("compare", base, head / "report.json", cwd=tmp_path)
    assert result.returncode == 1
    assert "the head's run did not complete (script failed: RuntimeError: boom)" in result.stdout
    rerendered = run_cli("report", head / "report.json", cwd=tmp_path)  # a report.json path works too
    assert rerendered.returncode == 0 and (head / "report.html").is_file()
    twice = run_cli("report", "--out", tmp_path / "x", base, base / "report.json", cwd=tmp_path)
    assert twice.returncode == 2 and "given twice" in twice.stderr


def test_a_report_of_an_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    """compare accepted any schema_version (a newer writer's, a string, a hand-made file)."""
    for version in (99, "1", None):
        folder = tmp_path / f"v{version}"
        data = json.loads(SAVED.read_text())
        data["schema_version"] = version
        folder.mkdir()
        (folder / "report.json").write_text(json.dumps(data))
        result = run_cli("compare", folder, DATA / "report", cwd=tmp_path)
        assert result.returncode == 2, (version, result.stdout)
        assert f"schema_version {str(version)!r} is not one this version reads (1 to 2)" in result.stderr
