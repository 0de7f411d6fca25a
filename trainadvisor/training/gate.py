"""A run started before its settings are known (the confirmation run, while the trials still
run): the script's set-up (imports, loading, building the model) goes on at the lowest CPU
priority, so it takes nothing from the windows being measured, and the script waits at its first
DataLoader, backward() or step until the parent writes the settings. Only settings applied from
that point on can be confirmed this way: DataLoader arguments (the parent starts such a run only
when every fix in question is one)."""

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
from trainadvisor.measure.config import WindowCommand, standing_file
from trainadvisor.training.hooks import Recorder, WindowComplete

POLL_S = 0.005


# Below this share of memory available, a run waiting for its settings exits (the parent then
# starts the confirmation afresh): standing by must never push the machine into swap or OOM.
MIN_AVAILABLE_PCT = 15.0

# What training scripts import lazily after their first DataLoader: torch's optimizers import
# torch._dynamo when first built (about 1 CPU-s on 2 cores, measured after the gate opened, before
# the confirmation's first step). Imported while the run stands by for its settings (at the lowest
# priority, while the trials run), the same modules in the same process, only earlier: what the
# run measures after its gate is the script's own loop.
IMPORTED_AHEAD = ("torch._dynamo",)


def _step_aside_on_low_memory(opened: threading.Event) -> None:
    while not opened.wait(0.2):
        if psutil.virtual_memory().available < MIN_AVAILABLE_PCT / 100 * psutil.virtual_memory().total:
            os._exit(75)  # EX_TEMPFAIL: this run is not needed; its workers end with its group


def hold(recorder: Recorder, path: Path) -> None:
    """Lower this process's priority now, and say so (`standing_file`: its imports are done);
    at the script's first gate, wait for `path`, then
    restore the priority of every thread (`priority.restore`). Where a thread stays lowered, the
    run stops there, recording how many (`priority.LOWERED`): the parent measures a fresh run."""
    before = priority.lower()
    with contextlib.suppress(OSError):  # the parent's trial windows wait for this, a while at most
        standing_file(path).touch()
    parent = os.getppid()
    opened = threading.Event()
    threading.Thread(
        target=_step_aside_on_low_memory, args=(opened,), name="trainadvisor-standby", daemon=True
    ).start()

    def wait_and_apply() -> None:
        if not path.exists():  # time to stand by: what the script would import next, now
            _import_ahead()
        while not path.exists():
            if os.getppid() != parent:
                raise WindowComplete()  # the parent is gone: nobody will read the result
            time.sleep(POLL_S)
        opened.set()
        command = _serial.load_json(WindowCommand, path)
        if command.stop:
            raise WindowComplete()
        lowered = priority.restore(before) if before is not None else 0
        if lowered:  # its speed would be a starved thread's: the parent measures a fresh run
            recorder.held_facts[priority.LOWERED] = lowered
            raise WindowComplete()
        _apply(recorder, command)

    recorder.gate = wait_and_apply


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
