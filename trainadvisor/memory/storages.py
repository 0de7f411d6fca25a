"""The storages one step's operators make, each from its allocation to its release: the bytes
live at each operator (the step's memory over time), the most they reach, and at that moment the
lines of the user's code whose tensors hold it. Measured through a dispatch mode on the counted
step only (never a timed one): each operator's new storages are logged with the first frame of
the user's code that called it, and a storage's release is seen when it is freed.

Parameters, gradients and optimizer state live at the step's start are logged too (named as
such, not by a line): they are part of what the peak holds."""

from __future__ import annotations

import os
import sys
import sysconfig
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

TIMELINE_POINTS = 240  # the chart's resolution: the most of each stretch of operators is kept
SITES_SHOWN = 5
_NOT_USER = tuple(
    os.path.normpath(p) + os.sep
    for p in {
        os.path.dirname(torch.__file__),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # trainadvisor
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    }
)


FSDP_BUFFERS = "FSDP's buffers (all-gather, reduce-scatter)"
# FSDP's code that allocates its communication buffers and gathered parameters (FSDP2's, in
# torch.distributed.fsdp._fully_shard or, before torch 2.6, _composable.fsdp; FSDP1's flat
# parameters): not the wrappers' forward, which calls the model's own code
_FSDP_CODE = ("_fsdp_collectives.py", "_fsdp_param.py", "_fsdp_param_group.py", "_flat_param.py")
# and FSDP1's reduce-scatter, in its runtime's functions (the rest of that file runs the hooks
# around the model's own code)
_FSDP_RUNTIME = (
    os.path.join("fsdp", "_runtime_utils.py"),
    {"_reduce_grad", "_get_reduce_scatter_tensors", "_accumulate_sharded_grad"},
)
_DISTRIBUTED = os.path.join(os.path.dirname(torch.__file__), "distributed") + os.sep


def user_site(depth: int = 2) -> str:
    """'train.py:42' of the innermost frame outside torch, trainadvisor, the standard library
    and installed packages; FSDP_BUFFERS where FSDP's own code made it on the way; '' when
    there is none (torch's own threads)."""
    frame = sys._getframe(depth)
    while frame is not None:
        name = os.path.normpath(frame.f_code.co_filename)
        if name.startswith(_DISTRIBUTED) and _fsdp_code(name, frame.f_code.co_name):
            return FSDP_BUFFERS
        if not name.startswith("<") and not name.startswith(_NOT_USER):
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""


def _fsdp_code(filename: str, function: str) -> bool:
    """Whether a frame of torch.distributed is FSDP's code that allocates its buffers."""
    runtime, functions = _FSDP_RUNTIME
    return filename.endswith(_FSDP_CODE) or (filename.endswith(runtime) and function in functions)


def _address(t: torch.Tensor) -> int | None:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # a tensor without storage
        return None


def _addresses(values: list[Any]) -> set[int | None]:
    """The storages of the tensors among an operator's arguments (one level of lists too)."""
    found: set[int | None] = set()
    for value in values:
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, torch.Tensor):
                found.add(_address(t))
    found.discard(None)
    return found


@dataclass
class _Allocation:
    size_bytes: int
    site: str
    made_at: int  # the operator's index that made it (0: live at the step's start)
    freed_at: int | None = None


class LiveStorages(TorchDispatchMode):
    """`device_type`: the storages that count ("cpu", or "cuda"). An allocation's `made_at`
    is the operator after which it is live; its `freed_at` the last one after which it still
    was (it was freed before the next)."""

    def __init__(
        self, device_type: str = "cpu", held: Callable[[], tuple[int, int]] | None = None, held_as: str = ""
    ) -> None:
        """`held`: bytes (and tensors) live outside the operators' storages, asked after each
        operator and counted as `held_as` (FSDP's gathered parameters: `sharded`)."""
        super().__init__()
        self.device_type = device_type
        self.ops = 0
        self.live_bytes = self.peak_bytes = 0
        self.log: list[_Allocation] = []
        self._live: dict[int, _Allocation] = {}
        self._held, self.held_as = held, held_as
        self.held: list[tuple[int, int]] = [(0, 0)]  # after each operator (index: the operator's)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        if self._held is not None:
            self.held.append(self._held())
        inputs: set[int | None] | None = None
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                inputs = _addresses([*args, *(kwargs or {}).values()]) if inputs is None else inputs
                if _address(t) not in inputs:  # a view of an input allocates nothing: a slice of a
                    self.track(t, "")  # data set held before the step is not the step's memory
        if self._held is not None:  # what it holds beside its operators' storages, after them
            self.peak_bytes = max(self.peak_bytes, self.live_bytes + self.held[-1][0])
        return out

    def track(self, t: torch.Tensor, named: str) -> None:
        """Log the tensor's storage once until it is freed; `named` in place of a user line."""
        try:
            storage = t.untyped_storage()
            address, size = storage.data_ptr(), storage.nbytes()
        except Exception:  # a tensor without storage (a fake, a sparse one): not counted
            return
        if address in self._live or not size:
            return
        made = _Allocation(size, named or user_site(3), self.ops)
        self._live[address] = made
        self.log.append(made)
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes + (self.held[-1][0] if self._held else 0))

        def freed(address: int = address, made: _Allocation = made) -> None:
            made.freed_at = self.ops
            self.live_bytes -= made.size_bytes
            if self._live.get(address) is made:
                del self._live[address]

        weakref.finalize(storage, freed)

    def timeline(self) -> tuple[list[int], int]:
        """Bytes live after each operator, the most of each of at most TIMELINE_POINTS
        stretches, and the index of the operator at the peak."""
        change = [0] * (self.ops + 2)
        for a in self.log:
            change[a.made_at] += a.size_bytes
            if a.freed_at is not None:  # freed before the next operator: live after its own
                change[a.freed_at + 1] -= a.size_bytes
        live, series = 0, []
        for op, delta in enumerate(change[: self.ops + 1]):
            live += delta
            series.append(live + (self.held[op][0] if op < len(self.held) else 0))
        peak_at = max(range(len(series)), key=series.__getitem__) if series else 0
        stretch = max(1, -(-len(series) // TIMELINE_POINTS))
        points = [max(series[i : i + stretch]) for i in range(0, len(series), stretch)]
        return points, peak_at

    def sites_at(self, op: int) -> list[dict[str, Any]]:
        """What was live after operator `op`, by the line that made it (largest first)."""
        by_site: dict[str, list[int]] = {}
        for a in self.log:
            if a.made_at <= op and (a.freed_at is None or op <= a.freed_at):
                entry = by_site.setdefault(a.site or "torch internals", [0, 0])
                entry[0] += a.size_bytes
                entry[1] += 1
        if op < len(self.held) and self.held[op][0]:
            by_site[self.held_as] = [self.held[op][0], self.held[op][1]]
        ranked = sorted(by_site.items(), key=lambda kv: -kv[1][0])
        return [{"site": s, "bytes": b, "tensors": n} for s, (b, n) in ranked[:SITES_SHOWN]]
