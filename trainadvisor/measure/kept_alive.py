"""The parent's side of trial windows in one process (`training.session` is the child's): the
baseline run is kept alive after its window, and each trial is a window of it measured with
another setting. Commands and results are small JSON files in the run's session folder, each
written whole (temporary file and rename)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from trainadvisor import _serial
from trainadvisor.measure import interrupts, priority
from trainadvisor.measure.config import (
    WindowCommand,
    WindowSize,
    at_gate_file,
    command_file,
    released_file,
    standing_file,
    window_file,
)
from trainadvisor.measure.proctable import PROC
from trainadvisor.measure.results import load_result
from trainadvisor.measure.runner import (
    STOP_GRACE_S,
    Launched,
    RunSpec,
    attach_samples,
    collect,
    launch,
    stop,
    wait_for,
)
from trainadvisor.measure.sampling import queued_ns_of
from trainadvisor.measure.watchdog import read_steps
from trainadvisor.records import Overrides, RawRun
from trainadvisor.units import signal_name

POLL_S = 0.02
# From this share of the time since its release spent waiting for a CPU, a run started ahead is
# starved: in the idle class beside processes that kept both cores busy, its set-up got 0.1 CPU-s
# in the 48 s of the baseline's window and the trials, and was done only once its settings came.
STARVED_SHARE = 0.5


class LiveRun:
    """One child measured window after window. `baseline()` first; then `window(...)` for each
    trial until it returns None (the script ended or failed: `ended` says how); `close()`."""

    def __init__(self, spec: RunSpec) -> None:
        assert spec.session_dir is not None
        self.spec = spec
        self.folder = spec.session_dir
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in self.folder.glob("*.json"):
            stale.unlink()
        self.index = 0
        self.ended: str | None = None  # why no more windows can be measured
        self.launched: Launched | None = launch(spec)
        self.final: RawRun | None = None  # what the child recorded last, once it has ended
        self._stop_sent: float | None = None  # time.monotonic() when the child was told to stop
        self._lowered_from: int | None = None  # the nice value to restore it to, once lowered

    def baseline(self, first_step: Callable[[], None] | None = None) -> RawRun:
        """The baseline window, once the child has written it (the child then waits for its
        first command); or the whole run, when it ended or failed before that. `first_step` is
        called once the child has taken its first step (its set-up done), if it does."""
        launched = self.launched
        assert launched is not None
        result = launched.files.result
        if not self._await(result, self.spec.timeout_s, "the baseline window", first_step):
            return self._ended_run()
        raw = load_result(result, self.spec)
        raw.wall_s = time.monotonic() - launched.started
        raw.log_file, raw.overrides = launched.files.log_rel, self.spec.overrides
        attach_samples(raw, launched.sampler, until_unix_s=raw.ended_unix_s or time.time())
        if raw.trace_file and launched.files.trace_rel:
            raw.trace_file = launched.files.trace_rel
        return raw

    def window(
        self, label: str, overrides: Overrides, warmup: int, steps: int, size: WindowSize, timeout_s: float
    ) -> RawRun | None:
        """One trial window: at least `warmup` steps with the setting to settle, then at least
        `steps` timed (`size`: how long beyond that). A window the script's end cut short comes
        back as far as it got (status `script_ended` or `script_failed`), and is the last."""
        if self.ended is not None or self.launched is None:
            return None
        command = WindowCommand(self.index, label, overrides, warmup, steps, size=size)
        _serial.save_json(command, command_file(self.folder, self.index))
        self.launched.watchdog.restart()  # it waited for this command, taking no step
        path = window_file(self.folder, self.index)
        self.index += 1
        sent = time.time()
        if not self._await(path, timeout_s, f"trial window {label}"):
            return None
        raw = load_result(path, self.spec)
        raw.wall_s = time.time() - sent
        attach_samples(
            raw, self.launched.sampler, since_unix_s=raw.window_start_unix_s or sent, until_unix_s=time.time()
        )
        if raw.status in ("script_ended", "script_failed"):
            how = "ended" if raw.status == "script_ended" else f"failed ({raw.error})"
            self.ended = f"the script {how} during trial window {label}, after {raw.steps_seen} steps"
            self._finish(None)
        return raw

    def _await(
        self, path: Path, timeout_s: float | None, what: str, first_step: Callable[[], None] | None = None
    ) -> bool:
        """Wait for `path`; False when the child ended first or the wait timed out. `first_step`
        is called as soon as the child's heartbeat counts a step."""
        assert self.launched is not None
        started = time.monotonic()
        stepped = _FirstStep(self.launched.files.heartbeat, first_step)
        while not path.exists():
            stepped()
            code = self.launched.proc.poll()
            if code is not None:
                self.ended = f"the script {_how_it_ended(code)} before {what} was measured"
                self._finish(None)
                return False
            stuck = self.launched.watchdog.stalled()
            if stuck is not None:
                self.ended = stuck
                self._finish(stuck)
                return False
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                self.ended = f"{what} took longer than {timeout_s:.0f} s"
                self._finish(self.ended)
                return False
            interrupts.pause(POLL_S)  # where a signal to trainadvisor is acted on
        return True

    def _ended_run(self) -> RawRun:
        assert self.final is not None
        return self.final

    def _finish(self, killed: str | None) -> None:
        launched, self.launched = self.launched, None
        if launched is None:
            return
        stop(launched)
        self.final = collect(launched, self.spec, killed)

    def stop_soon(self) -> None:
        """Tell the child to stop, without waiting for it to end (`close` waits): its exit (its
        DataLoader workers joined, the interpreter torn down) overlaps what runs next, lowered
        to the idle class until `close` where its priority can be restored. A torch process's
        teardown takes 1.0-1.2 CPU-s (the interpreter's last garbage collections, over some
        300,000 objects), which trainadvisor's measure of other processes does not count: at
        normal priority it slowed the confirmation run's warm-up beside it (settled after
        98-215 steps in three runs of the slow-start benchmark's script, 69-85 in four lowered)."""
        if self.launched is None or self._stop_sent is not None:
            return
        _serial.save_json(WindowCommand(self.index, stop=True), command_file(self.folder, self.index))
        self._stop_sent = time.monotonic()
        if priority.restorable():
            self._lowered_from = priority.current()
            priority.lower_threads(self.launched.proc.pid)

    def raise_back(self) -> None:
        """The child lowered by `stop_soon` raised back to this process's priority, once nothing
        is measured beside it: its exit then overlaps the report's making (beside a busy core,
        the report's making and the busy process would leave the idle class no core, and its
        exit would wait until `close`, after the report)."""
        launched, nice = self.launched, self._lowered_from
        if launched is not None and nice is not None:
            priority.restore(nice, launched.proc.pid)
        self._lowered_from = None

    def close(self) -> None:
        """Tell the child to stop (unless `stop_soon` did); give it the usual grace from then
        (none once trainadvisor is signalled to stop), then end its process group."""
        launched = self.launched
        if launched is None:
            return
        try:
            self.stop_soon()
            self.raise_back()  # its exit has the CPU it needs now
            deadline = (self._stop_sent or time.monotonic()) + STOP_GRACE_S
            while launched.proc.poll() is None and time.monotonic() < deadline:
                if interrupts.wait(POLL_S):
                    break
        finally:
            self._finish(None)


