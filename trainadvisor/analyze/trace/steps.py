"""Where a trace's training steps are, and how they were found.

`ProfilerStep#N` markers (a schedule with `prof.step()`) are the steps. Many traces have none
(a plain `with torch.profiler.profile():` block, `torch.autograd.profiler`, a schedule without
`prof.step()`, whose one `ProfilerStep#0` spans the whole loop): their iterations are found from
what the loop leaves in the trace, in this order of trust:
1. optimizer steps (`Optimizer.step#SGD.step`): an iteration ends with its optimizer step, as a
   step of `profile` does (the first optimizer's name: a GAN's two optimizers are one iteration
   when a DataLoader call separates iterations);
2. backward passes (`autograd::engine::evaluate_function: <root>`): the loss's backward root opens
   each pass, which ends the iteration;
3. the DataLoader's `__next__` cadence: an iteration starts when it asks for its batch;
4. a user annotation that repeats without overlapping (`record_function("train_step")`).
With an optimizer or backward, an iteration's boundary is moved to the next `__next__` call, so
its data wait and logging fall where `prof.step()` would put them. The first iteration carries
warm-up (cuDNN autotuning, allocator growth, lazy init) and is set apart when others follow."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from trainadvisor.analyze.read.columns import ANNOTATION, HOST, HOST_KINDS, KERNEL, Table

STEP_MARKER = re.compile(r"^ProfilerStep#(\d+)$")
OPTIMIZER_PREFIX = "Optimizer.step#"
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
LOADER_PREFIX = "enumerate(DataLoader)#"
# Annotations that are not iterations: Kineto's and torch.compile's own, and DataLoader calls.
_NOT_ITERATIONS = re.compile(r"^(?:ProfilerStep#|enumerate\(DataLoader\)|## |Optimizer\.|cuda::|\[memory\])")


def is_loader_call(name: str) -> bool:
    return name.startswith(LOADER_PREFIX) and name.endswith(".__next__")


@dataclass
class Steps:
    all_spans: list[tuple[int, float, float]]  # (number, host start, host end), the warm-up's first
    marked: bool  # ProfilerStep#N markers are the steps
    method: str  # how the steps were found, for the report
    warmup: tuple[float, float] | None = None  # the first iteration, set apart

    @property
    def spans(self) -> list[tuple[int, float, float]]:
        """The steps: every iteration but the warm-up."""
        return self.all_spans[1:] if self.warmup is not None else self.all_spans


def find_steps(t: Table, last_step: int | None = None) -> Steps:
    """The trace's steps: its ProfilerStep#N markers, else the iterations its events show.
    `last_step`: the last marker the run recorded whole (a profiled run's own count, where the
    script ended inside its traced steps: the marker after it holds only the script's end)."""
    host = t.rows(*HOST_KINDS)
    if not len(host):
        return Steps([], False, "no host events: the device's work is one window")
    markers = _markers(t, host, t.name[host])
    if last_step is None:
        return _steps_of(t, host, markers)
    kept = [m for m in markers if m[0] <= last_step]
    cut = [m for m in markers if m[0] > last_step]
    if not kept or not cut:
        return _steps_of(t, host, markers)
    found = _steps_of(t, host, kept)
    shown = ", ".join(f"ProfilerStep#{n}" for n, _, _ in cut)
    return replace(found, method=f"{found.method} ({shown} left out: the script ended inside it)")


def _steps_of(t: Table, host: np.ndarray, markers: list[tuple[int, float, float]]) -> Steps:
    # A marker of no length (Kineto writes some: a step ended as it began, or a `dur` of `inf`
    # read as none) holds no work and would divide by zero: it is skipped, and the report says so.
    empty = [number for number, start, end in markers if end <= start]
    found = _from_markers(t, host, [m for m in markers if m[2] > m[1]])
    if not empty:
        return found
    shown = ", ".join(f"ProfilerStep#{n}" for n in empty[:3]) + (", ..." if len(empty) > 3 else "")
    plural = "s" if len(empty) > 1 else ""
    return replace(found, method=f"{found.method} ({len(empty)} zero-length marker{plural} skipped: {shown})")


def _from_markers(t: Table, host: np.ndarray, markers: list[tuple[int, float, float]]) -> Steps:
    first_ts, last_end = float(t.ts[host].min()), float(t.end[host].max())
    if last_end <= first_ts:
        return Steps([], False, "the host events span no time: no steps")
    if len(markers) >= 2:
        return Steps(markers, True, f"{len(markers)} ProfilerStep#N markers")
    inside = (markers[0][1], markers[0][2]) if markers else (first_ts, last_end)
    inferred = _iterations(t, host, inside)
    if inferred is not None:
        spans, how = inferred
        if markers:
            how = f"one ProfilerStep#{markers[0][0]} marker holds {len(spans)} iterations, found from {how}"
        if len(spans) >= 2:
            numbered = [(i + 1, s, e) for i, (s, e) in enumerate(spans)]
            method = f"{how}: {len(spans)} iterations, the first (warm-up) set apart"
            return Steps(numbered, False, method, spans[0])
    if markers:
        return Steps(markers, True, f"1 ProfilerStep#{markers[0][0]} marker")
    return Steps([(0, first_ts, last_end)], False, "nothing marks an iteration: the trace is one window")


def _markers(t: Table, host: np.ndarray, names: np.ndarray) -> list[tuple[int, float, float]]:
    numbers = {i: int(m.group(1)) for i, n in enumerate(t.names) if (m := STEP_MARKER.match(n))}
    if not numbers:
        return []
    rows = host[np.isin(names, list(numbers))]
    spans = {(numbers[int(t.name[r])], float(t.ts[r]), float(t.end[r])) for r in rows.tolist()}
    return sorted(spans, key=lambda s: (s[1], s[0]))


def _iterations(
    t: Table, host: np.ndarray, inside: tuple[float, float]
) -> tuple[list[tuple[float, float]], str] | None:
    """Iteration spans inside [start, end] from the strongest anchor the trace has."""
    start, end = inside
    window = host[(t.ts[host] >= start) & (t.end[host] <= end)]

    def rows_named(predicate: Any) -> np.ndarray:
        rows = window[t.matching(window, predicate)]
        return rows[np.argsort(t.ts[rows], kind="stable")]

    loader_starts = np.unique(t.ts[rows_named(is_loader_call)])
    optimizer = rows_named(lambda n: n.startswith(OPTIMIZER_PREFIX))
    if len(optimizer):
        first_name = t.name[optimizer[0]]
        ends = np.sort(t.end[optimizer[t.name[optimizer] == first_name]])
        label = f"optimizer steps ({t.names[int(first_name)]})"
        return _closed_by(ends, loader_starts, start), label
    backward = rows_named(lambda n: n.startswith(BACKWARD_PREFIX))
    if len(backward):
        others = np.sort(t.ts[window[~np.isin(window, backward)]])
        ends, root = _backward_passes(t, backward, others)
        return _closed_by(ends, loader_starts, start), f"backward passes ({root})"
    if len(loader_starts) >= 2:
        return _opened_by(loader_starts, end), "DataLoader __next__ calls"
    annotated = _repeated_annotation(t, window)
    if annotated is not None:
        return annotated
    return None


def _closed_by(ends: np.ndarray, loader_starts: np.ndarray, start: float) -> list[tuple[float, float]]:
    """Iterations that end at `ends`; each end moved to the next DataLoader call before the
    following end (several optimizer steps between two calls close one iteration)."""
    bounds: list[float] = []
    for i, boundary in enumerate(ends.tolist()):
        later = ends[i + 1] if i + 1 < len(ends) else np.inf
        j = np.searchsorted(loader_starts, boundary)
        if j < len(loader_starts) and loader_starts[j] < later:  # a call before the next end
            boundary = float(loader_starts[j])
        if not bounds or boundary > bounds[-1]:
            bounds.append(boundary)
    edges = [start, *bounds]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _opened_by(starts: np.ndarray, end: float) -> list[tuple[float, float]]:
    """Iterations that start at each DataLoader call; the last one runs to the end of the host
    work when it is about as long as the others (a loop that stopped without asking again)."""
    spans = [(float(a), float(b)) for a, b in zip(starts, starts[1:])]
    lengths = [b - a for a, b in spans]
    last = end - float(starts[-1])
    if lengths and 0.5 * float(np.median(lengths)) <= last <= 2.0 * float(np.median(lengths)):
        spans.append((float(starts[-1]), end))
    return spans


def _backward_passes(t: Table, backward: np.ndarray, others: np.ndarray) -> tuple[np.ndarray, str]:
    """The end of each backward pass. A pass opens with the loss's backward function (the first
    one evaluated in the trace); an evaluation of it opens a new pass only when some other host
    op (the next forward) started after all backward work so far had ended: the same function
    evaluated twice in one pass does not. `others`: sorted starts of non-backward host ops."""
    root = t.name[backward[0]]
    starts, ends = t.ts[backward], t.end[backward]
    reach = np.maximum.accumulate(ends)
    opened = [0]
    for r in np.flatnonzero(t.name[backward] == root)[1:].tolist():
        idle_from = reach[r - 1]
        if idle_from < starts[r] and np.searchsorted(others, starts[r]) > np.searchsorted(
            others, idle_from, "right"
        ):
            opened.append(r)
    bounds = [*opened[1:], len(backward)]
    pass_ends = np.array([reach[b - 1] for b in bounds])
    return pass_ends, t.names[int(root)].removeprefix(BACKWARD_PREFIX)


def _repeated_annotation(t: Table, window: np.ndarray) -> tuple[list[tuple[float, float]], str] | None:
    """The user annotation with the most non-overlapping occurrences (at least two) that cover
    most of the time from the first to the last: an iteration, not a marker of some other work
    (a cache flush, a checkpoint) that happens to repeat."""
    rows = window[t.kind[window] == ANNOTATION]
    best: tuple[list[tuple[float, float]], str] | None = None
    for name_id in np.unique(t.name[rows]).tolist():
        name = t.names[name_id]
        if _NOT_ITERATIONS.match(name):
            continue
        mine = rows[t.name[rows] == name_id]
        spans = sorted(s for s in set(zip(t.ts[mine].tolist(), t.end[mine].tolist())) if s[1] > s[0])
        disjoint = [s for i, s in enumerate(spans) if i == 0 or s[0] >= spans[i - 1][1]]
        covered = sum(e - s for s, e in disjoint)
        if len(disjoint) < 2 or covered < 0.5 * (disjoint[-1][1] - disjoint[0][0]):
            continue
        if best is None or len(disjoint) > len(best[0]):
            best = (disjoint, f"the annotation '{name}'")
    return best


def loop_kind(t: Table) -> tuple[str, str]:
    """('training' | 'inference' | 'unknown', the evidence): training shows a backward pass or
    an optimizer step, on the host or in the device's kernel names."""
    host_names = np.unique(t.name[t.rows(HOST, ANNOTATION)]).tolist()
    optimizer = [t.names[i] for i in host_names if t.names[i].startswith(OPTIMIZER_PREFIX)]
    if optimizer:
        return "training", f"optimizer steps ({optimizer[0]})"
    backward = [t.names[i] for i in host_names if t.names[i].startswith(BACKWARD_PREFIX)]
    if backward:
        return "training", "backward passes"
    kernel_names = {t.names[i] for i in np.unique(t.name[t.rows(KERNEL)]).tolist()}
    if any(_BACKWARD_KERNEL.search(n) for n in kernel_names):
        return "training", "backward kernels"
    if host_names:
        return "inference", "no backward pass and no optimizer step in the trace"
    if kernel_names:
        return "inference", "no backward kernels on the device"
    return "unknown", "no host or device work"


_BACKWARD_KERNEL = re.compile(r"backward|_bwd|bwd_|wgrad|dgrad|igemm_wrw|_wrw_|grad_input|grad_weight", re.I)
