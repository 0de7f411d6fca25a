"""The MCP server's side that needs no process (`agents.server`): `explained`, one finding of a saved
report (tests/data/report, a profile; tests/data/report-v1-analyze, an analysis) with its fixes'
outcomes, checked against the report's own JSON; the last line of a failed command's stderr; and,
where the MCP SDK (and anyio with it) is installed: what a command's report or failure answers,
a cancelled child stopped, and the server built in this process (no transport): the tools it
lists, `explain` through it, and the command lines the other tools would run, the child process
replaced by a stand-in that answers as the CLI would."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA

from trainadvisor.agents import server
from trainadvisor.agents.digest import SUMMARY_MAX_BYTES
from trainadvisor.agents.server import _last_line, _reported, _stop, explained
from trainadvisor.errors import UsageError

SAVED = DATA / "report"
ANALYSIS = DATA / "report-v1-analyze"
NO_SDK = importlib.util.find_spec("mcp") is None
needs_sdk = pytest.mark.skipif(
    NO_SDK, reason="the MCP SDK (and anyio) is not installed: pip install -e '.[dev]'"
)
OUTCOME_KEYS = ("fix", "status", "chosen", "gain", "gain_low", "unit", "reason", "diff")


def _awaited(function: Any, *args: Any) -> Any:
    import anyio  # installed with the MCP SDK (the tests that await are skipped without it)

    return anyio.run(function, *args)


def _json(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())  # type: ignore[no-any-return]


def test_a_finding_is_explained_whole_with_what_its_fix_measured() -> None:
    saved = _json(SAVED)
    [finding] = saved["findings"]
    [outcome] = saved["fix_outcomes"]
    expected = {**finding, "fix_outcomes": [{key: outcome[key] for key in OUTCOME_KEYS}]}
    assert explained(str(SAVED), "data-stall") == expected
    assert explained(str(SAVED / "report.json"), "data-stall") == expected  # the file, as well as its folder
    assert expected["fix_outcomes"][0]["status"] == "kept"
    assert expected["fix_outcomes"][0]["chosen"] == "num_workers=8, persistent_workers=True"
    assert expected["fix_outcomes"][0]["diff"].startswith("--- a/slow_input_mnist.py\n")


def test_a_finding_of_an_analysis_has_no_fix_outcomes() -> None:
    data = explained(str(ANALYSIS), "data-stall")
    assert data["rule"] == "data-stall" and data["fix_outcomes"] == []
    assert data["message"] == _json(ANALYSIS)["findings"][0]["message"]


def test_a_rule_the_report_did_not_find_is_refused_naming_those_it_did(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as refused:
        explained(str(SAVED), "host-sync")
    assert str(refused.value) == f"no finding 'host-sync' in {SAVED}: it has data-stall"
    empty = _json(SAVED)
    empty["findings"] = []
    (tmp_path / "report.json").write_text(json.dumps(empty))
    with pytest.raises(UsageError) as refused:
        explained(str(tmp_path), "data-stall")
    assert str(refused.value) == f"no finding 'data-stall' in {tmp_path}: it has none"


def test_a_failed_commands_message_is_its_last_line_with_text() -> None:
    assert _last_line("trainadvisor: running\nError: --out x: not a report folder\n\n  \n") == (
        "Error: --out x: not a report folder"
    )
    assert _last_line("one\n   indented last  \n") == "   indented last  "
    assert _last_line("") == "trainadvisor failed without a message"
    assert _last_line(" \n\t\n") == "trainadvisor failed without a message"


class Child:
    """The CLI's child process as `_run` would report it: an exit code, stdout and stderr; each
    command it was asked for recorded with its folder. `writes`: a saved report copied to
    cwd/out, as a run of the CLI would leave it."""

    def __init__(self, code: int, out: str = "", err: str = "", writes: Path | None = None) -> None:
        self.code, self.out, self.err, self.writes = code, out, err, writes
        self.asked: list[tuple[list[str], str | None]] = []

    async def __call__(self, command: list[str], cwd: str | None, ctx: Any) -> tuple[int, str, str]:
        self.asked.append((command, cwd))
        if self.writes is not None:
            out = command[command.index("--out") + 1]
            (Path(cwd or ".") / out).mkdir(parents=True)
            shutil.copy(self.writes / "report.json", Path(cwd or ".") / out / "report.json")
        return self.code, self.out, self.err


@needs_sdk
@pytest.mark.parametrize("code", [0, 3])  # 3: the script failed, and was reported
def test_a_reported_command_answers_with_its_reports_summary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, code: int
) -> None:
    child = Child(code, writes=SAVED)
    monkeypatch.setattr(server, "_run", child)
    data = _awaited(_reported, ["analyze", "--out", "r", "t.json"], "r", str(tmp_path), None)
    assert child.asked == [(["analyze", "--out", "r", "t.json"], str(tmp_path))]
    assert (data["report"], data["report_json"], data["kind"]) == (
        "r/report.html",
        "r/report.json",
        "profile",
    )
    assert [f["rule"] for f in data["findings"]] == ["data-stall"]


@needs_sdk
@pytest.mark.parametrize(
    ("code", "writes"), [(2, None), (1, None), (0, None), (2, SAVED)]
)  # refused, failed, or no report written
def test_a_command_that_failed_or_wrote_no_report_is_refused_with_its_last_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, code: int, writes: Path | None
) -> None:
    monkeypatch.setattr(
        server, "_run", Child(code, err="trainadvisor: running\nError: no such script\n", writes=writes)
    )
    with pytest.raises(UsageError, match="^Error: no such script$"):
        _awaited(_reported, ["profile", "--out", "r", "x.py"], "r", str(tmp_path), None)


@needs_sdk
def test_a_report_the_command_left_damaged_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The command exited 0 but its report.json cannot be read (a disk that filled as it was
    written): the agent is told which file and why, as `explain` and the CLI tell it."""
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "report.json").write_text("{not json")
    monkeypatch.setattr(server, "_run", Child(0, writes=damaged))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(UsageError) as refused:
        _awaited(_reported, ["profile", "--out", "r", "x.py"], "r", str(work), None)
    report_json = work / "r" / "report.json"
    assert str(refused.value).startswith(f"{report_json}: not a report this version can read (")


