"""The CPU priority of a run started ahead of its settings (`training.gate`): lowered (nice 19,
and the idle scheduling class) while its imports and set-up overlap the baseline and the trials,
restored on every one of its threads before it is measured.

Linux keeps a nice value and a scheduling class per thread: `setpriority(PRIO_PROCESS, 0, n)` and
`sched_setscheduler(0, ...)` change the calling thread only, and a thread inherits its creator's.
A script whose set-up ran while the process was lowered has threads at the lowest priority
(torch's intra-op pool, started by a first forward pass); restoring the main thread alone left
them there, and beside a busy core every parallel op then waited for a starved thread: the run
measured several times slower than the same setting in the live process. A user who may lower a
priority but not raise it back (no CAP_SYS_NICE where the kernel checks it, an RLIMIT_NICE that
forbids it) gets no run started ahead."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

LOWEST = 19
# The idle scheduling class, where the kernel has one: a thread in it runs only where no other
# thread wants the CPU, and gives it up at once to one that wakes. Beside a training loop on 2
# cores, a process spinning at nice 19 slowed its steps 25-45% (a sleep-bound and a compute-bound
# loop alike); one spinning in SCHED_IDLE, 0-10%.
IDLE: int | None = getattr(os, "SCHED_IDLE", None)
TASKS = Path("/proc/self/task")
# A run's fact: how many of its threads stayed lowered once its settings came (not permitted).
LOWERED = "threads_left_lowered"


def current() -> int:
    """This thread's nice value."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def restorable() -> bool:
    """Whether a thread of this process, once lowered, may be raised back to the calling thread's
    nice value and scheduling class: tried on a thread of its own, lowered by one and raised back,
    moved to SCHED_IDLE and back, so that the kernel decides (CAP_SYS_NICE in the namespace where
    it counts, RLIMIT_NICE), not capability bits that a user namespace shows in full. False where
    threads have no priority of their own (not Linux)."""
    if not hasattr(os, "getpriority") or not TASKS.is_dir():
        return False
    nice = current()
    raised: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        try:
            if nice < LOWEST:
                os.setpriority(os.PRIO_PROCESS, tid, nice + 1)
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            if IDLE is not None:
                os.sched_setscheduler(tid, IDLE, os.sched_param(0))
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            raised.append(False)
        else:
            raised.append(True)

    if nice >= LOWEST and IDLE is None:
        return True  # lowering changes nothing
    thread = threading.Thread(target=probe, name="trainadvisor-priority-probe", daemon=True)
    thread.start()
    thread.join(5.0)
    return raised == [True]


def lower() -> int | None:
    """Lower this process to LOWEST and, where the kernel has it, to the idle scheduling class
    (`IDLE`); the nice value to restore, or None where not permitted."""
    before = current()
    try:
        os.nice(LOWEST - before)
    except OSError:  # not permitted: set-up competes at normal priority
        return None
    if IDLE is not None:
        with contextlib.suppress(OSError):  # not permitted: nice 19 alone
            os.sched_setscheduler(0, IDLE, os.sched_param(0))
    return before


def lower_threads(pid: int) -> int:
    """Every thread of process `pid` (a child of the same user) lowered to LOWEST and, where the
    kernel has it, to the idle class; how many were (none where it has ended or this is not
    permitted). Threads it starts later inherit the priority of the thread that starts them."""
    lowered = 0
    for tid in threads(pid):
        with contextlib.suppress(OSError):  # it ended, or this is not permitted
            os.setpriority(os.PRIO_PROCESS, tid, LOWEST)
            lowered += 1
            if IDLE is not None:
                os.sched_setscheduler(tid, IDLE, os.sched_param(0))
    return lowered


def threads(pid: int | None = None) -> list[int]:
    """This process's threads (the calling thread alone where /proc is not there), or process
    `pid`'s (none where it has ended)."""
    try:
        return sorted(int(tid) for tid in os.listdir(TASKS if pid is None else Path(f"/proc/{pid}/task")))
    except OSError:
        return [0] if pid is None else []


def restore(nice: int, pid: int | None = None) -> int:
    """Every thread of this process (or of process `pid`, a child of the same user) lowered (at
    LOWEST, or in the idle class) back to `nice` and the normal class: those lowered with it and
    those created while it was (a pass repeats where a thread started meanwhile is found lowered;
    a thread whose nice value the script set to another is left at it); how many stay lowered."""
    for _ in range(3):
        lowered = [tid for tid in threads(pid) if _lowered(tid, nice)]
        if not lowered:
            return 0
        for tid in lowered:
            with contextlib.suppress(OSError):  # it ended, or this is not permitted
                if IDLE is not None and _policy_of(tid) == IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                if nice < LOWEST and _nice_of(tid) == LOWEST:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
    return sum(1 for tid in threads(pid) if _lowered(tid, nice))


def _lowered(tid: int, nice: int) -> bool:
    in_idle = IDLE is not None and _policy_of(tid) == IDLE
    return in_idle or (nice < LOWEST and _nice_of(tid) == LOWEST)


def _policy_of(tid: int) -> int | None:
    try:
        return os.sched_getscheduler(tid)
    except OSError:
        return None  # ended


def _nice_of(tid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None  # ended
