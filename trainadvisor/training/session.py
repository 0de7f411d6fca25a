"""Trial windows in the script's own process: after the baseline window is written, the step
hook asks the parent what to measure next (`command-N.json` in the session folder), switches the
setting at this step boundary, and measures a window with it (`window-N.result.json`); until the
parent says stop. A verdict then costs the script's start-up once, not once per trial.

What can switch while the loop runs:
- DataLoader settings (`num_workers`, `prefetch_factor`, `persistent_workers`, `pin_memory`): the
  loader gets a stand-in built with the new settings from the same dataset, sampler, collate_fn,
  batch size and worker init; the iterator the loop is calling serves the stand-in's batches
  from now on, and later epochs start from the stand-in. The old workers are shut down. The
  stand-in starts a fresh pass of the sampler: the order differs from the script's, which is
  why this process is stopped after its trials and the chosen settings are confirmed in a
  fresh, seeded run.
- Switches that torch reads at every op (TF32, cuDNN autotuning, bf16 autocast, non-blocking
  copies), installed for one window and undone after it.
Everything else (a GradScaler, the optimizer's implementation, the batch size) restarts."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from trainadvisor import _serial, fixes
from trainadvisor.measure.config import WindowCommand, command_file, window_file
from trainadvisor.records import LoaderInfo, Overrides
from trainadvisor.training import gpu, loaders
from trainadvisor.training.hooks import Patches, Recorder, WindowComplete, window_plan, window_run
from trainadvisor.training.window import Window

POLL_S = 0.005


class WindowPatches(Patches):
    """A trial window's patches; the loss transform and step control go through the recorder."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    @property
    def loss_transform(self) -> Any:
        return self.recorder.loss_transform

    @loss_transform.setter
    def loss_transform(self, value: Any) -> None:
        previous = self.recorder.loss_transform
        self.recorder.loss_transform = value
        self.on_uninstall(lambda: setattr(self.recorder, "loss_transform", previous))

    def optimizer_step(self, optimizer: torch.optim.Optimizer, *args: Any) -> None:
        self.recorder.optimizer_step(optimizer, *args)


class Session:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.index = 0
        self.parent = os.getppid()
        self.command: WindowCommand | None = None  # the window being measured
        self.patches: WindowPatches | None = None

    def next_window(self, recorder: Recorder) -> bool:
        """Called at the step boundary where a window ended: saves a trial window's result,
        then waits for the next command. True: a new window runs from this boundary."""
        if self.command is not None:
            self._save(recorder, recorder.window, "window_complete", None)
        while True:
            command = self._wait()
            if command.stop:
                return False
            self.command = command
            problem = self._apply(recorder, command)
            if problem is None:
                break
            self._save(recorder, None, "refused", problem)
        plan = window_plan(command.warmup, command.steps, command.size)
        amp = command.overrides.runtime.get("amp")
        recorder.window = Window(
            plan,
            recorder.clock,
            first_index=recorder.steps_seen,
            device=recorder.window.device,
            on_open=lambda w: gpu.torch_facts(recorder.data_parallel_modules, amp, w.device),
        )
        return True

    def ended(self, recorder: Recorder, status: str, error: str | None) -> None:
        """The script ended (or failed) inside a trial window: what it measured so far is saved
        as that window's result, for the parent to judge whether it is enough."""
        if self.command is not None:
            recorder.window.cut_short()
            self._save(recorder, recorder.window, status, error)

    def _wait(self) -> WindowCommand:
        path = command_file(self.folder, self.index)
        while not path.exists():
            if os.getppid() != self.parent:  # the parent is gone: nobody will read a result
                raise WindowComplete()
            time.sleep(POLL_S)
        return _serial.load_json(WindowCommand, path)

    def _save(self, recorder: Recorder, window: Window | None, status: str, error: str | None) -> None:
        if self.patches is not None:
            self.patches.undo()
            self.patches = None
        recorder.non_blocking_h2d = recorder.config.overrides.non_blocking_h2d
        recorder.loader_overrides = recorder.config.overrides.loaders
        assert self.command is not None
        run = (
            window_run(
                window,
                label=self.command.label,
                status=status,
                exit_code=None,
                error=error,
                steps_seen=recorder.steps_seen,
                step_source=recorder.step_source,
                loaders=recorder.loaders,
            )
            if window is not None
            else _refused(self.command, error or "", recorder.steps_seen)
        )
        run.overrides = self.command.overrides
        run.ended_unix_s = time.time()
        _serial.save_json(run, window_file(self.folder, self.index))
        self.index += 1
        self.command = None

    def _apply(self, recorder: Recorder, command: WindowCommand) -> str | None:
        """Switch to the command's setting; why it cannot switch, or None."""
        # torch warns when workers outnumber the cores: here it is the trial that asks for them
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        recorder.loader_overrides = command.overrides.loaders  # for loaders the script builds anew
        problem = switch_loaders(recorder, command.overrides)
        if problem is not None:
            return problem
        patches = self.patches = WindowPatches(recorder)
        wanted = command.overrides
        if wanted.non_blocking_h2d and torch.cuda.is_available():
            from trainadvisor.fixes import switches

            switches.install_non_blocking_copies(patches)
            recorder.non_blocking_h2d = True
        fixes.install(patches, Overrides(runtime=wanted.runtime))
        return None


