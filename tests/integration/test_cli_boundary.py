"""The command line's one error boundary (`cli.boundary`): `run` turns each of trainadvisor's own errors
(trainadvisor/errors.py) into one line on stderr and its exit code, a file error into a usage error, Ctrl-C
and SIGTERM into 128 + the signal, and a defect of ours into one line and exit 1 (its traceback with
TRAINADVISOR_DEBUG=1); it installs its signal handlers for the command only. `echo` shows control
characters instead of acting on them, and `load` reads a saved report or says why it cannot."""

from __future__ import annotations

import errno
import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import DATA

from trainadvisor.cli.boundary import echo, load, run, terminate
from trainadvisor.errors import (
    MissingDependencyError,
    NoStepsError,
    RuleError,
    ScriptFailedError,
    Terminated,
    TrainAdvisorError,
    UsageError,
)
from trainadvisor.records import ProfileReport
from trainadvisor.report.saved import saved_report


def _ended(work: Callable[[], int], capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    """`run(work)`'s exit code, and what it wrote to stdout and stderr."""
    with pytest.raises(SystemExit) as ended:
        run(work)
    out, err = capsys.readouterr()
    return ended.value.code, out, err


def _raising(exc: BaseException) -> Callable[[], int]:
    def work() -> int:
        raise exc

    return work


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TrainAdvisorError("something went wrong"), 1),
        (UsageError("no such script: train.py"), 2),
        (NoStepsError("no training step was seen"), 2),
        (RuleError("rules/x.toml: `when` is missing"), 2),
        (ScriptFailedError("train.py exited with code 4"), 3),
        (MissingDependencyError("pip install lightning"), 2),
    ],
)
def test_each_of_our_errors_is_one_line_and_its_exit_code(
    error: TrainAdvisorError, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    ended, out, err = _ended(_raising(error), capsys)
    assert ended == code == type(error).exit_code
    assert out == ""
    assert err == f"trainadvisor: error: {error}\n"


def test_the_work_s_own_code_is_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert _ended(lambda: 0, capsys) == (0, "", "")
    assert _ended(lambda: 4, capsys) == (4, "", "")


def test_an_error_message_s_control_characters_are_shown_not_acted_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ended, _, err = _ended(_raising(UsageError("bad \x1b]0;title\x07 name\rover")), capsys)
    assert ended == 2
    assert err == "trainadvisor: error: bad \\x1b]0;title\\x07 name\\rover\n"


def test_echo_writes_one_visible_line_to_stderr_or_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    echo("key \x1b[31mred\u202e")
    echo("plain", err=False)
    out, err = capsys.readouterr()
    assert err == "key \\x1b[31mred\\u202e\n"
    assert out == "plain\n"


def test_ctrl_c_ends_with_130(capsys: pytest.CaptureFixture[str]) -> None:
    ended, _, err = _ended(_raising(KeyboardInterrupt()), capsys)
    assert ended == 130
    assert err == "trainadvisor: interrupted; the script and its workers were stopped\n"


def test_sigterm_ends_with_143_through_the_handler_run_installs(capsys: pytest.CaptureFixture[str]) -> None:
    def work() -> int:
        handler = signal.getsignal(signal.SIGTERM)
        assert handler is terminate
        handler(signal.SIGTERM, None)  # as the signal would call it
        return 0

    ended, _, err = _ended(work, capsys)
    assert ended == 128 + signal.SIGTERM == 143
    assert err == "trainadvisor: interrupted; the script and its workers were stopped\n"


def test_terminate_raises_terminated_with_its_signal() -> None:
    with pytest.raises(Terminated) as raised:
        terminate(signal.SIGHUP, None)
    assert raised.value.signum == signal.SIGHUP
    assert str(raised.value) == f"signal {int(signal.SIGHUP)}"
    assert not isinstance(raised.value, Exception)  # an `except Exception` in a script lets it through


def test_the_signal_handlers_are_installed_for_the_command_and_put_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGINT ignored before (a shell's background job): Ctrl-C's handler while the command runs,
    ignored again after, as SIGTERM's own handler is."""
    seen: dict[str, object] = {}

    def work() -> int:
        seen["int"], seen["term"] = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        return 0

    before_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    before_term = signal.getsignal(signal.SIGTERM)
    try:
        assert _ended(work, capsys)[0] == 0
        assert seen == {"int": signal.default_int_handler, "term": terminate}
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == before_term
        assert _ended(_raising(UsageError("x")), capsys)[0] == 2  # put back after an error too
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before_int)


def test_a_file_that_cannot_be_written_is_a_usage_error_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    error = OSError(errno.ENOSPC, "No space left on device", "/out/report.html")
    ended, _, err = _ended(_raising(error), capsys)
    assert ended == UsageError.exit_code == 2
    assert err == (
        "trainadvisor: error: No space left on device while writing or reading /out/report.html; free space, "
        "fix the permissions or choose another --out\n"
    )


def test_a_file_error_without_a_name_or_strerror_shows_the_error_itself(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ended, _, err = _ended(_raising(PermissionError("denied")), capsys)
    assert ended == 2
    assert err == (
        "trainadvisor: error: denied while writing or reading; free space, fix the permissions or choose "
        "another --out\n"
    )


def test_a_connection_that_fails_is_not_blamed_on_the_disk(capsys: pytest.CaptureFixture[str]) -> None:
    # a tracker's server that times out, an object store that refuses: no file is involved
    ended, _, err = _ended(_raising(TimeoutError("timed out")), capsys)
    assert ended == 1
    assert err == (
        "trainadvisor: error: TimeoutError: timed out; a connection failed or timed out (a tracker's server, "
        "an object store): check that it can be reached from here and run the command again\n"
    )
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    assert _ended(_raising(refused), capsys)[2] == (
        "trainadvisor: error: ConnectionRefusedError: Connection refused; a connection failed or timed out "
        "(a tracker's server, an object store): check that it can be reached from here and run the command "
        "again\n"
    )
    # a read-only folder without a file name is still about files
    assert _ended(_raising(OSError(errno.EROFS, "Read-only file system")), capsys)[0] == 2


def test_a_defect_of_ours_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRAINADVISOR_DEBUG", raising=False)
    ended, out, err = _ended(_raising(KeyError("steps")), capsys)
    assert ended == 1
    assert out == ""
    assert err == (
        "trainadvisor: internal error: KeyError: 'steps'. Please report it; set TRAINADVISOR_DEBUG=1 to see "
        "the traceback.\n"
    )


def test_with_trainadvisor_debug_a_defect_is_raised_as_it_is(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINADVISOR_DEBUG", "1")
    defect = ZeroDivisionError("division by zero")
    with pytest.raises(ZeroDivisionError) as raised:
        run(_raising(defect))
    assert raised.value is defect
    assert capsys.readouterr().err == ""
    assert _ended(_raising(UsageError("still ours")), capsys)[0] == 2  # our own errors stay one line


def test_load_reads_a_saved_report_from_its_folder_or_its_report_json() -> None:
    """The CLI reads a saved report as the MCP server does (`report.saved`)."""
    by_folder, by_file = load(DATA / "report"), load(DATA / "report" / "report.json")
    assert isinstance(by_folder, ProfileReport) and isinstance(by_file, ProfileReport)
    assert by_folder.script == by_file.script == saved_report(DATA / "report").script
    assert by_folder.script.endswith("examples/slow_input_mnist.py")


def test_load_of_a_folder_without_report_json_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        load(tmp_path)
    assert (
        str(raised.value) == f"{tmp_path}: no report.json here; give a report folder written by trainadvisor"
    )


def test_load_of_a_newer_version_s_report_is_a_usage_error(tmp_path: Path) -> None:
    data = json.loads((DATA / "report" / "report.json").read_text())
    (tmp_path / "report.json").write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(UsageError) as raised:
        load(tmp_path)
    assert str(raised.value) == (
        f"{tmp_path / 'report.json'}: schema_version '99' is not one this version reads (1 to 2); "
        "a newer trainadvisor wrote it, or it is not a report"
    )


def test_load_of_a_file_that_is_not_a_report_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text("[1, 2]")
    with pytest.raises(UsageError) as raised:
        load(tmp_path)
    assert str(raised.value) == (
        f"{tmp_path / 'report.json'}: not a report this version can read (not a JSON object)"
    )
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"report\.json: not a report this version can read \(Expecting"):
        load(tmp_path)


def test_load_of_a_report_with_a_field_of_the_wrong_type_is_a_usage_error(tmp_path: Path) -> None:
    shutil.copy(DATA / "report" / "report.json", tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    data["findings"] = "none"
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(UsageError) as raised:
        load(tmp_path)
    assert str(raised.value) == (
        f"{tmp_path / 'report.json'}: not a report this version can read (Expected `array`, got `str` - "
        "at `$.findings`)"
    )
