"""In the script's process, `Progress` is the heartbeat the recorder beats at each step and
batch: it keeps the step count in the heartbeat file (exact: a store into shared memory) and
saves the baseline window's steps so far beside the result (`measure.journal.progress_file`; at
most every SAVE_MIN_S, and rarely enough that taking them down costs the loop at most
1/SAVE_BUDGET of its time), so that a script that ends without a word (at `os._exit`, or
SIGKILLed) leaves what it measured (`measure.journal.last_known` reads it back)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainadvisor import _serial
from trainadvisor.measure.watchdog import Heartbeat
from trainadvisor.records import RawRun

if TYPE_CHECKING:
    from trainadvisor.training.hooks import Recorder

SAVE_MIN_S = 0.1
SAVE_BUDGET = 400  # a save at most every 400 times the last one's cost: 0.25% of the loop's time


class Progress:
    """The child's heartbeat (`measure.watchdog.Heartbeat`), which also keeps the step count
    and the baseline window's steps so far. The loop's thread only takes the window's state
    down as text; a thread of its own writes it (the file system's latency stays off the loop)."""

    def __init__(
        self,
        recorder: Recorder,
        heartbeat: Heartbeat,
        path: Path,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.recorder, self.heartbeat, self.clock = recorder, heartbeat, clock
        self.writer = _Writer(path)
        self.due = 0.0
        self.saved: tuple[int, int] | None = None  # the records saved: their count and the first's id

    def beat(self) -> None:
        self.heartbeat.steps = self.recorder.steps_seen
        self.heartbeat.beat()
        now = self.clock()
        if now >= self.due and not self.recorder.window_done:
            self._save(now)

    def busy(self) -> contextlib.AbstractContextManager[None]:
        return self.heartbeat.busy()

    def _save(self, now: float) -> None:
        records = self.recorder.window.records
        if not records or self.writer.failed:
            return
        saving = (len(records), id(records[0]))  # the first changes where the timed steps slid
        if saving == self.saved:
            return
        cpu_s = time.thread_time()  # the loop's own cost: a machine that is busy does not count
        text = json.dumps(window_so_far(self.recorder))
        self.due = now + max(SAVE_MIN_S, SAVE_BUDGET * (time.thread_time() - cpu_s))
        self.writer.put(text)
        self.saved = saving


class _Writer:
    """Writes the latest text it was given, whole (temporary file and rename), on a thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed = False
        self._text: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        threading.Thread(target=self._loop, name="trainadvisor-progress", daemon=True).start()

    def put(self, text: str) -> None:
        with self._lock:
            self._text = text
        self._wake.set()

    def _loop(self) -> None:
        partial = self.path.with_name(f".{self.path.name}.tmp")
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                text, self._text = self._text, None
            if text is None:
                continue
            try:
                partial.write_text(text)
                os.replace(partial, self.path)
            except OSError as exc:  # a full disk: training goes on, without this
                self.failed = True
                print(f"[trainadvisor] could not save the steps so far: {exc!r}", file=sys.stderr)
                return


def window_so_far(recorder: Recorder) -> dict[str, Any]:
    """The baseline window as far as it got, as `RawRun`'s plain data, without what would need
    the device (losses, GPU times, memory): cheap enough to save while it runs. Its status and
    error are for trainadvisor's process to set (`say_how_it_ended`)."""
    window = recorder.window
    records = list(window.records)
    shape = replace(window.shape, block_ms=list(window.shape.block_ms)) if window.phase != "warmup" else None
    if shape is not None and window.phase == "timed":  # as `Window.cut_short` would leave it
        shape.timed_s, shape.timed_end = window.last_mark - window.t0, "script ended"
    run = RawRun(
        label=recorder.config.label,
        status="script_failed",
        exit_code=None,
        error=None,
        warmup_steps=shape.warmup_steps if shape is not None else window.steps_done,
        window_steps=sum(not record.profiled for record in records),
        profile_steps=window.plan.profile_steps,
        steps_seen=recorder.steps_seen,
        steps=[],
        loaders=list(recorder.loaders),
        device=None,
        window_start_unix_s=window.start_unix_s,
        step_source=recorder.step_source,
        frameworks=list(recorder.framework_calls),
        shape=shape,
        ended_unix_s=time.time(),
    )
    plain: dict[str, Any] = _serial.to_plain(run)
    plain["steps"] = [dict(vars(record)) for record in records]  # far faster than to_plain
    return plain
