"""Entry point of the child process that runs the user's script under instrumentation:

    python -m trainadvisor.training.child CONFIG.json SCRIPT [ARGS...]

The script runs as `__main__` with `sys.argv = [SCRIPT, *ARGS]` and `sys.path[0]` its folder,
as `python SCRIPT ARGS` would run it. Exit codes: the script's own, or 0 once the profiled
window is complete and the script was stopped on purpose."""

from __future__ import annotations

import fcntl
import os
import random
import runpy
import signal
import sys
import termios
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainadvisor.training import hooks


def _seed(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def _print_script_traceback(exc: BaseException, script: str) -> None:
    """The user's traceback as `python script.py` prints it: frames before the script dropped."""
    tb = exc.__traceback__
    target = str(Path(script).resolve())
    while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()) != target:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__, file=sys.stderr)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _record_when_stopped(recorder: hooks.Recorder) -> None:
    """When trainadvisor stops the run (a timeout, a hung rank), record how far it got first.
    Processes forked from this one (DataLoader workers) keep the default: they just end."""
    main_pid = os.getpid()

    def stopped(signum: int, _frame: object) -> None:
        if os.getpid() != main_pid or recorder.window_done:
            os._exit(128 + signum)  # a worker, or the window is already recorded: nothing to add
        inside = recorder.window.backward_at is not None
        where = "inside backward()" if inside else "before its backward()"
        recorder.write(
            "script_failed",
            128 + signum,
            f"stopped by trainadvisor after {recorder.steps_seen} steps, {where}",
        )
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)


def _leave_the_terminal() -> None:
    """Give up the controlling terminal that this process shares with trainadvisor's session (it
    runs in that session, in a background process group), as the session of its own it once
    had did. On a terminal, a background group's read stops it (SIGTTIN: a prompt, `getpass`
    opening /dev/tty), and so does its write where the terminal is set to `stty tostop`
    (SIGTTOU). Without a controlling terminal, /dev/tty cannot be opened (a prompt fails at
    once, as it would have), and output to an inherited terminal goes on. Not being the
    session's leader, only this process and what it starts lose it."""
    if not hasattr(termios, "TIOCNOTTY"):
        return
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:  # no controlling terminal: nothing to give up
        return
    try:
        fcntl.ioctl(fd, termios.TIOCNOTTY)
    except OSError:
        pass
    finally:
        os.close(fd)


def main() -> int:
    from trainadvisor.measure.reaper import die_with_parent

    die_with_parent()  # first: trainadvisor may have been killed while this process started
    _leave_the_terminal()
    config_path, script, *script_args = sys.argv[1:]
    from trainadvisor.measure.console import quiet_numpy_warning

    quiet_numpy_warning()
    from trainadvisor.measure.config import load_config
    from trainadvisor.training import hooks

    config = load_config(config_path)
    # Under torchrun every rank runs this with the same config: each writes files of its own.
    rank = os.environ.get("RANK", "0")
    config.result_file = config.result_file.replace("{rank}", rank)
    if config.trace_file is not None:
        config.trace_file = config.trace_file.replace("{rank}", rank)
    if config.device_file is not None:
        config.device_file = config.device_file.replace("{rank}", rank)
    if config.stacks_file is not None:
        from trainadvisor.measure.watchdog import dump_stacks_on_signal

        dump_stacks_on_signal(config.stacks_file.replace("{rank}", rank))
    sys.argv = [script, *script_args]
    sys.path[0] = str(Path(script).resolve().parent)
    if config.seed is not None:
        _seed(config.seed)
    recorder = hooks.install(config)
    if config.cpu_peak_file is not None:  # the profile's earlier runs measured the CPU's peak
        from trainadvisor.compute.flops import share_cpu_peak

        share_cpu_peak(config.cpu_peak_file)
    if config.session_dir is not None:  # trial windows follow the run's own
        from trainadvisor.training.session import Session

        recorder.session = Session(Path(config.session_dir))
    if config.gate_file is not None:  # started ahead of its settings
        from trainadvisor.training.gate import hold, released

        hold(recorder, Path(config.gate_file))
        if not released(Path(config.gate_file)):
            return 0  # trainadvisor is gone before the script began
    if config.heartbeat_file is not None:  # the stall watchdog's, and the steps so far (`progress`)
        from trainadvisor.measure.journal import progress_file
        from trainadvisor.measure.watchdog import Heartbeat
        from trainadvisor.training.progress import Progress

        heartbeat = Heartbeat(config.heartbeat_file.replace("{rank}", rank))
        recorder.heartbeat = Progress(recorder, heartbeat, progress_file(config.result_file))
    _record_when_stopped(recorder)
    try:
        runpy.run_path(script, run_name="__main__")
    except hooks.WindowComplete:
        recorder.write("window_complete", 0, None)
        return 0
    except SystemExit as exc:
        code = _exit_code(exc)
        if code == 0:
            recorder.write("script_ended", 0, None)
        else:
            recorder.write("script_failed", code, f"the script exited with code {code}")
        return code
    except BaseException as exc:  # the user's error, reported as Python would, then recorded
        _print_script_traceback(exc, script)
        recorder.died(exc)
        summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        from trainadvisor.training.loaders import NOTE_PREFIX  # torch is imported by now

        summary = summary.replace(f"\n{NOTE_PREFIX}", f"; {NOTE_PREFIX}")  # one line
        recorder.write("script_failed", 1, summary)
        return 1
    recorder.write("script_ended", 0, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
