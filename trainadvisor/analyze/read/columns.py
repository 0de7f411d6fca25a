"""A Kineto trace as compact columns: one row per span the analysis uses (host ops, Python
frames, runtime calls, kernels, copies, memsets), held in numpy arrays of about 40 bytes a row.
Names and threads are interned (a trace repeats a few thousand names millions of times); flows
and metadata events are dropped as they stream past, and memory events are reduced to their
peaks. No Python object is kept per event, so a 2 GB trace fits in a few hundred MB."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from trainadvisor.analyze.read.op_flops import FORMULAS, op_dtype, op_flops
from trainadvisor.analyze.read.stream import Event

# Row kinds. A category is read case-blind: 2021 traces write Operator/Runtime/Kernel/Memcpy.
DROP, HOST, ANNOTATION, PYTHON, RUNTIME, KERNEL, MEMCPY, MEMSET, MEMORY = range(9)
_CATEGORIES = {
    "cpu_op": HOST, "operator": HOST, "python": HOST, "user_annotation": ANNOTATION,
    "python_function": PYTHON,
    "cuda_runtime": RUNTIME, "runtime": RUNTIME, "cuda_driver": RUNTIME, "hip_runtime": RUNTIME,
    "kernel": KERNEL, "gpu_memcpy": MEMCPY, "memcpy": MEMCPY, "gpu_memset": MEMSET, "memset": MEMSET,
    "cpu_instant_event": MEMORY, "": MEMORY,  # memory events (2021 traces give them no category)
}  # fmt: skip


def _category(cat: str) -> int:
    return _CATEGORIES.get(cat.lower(), DROP)


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
    end: np.ndarray  # float64 microseconds
    name: np.ndarray  # int32 index into names
    tid: np.ndarray  # int32 index into tids
    corr: np.ndarray  # int64 correlation id, -1 when none
    names: list[str]
    tids: list[Any]
    # External ids (the op a kernel belongs to; matrix ops with recorded shapes), sparse: rows
    # in order, and their ids.
    ext_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    ext_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # The host's matrix ops (MATRIX_OP_PREFIXES), sparse: rows in order, the FLOPs a tool wrote
    # into the trace and those their recorded shapes give (`op_flops`; -1 where none), and the
    # code of their operands' dtype (`op_flops.DTYPE_CODES`).
    flop_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    flop_given: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    flop_shapes: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    flop_dtype: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))
    # Times are microseconds since base_us (the trace's first timestamp, whole): absolute
    # timestamps (1.7e15 us since the epoch) leave float64 a quarter-microsecond of precision.
    base_us: float = 0.0
    copy_bytes: dict[int, int] = field(default_factory=dict)  # memcpy row -> bytes
    # correlation id -> bytes, from the runtime call that launched a copy (ROCm's hipMemcpy*
    # give the size there and not on the copy)
    call_copy_bytes: dict[int, int] = field(default_factory=dict)
    op_precision: dict[int, int] = field(default_factory=dict)  # external id -> REDUCED/FLOAT32
    peak_allocated: float | None = None
    peak_reserved: float | None = None
    # GPU index -> the kernels, copies and memsets that ran on it (the rank's GPU is the busiest)
    device_events: dict[int, int] = field(default_factory=dict)
    # kernel row -> the process group its collective ran in ("default_pg, 8 ranks"), where the
    # trace names it (NCCL kernels of torch 2.2+)
    kernel_groups: dict[int, str] = field(default_factory=dict)

    def duration(self, rows: np.ndarray) -> np.ndarray:
        return self.end[rows] - self.ts[rows]

    def external(self, rows: np.ndarray) -> np.ndarray:
        """The external id of each row, -1 where it has none."""
        pos, found = positions(self.ext_rows, rows)
        return np.where(found, self.ext_ids[pos], -1) if len(self.ext_rows) else np.full(len(rows), -1)

    def matching(self, rows: np.ndarray, predicate: Any) -> np.ndarray:
        """Which of `rows` have a name the predicate accepts (asked once per distinct name)."""
        ids = [i for i, name in enumerate(self.names) if predicate(name)]
        return np.isin(self.name[rows], ids) if ids else np.zeros(len(rows), bool)

    def rows(self, *kinds: int) -> np.ndarray:
        return np.flatnonzero(np.isin(self.kind, kinds))


def _decoded(raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw) if len(raw) else None
    except msgspec.DecodeError:
        return None


def positions(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each key stands in `sorted_keys`, and whether it is there."""
    if not len(sorted_keys):
        return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
    pos = np.clip(np.searchsorted(sorted_keys, keys), 0, len(sorted_keys) - 1)
    return pos, sorted_keys[pos] == keys


