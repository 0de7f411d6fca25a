"""A run started ahead of its settings (`training.gate`): `hold` lowers the process's priority and gives
the recorder a gate that, at the script's first DataLoader, backward() or step, waits for the parent's
command file (written here by a thread, atomically as the parent writes it), then applies its DataLoader
overrides and window size to the recorder, or stops the run; it stops too when the parent is gone. The
stand-by thread exits the run when memory runs short. The process's priority, parent and memory are
fakes: the gate module's `os`, `psutil` and `time` are replaced by recorders of what it asks."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainadvisor import _serial
from trainadvisor.measure import priority
from trainadvisor.measure.config import (
    AHEAD_ENV_CHANGED,
    ChildConfig,
    WindowCommand,
    WindowSize,
    released_file,
)
from trainadvisor.records import Overrides
from trainadvisor.training import gate
from trainadvisor.training.hooks import Recorder, WindowComplete

SITE = "/work/train.py:42"
real_standby = gate._step_aside_on_low_memory  # the stand-by thread's work (the fixture wraps it)


class _Exited(BaseException):
    """What the fake `os._exit` raises: the code the run would have ended with."""


class _Os:
    """The gate's view of the process: its threads' priorities (the main thread, 100, and any
    started while it stood by), priorities asked for, a parent that may go, an exit. Lowering is
    permitted unless `nice_allowed` is False; raising a priority back unless `raise_allowed` is."""

    PRIO_PROCESS = os.PRIO_PROCESS
    MAIN = 100

    def __init__(self, nice_allowed: bool = True) -> None:
        self.nice_allowed, self.raise_allowed = nice_allowed, True
        self.calls: list[tuple[Any, ...]] = []
        self.parents = [1000]  # getppid answers these in turn, then the last one on
        self.nices = {self.MAIN: 0}
        self.classes = {self.MAIN: os.SCHED_OTHER}
        self.environ = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_user", "HOME": "/home/user"}

    def nice(self, increment: int) -> int:
        self.calls.append(("nice", increment))
        if not self.nice_allowed:
            raise PermissionError(1, "Operation not permitted")
        self.nices[self.MAIN] = min(19, self.nices[self.MAIN] + increment)
        return self.nices[self.MAIN]

    def getpriority(self, which: int, who: int) -> int:
        return self.nices[who or self.MAIN]

    def setpriority(self, which: int, who: int, priority: int) -> None:
        self.calls.append(("setpriority", which, who, priority))
        if priority < self.nices[who or self.MAIN] and not self.raise_allowed:
            raise PermissionError(13, "Permission denied")
        self.nices[who or self.MAIN] = priority

    def listdir(self, path: Path) -> list[str]:
        assert path == priority.TASKS
        return [str(tid) for tid in self.nices]

    SCHED_IDLE, SCHED_OTHER, sched_param = os.SCHED_IDLE, os.SCHED_OTHER, os.sched_param

    def sched_getscheduler(self, who: int) -> int:
        return self.classes.setdefault(who or self.MAIN, os.SCHED_OTHER)

    def sched_setscheduler(self, who: int, policy: int, param: os.sched_param) -> None:
        self.calls.append(("sched", who or self.MAIN, "idle" if policy == os.SCHED_IDLE else "other"))
        leaving = self.sched_getscheduler(who) == os.SCHED_IDLE and policy != os.SCHED_IDLE
        if leaving and not self.raise_allowed:
            raise PermissionError(1, "Operation not permitted")
        self.classes[who or self.MAIN] = policy

    def getppid(self) -> int:
        return self.parents.pop(0) if len(self.parents) > 1 else self.parents[0]

    def _exit(self, code: int) -> None:
        self.calls.append(("_exit", code))
        raise _Exited(code)


class _Memory:
    """psutil's `virtual_memory()`: `available` of `total` bytes; `on_read` runs at each read."""

    def __init__(self, available: int, total: int, on_read: Any = None) -> None:
        self.available, self.total, self.on_read, self.reads = available, total, on_read, 0

    def virtual_memory(self) -> _Memory:
        self.reads += 1
        if self.on_read is not None:
            self.on_read()
        return self


