"""What a command prints on stdout (`cli.output`) and the exit codes its --help documents
(`cli.exits`): `print_as` writes each --format of the saved real report (tests/data/report) as
the golden renderings and the renderers have it, with paths relative to the repository around
the working directory; `stdout_kept_for` sends whatever reaches file descriptor 1 meanwhile to
stderr for a machine-readable format only; each command's --help ends with its exit codes, and
the CLI, run in-process with click's CliRunner, exits with the code its text gives."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT
from support.formats import SAVED, _report_in, _repository

from trainadvisor.cli import exits, main, output
from trainadvisor.errors import MissingDependencyError, NoStepsError, RuleError, ScriptFailedError, UsageError
from trainadvisor.report.render import load_report

GOLDEN = ROOT / "tests" / "golden"


def _golden(name: str) -> str:
    """A golden rendering of the saved report, without its header line."""
    return (GOLDEN / name).read_text().split("\n", 1)[1]


def test_terminal_prints_the_summary_as_the_golden_file_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainadvisor.report.render import terminal_summary

    monkeypatch.chdir(tmp_path)
    report = load_report(SAVED)
    output.print_as("terminal", report, lambda: terminal_summary(report, Path("trainadvisor-report")))
    assert capsys.readouterr() == (_golden("summary.txt"), "")


def test_terminal_writes_paths_under_the_repository_relative_and_shows_a_carriage_return(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _repository(tmp_path)
    monkeypatch.chdir(repo / "examples")  # the repository is found above the working directory
    text = f"see {repo}/examples/slow_input_mnist.py:56 and /elsewhere/x.py:3\rover"
    output.print_as("terminal", load_report(SAVED), lambda: text)
    assert capsys.readouterr().out == "see examples/slow_input_mnist.py:56 and /elsewhere/x.py:3\\rover\n"


def test_markdown_prints_report_md_as_the_golden_file_has_it_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    output.print_as("markdown", load_report(SAVED), lambda: pytest.fail("the terminal text was asked for"))
    assert capsys.readouterr() == (_golden("report.md"), "")


def test_json_prints_the_report_which_loads_back_as_the_same_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    report = load_report(SAVED)
    output.print_as("json", report, lambda: pytest.fail("the terminal text was asked for"))
    printed, err = capsys.readouterr()
    assert err == "" and printed.endswith("}\n") and not printed.endswith("\n\n")
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "report.json").write_text(printed)
    assert load_report(tmp_path / "again") == report
    plain = json.loads(printed)
    assert (plain["kind"], plain["run_id"]) == ("profile", report.run_id)


def test_sarif_names_the_line_relative_to_the_repository_around_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _repository(tmp_path)
    monkeypatch.chdir(repo / "examples")
    output.print_as("sarif", _report_in(repo), lambda: pytest.fail("the terminal text was asked for"))
    log = json.loads(capsys.readouterr().out)
    [run] = log["runs"]
    [result] = run["results"]
    assert (log["version"], result["ruleId"]) == ("2.1.0", "data-stall")
    assert result["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "examples/slow_input_mnist.py", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 56},
    }
    assert run["properties"]["lines_outside_the_repository"] == 0


def test_sarif_run_outside_that_repository_counts_the_line_instead_of_listing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _repository(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    output.print_as("sarif", _report_in(repo), str)
    [run] = json.loads(capsys.readouterr().out)["runs"]
    assert run["results"] == [] and run["properties"]["lines_outside_the_repository"] == 1


def test_root_is_the_repository_around_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repository(tmp_path)
    monkeypatch.chdir(repo / "examples")
    assert output.root() == repo.resolve()
    monkeypatch.chdir(tmp_path)
    assert output.root() == tmp_path.resolve()  # no repository: where it runs


# ---- stdout_kept_for: nothing but the document on stdout ----


@pytest.mark.parametrize("output_format", ["markdown", "json", "sarif"])
def test_a_machine_readable_format_sends_what_reaches_descriptor_1_meanwhile_to_stderr(
    output_format: str, capfd: pytest.CaptureFixture[str]
) -> None:
    os.write(1, b"before\n")
    with output.stdout_kept_for(output_format):
        os.write(1, b"the script's print\n")  # what a child process inheriting fd 1 writes
        os.write(2, b"progress\n")
    os.write(1, b"the document\n")
    assert capfd.readouterr() == ("before\nthe document\n", "the script's print\nprogress\n")


def test_the_terminal_format_leaves_stdout_as_it_is(capfd: pytest.CaptureFixture[str]) -> None:
    with output.stdout_kept_for("terminal"):
        os.write(1, b"the script's print\n")
    assert capfd.readouterr() == ("the script's print\n", "")


def test_stdout_is_restored_when_the_block_raises(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), output.stdout_kept_for("json"):
        os.write(1, b"inside\n")
        raise RuntimeError("the run failed")
    os.write(1, b"after\n")
    assert capfd.readouterr() == ("after\n", "inside\n")


def test_without_a_descriptor_to_keep_nothing_is_redirected(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def no_descriptor(fd: int) -> int:
        raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(os, "dup", no_descriptor)
    with output.stdout_kept_for("json"):
        os.write(1, b"inside\n")
    monkeypatch.undo()
    assert capfd.readouterr() == ("inside\n", "")


# ---- exits: the codes --help documents, and the CLI ends with ----


def _codes(text: str) -> dict[int, str]:
    """An exit-code text's codes and the start of what each means."""
    return {int(code): meaning for code, meaning in re.findall(r"^  (\d)  (.*)$", text, re.MULTILINE)}


