"""FLOPs per step and MFU from a trace's own ops: the FLOPs a tool wrote into the ops' arguments
("trace flops"), else those their recorded shapes give ("trace shapes", `op_flops`), summed over
each step's ops and taken as a mean per step, against the dense peak of the trace's GPU in the
dtype its matmuls ran in (`compute.mfu`, as for a profiled run).

torch.profiler's with_flops=True counts FLOPs (mm, addmm, bmm, baddbmm, conv2d, and elementwise
add and mul), but its Chrome trace export writes none of them: a trace made by torch carries
shapes at most (record_shapes=True). An op is counted once: FLOPs from shapes at the outermost
op that has a formula (torch's FlopCounterMode sees no op inside another), FLOPs a tool wrote at
the innermost op that carries them (aten::linear's and its aten::addmm's would be the same work).
Where the steps hold matrix work no counted op covers (a convolution of a trace without "Concrete
Inputs", an fp8 aten::_scaled_mm), the FLOPs are not given: a partial count would read as a low
MFU, which the compute-bound rule acts on."""

from __future__ import annotations

from collections import Counter

import numpy as np

from trainadvisor.analyze.read.columns import FLOAT32, KERNEL, Table, positions
from trainadvisor.analyze.read.op_flops import DTYPE_CODES
from trainadvisor.analyze.trace.device import combined
from trainadvisor.analyze.trace.kernels import classify
from trainadvisor.analyze.trace.trace_records import TraceAnalysis
from trainadvisor.compute.mfu import utilization
from trainadvisor.records.compute import Utilization

GIVEN, SHAPES = "trace flops", "trace shapes"
# What torch.compile's code leaves on the host: dynamo's region, AOTAutograd's function.
_COMPILED = ("Torch-Compiled Region", "CompiledFunction")
# A trace holds no peak of its CPU: `profile` measures the machine it runs on, `analyze` reads a
# file that may come from any machine, so a CPU trace gets achieved FLOP/s and no MFU.
_NO_CPU_PEAK = "not measured (a trace holds none; `trainadvisor profile` measures this machine's)"


def trace_utilization(
    t: Table, spans: list[tuple[float, float]], a: TraceAnalysis
) -> tuple[Utilization | None, str]:
    """The steps' FLOPs and MFU, and where the FLOPs come from (GIVEN or SHAPES); None and ""
    where the trace carries neither FLOPs nor the shapes of an op they follow from. `spans`: the
    steps' host spans (an op belongs to the step its host call started in); `a`: the analysis,
    its steps and device described."""
    inside = _within(t.ts[t.flop_rows], spans)
    rows = t.flop_rows[inside]
    given, shapes = t.flop_given[inside], t.flop_shapes[inside]
    if (given > 0).any():
        source, values, counted = GIVEN, given, given > 0
    elif (shapes >= 0).any():
        source, values, counted = SHAPES, shapes, shapes >= 0
    else:
        return None, ""
    unseen = _unseen_work(t, a)
    if unseen:
        return Utilization(status=f"not counted: {unseen}"), source
    kept = _once(t, rows, counted, innermost=source == GIVEN)
    missing = _uncovered(t, rows, kept)
    if missing:
        ops = ", ".join(f"{n} {name}" for name, n in missing.most_common(3))
        what = "recorded shapes" if source == SHAPES else "FLOPs the trace carries"
        return Utilization(status=f"not counted: the {what} give none of {ops} in the steps"), source
    flops_per_step = float(values[kept].sum()) / len(spans)
    codes, counted_flops = t.flop_dtype[inside][kept], values[kept]
    by_dtype = {
        DTYPE_CODES[c]: float(counted_flops[codes == c].sum()) for c in np.unique(codes).tolist() if c
    }
    on_gpu = a.gpu_name is not None or bool(a.kernels)
    runtime = {
        "flops_status": "counted",
        "flops_per_step": flops_per_step,
        "flops_by_dtype": by_dtype,
        "cuda_used": on_gpu,
        "tf32_enabled": on_gpu and not _amd(a.gpu_name) and _tf32(t),
        "cpu_peak": {"status": _NO_CPU_PEAK},
    }
    step_ms = a.step_time_ms_mean
    return utilization(runtime, a.gpu_name, 1e3 / step_ms if step_ms else None), source


