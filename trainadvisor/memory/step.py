"""What fills one training step's peak memory, measured on the step the window counts (the
profiler's warm-up step, never a timed one): parameters, gradients and optimizer state exactly
(the optimizer's tensors, each storage once), activations kept for backward (every tensor
autograd saves during the step, through `saved_tensors_hooks`, parameters excluded), and the
rest of the peak (temporaries; on a GPU also what the allocator keeps cached is beside it).

The peak: on a GPU the allocator's own (`max_memory_allocated` over the step, after
`reset_peak_memory_stats`); on a CPU, which keeps no statistics, the most that training's tensors
held at once: those live at the step's start that training owns (parameters, gradients,
optimizer state) and each storage the step's operators made, each counted until it is freed.
Over the step, `memory.storages` logs every storage training holds (on a GPU too): the step's
memory after each operator (`timeline_bytes`) and the lines of the user's code whose tensors
hold the peak (`peak_sites`). Measuring never breaks the step: a failure records why nothing
was measured."""

from __future__ import annotations

from typing import Any

import torch

from trainadvisor.memory import sharded
from trainadvisor.memory.sharded import local
from trainadvisor.memory.storages import LiveStorages


def _storages(tensors: list[torch.Tensor]) -> dict[int, int]:
    """Each distinct storage's bytes, by its address."""
    found: dict[int, int] = {}
    for t in tensors:
        try:
            storage = t.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
        except Exception:  # a tensor without storage (a fake, a sparse one): not counted
            continue
    return found


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[list[Any], list[Any], list[Any]]:
    """(parameters, their gradients, the optimizer's state tensors)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [local(p.grad) for p in params if p.grad is not None]
    state = [local(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [local(p) for p in params], grads, state


CPU_PEAK = "the most training's tensors held at once (parameters, gradients, optimizer state, the step's own)"


class StepMemory:
    """`start(optimizer, device)` at the boundary before the counted step, `stop()` after it;
    `facts()` is what the run records (`memory`)."""

    def __init__(self) -> None:
        self.status = "not measured"
        self._optimizer: torch.optim.Optimizer | None = None
        self._device: int | None = None
        self._saved: dict[int, int] = {}
        self._hooks: Any = None
        self._live: LiveStorages | None = None
        self.result: dict[str, Any] = {}

    def start(self, optimizer: torch.optim.Optimizer | None, device: int | None) -> None:
        if optimizer is None:
            self.status = "not measured: no optimizer stepped before the counted step"
            return
        self._optimizer, self._device = optimizer, device
        params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        try:
            if device is not None:
                torch.cuda.reset_peak_memory_stats(device)
            gathered = sharded.gathered_bytes()
            self._live = LiveStorages("cpu" if device is None else "cuda", gathered, sharded.GATHERED)
            params_, grads, state = optimizer_tensors(optimizer)
            for named, tensors in (("parameters", params_), ("gradients", grads), ("optimizer state", state)):
                for tensor in tensors:  # live until freed (old gradients are)
                    self._live.track(tensor, named)
            self._live.__enter__()
            weights = optimizer_tensors(optimizer)[0]
            self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack(params, weights), lambda t: t)
            self._hooks.__enter__()
        except Exception as exc:
            self.status = f"not measured: {type(exc).__name__}: {exc}"
            self._leave()

    def _pack(self, params: set[int], weights: list[torch.Tensor]) -> Any:
        """What autograd saves, kept as activations unless it is a parameter: the parameter
        itself, a view of its storage (a Linear saves `weight.t()`), or autocast's low-precision
        copy of it (a tensor of a float32 parameter's shape, or its transpose's, in bf16/fp16:
        a cast cached for the forward, not an activation checkpointing could free)."""
        storages = set(_storages(weights))
        shapes = {tuple(w.shape) for w in weights if w.dtype == torch.float32}
        shapes |= {s[::-1] for s in shapes}
        low = (torch.bfloat16, torch.float16)

        def pack(t: torch.Tensor) -> torch.Tensor:
            if id(t) in params or isinstance(t, torch.nn.Parameter):
                return t
            if isinstance(getattr(t, "_base", None), torch.nn.Parameter):
                return t  # a view of a parameter FSDP gathered (a Linear saves `weight.t()`)
            found = _storages([t])
            if found.keys() & storages:
                return t  # a view of a parameter
            if t.dtype in low and tuple(t.shape) in shapes and t.dim() >= 2:
                return t  # autocast's copy of a weight
            self._saved.update(found)
            return t

        return pack

    def _leave(self) -> bool:
        ok = True
        for mode in (self._hooks, self._live):
            if mode is None:
                continue
            try:
                mode.__exit__(None, None, None)
            except Exception as exc:
                self.status, ok = f"not measured: {type(exc).__name__}: {exc}", False
        self._hooks = None
        return ok

    def stop(self) -> None:
        if self._optimizer is None or self._hooks is None:
            return
        live = self._live
        if not self._leave():
            return
        params, grads, state = optimizer_tensors(self._optimizer)
        exact = {
            "parameters": sum(_storages(params).values()),
            "gradients": sum(_storages(grads).values()),
            "optimizer_state": sum(_storages(state).values()),
        }
        if self._device is not None:
            peak = int(torch.cuda.max_memory_allocated(self._device))
            source = "the CUDA allocator's peak over the step"
        else:
            peak = live.peak_bytes if live is not None else 0
            source = CPU_PEAK
        timeline, peak_at = live.timeline() if live is not None else ([], 0)
        if live is not None and len(live.held) > 1:  # FSDP: its gathered parameters at the peak
            exact["gathered_parameters"] = live.held[peak_at][0] if peak_at < len(live.held) else 0
        self.result = breakdown(peak, exact, sum(self._saved.values()), source)
        if live is not None:
            self.result.update(timeline_bytes=timeline, peak_sites=live.sites_at(peak_at))
        self.status = "measured"
        self._optimizer = None

    def facts(self) -> dict[str, Any]:
        return {"status": self.status, **self.result}


def breakdown(peak_bytes: int, exact: dict[str, int], activations_bytes: int, source: str) -> dict[str, Any]:
    """The peak split into its parts; `other` is what the peak holds beyond the parts counted
    (temporaries), never below zero: where the parts add up to more (gradients counted at
    the step's end, activations freed before it), the note says so."""
    parts = {**exact, "activations": activations_bytes}
    counted = sum(parts.values())
    parts["other"] = max(peak_bytes - counted, 0)
    facts: dict[str, Any] = {"peak_bytes": peak_bytes, "breakdown": parts, "peak_source": source}
    if counted > peak_bytes:
        facts["note"] = (
            f"the parts add up to {counted - peak_bytes} bytes more than the peak: not all of "
            "them were alive at the same moment"
        )
    return facts