def _refused(command: WindowCommand, reason: str, steps_seen: int) -> Any:
    from trainadvisor.records import RawRun

    return RawRun(command.label, "refused", None, reason, 0, 0, 0, steps_seen, [], [], None)


def switch_loaders(recorder: Recorder, overrides: Overrides) -> str | None:
    """Every loader the script built gets a stand-in with its own arguments changed by the
    overrides of its call site (none: as the script built it); why not, or None. A loader the
    script no longer holds (`for batch in DataLoader(...)`) is reached through the iterator it
    is serving from. Every loader's new arguments are checked before the first stand-in is
    built: where one is refused, none is switched, and each runs on as it did."""
    live = recorder.live_loaders
    wanted_sites = set(overrides.loaders)
    found = {info.created_at for info in recorder.loaders} & wanted_sites
    if wanted_sites - found:
        return f"no DataLoader was built at {', '.join(sorted(wanted_sites - found))} in this run"
    planned: list[tuple[LoaderInfo, dict[str, Any]]] = []
    for info in recorder.loaders:
        wanted = info.created_at in wanted_sites
        if info.index >= len(live.args) or (not wanted and info.index not in live.switched):
            continue  # never switched: it runs as the script built it
        if _gone(recorder, info):
            live.switched.discard(info.index)
            continue  # nothing of it will run again
        args = dict(live.args[info.index])
        checked = LoaderInfo(**{**info.__dict__, "overrides_applied": {}})
        loaders.apply(args, dict(overrides.loaders.get(info.created_at, {})), checked)
        if checked.override_refused:
            return checked.override_refused
        planned.append((info, args))
    reached = {info.created_at for info, _ in planned} & wanted_sites
    if wanted_sites - reached:
        return f"the DataLoader built at {', '.join(sorted(wanted_sites - reached))} is no longer in use"
    for info, args in planned:
        _stand_in(recorder, info, args)
    return None


def _gone(recorder: Recorder, info: LoaderInfo) -> bool:
    """Whether neither the loader nor an iterator serving from it is left."""
    live = recorder.live_loaders
    serving_ref = live.serving.get(info.index)
    return live.refs[info.index]() is None and (serving_ref is None or serving_ref() is None)


def _stand_in(recorder: Recorder, info: LoaderInfo, args: dict[str, Any]) -> None:
    """The loader of `info`, and the iterator serving from it, continue on a stand-in built
    with `args`."""
    live = recorder.live_loaders
    loader = live.refs[info.index]()
    serving_ref = live.serving.get(info.index)
    serving = serving_ref() if serving_ref is not None else None
    shadow = loaders.DataLoader.__new__(loaders.DataLoader)
    assert live.build is not None
    live.build(shadow, **args)
    shadow._trainadvisor_loader = info.index  # type: ignore[attr-defined]
    live.switched.add(info.index)
    if loader is not None:
        previous_shadow = getattr(loader, "_trainadvisor_shadow", None)
        loader._trainadvisor_shadow = shadow  # later epochs start from the stand-in
        if previous_shadow is not None:
            _shut_down(getattr(previous_shadow, "_iterator", None))
    if serving is not None:
        previous = getattr(serving, "_trainadvisor_delegate", None) or serving
        serving._trainadvisor_delegate = iter(shadow)  # type: ignore[attr-defined]  # the epoch goes on there
        # and does not end inside the trials: the stand-in's passes follow one another (an
        # epoch's end, with its validation or checkpoint, would fall into a window)
        serving._trainadvisor_again = lambda: iter(shadow)  # type: ignore[attr-defined]
        _shut_down(previous)


def _shut_down(iterator: Any) -> None:
    """End an iterator's worker processes (a single-process iterator has none) before the next
    window's first step: workers still ending while it is timed would take CPU from it (the first
    H100 runs saw 4 cores busy "elsewhere" during trials). Joining dozens of workers takes about
    a second of the loop's wall time, but no step of the script's. Nothing else touches the old
    iterator any more."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