def _unseen_work(t: Table, a: TraceAnalysis) -> str:
    """Why the steps may run matrix work that launched no op to count ("" where nothing says
    so): code torch.compile compiled (its own kernels, Triton matmul templates among them), or
    CUDA/HIP graph replays. As `compute.flops` does, such steps are not counted rather than
    counted short."""
    if any(name.startswith(_COMPILED) for name in t.names):
        return "the steps run code torch.compile compiled (its kernels launch no ops to count)"
    if a.graph_launches:
        return f"the steps replay CUDA graphs ({a.graph_launches} launches run kernels no op launched)"
    return ""


def _within(ts: np.ndarray, spans: list[tuple[float, float]]) -> np.ndarray:
    """Whether each time falls in one of the (disjoint) spans."""
    if not spans:
        return np.zeros(len(ts), bool)
    starts, ends = (np.array(column) for column in zip(*sorted(spans)))
    at = np.searchsorted(starts, ts, side="right") - 1
    return (at >= 0) & (ts < ends[np.maximum(at, 0)])


def _once(t: Table, rows: np.ndarray, counted: np.ndarray, innermost: bool) -> np.ndarray:
    """Which of the counted ops to count: per thread, where counted ops nest (host ops on one
    thread nest properly), the outermost or the innermost."""
    kept = counted.copy()
    tids = t.tid[rows]
    for tid in np.unique(tids[counted]).tolist():
        mine = np.flatnonzero(counted & (tids == tid))
        order = mine[np.lexsort((-t.end[rows[mine]], t.ts[rows[mine]]))]
        starts, ends = t.ts[rows[order]], t.end[rows[order]]
        if innermost:  # an op the next one starts inside holds it
            kept[order[:-1][starts[1:] < ends[:-1]]] = False
        else:  # an op that starts before the end of all before it is inside one of them
            reach = np.maximum.accumulate(ends)
            kept[order[1:][starts[1:] < reach[:-1]]] = False
    return kept


def _uncovered(t: Table, rows: np.ndarray, kept: np.ndarray) -> Counter[str]:
    """The matrix ops that neither are counted nor hold or sit inside a counted op (aten::linear
    holds its aten::addmm, aten::cudnn_convolution sits inside aten::convolution), by name."""
    missing: Counter[str] = Counter()
    tids = t.tid[rows]
    for tid in np.unique(tids).tolist():
        mine = tids == tid
        counted = rows[kept & mine]
        order = np.argsort(t.ts[counted], kind="stable")
        starts, ends = t.ts[counted][order], t.end[counted][order]
        others = rows[~kept & mine]
        if len(counted):  # counted ops on one thread do not overlap: the last to start before
            before = np.searchsorted(starts, t.end[others], side="left") - 1  # one's end
            others = others[(before < 0) | (ends[np.maximum(before, 0)] <= t.ts[others])]
        missing.update(t.names[t.name[r]] for r in others.tolist())
    return missing


def _amd(gpu_name: str | None) -> bool:
    """An AMD GPU: its matrix cores take float32 as float32 (MFMA), no TF32 unless asked for
    (hipBLASLt's XF32), which kernel names do not show."""
    return gpu_name is not None and any(word in gpu_name for word in ("AMD", "Radeon", "Instinct"))


def _tf32(t: Table) -> bool:
    """Whether float32 matmuls ran on Tensor Cores (TF32): more of the time of the matrix
    kernels that float32 ops launched in kernels whose names show Tensor Cores (and no reduced
    precision) than in those that show the FP32 units. A trace does not record torch's TF32
    switch; its kernels show it. Where no kernel names its op (2022 traces give a kernel its
    correlation as "External id"), every matrix kernel is read: the steps' matmuls are float32."""
    kernels = np.flatnonzero(t.kind == KERNEL)
    fp32_ops = np.array(sorted(e for e, p in t.op_precision.items() if p == FLOAT32), np.int64)
    _, launched = positions(fp32_ops, t.external(kernels))
    if launched.any():
        kernels = kernels[launched]
    spent = {"tensor_core": 0.0, "fp32": 0.0, "unknown": 0.0}
    for name_id, us in zip(*(a.tolist() for a in _time_by_name(t, kernels))):
        name = t.names[name_id]
        kind = classify(name)
        if kind.matrix:
            spent[combined(kind.precision, FLOAT32, name)] += us
    return spent["tensor_core"] > spent["fp32"]


def _time_by_name(t: Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    names, index = np.unique(t.name[rows], return_inverse=True)
    return names, np.bincount(index, weights=t.duration(rows), minlength=len(names))
