"""No process of a run outlives trainadvisor, however trainadvisor ends.

Every process of a run carries `TRAINADVISOR_RUN=<the run's token>` in its environment, and
passes it on to whatever it starts: DataLoader workers, helpers, a process that left the
script's process group for a session of its own (setsid). So the run's processes are found
where the process tree no longer leads to them. Three layers end them:
- trainadvisor's own stop (`runner.stop`) ends the child's process group, and any process with
  the run's token outside it (`strays`).
- A guard per run (this module, run as a program: `Guard`), started before the child, in a
  session of its own: it waits on a pipe from trainadvisor, which ends when trainadvisor's
  process does (SIGKILL included), and then kills every process of the run (`sweep`).
- On Linux the child asks the kernel for SIGKILL when trainadvisor's process ends
  (PR_SET_PDEATHSIG, `die_with_parent`), should the guard be gone as well."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from trainadvisor.measure import priority

RUN_ENV = "TRAINADVISOR_RUN"
# The pid of the trainadvisor process a child is to die with. Set only for a child started from
# trainadvisor's main thread: the kernel's parent-death signal fires when the *thread* that
# started the child ends. Not under torchrun, whose ranks are the launcher's children.
PARENT_ENV = "TRAINADVISOR_PARENT"
_PR_SET_PDEATHSIG = 1
POLL_S = 0.2
SWEEPS = 20  # passes, until one finds nothing: a process may fork while the run is ended
CLOSE_WAIT_S = 10.0


def new_token() -> str:
    return uuid.uuid4().hex


def marked(token: str) -> list[Any]:
    """The processes whose environment carries the run's token (psutil.Process each)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(RUN_ENV) == token:
                found.append(proc)
        except psutil.Error:  # gone, a zombie, or another user's
            continue
    return found


def strays(token: str, leader: int) -> list[Any]:
    """The run's processes outside the process group that `leader` leads: those with the token,
    and the leader's descendants (which may have cleared their environment)."""
    import psutil

    found = {proc.pid: proc for proc in marked(token)}
    with contextlib.suppress(psutil.Error):
        found.update((proc.pid, proc) for proc in psutil.Process(leader).children(recursive=True))
    outside = []
    for proc in found.values():
        try:
            if os.getpgid(proc.pid) != leader:
                outside.append(proc)
        except OSError:
            continue
    return outside


def signal_all(procs: list[Any], sig: int) -> None:
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)  # psutil checks the pid is still the same process


def family(pid: int) -> list[Any]:
    """Process `pid` and its descendants (psutil.Process each); none where it has ended."""
    import psutil

    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return []


def unlower(procs: list[Any]) -> None:
    """Raise every thread of `procs` still lowered (a run started ahead waits at nice 19 in the idle
    class: `priority`) back to this process's priority, so that it ends as soon as it is told to:
    killed beside two busy cores, such a run took over 5 s to exit, its memory held meanwhile (the
    kernel frees it in the exiting process's own time, which the idle class gives it only where no
    other thread wants a core). Not permitted, or ended: left as it is."""
    nice = priority.current()
    for proc in procs:
        priority.restore(nice, proc.pid)


def running(procs: list[Any]) -> bool:
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def sweep(token: str, leaders: list[Any]) -> None:
    """SIGKILL every process of the run (the groups of `leaders` still running, everything with
    the token), pass after pass until one finds nothing."""
    import psutil

    for _ in range(SWEEPS):
        found = marked(token)
        for leader in leaders:
            with contextlib.suppress(OSError, psutil.Error):
                if leader.is_running():  # the same process still: its group is the run's
                    os.killpg(leader.pid, signal.SIGKILL)
                    found.append(leader)
        if not found:
            return
        signal_all(found, signal.SIGKILL)
        unlower(found)
        time.sleep(0.05)


class Guard:
    """trainadvisor's side of a run's guard process: it is told the child's pid (`watch`), and
    ends the run's processes when trainadvisor closes the pipe (`close`) or its process ends."""

    def __init__(self, token: str, env: dict[str, str]) -> None:
        env = {name: value for name, value in env.items() if name not in (RUN_ENV, PARENT_ENV)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainadvisor.measure.reaper", token],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True,  # a Ctrl-C or a signal to trainadvisor's group spares it
        )  # fmt: skip

    def watch(self, pid: int) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        with contextlib.suppress(OSError):  # the guard is gone: the kernel's signal remains
            stdin.write(f"{pid}\n".encode())
            stdin.flush()

    def close(self) -> None:
        """The run is over: the guard sweeps once more and exits."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def die_with_parent() -> None:
    """In the child, before anything else: SIGKILL from the kernel when the trainadvisor process
    that started it ends (Linux); an exit at once if it already has."""
    expected = os.environ.pop(PARENT_ENV, None)  # not for what the script starts
    if expected is None:
        return
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(expected):
        os._exit(1)  # trainadvisor ended before the signal was asked for


_asked_to_end: list[int] = []  # signals to the guard itself


def _guard(leaders: list[Any]) -> None:
    """The guard's loop: the child's pids arrive on stdin; its end (or a new parent: the pipe
    may be held open by a process forked from trainadvisor) means trainadvisor's has ended, and
    so does a signal to the guard itself."""
    import psutil

    parent = os.getppid()
    pending = b""
    while os.getppid() == parent and not _asked_to_end:
        ready, _, _ = select.select([0], [], [], POLL_S)
        if not ready:
            continue
        data = os.read(0, 4096)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError, psutil.Error):
                leaders.append(psutil.Process(int(line)))


def main(argv: list[str]) -> int:
    """`python -m trainadvisor.measure.reaper TOKEN`: guard one run until trainadvisor's end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # trainadvisor's to handle; it then closes the pipe
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the guard asked to end: the run goes first
        signal.signal(sig, lambda signum, _frame: _asked_to_end.append(signum))
    leaders: list[Any] = []
    _guard(leaders)
    sweep(argv[0], leaders)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
