"""The child's heartbeat and its steps so far (`training.progress`): a real `hooks.Recorder` driven
by a fake clock through its warm-up and timed steps, a real `Heartbeat` file, and a fake CPU
clock for the cost of a save; what `window_so_far` takes down of the window as it stands, when
`Progress` saves it (at most every SAVE_MIN_S, or SAVE_BUDGET times a save's cost), and that the
writer's thread leaves the file whole for `measure.journal.last_known` to read back."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from support.window import FakeClock

from trainadvisor.measure.config import ChildConfig
from trainadvisor.measure.journal import last_known, progress_file
from trainadvisor.measure.watchdog import Heartbeat, read_beat, read_steps
from trainadvisor.training import hooks, progress
from trainadvisor.training.progress import SAVE_BUDGET, SAVE_MIN_S, Progress, window_so_far


def _recorder(tmp_path: Path, clock: FakeClock, warmup: int = 1, steps: int = 5) -> hooks.Recorder:
    config = ChildConfig("t", str(tmp_path / "baseline.result.json"), None, warmup, steps, 0, False, None)
    return hooks.Recorder(config, clock.clock())


def _steps(recorder: hooks.Recorder, clock: FakeClock, count: int, optimizer: torch.optim.Optimizer) -> None:
    """Steps of 5 ms, 2 of them waiting on a batch of 8, the loss's backward at the step's end."""
    for _ in range(count):
        clock.advance(5.0)
        recorder.data_wait(0.002, (torch.zeros(8, 2), torch.zeros(8)))
        recorder.loss_candidate(torch.tensor(0.5))
        recorder.optimizer_step(optimizer)


def _optimizer() -> torch.optim.SGD:
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def _rounded(plain: Any) -> Any:
    """Clock arithmetic in float seconds: compare to a nanosecond."""
    if isinstance(plain, float):
        return round(plain, 9)
    if isinstance(plain, list):
        return [_rounded(v) for v in plain]
    if isinstance(plain, dict):
        return {k: _rounded(v) for k, v in plain.items()}
    return plain


def _step(index: int, start_ms: float) -> dict[str, Any]:
    return {"index": index, "start_ms": start_ms, "step_ms": 5.0, "data_wait_ms": 2.0, "h2d_copy_ms": 0.0,
            "samples": 8, "loss": None, "profiled": False, "pre_backward_ms": 5.0, "gpu_ms": None,
            "trace_step": None, "outside_call_ms": None, "backwards": 1, "loaded_ahead": None,
            "ready_batches": None}  # fmt: skip


# ---- window_so_far ----


def test_the_timed_window_is_taken_down_as_cut_short_would_leave_it(tmp_path: Path) -> None:
    clock = FakeClock()
    recorder = _recorder(tmp_path, clock)
    _steps(recorder, clock, 3, _optimizer())  # one warm-up step, two timed of five
    plain = window_so_far(recorder)
    assert isinstance(plain.pop("ended_unix_s"), float)
    assert _rounded(plain) == {
        "label": "t", "status": "script_failed", "exit_code": None, "error": None,
        "warmup_steps": 1, "window_steps": 2, "profile_steps": 0, "steps_seen": 3,
        "steps": [_step(1, 0.0), _step(2, 5.0)],
        "loaders": [], "device": None, "window_start_unix_s": 1_700_000_100.005,
        "losses": [], "batch_fingerprints": [], "trace_file": None, "host_samples": [], "gpu_samples": [],
        "nvml_status": "not sampled", "overrides": {"loaders": {}, "non_blocking_h2d": False, "runtime": {}},
        "wall_s": 0.0, "log_file": None, "runtime": {}, "step_source": "optimizer", "rank": None,
        "frameworks": [], "ranks": [],
        "shape": {"warmup_steps": 1, "warmup_s": 0.005, "warmup_end": "count", "block_ms": [],
                  "timed_s": 0.010, "timed_end": "script ended", "min_time_s": 0.0, "slid_steps": 0,
                  "settle_s": None},
    }  # fmt: skip
    shape = recorder.window.shape  # the running window's own is left as it was
    assert (shape.timed_s, shape.timed_end) == (0.0, "plan")


def test_a_window_still_warming_up_has_no_shape_and_counts_its_steps_as_warmup(tmp_path: Path) -> None:
    clock = FakeClock()
    recorder = _recorder(tmp_path, clock, warmup=4)
    _steps(recorder, clock, 2, _optimizer())
    plain = window_so_far(recorder)
    assert (plain["warmup_steps"], plain["window_steps"], plain["steps_seen"]) == (2, 0, 2)
    assert (plain["shape"], plain["steps"], plain["window_start_unix_s"]) == (None, [], None)


def test_the_steps_so_far_load_back_as_the_run_record(tmp_path: Path) -> None:
    from trainadvisor import _serial
    from trainadvisor.records import RawRun

    clock = FakeClock()
    recorder = _recorder(tmp_path, clock)
    _steps(recorder, clock, 4, _optimizer())
    saved = tmp_path / "baseline.progress.json"
    saved.write_text(json.dumps(window_so_far(recorder)))
    raw = _serial.load_json(RawRun, saved)
    assert (raw.status, raw.warmup_steps, raw.window_steps, raw.steps_seen) == ("script_failed", 1, 3, 4)
    assert [step.index for step in raw.steps] == [1, 2, 3]
    assert raw.shape is not None and raw.shape.timed_end == "script ended"


# ---- Progress: the heartbeat, and when the steps so far are saved ----


class _Puts:
    """The writer, without its thread: the texts it was given."""

    def __init__(self, path: Path) -> None:
        self.path, self.failed, self.texts = path, False, []

    def put(self, text: str) -> None:
        self.texts.append(text)


class _CpuClock:
    """`time.thread_time` that advances `cost` seconds at each read: a save costs `cost`."""

    def __init__(self, cost: float) -> None:
        self.cost, self.now = cost, 0.0

    def __call__(self) -> float:
        self.now += self.cost
        return self.now


@pytest.fixture
def unthreaded(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """No writer thread; a save costs what the test says (in CPU seconds)."""
    monkeypatch.setattr(progress, "_Writer", _Puts)

    def cost(seconds: float) -> None:
        monkeypatch.setattr(time, "thread_time", _CpuClock(seconds))

    return cost


def _progress(tmp_path: Path, recorder: hooks.Recorder, clock: FakeClock) -> tuple[Progress, _Puts, Path]:
    beat = tmp_path / "run.heartbeat"
    made = Progress(
        recorder, Heartbeat(str(beat)), progress_file(recorder.config.result_file), clock.clock().perf_s
    )
    assert isinstance(made.writer, _Puts)
    return made, made.writer, beat


def test_each_beat_stores_the_step_count_and_a_window_without_steps_is_not_saved(
    tmp_path: Path, unthreaded: Callable[[float], None]
) -> None:
    unthreaded(0.001)
    clock = FakeClock()
    recorder = _recorder(tmp_path, clock, warmup=3)
    beats, puts, beat = _progress(tmp_path, recorder, clock)
    assert puts.path == tmp_path / "baseline.progress.json"
    beats.beat()
    _steps(recorder, clock, 2, _optimizer())
    beats.beat()
    beat_read = read_beat(beat)
    assert beat_read is not None and (beat_read[0], beat_read[2]) == (2, 0)  # two beats, not busy
    assert read_steps(beat) == 2
    assert puts.texts == []  # still warming up: nothing timed to save


@pytest.mark.parametrize("cost_s, wait_s", [(0.001, 0.001 * SAVE_BUDGET), (0.0001, SAVE_MIN_S)])
def test_a_save_waits_the_budget_times_its_cost_or_the_minimum_and_only_for_new_steps(
    tmp_path: Path, unthreaded: Callable[[float], None], cost_s: float, wait_s: float
) -> None:
    unthreaded(cost_s)
    clock = FakeClock()
    recorder = _recorder(tmp_path, clock, steps=50)
    beats, puts, _ = _progress(tmp_path, recorder, clock)
    optimizer = _optimizer()
    _steps(recorder, clock, 3, optimizer)
    beats.beat()
    [first] = puts.texts
    saved = json.loads(first)
    assert (saved["steps_seen"], len(saved["steps"])) == (3, 2)
    assert round(beats.due, 9) == round(100.015 + wait_s, 9)
    _steps(recorder, clock, 1, optimizer)  # a new step, 5 ms later: not due yet
    beats.beat()
    assert len(puts.texts) == 1
    clock.advance(wait_s * 1e3 - 6.0)  # a millisecond before it is due
    beats.beat()
    assert len(puts.texts) == 1
    clock.advance(2.0)  # a millisecond after
    beats.beat()
    assert len(puts.texts) == 2 and len(json.loads(puts.texts[1])["steps"]) == 3
    clock.advance(10_000.0)  # long past due, but no step since
    beats.beat()
    assert len(puts.texts) == 2
    window = recorder.window  # as many steps, but the first changed (the timed steps slid)
    window.records[0] = replace(window.records[0])
    beats.beat()
    assert len(puts.texts) == 3


def test_nothing_is_saved_once_the_window_is_written_or_the_writer_failed(
    tmp_path: Path, unthreaded: Callable[[float], None]
) -> None:
    unthreaded(0.001)
    clock = FakeClock()
    recorder = _recorder(tmp_path, clock, steps=2)
    beats, puts, _ = _progress(tmp_path, recorder, clock)
    optimizer = _optimizer()
    _steps(recorder, clock, 2, optimizer)
    puts.failed = True  # a full disk
    beats.beat()
    assert puts.texts == []
    puts.failed = False
    _steps(recorder, clock, 1, optimizer)  # the window's last step: it is written
    assert recorder.window_done and Path(recorder.config.result_file).is_file()
    beats.beat()
    assert puts.texts == []


@pytest.mark.usefixtures("unthreaded")
def test_busy_marks_the_heartbeat_busy_and_beats_after(tmp_path: Path) -> None:
    clock = FakeClock()
    beats, _, beat = _progress(tmp_path, _recorder(tmp_path, clock), clock)
    with beats.busy():
        assert read_beat(beat) == (0, beats.heartbeat.pid, 1)
    assert read_beat(beat) == (1, beats.heartbeat.pid, 0)


# ---- the writer's thread ----


def _until(done: Callable[[], bool]) -> None:
    """Wait for the writer's thread (a generous bound: a hang fails, no speed is judged)."""
    deadline = time.monotonic() + 30.0
    while not done():
        assert time.monotonic() < deadline, "the writer's thread did not write"
        time.sleep(0.001)


