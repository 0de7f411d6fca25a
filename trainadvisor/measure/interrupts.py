"""Signals to trainadvisor's own process (Ctrl-C, the SIGTERM that Slurm and Kubernetes send)
while `profile` runs: each is only noted where it arrives, and acted on where the run checks
for it (`check`, and `pause` in the loops that wait for a child, which a signal wakes at once).
An exception raised by the handler itself would surface inside whatever code the signal
interrupted: inside coverage's collector, say, holding a lock that the clean-up then waited for
forever. A second signal does not wait: every child's process group is killed and trainadvisor
exits at once (each run's guard, `measure.reaper`, ends whatever escaped the groups)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Iterator

from trainadvisor.errors import Terminated

SIGNALS = (signal.SIGINT, signal.SIGTERM)
ESCALATED = b"trainadvisor: signalled again: the script and its workers were killed without waiting\n"

_noted: list[int] = []  # the signals received, first first
_owner: int | None = None  # the process whose handlers these are (not one forked from it)
_wake: tuple[int, int] | None = None  # a pipe the handler writes to, so a waiting loop wakes
_groups: set[int] = set()  # the process groups of the children running now


def _exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _note(signum: int, _frame: object) -> None:
    """The handler: a note, a byte to wake the waiting loop, nothing that takes a lock."""
    if os.getpid() != _owner:  # a process forked from trainadvisor (a trace-reading worker)
        raise _exception(signum)
    _noted.append(signum)
    if _wake is not None:
        with contextlib.suppress(OSError):  # the pipe is full: a wake-up is pending already
            os.write(_wake[1], b"\0")
    if len(_noted) > 1:
        _escalate(signum)


def _escalate(signum: int) -> None:
    """Kill every child's process group and exit: system calls only, safe wherever the signal
    landed."""
    with contextlib.suppress(OSError):
        os.write(2, ESCALATED)
    for group in list(_groups):
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    os._exit(128 + signum)


def active() -> bool:
    return _owner == os.getpid()


@contextlib.contextmanager
def noted_only() -> Iterator[None]:
    """SIGINT and SIGTERM noted while the block runs, not raised (in the main thread: the only
    one that receives signals); the handlers before it are put back after it."""
    global _owner, _wake
    if threading.current_thread() is not threading.main_thread() or active():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    _noted.clear()
    _owner, _wake = os.getpid(), (read, write)
    previous = {sig: signal.signal(sig, _note) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        _owner, _wake = None, None
        os.close(read)
        os.close(write)


def noted() -> bool:
    """A signal arrived and is waiting to be acted on."""
    return bool(_noted) and active()


def check() -> None:
    """Where the run can stop cleanly: the first noted signal's exception (KeyboardInterrupt, or
    `Terminated`), for the callers' clean-up to run as it would for Ctrl-C."""
    if noted():
        raise _exception(_noted[0])


def wait(seconds: float) -> bool:
    """Sleep up to `seconds`, woken at once by a signal; whether one is noted (for clean-up
    loops, which must finish rather than raise)."""
    wake = _wake
    if wake is None or not active():
        time.sleep(seconds)
        return False
    if not _noted:
        ready, _, _ = select.select([wake[0]], [], [], seconds)
        if ready:
            with contextlib.suppress(OSError):
                os.read(wake[0], 512)
    return noted()


def pause(seconds: float) -> None:
    """`wait`, then `check`: a waiting loop's step."""
    check()
    wait(seconds)
    check()


def track(group: int) -> None:
    """A child's process group, to kill should a second signal come."""
    _groups.add(group)


def untrack(group: int) -> None:
    _groups.discard(group)
