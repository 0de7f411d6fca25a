"""Signals to trainadvisor's own process while a command runs (`measure.interrupts`): SIGINT and
SIGTERM sent to this test process with `signal.raise_signal` inside `noted_only` are noted, not
raised; `check` and `pause` raise their exception where the run checks; `wait` wakes on one; a
second signal kills the children's groups and exits (both faked here). Every test leaves the
signal handlers and the module's globals as it found them."""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trainadvisor.errors import Terminated
from trainadvisor.measure import interrupts


def _handlers() -> dict[int, Any]:
    return {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The module's notes and tracked groups are this test's own; the handlers are checked to
    be put back."""
    monkeypatch.setattr(interrupts, "_noted", [])
    monkeypatch.setattr(interrupts, "_groups", set())
    before = _handlers()
    yield
    assert _handlers() == before
    assert (interrupts._owner, interrupts._wake) == (None, None)


def _select_during_which(signum: int, seen: list[Any]) -> Callable[..., Any]:
    """A `select.select` in whose wait `signum` arrives: it records the timeout it was given and
    what the wake-up pipe holds then (asked without waiting)."""
    real = select.select

    def fake(read: list[int], write: list[int], error: list[int], timeout: float) -> Any:
        signal.raise_signal(signum)
        ready = real(read, write, error, 0)
        seen.append((timeout, ready))
        return ready

    return fake


def test_outside_noted_only_nothing_is_noted_and_check_and_wait_return() -> None:
    assert not interrupts.active() and not interrupts.noted()
    interrupts.check()
    assert interrupts.wait(0) is False


def test_inside_noted_only_a_sigterm_is_noted_not_raised_and_check_raises_terminated() -> None:
    with interrupts.noted_only():
        assert interrupts.active()
        assert _handlers() == {sig: interrupts._note for sig in interrupts.SIGNALS}
        assert not interrupts.noted()
        interrupts.check()  # nothing noted yet
        signal.raise_signal(signal.SIGTERM)  # noted; the block goes on
        assert interrupts.noted() and interrupts._noted == [signal.SIGTERM]
        with pytest.raises(Terminated) as raised:
            interrupts.check()
        assert raised.value.signum == signal.SIGTERM
    assert not interrupts.active() and not interrupts.noted()  # the note is no longer acted on


def test_a_sigint_is_checked_as_keyboard_interrupt() -> None:
    with interrupts.noted_only():
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()


def test_wait_returns_at_once_with_a_signal_already_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    selected: list[Any] = []
    monkeypatch.setattr(select, "select", lambda *args: selected.append(args) or ([], [], []))
    with interrupts.noted_only():
        signal.raise_signal(signal.SIGTERM)
        assert interrupts.wait(600.0) is True
    assert selected == []  # it never waited


def test_wait_without_a_signal_waits_its_time_and_says_none_came(monkeypatch: pytest.MonkeyPatch) -> None:
    selected: list[Any] = []

    def nothing_comes(read: list[int], write: list[int], error: list[int], timeout: float) -> Any:
        selected.append((read, timeout))
        return [], [], []

    monkeypatch.setattr(select, "select", nothing_comes)
    with interrupts.noted_only():
        wake = interrupts._wake
        assert wake is not None
        assert interrupts.wait(2.5) is False
    assert selected == [([wake[0]], 2.5)]


def test_a_signal_during_wait_wakes_it_through_the_pipe_which_is_drained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(select, "select", _select_during_which(signal.SIGTERM, seen))
    with interrupts.noted_only():
        wake = interrupts._wake
        assert wake is not None
        assert interrupts.wait(600.0) is True
        assert seen == [(600.0, ([wake[0]], [], []))]  # the handler's byte woke the wait
        with pytest.raises(BlockingIOError):
            os.read(wake[0], 1)  # read by wait: the next wait does not wake for it


def test_pause_raises_for_a_signal_that_arrives_while_it_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(select, "select", _select_during_which(signal.SIGINT, seen))
    with interrupts.noted_only():
        with pytest.raises(KeyboardInterrupt):
            interrupts.pause(30.0)
    assert len(seen) == 1 and seen[0][0] == 30.0


def test_pause_raises_before_waiting_for_a_signal_noted_earlier(monkeypatch: pytest.MonkeyPatch) -> None:
    selected: list[Any] = []
    monkeypatch.setattr(select, "select", lambda *args: selected.append(args) or ([], [], []))
    with interrupts.noted_only():
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(Terminated):
            interrupts.pause(30.0)
    assert selected == []


def test_a_nested_block_keeps_the_outer_ones_handlers_and_notes() -> None:
    with interrupts.noted_only():
        wake = interrupts._wake
        signal.raise_signal(signal.SIGTERM)
        with interrupts.noted_only():
            assert interrupts._wake == wake and interrupts.noted()
        assert interrupts.active() and interrupts.noted()
        assert _handlers() == {sig: interrupts._note for sig in interrupts.SIGNALS}


def test_a_block_entered_again_starts_with_no_note() -> None:
    with interrupts.noted_only():
        signal.raise_signal(signal.SIGTERM)
    with interrupts.noted_only():
        assert not interrupts.noted() and interrupts._noted == []


def test_in_a_thread_other_than_the_main_one_no_handler_is_installed() -> None:
    seen: list[Any] = []

    def block() -> None:
        with interrupts.noted_only():
            seen.append((interrupts.active(), _handlers()))

    before = _handlers()
    thread = threading.Thread(target=block)
    thread.start()
    thread.join()
    assert seen == [(False, before)]


def test_the_handler_raises_in_a_process_that_does_not_own_it() -> None:
    """A process forked from trainadvisor inherits the handler, not the ownership: there the
    signal is raised as Python's default would."""
    with pytest.raises(KeyboardInterrupt):
        interrupts._note(signal.SIGINT, None)
    with pytest.raises(Terminated):
        interrupts._note(signal.SIGTERM, None)
    assert interrupts._noted == []


class _Exited(Exception):
    pass


def test_a_second_signal_kills_the_tracked_groups_and_exits_with_128_plus_its_number(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    killed: list[tuple[int, int]] = []

    def exit_now(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(os, "killpg", lambda group, sig: killed.append((group, sig)))
    monkeypatch.setattr(os, "_exit", exit_now)
    interrupts.track(4101)
    interrupts.track(4102)
    interrupts.untrack(4102)  # that child has ended
    with interrupts.noted_only():
        signal.raise_signal(signal.SIGINT)
        assert killed == []  # the first is only noted
        with pytest.raises(_Exited) as exited:
            signal.raise_signal(signal.SIGTERM)
    assert exited.value.args == (128 + signal.SIGTERM,)
    assert killed == [(4101, signal.SIGKILL)]
    assert capfd.readouterr().err == interrupts.ESCALATED.decode()