_COLUMNS = ("kind", "ts", "end", "name", "tid", "corr", "ext_rows", "ext_ids")
_FLOP_COLUMNS = ("flop_rows", "flop_given", "flop_shapes", "flop_dtype")


_CAT, _NAME, _TID = attrgetter("cat"), attrgetter("name"), attrgetter("tid")
_TS, _DUR, _CORR = attrgetter("ts"), attrgetter("dur"), attrgetter("args.correlation")
_EXT, _EXT_2021 = attrgetter("args.external_id"), attrgetter("args.external_id_2021")
_DEVICE = attrgetter("args.device")


class TableReader:
    """The callback `stream.read_trace` feeds: each chunk of events becomes column pieces, one
    C-level pass per column (`map` and `np.fromiter`), no Python code per event."""

    def __init__(self, base_us: float | None = None) -> None:
        """`base_us`: the time rows are measured from; by default the floor of the first chunk's
        earliest (`pipeline` gives the parts of one trace the base its first chunk set)."""
        self.names: list[str] = []
        self.tids: list[Any] = []
        self._name_ids: dict[str, int] = {}
        self._tid_ids: dict[Any, int] = {}
        self._categories: dict[str, int] = {}
        self._matrix_names: list[int] = []
        self._memory_name = -1
        self._parts: dict[str, list[np.ndarray]] = {column: [] for column in (*_COLUMNS, *_FLOP_COLUMNS)}
        self.rows = 0
        self.copy_bytes: dict[int, int] = {}
        self.call_copy_bytes: dict[int, int] = {}
        self.op_precision: dict[int, int] = {}
        self.peak_allocated: float | None = None
        self.peak_reserved: float | None = None
        self.base_us = base_us
        self.device_events: dict[int, int] = {}
        self.kernel_groups: dict[int, str] = {}

    @staticmethod
    def _codes(values: list[Any], table: dict[Any, int], code: Any) -> np.ndarray:
        # In order of first appearance, not a set's order: that one changes with the process's
        # hash seed, and the ids (the first optimizer name a report quotes, say) would with it.
        for value in dict.fromkeys(values):
            if value not in table:
                table[value] = code(value)
        return np.fromiter(map(table.__getitem__, values), np.int32, len(values))

    def _intern_name(self, name: str) -> int:
        self.names.append(name)
        if name.startswith(MATRIX_OP_PREFIXES):
            self._matrix_names.append(len(self.names) - 1)
        if name == "[memory]":
            self._memory_name = len(self.names) - 1
        return len(self.names) - 1

    def _intern_tid(self, tid: Any) -> int:
        self.tids.append(tid)
        return len(self.tids) - 1

    def __call__(self, events: list[Event]) -> None:
        # The category decides the row kind: Kineto writes spans as "X" and memory events as "i"
        # instants of their own category; flows and metadata fall in categories not read.
        kind = self._codes(list(map(_CAT, events)), self._categories, _category)
        name = self._codes(list(map(_NAME, events)), self._name_ids, self._intern_name)
        kind[(kind == MEMORY) & (name != self._memory_name)] = DROP
        memory = np.flatnonzero(kind == MEMORY)
        if len(memory):
            self._memory([events[i] for i in memory.tolist()])
        keep = np.flatnonzero((kind > DROP) & (kind < MEMORY))
        if len(keep) < len(events):
            events = [events[i] for i in keep.tolist()]
            kind, name = kind[keep], name[keep]
        if not events:
            return
        count, part = len(events), self._parts
        part["kind"].append(kind.astype(np.int8))
        part["name"].append(name)
        ts = np.fromiter(map(_TS, events), np.float64, count)
        if self.base_us is None:
            self.base_us = float(np.floor(ts.min()))
        ts -= self.base_us
        part["ts"].append(ts)
        part["end"].append(ts + np.fromiter(map(_DUR, events), np.float64, count))
        part["tid"].append(self._codes(list(map(_TID, events)), self._tid_ids, self._intern_tid))
        part["corr"].append(np.fromiter(map(_CORR, events), np.int64, count))
        ext = np.full(count, -1, np.int64)
        linked = np.flatnonzero((kind == KERNEL) | ((kind == HOST) & np.isin(name, self._matrix_names)))
        if len(linked):
            subset = [events[i] for i in linked.tolist()]
            ext[linked] = np.maximum(
                np.fromiter(map(_EXT, subset), np.int64, len(subset)),
                np.fromiter(map(_EXT_2021, subset), np.int64, len(subset)),
            )
        known = np.flatnonzero(ext >= 0)
        part["ext_rows"].append(known + self.rows)
        part["ext_ids"].append(ext[known])
        self._side_tables(events, kind, name, ext)
        self.rows += count

    def _side_tables(self, events: list[Event], kind: np.ndarray, name: np.ndarray, ext: np.ndarray) -> None:
        for i in np.flatnonzero(kind == MEMCPY).tolist():
            nbytes = events[i].args.bytes
            if nbytes:
                self.copy_bytes[self.rows + i] = nbytes
        for i in np.flatnonzero(kind == RUNTIME).tolist():
            args = events[i].args
            if args.size is not None and args.correlation >= 0:
                size = _size(args.size)
                if size > 0:
                    self.call_copy_bytes[args.correlation] = size
        for i in np.flatnonzero(kind == KERNEL).tolist():
            args = events[i].args
            if args.pg_name or args.pg_desc:
                self.kernel_groups[self.rows + i] = group_label(args.pg_desc, args.pg_name, args.group_size)
        on_device = np.flatnonzero((kind == KERNEL) | (kind == MEMCPY) | (kind == MEMSET)).tolist()
        if on_device:
            devices = np.fromiter(map(_DEVICE, [events[i] for i in on_device]), np.int64, len(on_device))
            for index, count in zip(*(part.tolist() for part in np.unique(devices, return_counts=True))):
                self.device_events[index] = self.device_events.get(index, 0) + count
        if not self._matrix_names:
            return
        matrix = (kind == HOST) & np.isin(name, self._matrix_names)
        for i in np.flatnonzero(matrix & (ext >= 0)).tolist():
            precision = input_precision(events[i].args.input_type)
            if precision:
                self.op_precision[int(ext[i])] = precision
        self._flops(events, np.flatnonzero(matrix))

    def _flops(self, events: list[Event], rows: np.ndarray) -> None:
        """The FLOPs of the chunk's matrix ops, given or from their shapes (`op_flops`)."""
        if not len(rows):
            return
        given, shaped, dtypes = [], [], []
        for i in rows.tolist():
            event = events[i]
            args, flops = event.args, None
            if event.name in FORMULAS and len(args.input_dims):
                flops = op_flops(event.name, _decoded(args.input_dims), _decoded(args.concrete_inputs))
            given.append(args.flops)
            shaped.append(-1.0 if flops is None else flops)
            dtypes.append(op_dtype(event.name, args.input_type))
        part = self._parts
        part["flop_rows"].append(rows + self.rows)
        part["flop_given"].append(np.array(given, np.float64))
        part["flop_shapes"].append(np.array(shaped, np.float64))
        part["flop_dtype"].append(np.array(dtypes, np.int8))

    def _memory(self, events: list[Event]) -> None:
        """Peaks of the device's allocated and reserved memory."""
        device = np.fromiter((e.args.device_type for e in events), np.int64, len(events))
        on_device = np.isin(device, (1, 6))  # CUDA (ROCm reports it too) / HIP
        if not on_device.any():
            return
        allocated = np.fromiter((e.args.total_allocated for e in events), np.float64, len(events))[on_device]
        reserved = np.fromiter((e.args.total_reserved for e in events), np.float64, len(events))[on_device]
        if allocated.max() >= 0:
            self.peak_allocated = max(self.peak_allocated or 0.0, float(allocated.max()))
        if reserved.max() >= 0:
            self.peak_reserved = max(self.peak_reserved or 0.0, float(reserved.max()))

    def pieces(self) -> Pieces:
        """What was read, not yet joined (a worker process returns this: joining there would
        hold its rows twice)."""
        return Pieces(
            self._parts, self.rows, self.names, self.tids, self.copy_bytes, self.op_precision,
            self.peak_allocated, self.peak_reserved, self.base_us, self.device_events, self.kernel_groups,
            self.call_copy_bytes,
        )  # fmt: skip

    def table(self) -> Table:
        return join([self.pieces()])


