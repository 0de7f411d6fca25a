"""The few events of a trace that are read one by one: syncs, copy and factory ops, host-to-device
copies and user-code frames, picked from the columns by name (a Python loop over them, never
over the whole trace). `copies` and `callsites` read these."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from trainadvisor.analyze.read.columns import HOST_KINDS, KERNEL, MEMCPY, PYTHON, RUNTIME, Table
from trainadvisor.analyze.trace import callsites, copies
from trainadvisor.analyze.trace import intervals as iv
from trainadvisor.analyze.trace.trace_records import Facts

SYNCS = {
    "cudaStreamSynchronize": "stream_sync", "hipStreamSynchronize": "stream_sync",
    "cudaDeviceSynchronize": "device_sync", "hipDeviceSynchronize": "device_sync",
    "aten::_local_scalar_dense": "item",
    # ROCm: a blocking copy (`.item()`, `.cpu()`, a pageable upload) is one synchronous
    # hipMemcpyWithStream, with no stream sync after it. Inside a host-to-device copy op it is
    # the copy's own wait (`copies.copy_syncs`); elsewhere the host waited for the device.
    "hipMemcpyWithStream": "stream_sync", "hipMemcpy": "stream_sync",
}  # fmt: skip
# Runtime calls that copy synchronously: ROCm names no source memory ("Memcpy HtoD (Host ->
# Device)"), so a host-to-device copy they make counts as pageable: the host waits for it as for
# a pageable copy, and the fix (pinned memory, non-blocking copy) is the same.
SYNC_COPIES = {"hipMemcpyWithStream", "hipMemcpy"}
# An `.item()` (aten::_local_scalar_dense) that waited for no device: of a host tensor (Adam's
# step count, a Python-side counter), or any `.item()` of a run without a GPU. An `.item()` of a
# GPU tensor copies the value to the host and syncs its stream inside its own span.
HOST_ITEM = "host_item"
_NAMED_OPS = copies.FACTORY | copies.COPY | copies.GLUE


def gather(t: Table, source_dirs: tuple[Path, ...], host_ops: np.ndarray, loader: np.ndarray) -> Facts:
    """`host_ops`: the rows of host ops that are neither step markers nor DataLoader calls;
    `loader`: the DataLoader calls."""
    f = Facts(source_dirs, kernels_seen=bool(np.any(t.kind == KERNEL)))
    ts, end = t.ts, t.end
    calls = t.rows(*HOST_KINDS, RUNTIME)
    for r in calls[t.matching(calls, SYNCS.__contains__)].tolist():
        name = t.names[t.name[r]]
        f.syncs.append((float(ts[r]), SYNCS[name], float(end[r] - ts[r]), int(t.tid[r])))
        if t.kind[r] == RUNTIME and name in SYNC_COPIES and t.corr[r] >= 0:
            f.sync_copies.add(int(t.corr[r]))
    f.syncs.sort(key=lambda s: s[0])
    _items_without_wait(t, f)
    for r in host_ops[t.matching(host_ops, _NAMED_OPS.__contains__)].tolist():
        f.named_ops.append((int(t.tid[r]), float(ts[r]), float(end[r]), t.names[t.name[r]]))
    f.named_ops.sort(key=lambda op: op[1])
    memcpy = t.rows(MEMCPY)
    for r in memcpy[t.matching(memcpy, lambda n: "HtoD" in n or "HostToDevice" in n)].tolist():
        name = t.names[t.name[r]]
        kind = "pageable" if "Pageable" in name else "pinned" if "Pinned" in name else "unknown"
        nbytes = t.copy_bytes.get(r) or t.call_copy_bytes.get(int(t.corr[r]), 0)
        f.h2d.append((float(ts[r]), float(end[r] - ts[r]), kind, nbytes, int(t.corr[r])))
    f.h2d.sort(key=lambda c: c[0])
    if f.h2d:
        _copy_context(t, f, host_ops)
    f.data_wait = iv.Union(ts[loader], end[loader]).pairs()
    _python_frames(t, f)
    return f


def _items_without_wait(t: Table, f: Facts) -> None:
    """Mark as HOST_ITEM each `.item()` in whose span its thread made no call that waits for the
    device: a stream or device sync, or the launch of a device-to-host copy."""
    waits = _device_waits(t)
    for index, (ts, kind, dur, tid) in enumerate(f.syncs):
        if kind != "item":
            continue
        starts = waits.get(tid)
        first = int(np.searchsorted(starts, ts)) if starts is not None else 0
        if starts is None or first == len(starts) or starts[first] > ts + dur:
            f.syncs[index] = (ts, HOST_ITEM, dur, tid)


def _device_waits(t: Table) -> dict[int, np.ndarray]:
    """Per thread, the sorted starts of the runtime calls in which the host waits for the device."""
    runtime = t.rows(RUNTIME)
    if not len(runtime):
        return {}
    syncing = t.matching(runtime, lambda name: SYNCS.get(name) in ("stream_sync", "device_sync"))
    memcpy = t.rows(MEMCPY)
    to_host = memcpy[t.matching(memcpy, lambda name: "DtoH" in name or "DeviceToHost" in name)]
    corr = t.corr[runtime]
    copying = np.isin(corr, t.corr[to_host]) & (corr >= 0)
    rows = runtime[syncing | copying]
    tids = t.tid[rows]
    return {int(tid): np.sort(t.ts[rows[tids == tid]]) for tid in np.unique(tids).tolist()}


def _copy_context(t: Table, f: Facts, host_ops: np.ndarray) -> None:
    """What the copy analysis needs besides the copies: when each copy was launched, and every
    host op's start per thread (to see what ran between a factory op and a copy)."""
    runtime = t.rows(RUNTIME)
    wanted = runtime[np.isin(t.corr[runtime], [c for *_, c in f.h2d])]
    for r in wanted.tolist():
        f.runtime_start.setdefault(int(t.corr[r]), float(t.ts[r]))
    tids = t.tid[host_ops]
    for tid in np.unique(tids).tolist():
        f.host_starts[tid] = np.sort(t.ts[host_ops[tids == tid]])


def _python_frames(t: Table, f: Facts) -> None:
    """The Python frames of the user's own code (traces recorded with_stack=True), and the
    calls of torch built-ins that sync or create tensors, to name the call."""
    labels: dict[int, tuple[str, str]] = {}
    for i, name in enumerate(t.names):
        found = _frame_label(name)
        if found is not None:
            labels[i] = found
    if not labels:
        return
    rows = t.rows(PYTHON)
    rows = rows[np.isin(t.name[rows], list(labels))]
    for r in rows.tolist():
        which, label = labels[int(t.name[r])]
        spans = f.builtins if which == "builtin" else f.frames
        spans.setdefault(int(t.tid[r]), []).append((float(t.ts[r]), float(t.end[r]), label))
    for python_spans in (*f.frames.values(), *f.builtins.values()):
        python_spans.sort()


def _frame_label(name: str) -> tuple[str, str] | None:
    if name.startswith("<built-in"):
        callee = callsites.BUILTIN.match(name)
        if callee and callee["name"] in callsites.CALLEES:
            return "builtin", callee["name"]
        return None
    if name.startswith(("<", "nn.Module:")) or name.startswith(callsites.LIBRARIES):
        return None
    match = callsites.FRAME.match(name)
    if match is None or "site-packages" in match["file"] or match["file"].startswith("/usr/lib"):
        return None
    if match["file"].split("/")[0].removesuffix(".py") in sys.stdlib_module_names:
        return None
    return "frame", f"{match['file']}|{match['line']}|{match['func']}"
