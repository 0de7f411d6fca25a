"""The parent's side of runs kept waiting (`measure.kept_alive`), with no child started: how a
child's exit code is told in words, and a run started ahead of its settings (`Prestarted`), built
without its constructor (which launches the child) around a stand-in for the launched child: whether
it is still waiting, the settings it is handed in its gate file, and that it is stopped once and
only once, whatever ends the wait."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from trainadvisor.measure import kept_alive
from trainadvisor.measure.config import WindowSize, at_gate_file, released_file, standing_file
from trainadvisor.measure.kept_alive import Prestarted, _FirstStep, _how_it_ended, _LastWord
from trainadvisor.measure.spec import RunSpec
from trainadvisor.measure.watchdog import Heartbeat
from trainadvisor.records import Overrides, RawRun

WORKERS = Overrides(loaders={"train.py:12": {"num_workers": 4}})


class FakeChild:
    """The launched child's process: poll() answers `code` (None: still running)."""

    def __init__(self, code: int | None = None) -> None:
        self.code = code
        self.polls = 0
        self.pid = 4242

    def poll(self) -> int | None:
        self.polls += 1
        return self.code


class FakeSampler:
    def __init__(self) -> None:
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


def _launched(tmp_path: Path, code: int | None = None) -> Any:
    return types.SimpleNamespace(
        proc=FakeChild(code),
        files=types.SimpleNamespace(result=tmp_path / "after.result.json"),
        watchdog="dog",
        sampler=FakeSampler(),
    )


def _prestarted(tmp_path: Path, launched: Any) -> Prestarted:
    """A run started ahead with the settings of the baseline's spec (label "after"), waiting at its gate."""
    ahead = Prestarted.__new__(Prestarted)  # the constructor would launch the child
    ahead.spec = RunSpec(
        "after", Path("train.py"), ["--lr", "0.1"], tmp_path, 5, 20, gate_file=tmp_path / "gate.json"
    )
    ahead.launched, ahead.exiting, ahead.released_at = launched, None, None
    ahead.proc, ahead._queued_ns = tmp_path / "proc", None  # no schedstat: another OS
    return ahead


def _recorded(monkeypatch: pytest.MonkeyPatch, killed: str | None = None, fail: bool = False) -> list[Any]:
    """runner's wait_for, stop and collect replaced: each call recorded in order."""
    calls: list[Any] = []

    def wait_for(proc: Any, spec: RunSpec, files: list[Path], watchdog: Any, done: Any) -> str | None:
        assert isinstance(done, _LastWord) and done.path == files[0]
        calls.append(("wait_for", proc, spec, files, watchdog))
        if fail:
            raise KeyboardInterrupt
        return killed

    def collect(launched: Any, spec: RunSpec, why: str | None) -> RawRun:
        calls.append(("collect", launched, spec, why))
        return RawRun(spec.label, "window_complete", 0, None, spec.warmup, spec.steps, 2, 30, [], [], None)

    monkeypatch.setattr(kept_alive, "wait_for", wait_for)
    monkeypatch.setattr(kept_alive.priority, "current", lambda: 3)
    monkeypatch.setattr(
        kept_alive.priority, "restore", lambda nice, pid: calls.append(("restore", pid, nice)) or 0
    )
    monkeypatch.setattr(kept_alive, "stop", lambda launched: calls.append(("stop", launched)))
    monkeypatch.setattr(kept_alive, "collect", collect)
    return calls


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (0, "ended (exit code 0)"),
        (1, "ended (exit code 1)"),
        (3, "ended (exit code 3)"),
        (-9, "was killed by signal SIGKILL"),
        (-15, "was killed by signal SIGTERM"),
        (-11, "was killed by signal SIGSEGV"),
        (-40, "was killed by signal 40"),  # a real-time signal: Python has no name for it
    ],
)
def test_a_childs_end_is_told_by_its_exit_code_or_the_signal_that_killed_it(code: int, words: str) -> None:
    assert _how_it_ended(code) == words


def test_a_run_started_ahead_waits_while_its_child_runs(tmp_path: Path) -> None:
    assert _prestarted(tmp_path, _launched(tmp_path)).waiting()
    assert not _prestarted(tmp_path, _launched(tmp_path, code=0)).waiting()  # stepped aside: memory ran short
    assert not _prestarted(tmp_path, _launched(tmp_path, code=-9)).waiting()
    assert not _prestarted(tmp_path, None).waiting()  # handed its settings, or cancelled


