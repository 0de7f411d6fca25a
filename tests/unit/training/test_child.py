"""The child's helpers around the user's script (`training.child`), in this process (`main`,
which runs the script, is not called): `_seed` leaves random, torch and numpy where seeding them by
hand does; `_exit_code` reads SystemExit as Python's own exit does; `_print_script_traceback`
prints the traceback from the script's first frame on; `_record_when_stopped` records how far the
run got when SIGTERM (sent to this process) arrives, and only in the main process and before the
window is recorded. The handler's `os._exit` is a fake that raises, and SIGTERM's own handler is
put back after each test."""

from __future__ import annotations

import os
import random
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest
import torch
from support.window import FakeClock

from trainadvisor import _serial
from trainadvisor.measure.config import ChildConfig
from trainadvisor.records import RawRun
from trainadvisor.training import child, hooks


@pytest.fixture
def rng_kept() -> Iterator[None]:
    """The process's random states, put back after the test (other tests draw from them)."""
    states = random.getstate(), torch.get_rng_state(), numpy.random.get_state()
    yield
    random.setstate(states[0])
    torch.set_rng_state(states[1])
    numpy.random.set_state(states[2])


def _draws() -> tuple[float, list[float], list[float]]:
    return random.random(), torch.rand(3).tolist(), numpy.random.rand(2).tolist()


def test_seeding_draws_what_seeding_each_generator_by_hand_draws(rng_kept: None) -> None:
    random.seed(1234)
    torch.manual_seed(1234)
    numpy.random.seed(1234)
    by_hand = _draws()
    child._seed(99)  # elsewhere first, so nothing is left over from the hand-seeded draws
    other = _draws()
    child._seed(1234)
    assert _draws() == by_hand and other != by_hand


def test_seeding_without_numpy_still_seeds_random_and_torch(
    rng_kept: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    random.seed(7)
    torch.manual_seed(7)
    by_hand = random.random(), torch.rand(2).tolist()
    numpy.random.seed(5)
    numpy_before = numpy.random.rand()
    numpy.random.seed(5)
    monkeypatch.setitem(sys.modules, "numpy", None)  # as if not installed
    child._seed(7)
    assert (random.random(), torch.rand(2).tolist()) == by_hand
    monkeypatch.undo()
    assert numpy.random.rand() == numpy_before  # left alone


@pytest.mark.parametrize(
    ("code", "expected", "printed"),
    [(None, 0, ""), (0, 0, ""), (3, 3, ""), ("loss went NaN", 1, "loss went NaN\n")],
    ids=["none", "zero", "three", "text"],
)
def test_exit_codes_are_read_as_python_reads_systemexit(
    code: object, expected: int, printed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert child._exit_code(SystemExit(code)) == expected
    assert capsys.readouterr() == ("", printed)


SCRIPT = 'def step():\n    raise ValueError("bad batch")\n\nstep()\n'


def _run_script(path: str) -> BaseException:
    """What runpy does with the script: its code, compiled under its file name, run from here."""
    try:
        exec(compile(SCRIPT, path, "exec"), {"__name__": "__main__"})
    except ValueError as exc:
        return exc
    raise AssertionError("the script did not raise")


def test_the_traceback_starts_at_the_scripts_first_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The script named relative to the working directory, as `python train.py` names it."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    exc = _run_script(str(script))
    child._print_script_traceback(exc, "train.py")
    assert capsys.readouterr().err == (
        "Traceback (most recent call last):\n"
        f'  File "{script}", line 4, in <module>\n'
        "    step()\n"
        f'  File "{script}", line 2, in step\n'
        '    raise ValueError("bad batch")\n'
        "ValueError: bad batch\n"
    )


def test_an_error_outside_the_script_keeps_its_whole_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exc = _run_script(str(tmp_path / "train.py"))
    child._print_script_traceback(exc, str(tmp_path / "other.py"))
    printed = capsys.readouterr().err
    assert printed.startswith(f'Traceback (most recent call last):\n  File "{__file__}", line ')
    assert printed.count(f'File "{tmp_path / "train.py"}"') == 2 and printed.endswith(
        "ValueError: bad batch\n"
    )


class _Exited(BaseException):
    """What the fake `os._exit` raises: the code the process would have ended with."""


class _Os:
    """The handler's `os`: the process ids `getpid` answers in turn (the last one from then on),
    and an `_exit` that raises."""

    def __init__(self, *pids: int) -> None:
        self.pids = list(pids)
        self.exits: list[int] = []

    def getpid(self) -> int:
        return self.pids.pop(0) if len(self.pids) > 1 else self.pids[0]

    def _exit(self, code: int) -> None:
        self.exits.append(code)
        raise _Exited(code)


@pytest.fixture
def sigterm_kept() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def _recorder(tmp_path: Path) -> hooks.Recorder:
    """A run in its warm-up (5 steps before the window opens), on a fake clock."""
    config = ChildConfig("baseline", str(tmp_path / "r.json"), None, 5, 2, 0, True, None)
    return hooks.Recorder(config, FakeClock().clock())


def _terminated(faked: _Os, monkeypatch: pytest.MonkeyPatch) -> int:
    """SIGTERM to this process; the exit code the handler ended it with."""
    monkeypatch.setattr(child, "os", faked)
    with pytest.raises(_Exited) as exited:
        os.kill(os.getpid(), signal.SIGTERM)
    return int(exited.value.args[0])


@pytest.mark.parametrize(("inside", "where"), [(True, "inside backward()"), (False, "before its backward()")])
def test_sigterm_records_how_far_the_run_got_then_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigterm_kept: None, inside: bool, where: str
) -> None:
    recorder = _recorder(tmp_path)
    for _ in range(3):
        recorder.boundary()
    if inside:
        recorder.window.mark_backward()
    faked = _Os(4242)
    monkeypatch.setattr(child, "os", faked)
    child._record_when_stopped(recorder)
    assert _terminated(faked, monkeypatch) == 128 + signal.SIGTERM == 143
    saved = _serial.load_json(RawRun, tmp_path / "r.json")
    assert (saved.label, saved.status, saved.exit_code, saved.steps_seen) == (
        "baseline",
        "script_failed",
        143,
        3,
    )
    assert saved.error == f"stopped by trainadvisor after 3 steps, {where}"
    assert (saved.warmup_steps, saved.window_steps, saved.steps) == (3, 0, [])  # the window never opened


def test_sigterm_after_the_window_was_recorded_exits_without_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigterm_kept: None
) -> None:
    recorder = _recorder(tmp_path)
    recorder.result = RawRun("baseline", "window_complete", None, None, 1, 2, 0, 3, [], [], None)
    faked = _Os(4242)
    monkeypatch.setattr(child, "os", faked)
    child._record_when_stopped(recorder)
    assert _terminated(faked, monkeypatch) == 143
    assert not (tmp_path / "r.json").exists() and faked.exits == [143]


def test_sigterm_in_a_process_forked_from_the_run_just_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigterm_kept: None
) -> None:
    """A DataLoader worker inherits the handler: its process id is not the run's."""
    recorder = _recorder(tmp_path)
    faked = _Os(4242, 5151)  # the run's id when the handler is installed; the worker's after
    monkeypatch.setattr(child, "os", faked)
    child._record_when_stopped(recorder)
    assert _terminated(faked, monkeypatch) == 143
    assert not (tmp_path / "r.json").exists() and faked.exits == [143]