@dataclass
class Pieces:
    """A reader's columns before they are joined: per column, the arrays of its chunks."""

    parts: dict[str, list[np.ndarray]]
    rows: int
    names: list[str]
    tids: list[Any]
    copy_bytes: dict[int, int]
    op_precision: dict[int, int]
    peak_allocated: float | None
    peak_reserved: float | None
    base_us: float | None
    device_events: dict[int, int] = field(default_factory=dict)
    kernel_groups: dict[int, str] = field(default_factory=dict)
    call_copy_bytes: dict[int, int] = field(default_factory=dict)


def group_label(description: str, name: str, size: Any) -> str:
    """A process group as a report names it: "default_pg, 8 ranks"; by its name where it has no
    description of its own (torch's new_group says "undefined": two such groups must not merge)."""
    said = description if description and description != "undefined" else f"group {name or '?'}"
    return f"{said}, {size} ranks" if isinstance(size, int) and size > 0 else said


_EMPTY = {
    "kind": np.int8, "ts": np.float64, "end": np.float64, "name": np.int32, "tid": np.int32,
    "flop_given": np.float64, "flop_shapes": np.float64, "flop_dtype": np.int8,
}  # fmt: skip


def join(pieces: list[Pieces]) -> Table:
    """One table of the rows of several readers (parts of one file, in order): names and
    threads re-interned, times onto the first part's base. Each column is joined and its pieces
    freed before the next, so memory holds the rows about once."""
    names: dict[str, int] = {}
    tids: dict[Any, int] = {}
    name_maps = [np.array([names.setdefault(n, len(names)) for n in p.names], np.int32) for p in pieces]
    tid_maps = [np.array([tids.setdefault(x, len(tids)) for x in p.tids], np.int32) for p in pieces]
    offsets = np.cumsum([0] + [p.rows for p in pieces]).tolist()
    base = next((p.base_us for p in pieces if p.base_us is not None), 0.0)
    columns: dict[str, np.ndarray] = {}
    for column in (*_COLUMNS, *_FLOP_COLUMNS):
        chunks = []
        for i, p in enumerate(pieces):
            for chunk in p.parts.pop(column, []):
                if column == "name":
                    chunk = name_maps[i][chunk]
                elif column == "tid":
                    chunk = tid_maps[i][chunk]
                elif column in ("ext_rows", "flop_rows"):
                    chunk = chunk + offsets[i]
                elif column in ("ts", "end") and p.base_us is not None and p.base_us != base:
                    chunk = chunk + (p.base_us - base)
                chunks.append(chunk)
        columns[column] = np.concatenate(chunks) if chunks else np.empty(0, _EMPTY.get(column, np.int64))
        del chunks
    table = Table(
        columns["kind"], columns["ts"], columns["end"], columns["name"], columns["tid"], columns["corr"],
        list(names), list(tids), columns["ext_rows"], columns["ext_ids"], base_us=base,
        flop_rows=columns["flop_rows"], flop_given=columns["flop_given"],
        flop_shapes=columns["flop_shapes"], flop_dtype=columns["flop_dtype"],
    )  # fmt: skip
    for p, offset in zip(pieces, offsets):
        table.copy_bytes.update({row + offset: n for row, n in p.copy_bytes.items()})
        table.call_copy_bytes.update(p.call_copy_bytes)
        table.op_precision.update(p.op_precision)
        table.kernel_groups.update({row + offset: group for row, group in p.kernel_groups.items()})
        for index, count in p.device_events.items():
            table.device_events[index] = table.device_events.get(index, 0) + count
        for peak in ("peak_allocated", "peak_reserved"):
            value = getattr(p, peak)
            if value is not None:
                setattr(table, peak, max(getattr(table, peak) or 0.0, value))
    return table


def _size(value: object) -> int:
    """A size written as a number or as text ("2560"); 0 where it is neither."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return 0