class FakeTime:
    """kept_alive's clock: each sleep moves it on by what was asked (counted in whole
    milliseconds, so that 500 sleeps of 20 ms are 10 s exactly)."""

    def __init__(self) -> None:
        self.now_ms = 100_000

    @property
    def now_s(self) -> float:
        return self.now_ms / 1e3

    def monotonic(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_ms += round(seconds * 1e3)


def test_the_trials_wait_for_a_run_started_ahead_to_import_torch_then_go_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its standing file says its imports are done: no wait. Not there: the wait goes on while
    the child runs, up to `most_s`; a child that ended is not waited for."""
    clock = FakeTime()
    monkeypatch.setattr(kept_alive, "time", clock)
    launched = _launched(tmp_path)
    ahead = _prestarted(tmp_path, launched)
    ahead.imported(10.0)
    assert clock.now_ms == 110_000 and launched.proc.polls == 501  # every 20 ms, for 10 s
    standing_file(tmp_path / "gate.json").touch()
    ahead.imported(10.0)
    assert clock.now_ms == 110_000 and launched.proc.polls == 502  # there: no wait
    gone = _launched(tmp_path, code=75)  # stepped aside: memory ran short
    _prestarted(tmp_path, gone).imported(10.0)
    assert clock.now_ms == 110_000 and gone.proc.polls == 1
    _prestarted(tmp_path, None).imported(10.0)  # handed its settings, or cancelled
    assert clock.now_ms == 110_000


def test_a_run_started_ahead_is_handed_the_settings_and_window_of_the_spec_it_is_run_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _recorded(monkeypatch, killed="no step for 30 s: stuck")
    launched = _launched(tmp_path)
    ahead = _prestarted(tmp_path, launched)
    size = WindowSize(min_time_s=0.5, max_steps=40)
    # the settings confirmed: the label, arguments and folder stay the run's own
    asked = RunSpec(
        "confirm", Path("other.py"), [], tmp_path / "x", 3, 12, overrides=WORKERS, size=size, seed=7
    )
    raw = ahead.run(asked, profile_steps=4)
    assert ahead.launched is None
    assert json.loads((tmp_path / "gate.json").read_text()) == {
        "index": 0,
        "label": "after",
        "overrides": {
            "loaders": {"train.py:12": {"num_workers": 4}},
            "non_blocking_h2d": False,
            "runtime": {},
        },
        "warmup": 3,
        "steps": 12,
        "profile_steps": 4,
        "stop": False,
        "size": {"min_time_s": 0.5, "settle": None, "max_steps": 40, "race_below": None, "race_warmup": True},
    }
    # its priority raised first: what is left of its set-up is the confirmation's to wait for
    assert calls[0] == ("restore", 4242, 3)
    calls.pop(0)
    assert [c[0] for c in calls] == ["wait_for", "stop", "collect"]
    _, proc, waited, files, watchdog = calls[0]
    assert (proc, files, watchdog) == (launched.proc, [tmp_path / "after.result.json"], "dog")
    assert (waited.label, waited.script, waited.args, waited.out_dir, waited.seed) == (
        "after", Path("train.py"), ["--lr", "0.1"], tmp_path, 0,
    )  # fmt: skip
    assert (waited.overrides, waited.warmup, waited.steps, waited.size) == (WORKERS, 3, 12, size)
    assert calls[1] == ("stop", launched)
    assert calls[2] == ("collect", launched, waited, "no step for 30 s: stuck")
    assert (raw.label, raw.warmup_steps, raw.window_steps) == ("after", 3, 12)


def test_a_run_started_ahead_is_stopped_when_its_wait_is_interrupted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _recorded(monkeypatch, fail=True)
    launched = _launched(tmp_path)
    ahead = _prestarted(tmp_path, launched)
    with pytest.raises(KeyboardInterrupt):
        ahead.run(RunSpec("after", Path("train.py"), [], tmp_path, 3, 12), profile_steps=4)
    assert [c[0] for c in calls] == ["restore", "wait_for", "stop"] and calls[2] == ("stop", launched)
    assert ahead.launched is None
    ahead.cancel()  # nothing left to stop
    assert len(calls) == 3


def test_cancelling_a_run_started_ahead_stops_it_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _recorded(monkeypatch)
    launched = _launched(tmp_path)
    ahead = _prestarted(tmp_path, launched)
    ahead.cancel()
    ahead.cancel()
    assert calls == [("stop", launched)]
    assert not ahead.waiting()
    assert not (tmp_path / "gate.json").exists()  # never handed settings


def test_a_measured_run_started_ahead_ends_by_itself_while_the_report_is_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its last word written, it is collected at once (its sampling stopped) and left to exit;
    `cancel` then waits for its exit and stops what is left of it, once."""
    calls = _recorded(monkeypatch)
    launched = _launched(tmp_path)  # still running when the wait returns: exiting
    ahead = _prestarted(tmp_path, launched)
    ahead.run(RunSpec("after", Path("train.py"), [], tmp_path, 3, 12), profile_steps=4)
    assert [c[0] for c in calls] == ["restore", "wait_for", "collect"] and launched.sampler.stopped == 1
    assert ahead.exiting is launched and ahead.launched is None
    polls: list[int] = []

    def wait(seconds: float) -> bool:
        polls.append(launched.proc.polls)
        launched.proc.code = 0 if len(polls) == 3 else None  # it ends at the third wait
        return False

    monkeypatch.setattr(kept_alive.interrupts, "wait", wait)
    ahead.cancel()
    ahead.cancel()
    assert len(polls) == 3 and calls[3:] == [("stop", launched)] and ahead.exiting is None


def test_a_childs_last_word_is_its_result_with_its_exit_read_once_each_time_it_is_replaced(
    tmp_path: Path,
) -> None:
    result = tmp_path / "after.result.json"
    last_word = _LastWord(result)
    assert not last_word()  # nothing written yet
    result.write_text(json.dumps({"status": "window_complete", "exit_code": None}))
    assert not last_word()  # the window's measurements, written as it closed: the script goes on
    result.write_text("{not json")  # never seen whole (each write is a rename): read as not yet
    assert not last_word()
    replaced = tmp_path / "new.json"
    replaced.write_text(json.dumps({"status": "window_complete", "exit_code": 0}))
    replaced.rename(result)
    assert last_word()


def test_a_run_started_ahead_is_let_into_the_script_once_and_counts_its_set_up_from_then(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock = FakeTime()
    monkeypatch.setattr(kept_alive, "time", clock)
    ahead = _prestarted(tmp_path, _launched(tmp_path))
    assert ahead.setup_left(9.5) == (9.5, False)  # not let in yet: all of its set-up is left
    ahead.release()
    assert released_file(tmp_path / "gate.json").exists() and ahead.released_at == 100.0
    clock.sleep(3.0)
    ahead.release()  # the first step is the one that lets it in
    assert ahead.released_at == 100.0 and ahead.setup_left(9.5) == (6.5, False)  # counted in wall time
    at_gate_file(tmp_path / "gate.json").touch()
    assert ahead.setup_left(9.5) == (0.0, False)  # it waits for its settings: its set-up is done


def _queued(tmp_path: Path, pid: int, waited_ns: int) -> None:
    """Process `pid`'s main thread as /proc/<pid>/task/<pid>/schedstat gives it: on a CPU, waiting
    for one, time slices (ns, ns, count)."""
    folder = tmp_path / "proc" / str(pid) / "task" / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "schedstat").write_text(f"3800000000 {waited_ns} 912\n")


@pytest.mark.parametrize(
    ("waited_s", "left_s", "starved"),
    [
        (0.5, 6.0, False),  # it ran (or slept) 3.5 s of the 4: that much of its set-up is done
        (3.5, 9.0, True),  # it waited for a CPU 3.5 s of the 4: in the idle class beside busy cores
        (2.0, 7.5, True),  # half of the time, from which it is starved
    ],
)
def test_a_run_started_ahead_counts_its_set_up_in_the_time_it_did_not_wait_for_a_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, waited_s: float, left_s: float, starved: bool
) -> None:
    clock = FakeTime()
    monkeypatch.setattr(kept_alive, "time", clock)
    ahead = _prestarted(tmp_path, _launched(tmp_path))
    _queued(tmp_path, 4242, 1_000_000_000)
    ahead.release()
    clock.sleep(4.0)
    _queued(tmp_path, 4242, 1_000_000_000 + int(waited_s * 1e9))
    assert ahead.setup_left(9.5) == (pytest.approx(left_s), starved)


def test_the_baseline_lets_the_run_started_ahead_in_at_its_first_step(tmp_path: Path) -> None:
    """Polled while the baseline window is awaited, the child's heartbeat: the call comes at the
    first poll that counts a step (a batch alone is not one), and once only."""
    heartbeat = Heartbeat(str(tmp_path / "baseline.heartbeat"))
    let_in: list[int] = []
    first_step = _FirstStep(tmp_path / "baseline.heartbeat", lambda: let_in.append(heartbeat.steps))
    first_step()
    heartbeat.beat()  # a batch
    first_step()
    assert let_in == []
    heartbeat.steps = 1
    heartbeat.beat()
    first_step()
    heartbeat.steps = 2
    heartbeat.beat()
    first_step()
    assert let_in == [1]
    _FirstStep(tmp_path / "baseline.heartbeat", None)()  # nothing to call: nothing read
    _FirstStep(tmp_path / "no.heartbeat", lambda: let_in.append(-1))()  # none written yet
    assert let_in == [1]