class _Importer:
    """The gate's `importlib`: the modules it was asked to import; those in `failing` raise as a
    broken installation's would."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        self.imported: list[str] = []
        self.failing = failing

    def import_module(self, name: str) -> None:
        self.imported.append(name)
        if name in self.failing:
            raise RuntimeError(f"{name}: a broken installation")


class _Time:
    """The gate's `time.sleep`: each poll counted; after `polls` of them, `ready` is set and the
    poll waits until the writer says the file is there."""

    def __init__(self, polls: int) -> None:
        self.slept: list[float] = []
        self.polls = polls
        self.ready, self.written = threading.Event(), threading.Event()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if len(self.slept) == self.polls:
            self.ready.set()
            assert self.written.wait(10)


@pytest.fixture
def fake_os(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Os]:
    """The fakes, and every stand-by thread `hold` starts let go (and waited for) at the end of the
    test, whether its gate opened or not."""
    faked = _Os()
    monkeypatch.setattr(gate, "os", faked)
    monkeypatch.setattr(priority, "os", faked)
    monkeypatch.setattr(gate, "psutil", _Memory(available=50, total=100))
    monkeypatch.setattr(gate, "importlib", _Importer())
    standing_by: list[tuple[threading.Event, threading.Thread]] = []
    real = gate._step_aside_on_low_memory

    def standby(opened: threading.Event) -> None:
        standing_by.append((opened, threading.current_thread()))
        real(opened)

    monkeypatch.setattr(gate, "_step_aside_on_low_memory", standby)
    yield faked
    for opened, thread in standing_by:
        opened.set()
        thread.join(10)


def _recorder(tmp_path: Path) -> Recorder:
    config = ChildConfig(
        label="after",
        result_file=str(tmp_path / "after.result.json"),
        trace_file=str(tmp_path / "after.trace.json"),
        warmup=3,
        steps=10,
        profile_steps=5,
        stop_after_window=True,
        seed=0,
    )
    return Recorder(config)


def _written_later(path: Path, command: WindowCommand, clock: _Time) -> threading.Thread:
    """A thread that writes `command` to `path` as the parent does, once the gate has polled."""

    def write() -> None:
        assert clock.ready.wait(10)
        _serial.save_json(command, path)
        clock.written.set()

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_hold_imports_ahead_in_the_lowered_process_and_sets_a_gate_without_waiting(
    fake_os: _Os, tmp_path: Path
) -> None:
    recorder = _recorder(tmp_path)
    window = recorder.window
    gate.hold(recorder, tmp_path / "after.gate.json")
    assert fake_os.calls == [("nice", 19), ("sched", _Os.MAIN, "idle")]
    assert gate.importlib.imported == ["torch._dynamo"]  # type: ignore[attr-defined]  # before the script
    assert (tmp_path / "after.gate.json.standing").exists()  # its imports done: the trials may begin
    assert callable(recorder.gate)
    assert recorder.window is window and recorder.config.warmup == 3  # nothing applied yet


def test_hold_goes_on_at_normal_priority_where_lowering_it_is_not_permitted(
    fake_os: _Os, tmp_path: Path
) -> None:
    fake_os.nice_allowed = False
    recorder = _recorder(tmp_path)
    gate.hold(recorder, tmp_path / "after.gate.json")
    assert fake_os.calls == [("nice", 19)]
    assert (tmp_path / "after.gate.json.standing").exists()  # torch imported: the trials may begin
    assert callable(recorder.gate)


def test_the_gate_waits_for_the_file_then_applies_its_settings_to_the_recorder(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "after.gate.json"
    recorder = _recorder(tmp_path)
    old_window = recorder.window
    gate.hold(recorder, path)
    clock = _Time(polls=3)
    monkeypatch.setattr(gate, "time", clock)
    overrides = Overrides(loaders={SITE: {"num_workers": 4, "persistent_workers": True}})
    size = WindowSize(min_time_s=0.5, max_steps=200)
    command = WindowCommand(
        index=0, label="after", overrides=overrides, warmup=2, steps=7, profile_steps=3, size=size
    )
    writer = _written_later(path, command, clock)
    assert recorder.gate is not None
    recorder.gate()
    writer.join()
    assert clock.slept == [gate.POLL_S] * 3  # it waited, polling, until the file was there
    config = recorder.config
    assert (config.warmup, config.steps, config.profile_steps) == (2, 7, 3)
    assert config.overrides == overrides
    assert config.size == size
    assert recorder.loader_overrides == {SITE: {"num_workers": 4, "persistent_workers": True}}
    window = recorder.window
    assert window is not old_window
    plan = window.plan
    assert (plan.warmup, plan.steps, plan.profile_steps) == (2, 7, 3)
    assert (plan.min_time_s, plan.max_steps) == (0.5, 200)
    # lowered at hold, back to normal once the settings came
    assert fake_os.calls == [
        ("nice", 19),
        ("sched", _Os.MAIN, "idle"),
        ("sched", _Os.MAIN, "other"),
        ("setpriority", os.PRIO_PROCESS, _Os.MAIN, 0),
    ]
    assert recorder.held_facts == {}
    assert gate.importlib.imported == ["torch._dynamo"]  # type: ignore[attr-defined]  # once, at hold


@pytest.mark.parametrize(
    ("set_by_script", "changed"),
    [
        ({}, None),
        ({"HOME": "/elsewhere", "OMP_NUM_THREADS": "1"}, None),  # not read by what was imported ahead
        ({"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_user"}, None),  # set as the imports left it
        ({"TORCH_LOGS": "+dynamo"}, ["TORCH_LOGS"]),
        ({"TORCHINDUCTOR_CACHE_DIR": "/data/cache", "TRITON_CACHE_DIR": "/data/t"},
         ["TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"]),
        ({"TORCHINDUCTOR_CACHE_DIR": None}, ["TORCHINDUCTOR_CACHE_DIR"]),  # removed
    ],
)  # fmt: skip
def test_a_script_that_sets_what_the_imports_ahead_read_stops_the_run_at_its_gate(
    fake_os: _Os,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    set_by_script: dict[str, str | None],
    changed: list[str] | None,
) -> None:
    """torch._dynamo, imported before the script, read the environment then: where the script
    changes a variable it reads before its first DataLoader, the run would not run as the script
    does. It stops at its gate and says which (the parent measures a fresh run)."""
    recorder = _held(tmp_path)
    for name, value in set_by_script.items():
        if value is None:
            del fake_os.environ[name]
        else:
            fake_os.environ[name] = value
    if changed is None:
        _opened(recorder, tmp_path, monkeypatch)
        assert recorder.config.steps == 4 and recorder.held_facts == {}
        return
    with pytest.raises(WindowComplete):
        _opened(recorder, tmp_path, monkeypatch)
    assert recorder.held_facts == {AHEAD_ENV_CHANGED: changed}
    assert recorder.config.steps == 10  # nothing applied
    assert fake_os.calls == [("nice", 19), ("sched", _Os.MAIN, "idle")]  # it is not measured: left lowered


def test_the_script_waits_until_the_parent_lets_it_in_or_hands_its_settings(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "after.gate.json"
    clock = _Time(polls=2)
    monkeypatch.setattr(gate, "time", clock)

    def let_in() -> None:
        assert clock.ready.wait(10)
        released_file(path).touch()
        clock.written.set()

    thread = threading.Thread(target=let_in)
    thread.start()
    assert gate.released(path)
    thread.join()
    assert clock.slept == [gate.POLL_S] * 2
    released_file(path).unlink()
    _serial.save_json(WindowCommand(index=0, warmup=1, steps=4), path)  # the settings let it in too
    monkeypatch.setattr(gate, "time", _Time(polls=1))
    assert gate.released(path)


def test_the_script_never_starts_where_the_parent_is_gone(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_os.parents = [1000, 1000, 1000, 1]  # re-parented to init at the third poll
    clock = _Time(polls=100)
    monkeypatch.setattr(gate, "time", clock)
    assert not gate.released(tmp_path / "after.gate.json")
    assert clock.slept == [gate.POLL_S] * 2


def test_an_import_ahead_that_fails_leaves_the_gate_to_open_as_before(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    importer = _Importer(failing=("torch._dynamo",))
    monkeypatch.setattr(gate, "importlib", importer)
    path = tmp_path / "after.gate.json"
    recorder = _recorder(tmp_path)
    gate.hold(recorder, path)
    clock = _Time(polls=1)
    monkeypatch.setattr(gate, "time", clock)
    writer = _written_later(path, WindowCommand(index=0, warmup=1, steps=4), clock)
    assert recorder.gate is not None
    recorder.gate()
    writer.join()
    assert importer.imported == ["torch._dynamo"]
    assert recorder.config.steps == 4 and recorder.held_facts == {}


def _held(tmp_path: Path) -> Recorder:
    """A recorder standing by (`hold`), its command file to come at `after.gate.json`."""
    recorder = _recorder(tmp_path)
    gate.hold(recorder, tmp_path / "after.gate.json")
    return recorder


def _opened(recorder: Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate opened on a command already there."""
    _serial.save_json(WindowCommand(index=0, warmup=1, steps=4), tmp_path / "after.gate.json")
    monkeypatch.setattr(gate, "time", _Time(polls=1))
    assert recorder.gate is not None
    recorder.gate()