def _how_it_ended(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by signal {signal_name(-returncode)}"
    return f"ended (exit code {returncode})"


class Prestarted:
    """A fresh run started before its settings are known (`training.gate`): it imports, then
    waits before the script until `release()`; its set-up then overlaps what is measured next, at
    the lowest priority; `run(...)` hands it the settings and measures it as `runner.measure`
    would."""

    def __init__(self, spec: RunSpec) -> None:
        assert spec.gate_file is not None
        self.spec = spec
        gate = spec.gate_file
        for stale in (gate, standing_file(gate), released_file(gate), at_gate_file(gate)):
            stale.unlink(missing_ok=True)
        self.started_at = time.monotonic()
        self.released_at: float | None = None  # when it was let into the script
        self.proc = PROC  # where its threads' waits for a CPU are read
        self._queued_ns: int | None = None  # its main thread's, when it was let in
        self.launched: Launched | None = launch(spec)
        self.exiting: Launched | None = None  # measured, and ending by itself (`cancel` waits)

    def release(self) -> None:
        """Let it into the script: its set-up may run now."""
        assert self.spec.gate_file is not None
        if self.released_at is None:
            self.released_at = time.monotonic()
            if self.launched is not None:
                self._queued_ns = queued_ns_of(self.launched.proc.pid, self.proc)
            with contextlib.suppress(OSError):  # a full disk: the settings let it in later
                released_file(self.spec.gate_file).touch()

    def setup_left(self, setup_s: float) -> tuple[float, bool]:
        """About how long its set-up, `setup_s` where it runs as the baseline's did, has left
        (all of it where not let in yet; none once it waits at its gate, `config.at_gate_file`),
        and whether it is starved (STARVED_SHARE): counted from its release in the time its main
        thread did not wait for a CPU (in wall time where the kernel keeps no such count). A
        starved set-up goes on once its settings come, after the trials, not beside them."""
        assert self.spec.gate_file is not None
        if at_gate_file(self.spec.gate_file).exists():
            return 0.0, False
        if self.released_at is None or self.launched is None:
            return setup_s, False
        elapsed_s = time.monotonic() - self.released_at
        now_ns, then_ns = queued_ns_of(self.launched.proc.pid, self.proc), self._queued_ns
        waited_s = max(0.0, (now_ns - then_ns) / 1e9) if now_ns is not None and then_ns is not None else 0.0
        starved = elapsed_s > 0.0 and waited_s >= STARVED_SHARE * elapsed_s
        return max(0.0, setup_s - (elapsed_s - waited_s)), starved

    def imported(self, most_s: float) -> None:
        """Return once the run has imported what it runs with (`config.standing_file`), or has
        ended, or after `most_s`. Importing torch takes a core for seconds whatever its priority
        (torch's own compute beside it ran 3-5 times slower on 2 cores, at nice 0 or 19): a trial
        window measured meanwhile would measure that."""
        launched, gate = self.launched, self.spec.gate_file
        assert gate is not None
        until = time.monotonic() + most_s
        standing = standing_file(gate)
        while launched is not None and launched.proc.poll() is None and time.monotonic() < until:
            if standing.exists():
                return
            time.sleep(POLL_S)

    def waiting(self) -> bool:
        """Still there, waiting for its settings (it exits if memory ran short meanwhile)."""
        return self.launched is not None and self.launched.proc.poll() is None

    def run(self, spec: RunSpec, profile_steps: int) -> RawRun:
        """Hand the waiting run `spec`'s settings and window, then measure it."""
        launched, self.launched = self.launched, None
        assert launched is not None and self.spec.gate_file is not None
        spec = replace(
            self.spec, overrides=spec.overrides, warmup=spec.warmup, steps=spec.steps, size=spec.size
        )
        command = WindowCommand(
            0, spec.label, spec.overrides, spec.warmup, spec.steps, profile_steps, size=spec.size
        )
        # what is left of its set-up is the confirmation's to wait for now: at normal priority (in
        # the idle class it would crawl where every core is busy); its gate restores it too
        priority.restore(priority.current(), launched.proc.pid)
        _serial.save_json(command, self.spec.gate_file)
        result = launched.files.result
        try:
            killed = wait_for(launched.proc, spec, [result], launched.watchdog, done=_LastWord(result))
        except BaseException:
            stop(launched)
            raise
        if killed is None and launched.proc.poll() is None:  # its exit overlaps what comes next
            launched.sampler.stop()
            self.exiting = launched
        else:
            stop(launched)
        return collect(launched, spec, killed)

    def cancel(self) -> None:
        """End it and everything it started: at once where it was not needed after all; where
        it was measured, once it has exited by itself (the user's exit handlers run), at most
        STOP_GRACE_S from now."""
        launched, self.launched = self.launched, None
        if launched is not None:
            stop(launched)
        exiting, self.exiting = self.exiting, None
        if exiting is not None:
            deadline = time.monotonic() + STOP_GRACE_S
            while exiting.proc.poll() is None and time.monotonic() < deadline:
                if interrupts.wait(POLL_S):
                    break
            stop(exiting)


class _FirstStep:
    """Polled: calls `then` once, at the first poll where the child's heartbeat counts a step
    (its set-up done); nothing where `then` is None."""

    def __init__(self, heartbeat: Path, then: Callable[[], None] | None) -> None:
        self.heartbeat, self.then = heartbeat, then

    def __call__(self) -> None:
        if self.then is not None and (read_steps(self.heartbeat) or 0) > 0:
            then, self.then = self.then, None
            then()


class _LastWord:
    """Whether a child's result holds its exit too (its last write, `hooks.Recorder.write`):
    what it measured is all there, and what it does next is end. Read again only where the file
    was replaced (each write is whole: a new file renamed into place)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: tuple[int, int] | None = None

    def __call__(self) -> bool:
        try:
            stat = self.path.stat()
            if (stat.st_ino, stat.st_mtime_ns) == self.seen:
                return False
            self.seen = (stat.st_ino, stat.st_mtime_ns)
            return json.loads(self.path.read_text()).get("exit_code") is not None
        except (OSError, ValueError, AttributeError):
            return False
