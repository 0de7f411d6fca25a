"""The CPU priority of a run started ahead of its settings (`training.gate`): lowered while its
set-up overlaps the trials, restored on every one of its threads before it is measured.

Linux keeps a nice value per thread: `setpriority(PRIO_PROCESS, 0, n)` changes the calling thread
only, and a thread inherits its creator's value. A script whose set-up ran while the process was
lowered has threads at the lowest priority (torch's intra-op pool, started by a first forward
pass); restoring the main thread alone left them there, and beside a busy core every parallel op
then waited for a starved thread: the run measured several times slower than the same setting in
the live process. A user who may lower a priority but not raise it back (no CAP_SYS_NICE where
the kernel checks it, an RLIMIT_NICE that forbids it) gets no run started ahead."""

from __future__ import annotations

import os
import threading
from pathlib import Path

LOWEST = 19
TASKS = Path("/proc/self/task")
# A run's fact: how many of its threads stayed lowered once its settings came (not permitted).
LOWERED = "threads_left_lowered"


def current() -> int:
    """This thread's nice value."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def restorable() -> bool:
    """Whether a thread of this process, once lowered, may be raised back to the calling thread's
    nice value: tried on a thread of its own, lowered by one and raised back, so that the kernel
    decides (CAP_SYS_NICE in the namespace where it counts, RLIMIT_NICE), not capability bits that
    a user namespace shows in full. False where threads have no priority of their own (not Linux)."""
    if not hasattr(os, "getpriority") or not TASKS.is_dir():
        return False
    nice = current()
    if nice >= LOWEST:
        return True  # lowering changes nothing
    raised: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice + 1)
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            raised.append(False)
        else:
            raised.append(True)

    thread = threading.Thread(target=probe, name="trainadvisor-priority-probe", daemon=True)
    thread.start()
    thread.join(5.0)
    return raised == [True]


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
    """Every thread of this process at LOWEST back to `nice`: those lowered with it and those
    created while it was (a pass repeats where a thread started meanwhile is found lowered; a
    thread the script set to another value is left at it); how many stay at LOWEST."""
    if nice >= LOWEST:
        return 0
    for _ in range(3):
        lowered = [tid for tid in threads() if _nice_of(tid) == LOWEST]
        if not lowered:
            return 0
        for tid in lowered:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except OSError:  # it ended, or this is not permitted
                pass
    return sum(1 for tid in threads() if _nice_of(tid) == LOWEST)


def _nice_of(tid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None  # ended