EPILOGS = [
    (["profile"], exits.PROFILE),
    (["analyze"], exits.ANALYZE),
    (["report"], exits.REPORT),
    (["compare"], exits.COMPARE),
    (["export"], exits.EXPORT),
    (["mcp"], exits.MCP),
    (["baseline"], exits.BASELINE),
    (["baseline", "save"], exits.BASELINE),
    (["baseline", "list"], exits.BASELINE),
    (["baseline", "delete"], exits.BASELINE),
]


@pytest.mark.parametrize("command, text", EPILOGS, ids=[" ".join(c) for c, _ in EPILOGS])
def test_each_commands_help_ends_with_its_exit_codes_unwrapped(command: list[str], text: str) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0
    shown = ["  " + line for line in text.splitlines()[1:]]  # click indents an epilog; \b keeps its lines
    assert result.output.splitlines()[-len(shown) :] == shown


def test_the_codes_each_text_lists_are_those_of_the_errors_raised_for_them() -> None:
    assert {UsageError.exit_code, NoStepsError.exit_code, RuleError.exit_code} == {2}
    assert MissingDependencyError.exit_code == 2 and ScriptFailedError.exit_code == 3
    assert _codes(exits.PROFILE) == {
        0: "the report was written",
        2: "a usage problem: no such script, no training step seen, bad --out or rule file",
        3: "the script failed (its error is shown; what was measured is still reported)",
        1: "trainadvisor itself failed (please report it)",
    }
    for text in (exits.ANALYZE, exits.REPORT, exits.BASELINE, exits.MCP):
        assert sorted(_codes(text)) == [0, 1, 2]
    assert sorted(_codes(exits.EXPORT)) == [0, 1, 2, 4]
    assert sorted(_codes(exits.COMPARE)) == [0, 1, 2]  # 1: a regression, not a failure of ours
    assert _codes(exits.COMPARE)[1].startswith("regression_likely")


def _exit(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def test_report_without_a_report_json_exits_2_as_its_help_says(tmp_path: Path) -> None:
    assert "2  no report.json in a DIR" in exits.REPORT
    code, said = _exit("report", tmp_path)
    assert code == 2
    assert said.strip() == (
        f"trainadvisor: error: {tmp_path}: no report.json here; give a report folder written by trainadvisor"
    )


def test_export_without_a_tracker_exits_2_as_its_help_says() -> None:
    assert "no --to" in _codes(exits.EXPORT)[2]
    code, said = _exit("export", SAVED)
    assert (code, said.strip()) == (
        2,
        "trainadvisor: error: give at least one tracker: --to wandb, --to mlflow or --to tensorboard",
    )


def test_baseline_with_a_bad_name_or_none_of_that_name_exits_2_as_its_help_says(tmp_path: Path) -> None:
    assert "a bad name, no such baseline" in _codes(exits.BASELINE)[2]
    store = tmp_path / "store"
    code, said = _exit("baseline", "delete", "--store", store, "bad/name")
    assert code == 2 and said.startswith("trainadvisor: error: 'bad/name' is not a baseline name")
    code, said = _exit("baseline", "delete", "--store", store, "main")
    assert code == 2 and said.startswith("trainadvisor: error: no baseline 'main' in ")


def test_compare_of_a_report_with_itself_is_neutral_and_exits_0_as_its_help_says() -> None:
    assert _codes(exits.COMPARE)[0].startswith("neutral")
    code, said = _exit("compare", "--format", "json", SAVED, SAVED)
    assert code == 0, said
    assert json.loads(said)["verdict"] == "neutral"
