"""`--format terminal|markdown|json|sarif` on profile, analyze and report; SARIF 2.1.0 checked
against the official schema (tests/data/sarif/SOURCE.md); paths relative to the repository root
in every format and every file of a published report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DATA
from support.formats import SAVED, _report_in, _repository, _sarif_problems

from trainadvisor.cli import main
from trainadvisor.report.paths import relative_text, relativized, repository_root
from trainadvisor.report.render import load_report
from trainadvisor.report.sarif import sarif_log


def test_sarif_names_the_line_in_the_repository_and_holds_to_the_official_schema(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    log = sarif_log(_report_in(repo), repo)
    assert _sarif_problems(log) == []
    [run] = log["runs"]
    [result] = run["results"]
    assert result["ruleId"] == "data-stall" and result["level"] == "error"  # high -> error
    location = result["locations"][0]["physicalLocation"]
    assert location == {
        "artifactLocation": {"uri": "examples/slow_input_mnist.py", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 56},
    }
    [rule] = run["tool"]["driver"]["rules"]
    assert rule["id"] == "data-stall" and rule["defaultConfiguration"] == {"level": "error"}
    assert "Threshold:" in rule["help"]["text"] and rule["properties"]["threshold_source"]
    figures = result["properties"]["measurements"]
    assert figures["data_wait_pct"]["value"] == pytest.approx(86.60471955652325)
    assert figures["data_wait_pct"]["unit"] == "%"


def test_a_results_fingerprint_follows_its_line_of_code_not_its_number(tmp_path: Path) -> None:
    first = sarif_log(_report_in(_repository(tmp_path / "a")), tmp_path / "a" / "repo")
    moved_repo = _repository(tmp_path / "b", lines_above=3)
    moved = sarif_log(_report_in(moved_repo, line=59), moved_repo)
    [a], [b] = first["runs"][0]["results"], moved["runs"][0]["results"]
    assert b["locations"][0]["physicalLocation"]["region"]["startLine"] == 59
    assert a["partialFingerprints"] == b["partialFingerprints"]
    other = sarif_log(_report_in(moved_repo, line=60), moved_repo)["runs"][0]["results"][0]
    assert other["partialFingerprints"] != a["partialFingerprints"]  # another line of code


def test_a_line_outside_the_repository_is_counted_not_listed(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    log = sarif_log(load_report(SAVED), repo)  # its site is under /work/main, not in repo
    assert log["runs"][0]["results"] == [] and _sarif_problems(log) == []
    assert log["runs"][0]["properties"]["lines_outside_the_repository"] == 1


def test_paths_under_the_root_are_written_relative_to_it(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    assert repository_root(repo / "examples") == repo.resolve()
    assert repository_root(tmp_path) == tmp_path.resolve()  # no repository: where it runs
    text = f"DataLoader at {repo}/examples/slow_input_mnist.py:56; torch at /usr/lib/torch/x.py:3"
    assert (
        relative_text(text, repo)
        == "DataLoader at examples/slow_input_mnist.py:56; torch at /usr/lib/torch/x.py:3"
    )
    assert relativized({"a": [f"{repo}/t.py", 3, None]}, repo) == {"a": ["t.py", 3, None]}


@pytest.mark.parametrize("output_format", ["terminal", "markdown", "json", "sarif"])
def test_report_prints_each_format_and_nothing_else(output_format: str, tmp_path: Path) -> None:
    folder = tmp_path / "saved"
    shutil.copytree(SAVED, folder)
    result = CliRunner().invoke(main, ["report", "--format", output_format, str(folder)])
    assert result.exit_code == 0, result.output
    if output_format == "json":
        assert json.loads(result.output)["kind"] == "profile"
    elif output_format == "sarif":
        assert _sarif_problems(json.loads(result.output)) == []
    elif output_format == "markdown":
        assert result.output.startswith("#") and "| " in result.output
    else:
        assert result.output.startswith("trainadvisor: ") and len(result.output.splitlines()) < 40


def test_analyze_json_is_the_only_thing_on_stdout(tmp_path: Path) -> None:
    traces = sorted((DATA / "own").glob("*.gz"))[:2]
    result = CliRunner().invoke(
        main, ["analyze", "--out", str(tmp_path / "r"), "--format", "json", *map(str, traces)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kind"] == "analyze"
