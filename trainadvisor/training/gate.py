"""A run started before its settings are known (the confirmation run, started beside the
baseline): it imports torch, trainadvisor's hooks and torch._dynamo, lowers its CPU priority
(nice 19 and the idle scheduling class), and waits before the script until the parent lets it in
(`released`: the baseline has taken its first step, so the two runs' set-ups never run at once).
The script's set-up (imports, loading, building the model) then goes on at the lowest priority
beside the baseline's window and the trials, and the script waits at its first DataLoader,
backward() or step until the parent writes the settings. Only settings applied from that point
on can be confirmed this way: DataLoader arguments (the parent keeps such a run only where every
fix in question is one)."""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from pathlib import Path

import psutil

from trainadvisor import _serial
from trainadvisor.measure import priority
from trainadvisor.measure.config import (
    AHEAD_ENV_CHANGED,
    WindowCommand,
    at_gate_file,
    released_file,
    standing_file,
)
from trainadvisor.training.hooks import Recorder, WindowComplete

POLL_S = 0.005


# Below this share of memory available, a run waiting for its settings exits (the parent then
# starts the confirmation afresh): standing by must never push the machine into swap or OOM.
MIN_AVAILABLE_PCT = 15.0

# What training scripts import lazily after their first DataLoader: torch's optimizers import
# torch._dynamo when first built (about 1 CPU-s on 2 cores, measured after the gate opened, before
# the confirmation's first step). Imported before the run is let into the script, at the lowest
# priority, while the baseline sets up (imported at its gate, it ran beside a trial window, whose
# first blocks ran 112-124 ms a step against 84-93 settled): the same modules in the same
# process, only earlier, so that what the run measures after its gate is the script's own loop.
IMPORTED_AHEAD = ("torch._dynamo",)

# Most of what those modules read from the environment when imported (torch._dynamo's and
# inductor's settings; a few others, such as CXX and AOT_INDUCTOR_*, are not checked): where the
# script sets one of these before its first DataLoader, the run imported ahead would not run as
# the script does, and stands aside (`config.AHEAD_ENV_CHANGED`).
READ_AT_IMPORT = ("TORCH", "PYTORCH", "TRITON")


def _step_aside_on_low_memory(opened: threading.Event) -> None:
    while not opened.wait(0.2):
        if psutil.virtual_memory().available < MIN_AVAILABLE_PCT / 100 * psutil.virtual_memory().total:
            os._exit(75)  # EX_TEMPFAIL: this run is not needed; its workers end with its group


def hold(recorder: Recorder, path: Path) -> None:
    """Import what the script would import after its first DataLoader (IMPORTED_AHEAD), beside
    the baseline's own imports and at the same priority (in the idle class they crawl on a
    machine whose cores are all busy); then lower this process (`priority.lower`) and say so
    (`standing_file`: its imports are done). At the script's first gate, say so (`at_gate_file`:
    its set-up is done), wait for `path`, then restore the priority of every thread
    (`priority.restore`). Where a thread stays lowered, the run stops there, recording how many
    (`priority.LOWERED`); where the script set a variable those imports read
    (`config.AHEAD_ENV_CHANGED`), too: the parent measures a fresh run."""
    _import_ahead()
    environ = _read_at_import()  # as the imports left it (inductor sets its cache folder's)
    before = priority.lower()
    with contextlib.suppress(OSError):  # the parent's trial windows wait for this, a while at most
        standing_file(path).touch()
    parent = os.getppid()
    opened = threading.Event()
    threading.Thread(
        target=_step_aside_on_low_memory, args=(opened,), name="trainadvisor-standby", daemon=True
    ).start()

    def wait_and_apply() -> None:
        with contextlib.suppress(OSError):  # the parent's estimate of what is left reads this
            at_gate_file(path).touch()
        while not path.exists():
            if os.getppid() != parent:
                raise WindowComplete()  # the parent is gone: nobody will read the result
            time.sleep(POLL_S)
        opened.set()
        command = _serial.load_json(WindowCommand, path)
        if command.stop:
            raise WindowComplete()
        changed = sorted(k for k in {*environ, *_read_at_import()} if environ.get(k) != os.environ.get(k))
        if changed:  # the script's torch._dynamo would have read these
            recorder.held_facts[AHEAD_ENV_CHANGED] = changed
            raise WindowComplete()
        lowered = priority.restore(before) if before is not None else 0
        if lowered:  # its speed would be a starved thread's: the parent measures a fresh run
            recorder.held_facts[priority.LOWERED] = lowered
            raise WindowComplete()
        _apply(recorder, command)

    recorder.gate = wait_and_apply


def released(path: Path) -> bool:
    """Wait before the script until the parent lets it in (`config.released_file`) or hands it
    its settings (`path`). The script sets up only once the baseline's own set-up is done: a
    dataset downloaded or a folder made at start is never made by two runs at once. False where
    the parent is gone: nobody would read the result."""
    parent = os.getppid()
    let_in = released_file(path)
    while not (let_in.exists() or path.exists()):
        if os.getppid() != parent:
            return False
        time.sleep(POLL_S)
    return True


def _read_at_import() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(READ_AT_IMPORT)}


def _import_ahead() -> None:
    """IMPORTED_AHEAD, each where it imports: one that fails fails again where the script imports
    it, and says so there."""
    for name in IMPORTED_AHEAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _apply(recorder: Recorder, command: WindowCommand) -> None:
    """The settings and the window's size. They are DataLoader arguments only: the parent starts
    a run ahead of its settings only for DataLoader fixes, on a run without a GPU."""
    config = recorder.config
    config.overrides, config.warmup, config.steps = command.overrides, command.warmup, command.steps
    config.profile_steps, config.size = command.profile_steps, command.size
    recorder.loader_overrides = command.overrides.loaders
    recorder.window = recorder.new_window()
