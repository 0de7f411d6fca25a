"""Reads Kineto (torch.profiler) Chrome traces: the per-step device-side facts that host timers
cannot see, such as host-to-device copy time and whether the copies came from pinned memory."""

from __future__ import annotations

import bisect
import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainadvisor.errors import UsageError

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
# CUDA: "Memcpy HtoD (Pageable -> Device)"; ROCm: "CopyHostToDevice"; 2021 schema: "Memcpy HtoD".
_H2D = re.compile(r"HtoD|HostToDevice")
_MEMCPY_CATEGORIES = {"gpu_memcpy", "Memcpy"}


@dataclass
class TraceStep:
    number: int
    start_us: float
    dur_us: float
    h2d_copy_us: float = 0.0
    h2d_pageable: int = 0
    h2d_pinned: int = 0
    h2d_unknown: int = 0  # ROCm names copies "Host -> Device", without pinned or pageable
    h2d_bytes: int = 0


@dataclass
class TraceSummary:
    path: str
    events: int
    steps: list[TraceStep] = field(default_factory=list)


def load_events(path: Path) -> list[dict[str, Any]]:
    """The trace's events; a clear UsageError for anything that is not a readable trace."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        document = json.loads(raw)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such trace file") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise UsageError(f"{path}: cannot read the trace ({exc}); is the file complete?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}); is the file truncated?") from None
    if isinstance(document, dict):
        document = document.get("traceEvents")
    if not isinstance(document, list):
        raise UsageError(
            f"{path}: a JSON file but not a profiler trace (no 'traceEvents' list); "
            "write traces with torch.profiler's export_chrome_trace or tensorboard_trace_handler"
        )
    return [e for e in document if isinstance(e, dict)]


def summarize_trace(path: Path) -> TraceSummary:
    events = load_events(path)
    steps = sorted(
        (
            TraceStep(int(m.group(1)), float(e["ts"]), float(e.get("dur", 0.0)))
            for e in events
            if e.get("ph") == "X"
            and e.get("cat") != "gpu_user_annotation"  # the step's mirror on the GPU timeline
            and (m := _STEP.match(str(e.get("name", ""))))
        ),
        key=lambda s: s.start_us,
    )
    starts = [s.start_us for s in steps]
    for event in events:
        if event.get("ph") != "X" or event.get("cat") not in _MEMCPY_CATEGORIES:
            continue
        if not _H2D.search(str(event.get("name", ""))):
            continue
        step = _step_at(steps, starts, float(event["ts"]))
        if step is None:
            continue
        step.h2d_copy_us += float(event.get("dur", 0.0))
        step.h2d_bytes += int((event.get("args") or {}).get("bytes", 0) or 0)
        name = str(event.get("name"))
        if "Pageable" in name:
            step.h2d_pageable += 1
        elif "Pinned" in name:
            step.h2d_pinned += 1
        else:
            step.h2d_unknown += 1
    return TraceSummary(path=str(path), events=len(events), steps=steps)


def _step_at(steps: list[TraceStep], starts: list[float], ts_us: float) -> TraceStep | None:
    """The step whose span [start, next step's start) holds `ts_us`: device work launched
    in a step may run past the end of the step's host-side span."""
    i = bisect.bisect_right(starts, ts_us) - 1
    if i < 0:
        return None
    if i == len(steps) - 1 and ts_us > steps[i].start_us + steps[i].dur_us * 2:
        return None
    return steps[i]
