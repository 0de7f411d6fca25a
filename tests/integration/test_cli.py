"""The command line's one error boundary, through click's CliRunner: commands, exit codes and
one-line messages for user mistakes."""

from __future__ import annotations

import errno
import shutil
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DATA, EXAMPLES, ROOT, shared_trace

from trainadvisor import _serial
from trainadvisor.cli import main


def _run(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def test_help_lists_each_command_once_by_its_name() -> None:
    code, output = _run("--help")
    commands = [line.split()[0] for line in output.split("Commands:")[1].splitlines() if line.strip()]
    named = ("analyze", "baseline", "compare", "profile", "report")
    assert code == 0 and [c for c in commands if c in named] == list(named)
    assert "profile-command" not in output


@pytest.mark.parametrize("command", ["analyze", "report", "profile"])
def test_an_out_folder_under_a_file_is_a_usage_error(tmp_path: Path, command: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    target = {"analyze": shared_trace("hta/trace_filter/sampled_rank-0.json.gz"), "report": DATA / "report",
              "profile": EXAMPLES / "small_batch.py"}[command]  # fmt: skip
    code, output = _run(command, "--out", afile / "sub", target)
    assert code == 2, output
    assert output.strip().splitlines() == [
        f"trainadvisor: error: --out {afile / 'sub'}: is inside {afile}, a file; choose another --out"
    ]
    assert afile.read_text() == "mine"


def test_a_full_disk_is_one_line_and_leaves_the_report_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(DATA / "report", tmp_path / "r")
    before = (tmp_path / "r" / "report.json").read_text()

    def full(handle: typing.TextIO, text: str) -> None:
        handle.write(text[: len(text) // 2])  # what the disk took before it filled
        raise OSError(errno.ENOSPC, "No space left on device", handle.name)

    monkeypatch.setattr(_serial, "_write", full)
    code, output = _run("report", tmp_path / "r")
    assert code == 2
    [line] = output.strip().splitlines()
    assert line == (
        # re-rendered in its own folder, report.json is left as saved: report.md is written first
        f"trainadvisor: error: no space left on device while writing {tmp_path / 'r' / 'report.md'}; "
        "free space or choose another --out"
    )
    monkeypatch.undo()
    assert (tmp_path / "r" / "report.json").read_text() == before  # never half-written
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["SOURCE.md", "report.json"]


def _user_rule(tmp_path: Path, rule_id: str, condition: str) -> Path:
    """A folder holding the shipped data-stall rule under another id and condition."""
    rules = tmp_path / "rules"
    rules.mkdir()
    rule = (ROOT / "rules" / "data-stall.toml").read_text()
    rule = rule.replace('id = "data-stall"', f'id = "{rule_id}"')
    rule = rule.replace('condition = "data_wait_pct >= 20"', f'condition = "{condition}"')
    (rules / f"{rule_id}.toml").write_text(rule)
    return rules


def test_a_user_rule_that_cannot_be_evaluated_names_its_file(tmp_path: Path) -> None:
    rules = _user_rule(tmp_path, "my-rule", "data_wait_pct >= 'twenty'")
    code, output = _run("report", "--out", tmp_path / "o", "--rules", rules, DATA / "report", DATA / "report")
    assert code == 2 and "a report folder was given twice" in output
    code, output = _run(
        "analyze", "--out", tmp_path / "a", "--rules", rules, shared_trace("tb_plugin/resnet50_num_workers_0")
    )
    assert code == 2, output
    assert output.strip() == (
        f"trainadvisor: error: {rules / 'my-rule.toml'}: condition \"data_wait_pct >= 'twenty'\" cannot be "
        "evaluated ('>=' not supported between instances of 'float' and 'str'); fix or remove the rule"
    )


def test_a_user_rule_that_reads_an_unknown_measurement_is_refused_with_the_closest_name(
    tmp_path: Path,
) -> None:
    """`data_wait_pc` (a typo) would have kept the rule silent forever: loading it fails, exit 2,
    naming the file, the line and the measurement meant."""
    rules = _user_rule(tmp_path, "my-rule", "data_wait_pc >= 20")
    line = next(
        i for i, text in enumerate((rules / "my-rule.toml").read_text().splitlines(), 1) if "_pc " in text
    )
    trace = DATA / "own" / "host_tensors_cpu.pt.trace.json.gz"
    code, output = _run("analyze", "--out", tmp_path / "a", "--rules", rules, trace)
    assert code == 2, output
    assert output.strip() == (
        f"trainadvisor: error: {rules / 'my-rule.toml'}:{line}: 'data_wait_pc' is not a measurement "
        "trainadvisor makes; did you mean 'data_wait_pct'? (every measurement, with its unit and meaning, "
        "is listed in trainadvisor/records/measurements.py)"
    )


def test_a_user_rule_over_num_workers_runs_on_traces_of_multi_process_loaders(tmp_path: Path) -> None:
    """analyze used to set num_workers to the text "1 or more", and `num_workers < 2` raised."""
    rules = _user_rule(tmp_path, "few-workers", "num_workers < 2")
    code, output = _run(
        "analyze", "--out", tmp_path / "a", "--rules", rules, shared_trace("tb_plugin/resnet50_num_workers_4")
    )
    assert code == 0, output


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--memory-budget", "NaN", "'NaN' is not an amount of memory"),
        ("--memory-budget", "inf", "'inf' is not an amount of memory"),
        ("--min-time", "nan", "'nan' is not a duration"),
        ("--max-warmup", "inf", "'inf' is not a duration"),
        ("--budget", "nan", "'nan' is not a duration"),
        ("--timeout", "nan", "'nan' is not a number of seconds"),
        ("--stall-timeout", "inf", "'inf' is not a number of seconds"),
    ],
)
def test_a_number_that_is_not_finite_is_a_usage_error(option: str, value: str, message: str) -> None:
    """NaN passes every comparison (a range check takes it): a NaN --min-time never ended the
    window, a NaN --timeout or --budget never fired, a NaN --memory-budget raised a traceback."""
    code, output = _run("profile", option, value, EXAMPLES / "small_batch.py")
    assert code == 2 and message in output, output


def test_a_gate_of_nan_is_a_usage_error() -> None:
    """`compare --max-regression nan` passed every regression (nothing is below -nan)."""
    code, output = _run("compare", "--max-regression", "nan", DATA / "report", DATA / "report")
    assert code == 2 and "'nan' is not a finite number" in output, output
