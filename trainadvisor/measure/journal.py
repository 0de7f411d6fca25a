"""What a run measured, kept as it goes: a script that ends without a word (at `os._exit`, or
killed by the kernel's out-of-memory killer's SIGKILL) writes no result, nor the last update
of one, and the report would say it recorded nothing, or that a run seen dying had run on.

In the script's process, `training.progress` keeps the step count and the window's steps so far
beside the result (`progress_file`). In trainadvisor's process, `last_known` reads back what such
a process left, and `say_how_it_ended` reports its end as its exit status tells it."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

from trainadvisor import _serial
from trainadvisor.measure.watchdog import read_steps
from trainadvisor.records import RawRun
from trainadvisor.units import signal_name

OOM_HINT = "the kernel's out-of-memory killer sends SIGKILL: check the machine's memory"


def progress_file(result_file: str | Path) -> Path:
    """Beside the result: `baseline.result.json` -> `baseline.progress.json`."""
    path = Path(result_file)
    return path.with_name(path.name.removesuffix(".result.json") + ".progress.json")


def last_known(raw: RawRun | None, result_file: Path, heartbeat: Path | None, label: str) -> RawRun | None:
    """A run whose process wrote no last word: its result as written when its window ended, or
    else the window as far as it was saved, or else none but its step count; with the steps
    it had seen when it ended. None where it saw no step."""
    written = raw is not None
    if raw is None:
        with contextlib.suppress(OSError, ValueError):
            raw = _serial.load_json(RawRun, progress_file(result_file))
    steps = read_steps(heartbeat) if heartbeat is not None else None
    if raw is None and steps:
        raw = RawRun(label, "script_failed", None, None, steps, 0, 0, steps, [], [], None)
    if raw is None:
        return None
    raw.steps_seen = max(raw.steps_seen, steps or 0)
    if not written:  # until its end is known (`say_how_it_ended`), or trainadvisor's doing
        raw.error = f"the script's process ended after {_steps(raw)} without recording how"
    return raw


def say_how_it_ended(raw: RawRun, returncode: int, launcher: str | None = None) -> None:
    """The run's end as its exit status tells it (the process left no word of its own): a
    window already written stays complete; otherwise the script ended (status 0, as
    `sys.exit(0)` there would) or failed. `launcher`: whose exit status it is, where not the
    script's own (torchrun's)."""
    if raw.status == "window_complete":
        where = "after its window was measured"
    elif raw.steps:
        where = "inside the measuring window"
    else:
        where = "before its timed steps began"
    when = f"after {_steps(raw)}, {where}"
    raw.exit_code = returncode if launcher is None else None
    if raw.status != "window_complete":
        raw.status = "script_failed" if returncode else "script_ended"
    if not returncode:
        raw.error = None
    elif launcher is not None:
        raw.error = (
            f"the process ended {when}, without recording how ({launcher} ended with exit code {returncode})"
        )
    elif returncode < 0:
        hint = f" ({OOM_HINT})" if -returncode == signal.SIGKILL else ""
        raw.error = f"the script was killed by signal {signal_name(-returncode)} {when}{hint}"
    else:
        raw.error = (
            f"the script's process exited with code {returncode} {when}, without Python's own exit "
            "(os._exit(), or a library's exit())"
        )


def _steps(raw: RawRun) -> str:
    return f"{raw.steps_seen} step{'' if raw.steps_seen == 1 else 's'}"
