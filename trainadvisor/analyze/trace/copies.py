"""Host-to-device copies in a Kineto trace: which op launched each, which syncs are a blocking
copy's own wait, and which copied a tensor the host had just made (`cpu-tensor-creation`)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainadvisor.analyze.trace.trace_records import Facts

# Host ops that make a tensor from nothing: on the host unless `device=` names another device.
FACTORY = {
    "aten::randn", "aten::rand", "aten::randint", "aten::randperm", "aten::normal",
    "aten::zeros", "aten::ones", "aten::full", "aten::arange", "aten::linspace", "aten::eye",
    "aten::scalar_tensor", "aten::lift_fresh", "aten::from_file",
}  # fmt: skip
COPY = {"aten::to", "aten::_to_copy", "aten::copy_"}
FACTORY_CALLS = {name.removeprefix("aten::") for name in FACTORY} | {"tensor"}
# Ops torch.tensor(...) runs after creating the tensor: they may sit between creation and copy.
GLUE = {"aten::detach_", "detach_", "aten::detach", "detach"}


def resolve_unnamed_copies(c: Facts) -> None:
    """Host-to-device copies whose name gives no source memory (ROCm) made by a synchronous
    copy call count as pageable (see `_SYNC_COPIES`)."""
    c.h2d = [
        (ts, dur, "pageable" if kind == "unknown" and corr in c.sync_copies else kind, nbytes, corr)
        for ts, dur, kind, nbytes, corr in c.h2d
    ]


def h2d_copy_ops(c: Facts) -> list[tuple[float, float, Any]]:
    """The outermost copy ops (`aten::to`, `_to_copy`, `copy_`) that launched a host-to-device
    copy: (start, end, thread), sorted."""
    copies = sorted((start, end, tid) for tid, start, end, name in c.named_ops if name in COPY)
    copy_starts = [start for start, _, _ in copies]
    found: dict[float, tuple[float, float, Any]] = {}
    for _, _, _, _, corr in c.h2d:
        launched = c.runtime_start.get(corr)
        if launched is None:
            continue
        i = bisect.bisect_right(copy_starts, launched) - 1
        outer = None
        for start, end, tid in reversed(copies[max(0, i - 8) : i + 1]):
            if start <= launched <= end:
                outer = (start, end, tid)
        if outer is not None:
            found[outer[0]] = outer
    return sorted(found.values())


def cpu_tensor_copies(
    c: Facts, h2d_ops: list[tuple[float, float, Any]]
) -> list[tuple[float, str, Any, float]]:
    """Host-to-device copies of tensors the host had just created: the copy op that launched
    the copy follows a factory op (`randn`, `zeros`, `tensor`, ...) on the same thread with no
    other host op of that thread in between (`detach_`, which torch.tensor runs, aside). A
    factory op inside DataLoader `__next__` (collate's torch.tensor of labels) is the batch's,
    not the step's. Returns (copy start, factory op, thread, factory start)."""
    factories: dict[Any, list[tuple[float, float, str]]] = {}
    glue: dict[Any, list[float]] = {}
    for tid, start, end, name in c.named_ops:
        if name in FACTORY:
            factories.setdefault(tid, []).append((end, start, name))
        elif name in GLUE:
            glue.setdefault(tid, []).append(start)
    for ops in factories.values():
        ops.sort()
    for starts in glue.values():
        starts.sort()
    loading = c.data_wait
    loading_starts = [start for start, _ in loading]
    found = []
    for copy_start, _, tid in h2d_ops:
        ops = factories.get(tid, [])
        j = bisect.bisect_right(ops, (copy_start, float("inf"), "")) - 1
        if j < 0:
            continue
        f_end, f_start, f_name = ops[j]
        k = bisect.bisect_right(loading_starts, f_start) - 1
        if k >= 0 and f_start <= loading[k][1]:
            continue
        host: Any = c.host_starts.get(tid, [])
        tid_glue = glue.get(tid, [])
        between = bisect.bisect_left(host, copy_start) - bisect.bisect_right(host, f_end)
        between -= bisect.bisect_left(tid_glue, copy_start) - bisect.bisect_right(tid_glue, f_end)
        if between == 0:
            found.append((copy_start, f_name, tid, f_start))
    return found


def copy_syncs(c: Facts, h2d_ops: list[tuple[float, float, Any]]) -> None:
    """Mark the stream syncs a blocking host-to-device copy makes inside its own copy op as
    `copy_sync`: that wait is the copy's (pageable-h2d-copy), not a sync the code asked for."""
    starts = [start for start, _, _ in h2d_ops]
    for index, (ts, kind, dur, tid) in enumerate(c.syncs):
        if kind != "stream_sync":
            continue
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= h2d_ops[i][1] and h2d_ops[i][2] == tid:
            c.syncs[index] = (ts, "copy_sync", dur, tid)
