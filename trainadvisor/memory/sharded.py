"""FSDP's memory on one rank (39.5): parameters, gradients and optimizer state as the rank holds
them (the local shards of FSDP2's DTensors: a DTensor over two ranks or more has no storage of
its own to count), and the parameters FSDP gathers for a unit's forward and backward, which
its own storage resizing hides from the step's operator log: at each operator, the gathered
bytes of the units that are unsharded then.

Read only where the script imported FSDP and started a process group, and never at the cost of
the run: a torch whose FSDP internals differ gives no gathered figure, not an error."""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Callable
from typing import Any

import torch

GATHERED = "gathered parameters (FSDP)"


def local(t: Any) -> Any:
    """A DTensor's local shard (what this rank holds); any other tensor as it is."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t


def gathered_bytes() -> Callable[[], tuple[int, int]] | None:
    """A function giving, when called, the bytes of the FSDP2 units' parameters gathered at
    that moment and how many parameters; None where no FSDP2 unit is alive (or FSDP's
    internals are not as expected)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    try:
        groups = _groups(fsdp)
    except Exception:  # noqa: BLE001 - an optional figure; never the run's failure
        return None
    if not groups:
        return None

    def now() -> tuple[int, int]:
        try:
            gathered = [(size, count) for group, size, count in groups if group.is_unsharded]
        except Exception:  # noqa: BLE001 - as above
            return 0, 0
        return sum(size for size, _ in gathered), sum(count for _, count in gathered)

    return now


def _groups(fsdp: Any) -> list[tuple[Any, int, int]]:
    """Each FSDP2 unit's parameter group and the bytes of its parameters gathered whole (in
    the dtype they are gathered in: the mixed-precision policy's, else their own)."""
    unit_type = getattr(fsdp, "FSDPModule", None)
    if unit_type is None:
        return []
    found = []
    for unit in [o for o in gc.get_objects() if issubclass(type(o), unit_type)]:
        try:
            group = unit._get_fsdp_state()._fsdp_param_group
            if group is None:
                continue
            size = 0
            for param in group.fsdp_params:
                dtype = getattr(param, "param_dtype", None) or param.sharded_param.dtype
                size += math.prod(param._orig_size) * torch.empty((), dtype=dtype).element_size()
        except (AttributeError, RuntimeError, TypeError):  # a unit of another make: not counted
            continue
        found.append((group, size, len(group.fsdp_params)))
    return found