def test_threads_started_while_standing_by_get_their_priority_back_too(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux keeps a priority per thread, and a thread inherits its creator's: torch's intra-op
    pool, started by a forward pass in the set-up, stood by at 19 beside the main thread."""
    fake_os.nices[_Os.MAIN] = 5  # the user ran it under `nice -n 5`
    fake_os.nices[102] = 2  # a thread started before, at a priority of its own
    recorder = _held(tmp_path)
    fake_os.nices[101] = fake_os.nices[_Os.MAIN]  # started during set-up
    fake_os.nices[103] = 10  # one the script set to 10 during set-up
    fake_os.classes.update({101: os.SCHED_IDLE, 102: os.SCHED_OTHER, 103: os.SCHED_IDLE})  # inherited
    _opened(recorder, tmp_path, monkeypatch)
    assert fake_os.nices == {_Os.MAIN: 5, 102: 2, 101: 5, 103: 10}  # the user's own, not above it
    assert set(fake_os.classes.values()) == {os.SCHED_OTHER}
    assert fake_os.calls == [
        ("nice", 14),
        ("sched", _Os.MAIN, "idle"),
        ("sched", _Os.MAIN, "other"),
        ("setpriority", os.PRIO_PROCESS, _Os.MAIN, 5),
        ("sched", 101, "other"),
        ("setpriority", os.PRIO_PROCESS, 101, 5),
        ("sched", 103, "other"),  # its nice value is the script's
    ]
    assert recorder.held_facts == {} and recorder.config.steps == 4  # its settings applied


def test_a_run_whose_threads_could_not_get_their_priority_back_stops_at_its_gate(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its speed beside a busy core would be a starved thread's: it says so, and measures nothing."""
    fake_os.raise_allowed = False
    recorder = _held(tmp_path)
    fake_os.nices[101], fake_os.classes[101] = 19, os.SCHED_IDLE
    with pytest.raises(WindowComplete):
        _opened(recorder, tmp_path, monkeypatch)
    assert fake_os.nices == {_Os.MAIN: 19, 101: 19}
    assert set(fake_os.classes.values()) == {os.SCHED_IDLE}
    assert recorder.held_facts == {priority.LOWERED: 2}
    assert (recorder.config.warmup, recorder.config.steps) == (3, 10)  # nothing applied
    tried = [call for call in fake_os.calls if call[0] == "sched" and call[2] == "other"]
    assert len(tried) == 6  # each thread, in each of three passes


def test_a_run_that_could_not_lower_its_priority_raises_none_back(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_os.nice_allowed = False
    recorder = _held(tmp_path)
    _opened(recorder, tmp_path, monkeypatch)
    assert fake_os.calls == [("nice", 19)] and recorder.held_facts == {}


def test_a_file_already_there_is_read_at_once(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "after.gate.json"
    _serial.save_json(WindowCommand(index=0, warmup=1, steps=4), path)
    recorder = _recorder(tmp_path)
    gate.hold(recorder, path)
    clock = _Time(polls=1)
    monkeypatch.setattr(gate, "time", clock)
    assert recorder.gate is not None
    recorder.gate()
    assert clock.slept == []
    assert (recorder.config.warmup, recorder.config.steps, recorder.config.profile_steps) == (1, 4, 0)
    assert recorder.loader_overrides == {}


def test_a_stop_command_ends_the_run_with_nothing_applied(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "after.gate.json"
    recorder = _recorder(tmp_path)
    window = recorder.window
    gate.hold(recorder, path)
    clock = _Time(polls=2)
    monkeypatch.setattr(gate, "time", clock)
    writer = _written_later(path, WindowCommand(index=0, warmup=9, steps=9, stop=True), clock)
    assert recorder.gate is not None
    with pytest.raises(WindowComplete):
        recorder.gate()
    writer.join()
    assert clock.slept == [gate.POLL_S] * 2
    assert (recorder.config.warmup, recorder.config.steps) == (3, 10)
    assert recorder.window is window
    assert fake_os.calls == [("nice", 19), ("sched", _Os.MAIN, "idle")]  # never back to normal priority


def test_the_gate_stops_the_run_when_the_parent_is_gone(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent at hold is 1000; on the gate's second poll it is 1 (the process was reparented)."""
    fake_os.parents = [1000, 1000, 1]
    recorder = _recorder(tmp_path)
    gate.hold(recorder, tmp_path / "never.json")
    clock = _Time(polls=0)
    monkeypatch.setattr(gate, "time", clock)
    assert recorder.gate is not None
    with pytest.raises(WindowComplete):
        recorder.gate()
    assert clock.slept == [gate.POLL_S]
    assert recorder.config.warmup == 3


def test_the_standby_thread_runs_until_the_settings_are_read(
    fake_os: _Os, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "after.gate.json"
    before = set(threading.enumerate())
    recorder = _recorder(tmp_path)
    gate.hold(recorder, path)
    started = [t for t in set(threading.enumerate()) - before if t.name == "trainadvisor-standby"]
    assert len(started) == 1 and started[0].daemon and started[0].is_alive()
    _serial.save_json(WindowCommand(index=0, warmup=1, steps=1), path)
    monkeypatch.setattr(gate, "time", _Time(polls=1))
    assert recorder.gate is not None
    recorder.gate()
    started[0].join(10)
    assert not started[0].is_alive()
    assert ("_exit", 75) not in fake_os.calls


def test_standing_by_exits_with_75_below_15_percent_of_memory_available(
    fake_os: _Os, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = _Memory(available=149, total=1000)
    monkeypatch.setattr(gate, "psutil", memory)
    with pytest.raises(_Exited) as exited:
        real_standby(threading.Event())
    assert exited.value.args == (75,)
    assert fake_os.calls == [("_exit", 75)]


def test_standing_by_goes_on_at_15_percent_available_until_the_gate_opens(
    fake_os: _Os, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = threading.Event()
    memory = _Memory(available=150, total=1000, on_read=opened.set)  # opened while it checks memory
    monkeypatch.setattr(gate, "psutil", memory)
    real_standby(opened)
    assert memory.reads == 2  # one look (available, then total), then it saw the gate open
    assert fake_os.calls == []


def test_standing_by_once_the_gate_is_open_reads_no_memory(
    fake_os: _Os, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = threading.Event()
    opened.set()
    memory = _Memory(available=0, total=1000)
    monkeypatch.setattr(gate, "psutil", memory)
    real_standby(opened)
    assert memory.reads == 0
    assert fake_os.calls == []
