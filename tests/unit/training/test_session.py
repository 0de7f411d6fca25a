"""Trial windows in the script's own process (`training.session`): a real `hooks.Recorder` on a
fake clock, with torch's DataLoader patched by `loaders.install` and real single-process loaders
(num_workers=0) over a dataset whose items each cost 1 ms of the fake clock. Commands are written
into the session folder as the parent writes them (`_serial.save_json` of a `WindowCommand`);
what the session saves (`window-N.result.json`), the commands it refuses and why, what
`switch_loaders` says of a setting it cannot apply, and the batches the loop's own iterator
serves once a stand-in loader takes over. The session's `time` is a fake: its wall clock is
fixed and its polls are counted."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import torch
from support.window import FakeClock
from torch.utils.data import DataLoader, Dataset

from trainadvisor import _serial
from trainadvisor.measure.config import ChildConfig, WindowCommand, command_file, window_file
from trainadvisor.records import Overrides, RawRun, StepRecord
from trainadvisor.training import hooks, loaders, session
from trainadvisor.training.session import POLL_S, Session, WindowPatches, switch_loaders

WALL_S = 1_700_000_123.5  # the fake wall clock the session stamps its results with


class _Items(Dataset[torch.Tensor]):
    """0, 1, ... n-1; reading an item takes 1 ms of the fake clock (the loop's wait for data)."""

    def __init__(self, n: int, clock: FakeClock) -> None:
        self.n, self.clock = n, clock

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        self.clock.advance(1.0)
        return torch.tensor(index)


def _build(dataset: Dataset[torch.Tensor], batch_size: int) -> DataLoader[torch.Tensor]:
    return DataLoader(dataset, batch_size=batch_size)  # the call site the commands name


SITE = f"{__file__}:{_build.__code__.co_firstlineno + 1}"


class _Time:
    """The session's `time`: a fixed wall clock; each poll is counted, and after `polls` of them
    `ready` is set and the poll waits until the writer says the command is there."""

    def __init__(self, polls: int = 0) -> None:
        self.slept: list[float] = []
        self.polls = polls
        self.ready, self.written = threading.Event(), threading.Event()

    def time(self) -> float:
        return WALL_S

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if len(self.slept) == self.polls:
            self.ready.set()
            assert self.written.wait(10)


class _Refused(Exception):
    pass


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> _Time:
    faked = _Time()
    monkeypatch.setattr(session, "time", faked)
    return faked


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recorder(tmp_path: Path, clock: FakeClock, fake_time: _Time) -> Iterator[hooks.Recorder]:
    """A baseline window of 1 warm-up and 1 timed step, then trial windows from the session
    folder; DataLoader patched as in the child, and put back after the test."""
    config = ChildConfig(
        "baseline", str(tmp_path / "baseline.result.json"), None, 1, 1, 0, True, None,
        session_dir=str(tmp_path / "session"),
    )  # fmt: skip
    (tmp_path / "session").mkdir()
    made = hooks.Recorder(config, clock.clock())

    def refuse(reason: str) -> None:
        raise _Refused(reason)

    loaders.install(made, refuse)
    try:
        yield made
    finally:
        made.uninstall()


def _session(recorder: hooks.Recorder) -> Session:
    made = Session(Path(str(recorder.config.session_dir)))
    recorder.session = made
    return made


def _send(recorder: hooks.Recorder, command: WindowCommand) -> None:
    """Write a command as the parent does (`measure.kept_alive.LiveRun`)."""
    _serial.save_json(command, command_file(Path(str(recorder.config.session_dir)), command.index))


def _saved(recorder: hooks.Recorder, index: int) -> RawRun:
    return _serial.load_json(RawRun, window_file(Path(str(recorder.config.session_dir)), index))


def _step(
    recorder: hooks.Recorder, clock: FakeClock, batches: Iterator[torch.Tensor], served: list[list[int]]
) -> None:
    """One step of the loop: a batch (1 ms an item), 5 ms of compute, a backward() of the batch's
    mean as the loss, the step's end."""
    batch = next(batches)
    served.append([int(v) for v in batch])
    clock.advance(5.0)
    recorder.loss_candidate(batch.float().mean())
    recorder.boundary()


def _exact(records: list[StepRecord]) -> list[StepRecord]:
    """Clock arithmetic in float seconds: compared to a nanosecond of a millisecond."""
    return [
        replace(
            r,
            start_ms=round(r.start_ms, 6),
            step_ms=round(r.step_ms, 6),
            data_wait_ms=round(r.data_wait_ms, 6),
            pre_backward_ms=None if r.pre_backward_ms is None else round(r.pre_backward_ms, 6),
        )
        for r in records
    ]


def test_a_command_switches_the_loop_to_a_stand_in_loader_and_saves_the_trial_window(
    recorder: hooks.Recorder, clock: FakeClock
) -> None:
    """Baseline batches of 2; the trial asks for 4 at the loader's call site. The loop's own
    iterator serves the stand-in's batches from a fresh pass, and a pass that ends starts the next
    one without ending the epoch; the trial window's steps take 4 ms of waiting and 5 of compute."""
    _session(recorder)
    wanted = Overrides(loaders={SITE: {"batch_size": 4}})
    _send(recorder, WindowCommand(0, "batch_size=4", wanted, warmup=1, steps=2))
    loader = _build(_Items(8, clock), batch_size=2)
    batches = iter(loader)
    served: list[list[int]] = []
    for _ in range(2):  # the baseline window
        _step(recorder, clock, batches, served)
    assert served == [[0, 1], [2, 3]]
    assert recorder.window_done and isinstance(recorder.session.command, WindowCommand)
    assert recorder.window.first_index == 2 and recorder.loader_overrides == wanted.loaders
    for _ in range(2):  # the trial's warm-up step and first timed one
        _step(recorder, clock, batches, served)
    _send(recorder, WindowCommand(1, stop=True))
    with pytest.raises(hooks.WindowComplete):  # the last timed step: saved, then told to stop
        _step(recorder, clock, batches, served)
    assert served[2:] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    trial = _saved(recorder, 0)
    assert (trial.label, trial.status, trial.exit_code, trial.error) == (
        "batch_size=4",
        "window_complete",
        None,
        None,
    )
    assert (trial.warmup_steps, trial.window_steps, trial.profile_steps, trial.steps_seen) == (1, 2, 0, 5)
    assert (trial.overrides, trial.ended_unix_s, trial.step_source) == (wanted, WALL_S, "optimizer")
    timed = {"step_ms": 9.0, "data_wait_ms": 4.0, "samples": 4, "pre_backward_ms": 9.0, "backwards": 1}
    assert _exact(trial.steps) == [
        StepRecord(index=3, start_ms=0.0, loss=5.5, **timed),
        StepRecord(index=4, start_ms=9.0, loss=1.5, **timed),
    ]
    # the losses by step index, the baseline's steps left out; no fingerprints in a trial window
    assert trial.losses == [None, None, 1.5, 5.5, 1.5] and trial.batch_fingerprints == [None, None, None]
    assert trial.shape is not None
    shape = trial.shape
    assert (shape.warmup_steps, round(shape.warmup_s, 9), shape.warmup_end) == (1, 0.009, "count")
    assert (round(shape.timed_s, 9), shape.timed_end, shape.slid_steps, shape.settle_s) == (
        0.018,
        "plan",
        0,
        None,
    )
    # the loader as the script built it, its one batch inside the baseline's timed step
    built = [(i.index, i.created_at, i.batch_size, i.num_workers, i.batches_in_window) for i in trial.loaders]
    assert built == [(0, SITE, 2, 0, 1)]
    assert not window_file(Path(str(recorder.config.session_dir)), 1).exists()
    assert recorder.loader_overrides == {}  # the command's sites are let go
    assert recorder.session.command is None and recorder.session.index == 1
    assert [int(v) for v in next(iter(loader))] == [0, 1, 2, 3]  # a later epoch starts from the stand-in


def test_a_command_naming_a_call_site_where_no_loader_was_built_is_refused_and_the_next_is_read(
    recorder: hooks.Recorder, fake_time: _Time
) -> None:
    session_ = _session(recorder)
    window = recorder.window
    wanted = Overrides(loaders={"/work/train.py:7": {"batch_size": 4}})
    _send(recorder, WindowCommand(0, "elsewhere", wanted, warmup=1, steps=2))
    _send(recorder, WindowCommand(1, stop=True))
    assert session_.next_window(recorder) is False
    expected = RawRun(
        "elsewhere", "refused", None, "no DataLoader was built at /work/train.py:7 in this run",
        0, 0, 0, 0, [], [], None, overrides=wanted, ended_unix_s=WALL_S,
    )  # fmt: skip
    assert _saved(recorder, 0) == expected
    assert recorder.window is window and recorder.loader_overrides == {}  # the command's site is let go
    assert (session_.index, session_.command, fake_time.slept) == (1, None, [])


def test_a_window_the_script_ends_inside_is_saved_as_far_as_it_got_and_its_switch_undone(
    recorder: hooks.Recorder, clock: FakeClock
) -> None:
    """A refused command, then cuDNN autotuning for a window of 1 warm-up and 3 timed steps: the
    script fails after the warm-up and one timed step of 5 ms."""
    session_ = _session(recorder)
    assert torch.backends.cudnn.benchmark is False
    recorder.steps_seen = 7  # where the baseline left the loop
    nowhere = Overrides(loaders={"/work/train.py:7": {"num_workers": 0}})
    autotune = Overrides(runtime={"cudnn_benchmark": True})
    _send(recorder, WindowCommand(0, "nowhere", nowhere, warmup=1, steps=1))
    _send(recorder, WindowCommand(1, "cudnn", autotune, warmup=1, steps=3))
    try:
        assert session_.next_window(recorder) is True
        assert torch.backends.cudnn.benchmark is True  # for this window only
        assert (session_.index, session_.command.label, recorder.window.first_index) == (1, "cudnn", 7)
        for _ in range(2):
            clock.advance(5.0)
            recorder.boundary()
        session_.ended(recorder, "script_failed", "ValueError: boom")
    finally:
        if session_.patches is not None:
            session_.patches.undo()
    assert torch.backends.cudnn.benchmark is False
    refused = _saved(recorder, 0)
    assert (refused.status, refused.error, refused.steps_seen) == (
        "refused", "no DataLoader was built at /work/train.py:7 in this run", 7,
    )  # fmt: skip
    cut = _saved(recorder, 1)
    assert (cut.label, cut.status, cut.error, cut.overrides, cut.steps_seen) == (
        "cudnn", "script_failed", "ValueError: boom", autotune, 9,
    )  # fmt: skip
    assert (cut.warmup_steps, cut.window_steps, _exact(cut.steps)) == (
        1, 1, [StepRecord(index=8, start_ms=0.0, step_ms=5.0, data_wait_ms=0.0, samples=None, backwards=0)],
    )  # fmt: skip
    assert cut.shape is not None
    assert (cut.shape.timed_end, round(cut.shape.timed_s, 9)) == ("script ended", 0.005)
    assert cut.runtime["amp_override"] is None and cut.runtime["data_parallel_modules"] == 0
    assert session_.index == 2 and session_.command is None


def test_the_scripts_end_outside_a_trial_window_saves_nothing(recorder: hooks.Recorder) -> None:
    session_ = _session(recorder)
    session_.ended(recorder, "script_ended", None)
    assert list(Path(str(recorder.config.session_dir)).iterdir()) == []


def test_the_session_polls_until_the_parent_writes_the_next_command(
    recorder: hooks.Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting = _Time(polls=3)
    monkeypatch.setattr(session, "time", waiting)
    session_ = _session(recorder)

    def parent() -> None:
        assert waiting.ready.wait(10)
        _send(recorder, WindowCommand(0, stop=True))
        waiting.written.set()

    writer = threading.Thread(target=parent)
    writer.start()
    try:
        assert session_.next_window(recorder) is False
    finally:
        waiting.written.set()
        writer.join(10)
    assert not writer.is_alive() and waiting.slept == [POLL_S, POLL_S, POLL_S]


def test_a_session_whose_parent_is_gone_stops_the_script_instead_of_waiting(
    recorder: hooks.Recorder, fake_time: _Time
) -> None:
    session_ = _session(recorder)
    session_.parent = os.getppid() + 1  # the parent it started under is not this one
    with pytest.raises(hooks.WindowComplete):
        session_.next_window(recorder)
    assert fake_time.slept == []


def test_a_stand_in_goes_back_to_the_scripts_own_settings_when_a_later_window_names_none(
    recorder: hooks.Recorder, clock: FakeClock
) -> None:
    loader = _build(_Items(6, clock), batch_size=2)
    untouched = DataLoader(_Items(6, clock), batch_size=3)  # built at another line
    batches = iter(loader)
    assert [int(v) for v in next(batches)] == [0, 1]
    assert switch_loaders(recorder, Overrides(loaders={SITE: {"batch_size": 4}})) is None
    assert [int(v) for v in next(batches)] == [0, 1, 2, 3]
    assert recorder.live_loaders.switched == {0}  # the second loader (index 1) was not switched
    assert switch_loaders(recorder, Overrides()) is None  # the next window names no loader
    assert [[int(v) for v in b] for b in (next(batches), next(batches))] == [[0, 1], [2, 3]]
    assert [[int(v) for v in b] for b in loader] == [[0, 1], [2, 3], [4, 5]]
    assert not hasattr(untouched, "_trainadvisor_shadow") and recorder.live_loaders.switched == {0}


def test_a_loader_the_script_no_longer_holds_cannot_be_switched(
    recorder: hooks.Recorder, clock: FakeClock
) -> None:
    loader = _build(_Items(4, clock), batch_size=2)
    del loader
    gc.collect()
    assert switch_loaders(recorder, Overrides(loaders={SITE: {"batch_size": 4}})) == (
        f"the DataLoader built at {SITE} is no longer in use"
    )
    assert recorder.live_loaders.switched == set()


def test_pinned_memory_a_rank_would_pin_on_another_gpu_is_refused_and_nothing_switched(
    recorder: hooks.Recorder, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local rank 1 of 2 with device 0 current: pinning would open a CUDA context on GPU 0."""
    loader = _build(_Items(4, clock), batch_size=2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert switch_loaders(recorder, Overrides(loaders={SITE: {"pin_memory": True}})) == (
        "local rank 1 has not called torch.cuda.set_device(1) before iterating its DataLoader: with "
        "pin_memory=True its pinning thread would run on GPU 0 and every rank would open a CUDA "
        "context there; call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) first, then pin memory"
    )
    assert recorder.live_loaders.switched == set() and not hasattr(loader, "_trainadvisor_shadow")
    assert recorder.loaders[0].override_refused is None  # the run's own record of the loader stays


def test_where_one_loader_is_refused_no_loader_is_switched(
    recorder: hooks.Recorder, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two loaders, the second's pinning refused (local rank 1 on GPU 0): the first, whose
    setting could be applied, is not switched either, and both run on as the script built them."""
    first = _build(_Items(4, clock), batch_size=2)
    second = DataLoader(_Items(4, clock), batch_size=2)  # built at another line
    other_site = recorder.loaders[1].created_at
    assert other_site != SITE
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    wanted = Overrides(loaders={SITE: {"batch_size": 4}, other_site: {"pin_memory": True}})
    assert switch_loaders(recorder, wanted).startswith("local rank 1 has not called torch.cuda.set_device(1)")
    assert recorder.live_loaders.switched == set()
    assert not hasattr(first, "_trainadvisor_shadow") and not hasattr(second, "_trainadvisor_shadow")
    assert [[int(v) for v in b] for b in first] == [[0, 1], [2, 3]]


def test_window_patches_route_the_loss_transform_and_steps_through_the_recorder(
    recorder: hooks.Recorder,
) -> None:
    def before(loss: torch.Tensor) -> torch.Tensor:
        return loss

    def halved(loss: torch.Tensor) -> torch.Tensor:
        return loss / 2

    recorder.loss_transform = before
    patches = WindowPatches(recorder)
    patches.loss_transform = halved
    assert recorder.loss_transform is halved and patches.loss_transform is halved
    # the recorder keeps an optimizer's identity only (building a real one first costs a second)
    optimizer = cast(torch.optim.Optimizer, SimpleNamespace())
    patches.optimizer_step(optimizer)
    assert (recorder.steps_seen, recorder.first_optimizer) == (1, id(optimizer))
    patches.undo()
    assert recorder.loss_transform is before
