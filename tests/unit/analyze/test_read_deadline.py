"""The deadline on one call to an object store (`analyze.read.deadline`): a real-time timer of the
store timeout plus the bytes asked for at 256 KiB/s, whose SIGALRM ends the block with a
UsageError that says the store stalled. No clock is waited on: the timer's signal is sent to this
process by the test itself, and the timer's settings are read from the calls that set it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from trainadvisor.analyze.read.deadline import MIN_RATE_BYTES_S, store_deadline
from trainadvisor.errors import UsageError

_URL = "s3://bucket/runs/rank0.json.gz"


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, float]]]:
    """Every timer set (which, seconds), set for real too; no timer or handler left behind."""
    calls: list[tuple[int, float]] = []
    real = signal.setitimer

    def recording(which: int, seconds: float, interval: float = 0.0) -> Any:
        calls.append((which, seconds))
        return real(which, seconds, interval)

    before = signal.getsignal(signal.SIGALRM)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    monkeypatch.setattr(signal, "setitimer", recording)
    yield calls
    real(signal.ITIMER_REAL, 0.0)
    signal.signal(signal.SIGALRM, before)


def test_a_call_past_its_deadline_is_a_usage_error_that_says_the_store_stalled(
    timers: list[tuple[int, float]],
) -> None:
    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(UsageError) as caught:
        with store_deadline(_URL, 30.0, 10 * 256 * 1024):  # 30 s, and 10 s for 2.5 MiB
            signal.raise_signal(signal.SIGALRM)  # the timer's signal, as if 40 s had passed
            pytest.fail("the block went on past its deadline")
    assert str(caught.value) == (
        "s3://bucket/runs/rank0.json.gz: the store sent too little in 40 s (a stalled or trickling "
        "connection); check the endpoint (AWS_ENDPOINT_URL) and the network, or give it longer with "
        "TRAINADVISOR_STORE_TIMEOUT_S"
    )
    assert caught.value.exit_code == 2
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert timers == [(signal.ITIMER_REAL, 40.0), (signal.ITIMER_REAL, 0.0)]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before


def test_the_deadline_gets_past_a_clients_own_except_exception(timers: list[tuple[int, float]]) -> None:
    swallowed = []
    with pytest.raises(UsageError, match="too little in 5 s"):
        with store_deadline(_URL, 5.0):
            try:
                signal.raise_signal(signal.SIGALRM)
            except Exception as exc:  # a client's retry loop, say
                swallowed.append(exc)
    assert swallowed == []
    assert timers == [(signal.ITIMER_REAL, 5.0), (signal.ITIMER_REAL, 0.0)]


def test_a_call_in_time_raises_nothing_and_leaves_no_timer(timers: list[tuple[int, float]]) -> None:
    assert MIN_RATE_BYTES_S == 262_144
    before = signal.getsignal(signal.SIGALRM)
    done = []
    with store_deadline(_URL, 30.0):
        assert signal.getsignal(signal.SIGALRM) is not before  # its own handler, while it runs
        done.append(True)
    assert done == [True]
    assert timers == [(signal.ITIMER_REAL, 30.0), (signal.ITIMER_REAL, 0.0)]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before


def test_another_error_in_the_block_passes_through_and_the_timer_is_stopped(
    timers: list[tuple[int, float]],
) -> None:
    with pytest.raises(ConnectionError, match="reset"):
        with store_deadline(_URL, 2.0, 256 * 1024):
            raise ConnectionError("reset")
    assert timers == [(signal.ITIMER_REAL, 3.0), (signal.ITIMER_REAL, 0.0)]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_handler_someone_else_installed_is_left_alone(timers: list[tuple[int, float]]) -> None:
    received: list[int] = []
    signal.signal(signal.SIGALRM, lambda signum, frame: received.append(signum))
    with store_deadline(_URL, 30.0):
        signal.raise_signal(signal.SIGALRM)  # theirs: no deadline of ours to end the block
    assert received == [signal.SIGALRM]
    assert timers == []


def test_a_timer_someone_else_set_is_left_running(timers: list[tuple[int, float]]) -> None:
    signal.setitimer(signal.ITIMER_REAL, 3600.0)  # theirs, far off: it never fires in this test
    timers.clear()
    with store_deadline(_URL, 30.0):
        pass
    assert timers == []
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 0.0


def test_outside_the_main_thread_no_timer_is_set(timers: list[tuple[int, float]]) -> None:
    outcome: list[str] = []

    def call() -> None:
        with store_deadline(_URL, 30.0):
            outcome.append("ran")

    worker = threading.Thread(target=call)
    worker.start()
    worker.join()
    assert outcome == ["ran"]
    assert timers == []
