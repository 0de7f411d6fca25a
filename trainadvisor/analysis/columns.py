"""A Kineto trace as compact columns: one row per span the analysis uses (host ops, Python
frames, runtime calls, kernels, copies, memsets), held in numpy arrays of about 40 bytes a row.
Names and threads are interned (a trace repeats a few thousand names millions of times); flows
and metadata events are dropped as they stream past, and memory events are reduced to their
peaks. No Python object is kept per event, so a 2 GB trace fits in a few hundred MB."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainadvisor.analysis.stream import Event

# Row kinds. A category is read case-blind: 2021 traces write Operator/Runtime/Kernel/Memcpy.
DROP, HOST, ANNOTATION, PYTHON, RUNTIME, KERNEL, MEMCPY, MEMSET, MEMORY = range(9)
_CATEGORIES = {
    "cpu_op": HOST, "operator": HOST, "python": HOST, "user_annotation": ANNOTATION,
    "python_function": PYTHON,
    "cuda_runtime": RUNTIME, "runtime": RUNTIME, "cuda_driver": RUNTIME, "hip_runtime": RUNTIME,
    "kernel": KERNEL, "gpu_memcpy": MEMCPY, "memcpy": MEMCPY, "gpu_memset": MEMSET, "memset": MEMSET,
}  # fmt: skip
HOST_KINDS = (HOST, ANNOTATION)
DEVICE_KINDS = (KERNEL, MEMCPY, MEMSET)

# Ops whose inputs tell the precision of the matrix work they launch (with record_shapes).
MATRIX_OP_PREFIXES = (
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
    "aten::linear", "aten::conv", "aten::_conv", "aten::cudnn_conv", "aten::miopen_conv",
    "aten::_scaled_mm", "aten::scaled_dot_product", "aten::_scaled_dot_product", "aten::_flash_attention",
    "aten::_efficient_attention",
)  # fmt: skip
REDUCED, FLOAT32 = 1, 2  # input precision of a matrix op; 0: not known
_REDUCED_TYPES = {"c10::BFloat16", "c10::Half", "BFloat16", "Half", "c10::Float8_e4m3fn", "c10::Float8_e5m2"}
_FLOAT_TYPES = {"float", "Float"}


def input_precision(types: Any) -> int:
    """REDUCED when a tensor input is bf16/fp16/fp8, FLOAT32 when the tensor inputs are fp32."""
    if not isinstance(types, list):
        return 0
    tensors = [t for t in types if isinstance(t, str) and t and t not in ("Scalar", "ScalarList", "int")]
    if any(t in _REDUCED_TYPES for t in tensors):
        return REDUCED
    if tensors and all(t in _FLOAT_TYPES for t in tensors[:2]):
        return FLOAT32
    return 0


@dataclass
class Table:
    """The rows (file order) and what was reduced on the way."""

    kind: np.ndarray  # int8 row kind
    ts: np.ndarray  # float64 microseconds
    dur: np.ndarray  # float64 microseconds
    name: np.ndarray  # int32 index into names
    tid: np.ndarray  # int32 index into tids
    corr: np.ndarray  # int64 correlation id, -1 when none
    ext: np.ndarray  # int64 external id (kernels, and ops with recorded shapes), -1 when none
    names: list[str]
    tids: list[Any]
    copy_bytes: dict[int, int] = field(default_factory=dict)  # memcpy row -> bytes
    op_precision: dict[int, int] = field(default_factory=dict)  # external id -> REDUCED/FLOAT32
    peak_allocated: float | None = None
    peak_reserved: float | None = None

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def flags(self, predicate: Any) -> np.ndarray:
        """A per-row mask from a predicate over names (evaluated once per distinct name)."""
        return np.fromiter((bool(predicate(n)) for n in self.names), bool, len(self.names))[self.name]

    def rows(self, *kinds: int) -> np.ndarray:
        return np.flatnonzero(np.isin(self.kind, kinds))


_COLUMNS = ("kind", "ts", "dur", "name", "tid", "corr", "ext")


class TableReader:
    """The callback `stream.read_trace` feeds: each chunk of events becomes column pieces."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.tids: list[Any] = []
        self._name_ids: dict[str, int] = {}
        self._tid_ids: dict[Any, int] = {}
        self._categories: dict[str, int] = {}
        self._matrix_names: set[int] = set()
        self._parts: dict[str, list[np.ndarray]] = {column: [] for column in _COLUMNS}
        self.rows = 0
        self.copy_bytes: dict[int, int] = {}
        self.op_precision: dict[int, int] = {}
        self.peak_allocated: float | None = None
        self.peak_reserved: float | None = None

    def __call__(self, events: list[Event]) -> None:
        categories = self._categories
        for cat in {e.cat for e in events}:
            if cat not in categories:
                categories[cat] = _CATEGORIES.get(cat.lower(), DROP)
        codes = [categories[e.cat] if e.ph == "X" else MEMORY if e.name == "[memory]" else DROP for e in events]
        memory = [e for e, code in zip(events, codes) if code == MEMORY]
        if memory:
            self._memory(memory)
        kept = [e for e, code in zip(events, codes) if DROP < code < MEMORY]
        if kept:
            self._append(kept, np.array([code for code in codes if DROP < code < MEMORY], np.int8))

    def _append(self, kept: list[Event], kind: np.ndarray) -> None:
        count = len(kept)
        names = [e.name for e in kept]
        ids = self._name_ids
        for name in set(names).difference(ids):
            ids[name] = len(self.names)
            self.names.append(name)
            if name.startswith(MATRIX_OP_PREFIXES):
                self._matrix_names.add(ids[name])
        tids = [e.tid for e in kept]
        for tid in set(tids).difference(self._tid_ids):
            self._tid_ids[tid] = len(self.tids)
            self.tids.append(tid)
        args = [e.args for e in kept]
        part = self._parts
        part["kind"].append(kind)
        part["ts"].append(np.fromiter((e.ts for e in kept), np.float64, count))
        part["dur"].append(np.fromiter((e.dur for e in kept), np.float64, count))
        name_ids = np.fromiter(map(ids.__getitem__, names), np.int32, count)
        part["name"].append(name_ids)
        part["tid"].append(np.fromiter(map(self._tid_ids.__getitem__, tids), np.int32, count))
        part["corr"].append(_ints([a.correlation if a is not None else None for a in args]))
        ext = np.full(count, -1, np.int64)
        for i in np.flatnonzero((kind == KERNEL) | (kind == HOST)).tolist():
            a = args[i]
            if a is not None and (kind[i] == KERNEL or a.input_type is not None):
                ext[i] = _external(a)
        part["ext"].append(ext)
        self._side_tables(kept, kind, name_ids, ext)
        self.rows += count

    def _side_tables(self, kept: list[Event], kind: np.ndarray, name_ids: np.ndarray, ext: np.ndarray) -> None:
        for i in np.flatnonzero(kind == MEMCPY).tolist():
            a = kept[i].args
            if a is not None and isinstance(a.bytes, int):
                self.copy_bytes[self.rows + i] = a.bytes
        for i in np.flatnonzero((kind == HOST) & (ext >= 0)).tolist():
            if int(name_ids[i]) in self._matrix_names:
                precision = input_precision(kept[i].args.input_type)  # type: ignore[union-attr]
                if precision:
                    self.op_precision[int(ext[i])] = precision

    def _memory(self, events: list[Event]) -> None:
        for e in events:
            a = e.args
            if a is None or a.device_type not in (1, 6):  # CUDA (ROCm reports it too) / HIP
                continue
            if isinstance(a.total_allocated, (int, float)):
                self.peak_allocated = max(self.peak_allocated or 0, a.total_allocated)
            if isinstance(a.total_reserved, (int, float)):
                self.peak_reserved = max(self.peak_reserved or 0, a.total_reserved)

    def table(self) -> Table:
        dtypes = {"kind": np.int8, "ts": np.float64, "dur": np.float64, "name": np.int32, "tid": np.int32}
        columns = {}
        for column in _COLUMNS:
            parts = self._parts.pop(column)
            columns[column] = np.concatenate(parts) if parts else np.empty(0, dtypes.get(column, np.int64))
            parts.clear()
        return Table(
            **columns,
            names=self.names,
            tids=self.tids,
            copy_bytes=self.copy_bytes,
            op_precision=self.op_precision,
            peak_allocated=self.peak_allocated,
            peak_reserved=self.peak_reserved,
        )


def _external(a: Any) -> int:
    value = a.external_id if a.external_id is not None else a.external_id_2021
    return value if isinstance(value, int) else -1


def _ints(values: list[Any]) -> np.ndarray:
    """Correlation ids as int64 (-1 for none); a trace with odd ids (strings) is read loosely."""
    try:
        return np.array([-1 if v is None else v for v in values], np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([v if isinstance(v, int) and 0 <= v < 2**62 else -1 for v in values], np.int64)
