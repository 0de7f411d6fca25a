"""`trainadvisor compare` as a CI gate, `trainadvisor baseline`, and `trainadvisor report`, on a
real saved report: its first run (num_workers=0, 20.8 steps/s) and its confirmation run (the
kept num_workers=8, 139.3 steps/s) stand for two commits."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import DATA

from trainadvisor.cli import main
from trainadvisor.records.upgrade import from_v1

SAVED = DATA / "report" / "report.json"
FORMATS = ("terminal", "markdown", "json", "sarif")


def _cli(*args: str | Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args], env=env)
    return result.exit_code, result.stdout, result.stderr


def _report(folder: Path, run: str, **changes: Any) -> Path:
    """A report folder whose run is the saved report's `run` (baseline or after), with
    `changes` to its top-level fields."""
    data = from_v1(json.loads(SAVED.read_text()))  # saved by version 1: its fields are 2's
    data["baseline"], data["after"] = data[run], None
    data["comparison"] = data["speedup"] = None
    data.update(changes)
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(data))
    return folder


@pytest.fixture
def fast_slow(tmp_path: Path) -> tuple[Path, Path]:
    return _report(tmp_path / "fast", "after"), _report(tmp_path / "slow", "baseline")


def test_a_slower_head_is_regression_likely_and_exits_1(fast_slow: tuple[Path, Path]) -> None:
    fast, slow = fast_slow
    code, out, _ = _cli("compare", fast, slow)
    assert code == 1
    assert out.splitlines()[0] == (
        "trainadvisor compare: regression_likely: Step time (median) +593.0% (interval +550.6% to "
        "+635.4%): worse by more than the gate of 5%"
    )
    assert "gate: step_time, ±5%; noise floor ±6.1% (from the runs' timed windows, at least 2%)" in out
    code, markdown, _ = _cli("compare", "--format", "markdown", fast, slow)
    assert code == 1 and markdown.startswith("### ❌ trainadvisor compare: regression_likely\n")
    assert "| Throughput steps/s | 139.3 | 20.8 | -85.1% | worse |" in markdown


def test_a_faster_head_is_improvement_likely_and_json_says_why(fast_slow: tuple[Path, Path]) -> None:
    fast, slow = fast_slow
    code, out, _ = _cli("compare", "--format", "json", slow, fast / "report.json")
    assert code == 0
    data = json.loads(out)
    assert data["verdict"] == "improvement_likely"
    assert round(data["gate"]["change_pct"], 1) == -85.6 and data["gate"]["metric"] == "step_time"
    assert [round(x, 1) for x in data["gate"]["interval_pct"]] == [-86.5, -84.7]
    assert data["comparability"] == {"matched": 5, "known": 5, "differs": [], "blocking": []}


def test_the_same_runs_are_neutral_or_inconclusive_as_their_noise_says(fast_slow: tuple[Path, Path]) -> None:
    """The slow run's windows agree to ±4.7%, inside a 5% gate: neutral. The fast run's spread
    ±7.2%: a change of 5% cannot be told from its noise, so inconclusive, which --strict fails."""
    fast, slow = fast_slow
    code, out, _ = _cli("compare", slow, slow)
    assert (code, out.split(":")[1].strip()) == (0, "neutral")
    code, out, _ = _cli("compare", fast, fast)
    assert (code, out.split(":")[1].strip()) == (0, "inconclusive")
    assert "(interval -7.2% to +7.2%): the runs' noise leaves open a change beyond the gate of 5%" in out
    assert _cli("compare", "--strict", fast, fast)[0] == 1
    assert _cli("compare", "--gate", "10", fast, fast)[0] == 0  # a 10% gate: neutral
    assert "neutral" in _cli("compare", "--max-regression", "10", fast, fast)[1]  # the old name


def test_comparability_is_checked_first_and_names_what_differs(tmp_path: Path) -> None:
    base = _report(tmp_path / "base", "baseline", workload="mnist", content_digest="a" * 64)
    edited = _report(tmp_path / "edited", "baseline", workload="mnist", content_digest="b" * 64)
    code, out, _ = _cli("compare", base, edited)
    assert code == 0 and "neutral" in out.splitlines()[0]
    assert (
        f"comparable on 6 of 7 facts; differs: script: {'a' * 12} vs {'b' * 12} (one workload, mnist)" in out
    )
    other = _report(tmp_path / "other", "baseline", workload="resnet", content_digest="a" * 64)
    code, out, _ = _cli("compare", "--format", "json", base, other)
    data = json.loads(out)
    assert code == 0 and data["verdict"] == "inconclusive"
    assert data["gate"]["reason"] == "not comparable: workload: mnist vs resnet"
    assert _cli("compare", "--strict", base, other)[0] == 1
    bigger = json.loads((base / "report.json").read_text())
    bigger["environment"]["cpu_count"] = 64
    (tmp_path / "bigger").mkdir()
    (tmp_path / "bigger" / "report.json").write_text(json.dumps(bigger))
    out = _cli("compare", base, tmp_path / "bigger")[1]
    assert "not comparable: device: CPU (2 cores) vs CPU (64 cores)" in out


def test_every_metric_can_be_the_gate(fast_slow: tuple[Path, Path]) -> None:
    fast, slow = fast_slow
    verdicts = {}
    for metric in ("step_time", "samples_per_s", "peak_memory", "mfu", "energy_per_sample"):
        code, out, _ = _cli("compare", "--format", "json", "--metric", metric, fast, slow)
        data = json.loads(out)
        verdicts[metric] = (code, data["verdict"])
    assert verdicts == {
        "step_time": (1, "regression_likely"),
        "samples_per_s": (1, "regression_likely"),
        "peak_memory": (0, "neutral"),  # the same model: the same peak (1% floor)
        "mfu": (1, "regression_likely"),
        "energy_per_sample": (0, "inconclusive"),  # a CPU run: no energy measured
    }


def test_sarif_of_a_comparison_is_the_heads_findings(fast_slow: tuple[Path, Path]) -> None:
    fast, slow = fast_slow
    code, out, _ = _cli("compare", "--format", "sarif", fast, slow)
    assert code == 1
    log = json.loads(out)
    assert log["version"] == "2.1.0" and log["runs"][0]["properties"]["findings"] >= 1


def test_usage_problems_exit_2_with_one_line(tmp_path: Path, fast_slow: tuple[Path, Path]) -> None:
    fast, _ = fast_slow
    code, _, err = _cli("compare", tmp_path / "nope", fast)
    assert code == 2 and "no report.json here; give a report folder written by trainadvisor" in err
    code, _, err = _cli("compare", "--run", "after", _report(tmp_path / "b", "baseline"), fast)
    assert code == 2 and "has no 'after' run" in err
    code, _, err = _cli("compare", fast)
    assert code == 2 and "compare takes BASE and HEAD" in err


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_tampered_report_is_refused_in_one_line_in_every_format(tmp_path: Path, output_format: str) -> None:
    good = _report(tmp_path / "good", "baseline")
    data = json.loads(SAVED.read_text())
    data["baseline"]["steps_per_s"] = "fast"
    refused = {
        "numbers": json.dumps(data),
        "version": json.dumps({**json.loads(SAVED.read_text()), "schema_version": 99}),
        "nan": SAVED.read_text().replace('"loss_noise_rel": null', '"loss_noise_rel": NaN'),
        "list": "[1, 2]",
        "huge": " " * (50 * 2**20 + 1) + "{}",
    }
    for name, text in refused.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "report.json").write_text(text)
        code, out, err = _cli("compare", "--format", output_format, good, folder)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (name, err)
    code, _, err = _cli("compare", good, tmp_path / "numbers")
    assert "Expected `float | null`, got `str` - at `$.baseline.steps_per_s`" in err
    assert "is not one this version reads (1 to 2)" in _cli("compare", good, tmp_path / "version")[2]


@pytest.mark.parametrize("output_format", ["terminal", "markdown"])
def test_markup_in_a_report_is_shown_as_text(tmp_path: Path, output_format: str) -> None:
    evil = "<img src=x onerror=alert(1)> [click](http://x) `$(rm -rf ~)` \x1b[31mred"
    base = _report(tmp_path / "base", "baseline", script=evil, workload=evil)
    head = _report(tmp_path / "head", "after", script=evil, workload=evil)
    code, out, _ = _cli("compare", "--format", output_format, base, head)
    assert code == 0 and "\x1b" not in out
    if output_format == "markdown":  # inside code spans, where GitHub renders neither HTML nor links
        assert out.count("<img") == out.count("``<img") == 2 and out.count("](http") == 2


def test_a_baseline_saved_by_name_is_what_compare_against_reads(tmp_path: Path) -> None:
    fast, slow = _report(tmp_path / "fast", "after"), _report(tmp_path / "slow", "baseline")
    env = {"TRAINADVISOR_BASELINES": str(tmp_path / "store")}
    assert _cli("baseline", "save", "main", fast, env=env)[0] == 0
    code, out, _ = _cli("baseline", "list", env=env)
    assert code == 0 and out.startswith("baseline:main\t")
    code, out, _ = _cli("compare", "--against", "baseline:main", slow, env=env)
    assert code == 1 and "regression_likely" in out.splitlines()[0]
    code, _, err = _cli("compare", "--against", "baseline:release", slow, env=env)
    assert code == 2 and "no baseline 'release'" in err and "(saved: main)" in err
    code, _, err = _cli("baseline", "save", "../up", fast, env=env)
    assert code == 2 and "is not a baseline name" in err
    assert _cli("baseline", "delete", "main", env=env)[0] == 0
    assert "no baselines in" in _cli("baseline", "list", env=env)[1]


def test_saves_of_one_name_at_once_leave_one_whole_report(tmp_path: Path) -> None:
    """Eight saves of `main` at once, of two different reports: the baseline left is one of them,
    whole, and no temporary file stays behind."""
    from trainadvisor.report.baselines import BaselineStore

    store = BaselineStore(str(tmp_path / "store"))
    texts = [(DATA / "report" / "report.json").read_text(), json.dumps({"other": 1}) * 5000]
    threads = [threading.Thread(target=store.save, args=("main", texts[i % 2])) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.load("main") in texts
    assert [p.name for p in (tmp_path / "store" / "main").iterdir()] == ["report.json"]


def test_report_re_renders_a_saved_run_without_rerunning(tmp_path: Path) -> None:
    folder = tmp_path / "saved"
    folder.mkdir()
    shutil.copy(SAVED, folder / "report.json")
    code, out, _ = _cli("report", folder)
    assert code == 0
    assert (folder / "report.html").stat().st_size > 10_000 and (folder / "report.md").is_file()
    assert "trainadvisor: 6.70x faster in steps/s" in out
    assert _cli("report", "--out", tmp_path / "copy", folder)[0] == 0
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
    code, out, _ = _cli("compare", base, head / "report.json")
    assert code == 1
    assert "the head's run did not complete (script failed: RuntimeError: boom)" in out
    assert _cli("report", head / "report.json")[0] == 0 and (head / "report.html").is_file()
    code, _, err = _cli("report", "--out", tmp_path / "x", base, base / "report.json")
    assert code == 2 and "given twice" in err