class Process:
    """What `_stop` asks of anyio's process: its exit code, signals, and waits that end only once
    told to (`ends`), else never."""

    def __init__(self, returncode: int | None, ends: bool) -> None:
        self.returncode, self.ends, self.pid = returncode, ends, 4321
        self.calls: list[str] = []

    def send_signal(self, sig: int) -> None:
        self.calls.append(f"signal {signal.Signals(sig).name}")

    async def wait(self) -> int:
        self.calls.append("wait")
        if not self.ends:
            self.ends = True  # the next wait, after the group's SIGKILL, returns
            import anyio

            await anyio.sleep_forever()
        return -9


def _stopped(monkeypatch: pytest.MonkeyPatch, process: Process, group_gone: bool = False) -> list[str]:
    def killpg(pid: int, sig: int) -> None:
        process.calls.append(f"killpg {pid} {signal.Signals(sig).name}")
        if group_gone:
            raise ProcessLookupError(pid)

    monkeypatch.setattr(server, "os", types.SimpleNamespace(killpg=killpg))
    monkeypatch.setattr(server, "STOP_GRACE_S", 0.01)  # the waits that end never: no race with it
    _awaited(_stop, process)
    return process.calls


@needs_sdk
def test_a_cancelled_child_that_ended_already_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _stopped(monkeypatch, Process(returncode=0, ends=True)) == []


@needs_sdk
def test_a_cancelled_child_is_sent_sigterm_and_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _stopped(monkeypatch, Process(returncode=None, ends=True)) == ["signal SIGTERM", "wait"]


@needs_sdk
def test_a_cancelled_child_that_outlasts_its_grace_has_its_group_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _stopped(monkeypatch, Process(returncode=None, ends=False))
    assert calls == ["signal SIGTERM", "wait", "killpg 4321 SIGKILL", "wait"]
    gone = _stopped(monkeypatch, Process(returncode=None, ends=False), group_gone=True)
    assert gone == ["signal SIGTERM", "wait", "killpg 4321 SIGKILL", "wait"]


# ---- the server, built in this process ----


def _call(name: str, arguments: dict[str, Any]) -> Any:
    built = server._server()
    return _awaited(built.call_tool, name, arguments)


@needs_sdk
def test_the_server_lists_its_four_tools_and_what_each_requires() -> None:
    built = server._server()
    tools = {tool.name: tool for tool in _awaited(built.list_tools)}
    assert sorted(tools) == ["analyze", "compare", "explain", "profile"]
    shapes = {
        name: (sorted(tool.input_schema["properties"]), tool.input_schema.get("required"))
        for name, tool in tools.items()
    }
    assert shapes == {
        "profile": (["args", "budget", "cwd", "measure_fixes", "out", "script"], ["script"]),
        "analyze": (["cwd", "out", "paths"], ["paths"]),
        "compare": (["against", "base", "cwd", "gate_pct", "head", "metric"], ["head"]),
        "explain": (["report", "rule"], ["report", "rule"]),
    }  # the context the SDK passes is no argument of the client's
    assert (built.name, built.instructions) == ("trainadvisor", server.INSTRUCTIONS)


@needs_sdk
def test_the_explain_tool_answers_what_explained_does() -> None:
    result = _call("explain", {"report": str(SAVED), "rule": "data-stall"})
    assert not result.is_error
    assert result.structured_content == explained(str(SAVED), "data-stall")
    assert json.loads(result.content[0].text) == explained(str(SAVED), "data-stall")