def _thread_started_since(before: set[threading.Thread]) -> threading.Thread:
    [thread] = [t for t in set(threading.enumerate()) - before if t.name == "trainadvisor-progress"]
    return thread


Ended = list[tuple[progress._Writer, threading.Thread, Path]]


@pytest.fixture
def ended() -> Iterator[Ended]:
    """The writers a test starts (writer, thread, the folder it writes in), each thread ended
    after the test: its folder removed, its next write fails and it returns."""
    started: Ended = []
    yield started
    for writer, thread, folder in started:
        if thread.is_alive():
            shutil.rmtree(folder)
            writer.put("{}")
            thread.join(30.0)
            assert not thread.is_alive()


def test_the_writer_leaves_the_latest_text_whole_and_no_partial_file(tmp_path: Path, ended: Ended) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "baseline.progress.json"
    before = set(threading.enumerate())
    writer = progress._Writer(path)
    ended.append((writer, _thread_started_since(before), folder))
    writer.put('{"first": 1}')
    writer.put('{"second": 2}')
    _until(lambda: path.is_file() and path.read_text() == '{"second": 2}')
    assert not writer.failed and sorted(p.name for p in folder.iterdir()) == ["baseline.progress.json"]


def test_a_writer_that_cannot_write_says_so_once_and_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = set(threading.enumerate())
    writer = progress._Writer(tmp_path / "gone" / "baseline.progress.json")
    thread = _thread_started_since(before)
    writer.put("{}")
    thread.join(30.0)
    assert not thread.is_alive() and writer.failed
    assert capsys.readouterr().err == (
        "[trainadvisor] could not save the steps so far: FileNotFoundError(2, 'No such file or directory')\n"
    )


