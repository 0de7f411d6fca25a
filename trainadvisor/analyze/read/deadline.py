"""A deadline on one call to an object store. The clients' own timeouts are per socket read: a
store that trickles a byte every few seconds, or holds a response open, never trips them, and
`analyze` waited on it for ever. Each call (a listing, a stat, an open, one ranged read) must end
within its deadline: the store timeout for the request, plus the bytes asked for at the slowest
rate a trace store may send them. The deadline is a real-time timer whose signal interrupts the
blocking wait in the main thread (a socket read, or the wait on fsspec's I/O thread), so it holds
however the client waits; where the timer cannot be used (not the main thread, or the timer or
its signal taken by someone else), the clients' own timeouts are all there is."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trainadvisor.errors import UsageError

MIN_RATE_BYTES_S = 256 * 1024  # a trace store slower than this is stalled, not slow


class _Expired(BaseException):
    """Raised by the timer's signal: a BaseException, so that the clients' own `except
    Exception` handlers do not swallow it on its way out."""


def _usable() -> bool:
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return False
    return signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) in (
        signal.SIG_DFL,
        signal.SIG_IGN,
        None,
    )


def _expire(signum: int, frame: Any) -> None:
    raise _Expired


@contextmanager
def store_deadline(where: str, timeout_s: float, size_bytes: int = 0) -> Iterator[None]:
    """The block must end within `timeout_s` plus `size_bytes` at MIN_RATE_BYTES_S; past it, a
    UsageError that says the store stalled (`where`: the URL as reports show it)."""
    if not _usable():
        yield
        return
    seconds = timeout_s + size_bytes / MIN_RATE_BYTES_S
    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Expired:
        raise UsageError(
            f"{where}: the store sent too little in {seconds:.0f} s (a stalled or trickling "
            "connection); check the endpoint (AWS_ENDPOINT_URL) and the network, or give it longer "
            "with TRAINADVISOR_STORE_TIMEOUT_S"
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)
