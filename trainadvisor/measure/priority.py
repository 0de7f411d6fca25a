"""The CPU priority of a run started ahead of its settings (`training.gate`): lowered while its
set-up overlaps the trials, restored on every one of its threads before it is measured.

Linux keeps a nice value per thread: `setpriority(PRIO_PROCESS, 0, n)` changes the calling thread
only, and a thread inherits its creator's value. A script whose set-up ran while the process was
lowered has threads at the lowest priority (torch's intra-op pool, started by the first parallel
op while the model was built); restoring the main thread alone left them there, and beside a busy
core every parallel op then waited for a starved thread: the run measured several times slower
than the same setting in the live process. A user without CAP_SYS_NICE (or an RLIMIT_NICE that
allows it) may lower a priority but never raise it back: there no run is started ahead."""

from __future__ import annotations

import os
import resource
from pathlib import Path

LOWEST = 19
CAP_SYS_NICE = 23  # its bit in /proc/self/status's CapEff
TASKS = Path("/proc/self/task")
STATUS = Path("/proc/self/status")
# A run's fact: how many of its threads stayed lowered once its settings came (not permitted).
LOWERED = "threads_left_lowered"


def current() -> int:
    """This thread's nice value."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def restorable(nice: int | None = None) -> bool:
    """Whether this process, once lowered to LOWEST, may go back to `nice` (its own value now):
    with CAP_SYS_NICE, or where RLIMIT_NICE's soft limit allows that value (20 - limit <= nice)."""
    nice = current() if nice is None else nice
    if nice >= LOWEST:
        return True  # lowering changes nothing
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or 20 - soft <= nice:
        return True
    return _capable()


def _capable() -> bool:
    try:
        status = STATUS.read_text()
    except OSError:
        return os.geteuid() == 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    return os.geteuid() == 0


def lower() -> int | None:
    """Lower this process to LOWEST; the nice value to restore, or None where not permitted."""
    before = current()
    try:
        os.nice(LOWEST - before)
    except OSError:  # not permitted: set-up competes at normal priority
        return None
    return before


def threads() -> list[int]:
    """This process's threads (the calling thread alone where /proc is not there)."""
    try:
        return sorted(int(tid) for tid in os.listdir(TASKS))
    except OSError:
        return [0]


def restore(nice: int) -> int:
    """Every thread of this process back to `nice`, those created while it was lowered too (a
    pass repeats where a thread started meanwhile is found lowered); how many stay lowered."""
    for _ in range(3):
        lowered = [tid for tid in threads() if not _at_most(tid, nice)]
        if not lowered:
            return 0
        for tid in lowered:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except OSError:  # it ended, or this is not permitted
                pass
    return sum(1 for tid in threads() if not _at_most(tid, nice))


def _at_most(tid: int, nice: int) -> bool:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid) <= nice
    except OSError:
        return True  # ended