def test_a_script_that_ends_without_a_word_leaves_its_steps_for_last_known(
    tmp_path: Path, ended: Ended
) -> None:
    """The child's wiring (`training.child`): the recorder beats Progress at each batch and step;
    the steps saved are what trainadvisor's process reads back when no result was written."""
    folder = tmp_path / "run"
    folder.mkdir()
    clock = FakeClock()
    recorder = _recorder(folder, clock)
    beat = tmp_path / "run.heartbeat"
    result = Path(recorder.config.result_file)
    before = set(threading.enumerate())
    beats = Progress(recorder, Heartbeat(str(beat)), progress_file(result), clock.clock().perf_s)
    ended.append((beats.writer, _thread_started_since(before), folder))
    recorder.heartbeat = beats
    _steps(recorder, clock, 4, _optimizer())
    saved = progress_file(result)
    _until(saved.is_file)
    raw = last_known(None, result, beat, "t")
    assert raw is not None and raw.status == "script_failed"
    # saved once, at step 3's batch (the first beat with a timed step in): the next save is due
    # SAVE_MIN_S later at the soonest, past the last step (15 ms on)
    assert [step.index for step in raw.steps] == [1]
    assert raw.steps_seen == 4  # the heartbeat's count, past the 2 steps seen when it was saved
    assert raw.error == "the script's process ended after 4 steps without recording how"