@needs_sdk
def test_an_agent_is_told_why_explain_found_no_such_finding() -> None:
    """The SDK passes on a ToolError's message after "Error executing tool explain: "; any other
    exception reaches the agent as that prefix alone."""
    from mcp.server.mcpserver.exceptions import ToolError

    with pytest.raises(ToolError) as failed:
        _call("explain", {"report": str(SAVED), "rule": "host-sync"})
    assert (
        str(failed.value)
        == f"Error executing tool explain: no finding 'host-sync' in {SAVED}: it has data-stall"
    )
    with pytest.raises(ToolError) as failed:
        _call("explain", {"report": "no-such-folder", "rule": "data-stall"})
    assert str(failed.value) == (
        "Error executing tool explain: no-such-folder: no report.json here; give a report folder written by "
        "trainadvisor"
    )


@needs_sdk
def test_an_agent_is_told_a_damaged_report_cannot_be_read(tmp_path: Path) -> None:
    """explain on a report.json that is not JSON, or of a schema this version does not know,
    says so naming the file, as the CLI does (`report.saved`), not a bare error."""
    from mcp.server.mcpserver.exceptions import ToolError

    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(ToolError) as failed:
        _call("explain", {"report": str(tmp_path), "rule": "data-stall"})
    assert str(failed.value).startswith(
        f"Error executing tool explain: {tmp_path / 'report.json'}: not a report this version can read ("
    )
    (tmp_path / "report.json").write_text('{"schema_version": 99, "kind": "profile"}')
    with pytest.raises(ToolError) as failed:
        _call("explain", {"report": str(tmp_path / "report.json"), "rule": "data-stall"})
    assert str(failed.value).startswith(f"Error executing tool explain: {tmp_path / 'report.json'}: ")
    assert "99" in str(failed.value)


@needs_sdk
def test_the_profile_tool_runs_the_clis_profile_with_the_options_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    child = Child(0, writes=SAVED)
    monkeypatch.setattr(server, "_run", child)
    arguments = {
        "script": "train.py", "args": ["--lr", "0.1"], "measure_fixes": False, "budget": "10m",
        "out": "mcp-report", "cwd": str(tmp_path),
    }  # fmt: skip
    result = _call("profile", arguments)
    assert child.asked == [
        (
            ["profile", "--format", "json", "--out", "mcp-report", "--no-fix", "--budget", "10m", "train.py",
             "--lr", "0.1"],
            str(tmp_path),
        )
    ]  # fmt: skip
    assert result.structured_content["report"] == "mcp-report/report.html"
    child.asked.clear()
    shutil.rmtree(tmp_path / "mcp-report")
    _call("profile", {"script": "train.py", "cwd": str(tmp_path)})
    assert child.asked[0][0] == ["profile", "--format", "json", "--out", "trainadvisor-report", "train.py"]


@needs_sdk
def test_the_analyze_tool_runs_the_clis_analyze_on_the_paths_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    child = Child(0, writes=ANALYSIS)
    monkeypatch.setattr(server, "_run", child)
    result = _call("analyze", {"paths": ["a.json", "s3://b/traces/"], "cwd": str(tmp_path)})
    assert child.asked == [
        (
            ["analyze", "--format", "json", "--out", "trainadvisor-report", "a.json", "s3://b/traces/"],
            str(tmp_path),
        )
    ]
    assert result.structured_content["kind"] == "analyze"


@needs_sdk
def test_the_compare_tool_answers_the_clis_verdict_without_a_table_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    verdict = {"verdict": "regression_likely", "reasons": ["slower"], "metrics": [{"name": "step_time"}]}
    child = Child(1, json.dumps(verdict))  # 1: a regression, not a failure
    monkeypatch.setattr(server, "_run", child)
    assert _call("compare", {"head": "new", "base": "old"}).structured_content == verdict
    assert (
        _call("compare", {"head": "new", "against": "baseline:main", "gate_pct": 2.5}).structured_content
        == verdict
    )
    assert [command for command, _ in child.asked] == [
        ["compare", "--format", "json", "--gate", "5.0", "--metric", "step_time", "old", "new"],
        [
            "compare",
            "--format",
            "json",
            "--gate",
            "2.5",
            "--metric",
            "step_time",
            "--against",
            "baseline:main",
            "new",
        ],
    ]
    large = {**verdict, "metrics": [{"name": "x" * SUMMARY_MAX_BYTES}]}
    monkeypatch.setattr(server, "_run", Child(0, json.dumps(large)))
    assert _call("compare", {"head": "new", "base": "old"}).structured_content == {
        "verdict": "regression_likely", "reasons": ["slower"],
    }  # fmt: skip


@needs_sdk
def test_a_compare_the_cli_refused_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    monkeypatch.setattr(server, "_run", Child(2, err="Error: old: no report.json there\n"))
    with pytest.raises(ToolError, match="^Error executing tool compare: Error: old: no report.json there$"):
        _call("compare", {"head": "new", "base": "old"})
    with pytest.raises(
        ToolError, match="^Error executing tool compare: give the report to compare with: base"
    ):
        _call("compare", {"head": "new"})  # neither base nor against: nothing run
