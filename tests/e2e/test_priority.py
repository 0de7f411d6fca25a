"""`measure.priority` in a real process whose thread was started while it stood lowered, as
torch's intra-op pool is when a script's set-up runs while its run stands by (`training.gate`):
raising the calling thread alone leaves that thread at 19, starved beside a busy core; `restore`
raises both, and takes both out of the idle scheduling class. In a user namespace (a rootless
container) CAP_SYS_NICE shows in the capability bits but the kernel refuses to raise a priority
back: `restorable` says so, and `restore` counts both threads left lowered. A run ended while it
stands lowered is raised back first (`reaper.unlower`), so that it exits at once. A live run told
to stop while the next run starts ends lowered (`priority.lower_threads`), and is raised back
once nothing is measured beside it (`LiveRun.raise_back`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from conftest import SCRIPTS

from trainadvisor.measure import priority, reaper
from trainadvisor.measure.kept_alive import LiveRun
from trainadvisor.measure.spec import RunSpec

CHILD = textwrap.dedent(
    """
    import json, os, threading
    from trainadvisor.measure import priority

    started, done = threading.Event(), threading.Event()
    def pool_thread():
        started.set()
        done.wait()

    def nices():
        return sorted(os.getpriority(os.PRIO_PROCESS, tid) for tid in priority.threads())

    def classes():
        return sorted(os.sched_getscheduler(tid) for tid in priority.threads())

    restorable = priority.restorable()
    before = priority.lower()
    thread = threading.Thread(target=pool_thread, daemon=True)
    thread.start()
    started.wait()
    lowered, lowered_classes = nices(), classes()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, before)  # the calling thread alone, as the gate once did
    except PermissionError:
        pass
    main_only = nices()
    left = priority.restore(before)
    print(json.dumps({"restorable": restorable, "before": before, "lowered": lowered,
                      "main_only": main_only, "left": left, "after": nices(),
                      "lowered_classes": lowered_classes, "after_classes": classes()}))
    done.set()
    """
)


def _in_user_namespace() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-Ur", "true"], capture_output=True).returncode:
        pytest.skip("unshare -Ur (a user namespace) is not available here")
    return [unshare, "-Ur"]


def _seen(prefix: list[str]) -> dict[str, object]:
    command = [*prefix, sys.executable, "-c", CHILD]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    seen: dict[str, object] = json.loads(out.stdout)
    return seen


def test_restore_raises_every_thread_back_where_the_kernel_permits() -> None:
    seen = _seen([])
    if not seen["restorable"]:
        pytest.skip("this user may not raise a lowered priority back (no CAP_SYS_NICE, RLIMIT_NICE)")
    before = seen["before"]
    assert seen["lowered"] == [19, 19]
    assert seen["main_only"] == [before, 19]  # the thread started while lowered stays there
    assert seen["left"] == 0
    assert seen["after"] == [before, before]
    assert seen["lowered_classes"] == [os.SCHED_IDLE, os.SCHED_IDLE]  # both in the idle class
    assert seen["after_classes"] == [os.SCHED_OTHER, os.SCHED_OTHER]


def test_in_a_user_namespace_nothing_is_raised_back_and_restorable_says_so() -> None:
    seen = _seen(_in_user_namespace())
    assert seen["restorable"] is False
    assert seen["lowered"] == seen["main_only"] == seen["after"] == [19, 19]
    assert seen["lowered_classes"] == seen["after_classes"] == [os.SCHED_IDLE, os.SCHED_IDLE]
    assert seen["left"] == 2


WAITING = textwrap.dedent(
    """
    import sys, threading
    from trainadvisor.measure import priority

    priority.lower()
    threading.Thread(target=threading.Event().wait, daemon=True).start()  # started while lowered
    print("lowered", flush=True)
    sys.stdin.read()
    """
)


def test_a_run_ended_while_it_stands_lowered_is_raised_back_first() -> None:
    """Killed at nice 19 in the idle class beside two busy cores, such a run took over 5 s to exit
    (`test_hostile_processes`); raised, every thread is at this process's priority again."""
    if not priority.restorable():
        pytest.skip("this user may not raise a lowered priority back (no CAP_SYS_NICE, RLIMIT_NICE)")
    child = subprocess.Popen(
        [sys.executable, "-c", WAITING], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "lowered\n"
        tids = priority.threads(child.pid)
        assert len(tids) == 2 and {os.sched_getscheduler(tid) for tid in tids} == {os.SCHED_IDLE}
        reaper.unlower([psutil.Process(child.pid)])
        assert {os.sched_getscheduler(tid) for tid in tids} == {os.SCHED_OTHER}
        assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in tids} == {priority.current()}
    finally:
        child.kill()
        child.wait()


def test_a_live_run_told_to_stop_soon_ends_lowered_until_it_is_raised_back(tmp_path: Path) -> None:
    """Its exit (1.0-1.2 CPU-s of a torch process's teardown) would otherwise take the CPU of the
    next run's warm-up; once nothing is measured beside it (`raise_back`), it runs as before."""
    if not priority.restorable():
        pytest.skip("this user may not raise a lowered priority back (no CAP_SYS_NICE, RLIMIT_NICE)")
    spec = RunSpec(
        "baseline", SCRIPTS / "manual_steps.py", ["100000"], tmp_path, warmup=2, steps=4,
        profile=False, show_output=False, session_dir=tmp_path / "session",
    )  # fmt: skip
    live = LiveRun(spec)
    try:
        assert live.baseline().status == "window_complete"
        assert live.launched is not None
        pid = live.launched.proc.pid
        live.stop_soon()
        tids = priority.threads(pid)
        assert tids and {os.sched_getscheduler(tid) for tid in tids} == {os.SCHED_IDLE}
        assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in tids} == {priority.LOWEST}
        live.raise_back()  # nothing measured beside it any more: its exit may take a core
        raised = priority.threads(pid)  # none where it has ended meanwhile
        assert {os.sched_getscheduler(tid) for tid in raised} <= {os.SCHED_OTHER}
        assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in raised} <= {priority.current()}
        live.close()
        assert live.launched is None and not psutil.pid_exists(pid)
    finally:
        live.close()
