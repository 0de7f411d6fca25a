"""FLOPs of one training step, counted as it runs: torch's own FLOP formulas
(`torch.utils.flop_counter`: matmuls, convolutions, attention, forward and backward) over
every operator the step dispatches, and beside them the dtype each counted operator's inputs
had (under autocast the matmuls see bf16 or fp16 tensors), so the peak the step is measured
against is the one of the dtype its matmuls ran in.

Counting runs the step's operators through a Python dispatch mode: that step is slow and is
never a timed one (the window counts the profiler's warm-up step). Elementwise work and the
optimizer's updates count nothing, as in every MFU convention; a step whose work runs in
compiled code (torch.compile's kernels, CUDA graph replays) dispatches no operators to count,
and is reported as not counted rather than as zero. Counting never breaks the step: a failure
to enter or leave the mode is recorded as the reason nothing was counted."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

try:  # torch >= 2.1
    from torch.utils.flop_counter import FlopCounterMode, flop_registry
except ImportError:  # pragma: no cover - older torch: nothing to count with
    FlopCounterMode = None  # type: ignore[assignment,misc]
    flop_registry = {}


def _cpu_attention() -> dict[Any, Any]:
    """Formulas torch's registry lacks: the CPU's flash attention, forward and backward (the
    same counts as the GPU's flash attention; arguments in the same order). Shape formulas,
    as FlopCounterMode's custom_mapping takes them."""
    import torch.utils.flop_counter as counter

    forward = getattr(counter, "sdpa_flop_count", None)
    backward = getattr(counter, "sdpa_backward_flop_count", None)
    ops = torch.ops.aten
    if forward is None or backward is None or not hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu"):
        return {}

    def cpu_forward(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return int(forward(q, k, v))

    def cpu_backward(g: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return int(backward(g, q, k, v))

    mapping: dict[Any, Any] = {ops._scaled_dot_product_flash_attention_for_cpu: cpu_forward}
    if hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        mapping[ops._scaled_dot_product_flash_attention_for_cpu_backward] = cpu_backward
    return mapping


if FlopCounterMode is not None:

    class _Counter(FlopCounterMode):  # type: ignore[misc,valid-type]
        """torch's counter, whose formula errors (an operator with arguments its formula does
        not expect) count nothing instead of raising inside the user's step."""

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            try:
                return super()._count_flops(func_packet, out, args, kwargs)
            except Exception:
                return out


# A convolution's FLOPs are kept apart from the matmuls' (`CONV` + dtype): cuDNN runs float32
# convolutions in TF32 by default, under its own flag, whatever the matmuls' is.
CONV = "conv:"


class _Dtypes(TorchDispatchMode):
    """The FLOPs of each operator torch has a formula for, by the dtype of its first tensor
    input (a convolution's under `CONV` + dtype). Entered inside FlopCounterMode, which counts
    the total (decompositions and higher-order operators included); this one only splits it by
    dtype."""

    def __init__(self, extra: dict[Any, Any]) -> None:
        super().__init__()
        self.flops: dict[str, float] = defaultdict(float)
        self.extra = {op: _on_shapes(formula) for op, formula in extra.items()}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = getattr(func, "_overloadpacket", None)
        formula = flop_registry.get(packet) or self.extra.get(packet)
        if formula is not None:
            dtype = next((str(a.dtype) for a in args if isinstance(a, torch.Tensor)), None)
            if dtype is not None and "convolution" in str(packet):
                dtype = CONV + dtype
            if dtype is not None:
                try:
                    self.flops[dtype] += float(formula(*args, **kwargs, out_val=out))
                except Exception:  # a formula that cannot read these arguments: no split
                    pass
        return out


def _on_shapes(formula: Any) -> Any:
    """A shape formula called as the registry's are: with tensors, and `out_val`."""

    def on_tensors(*args: Any, out_val: Any = None, **kwargs: Any) -> Any:
        shapes = [a.shape if isinstance(a, torch.Tensor) else a for a in args]
        return formula(*shapes, **kwargs)

    return on_tensors


def compiled_frames() -> int:
    """How many frames torch.compile has compiled in this process (0 where dynamo never ran)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    stats = getattr(utils, "counters", {}).get("stats", {})
    return int(stats.get("unique_graphs", 0))


class Recomputes:
    """Counts, while entered, the recomputations of activation checkpointing
    (`torch.utils.checkpoint`): non-reentrant checkpoints recompute under a
    `_recomputation_hook`, reentrant ones in `CheckpointFunction.backward`. FLOPs counted over
    a step that recomputes are hardware FLOPs: its utilisation is HFU, not MFU. Both are looked
    up by name when a checkpoint runs, so a stand-in that counts, put in for one step and then
    taken out, sees every one; a torch without them counts none."""

    def __init__(self) -> None:
        self.count = 0
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Recomputes:
        try:
            import torch.utils.checkpoint as checkpoint
        except ImportError:  # pragma: no cover - a torch without checkpointing
            return self
        recomputes = self
        hook = getattr(checkpoint, "_recomputation_hook", None)
        if isinstance(hook, type):

            class Counted(hook):  # type: ignore[misc,valid-type]
                def __init__(self, *args: Any, **kwargs: Any) -> None:
                    recomputes.count += 1
                    super().__init__(*args, **kwargs)

            self._swap(checkpoint, "_recomputation_hook", Counted)
        function = getattr(checkpoint, "CheckpointFunction", None)
        backward = getattr(function, "backward", None)
        if backward is not None:

            def counted(ctx: Any, *args: Any) -> Any:
                recomputes.count += 1
                return backward(ctx, *args)

            self._swap(function, "backward", staticmethod(counted))
        return self

    def _swap(self, owner: Any, name: str, value: Any) -> None:
        self._undo.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


class StepFlops:
    """Counts one step: `start()` at the boundary before it, `stop()` at the boundary after.
    `facts()` is what the run records: `flops_per_step` and `flops_by_dtype`, or `status`
    saying why nothing was counted."""

    def __init__(self) -> None:
        self._counter: Any = None
        self._dtypes: _Dtypes | None = None
        self._recomputes: Recomputes | None = None
        self.recomputed = 0  # checkpointed activations recomputed in the counted step
        self.status = "not counted"
        self.flops_per_step: float | None = None
        self.flops_by_dtype: dict[str, float] = {}

    def start(self) -> None:
        if FlopCounterMode is None:
            self.status = "not counted: this torch has no torch.utils.flop_counter"
            return
        if compiled_frames():
            self.status = "not counted: the step runs code torch.compile compiled"
            return
        try:
            try:
                counter = _Counter(display=False, custom_mapping=_cpu_attention())
            except TypeError:  # a torch whose counter takes no custom formulas
                counter = _Counter(display=False)
            counter.__enter__()
            self._counter = counter
            dtypes = _Dtypes(_cpu_attention())
            dtypes.__enter__()
            self._dtypes = dtypes
            self._recomputes = Recomputes().__enter__()
        except Exception as exc:
            self.status = f"not counted: {type(exc).__name__}: {exc}"
            self._leave()

    def stop(self) -> None:
        if self._counter is None:
            return
        counter, dtypes = self._counter, self._dtypes
        if not self._leave():
            return
        total = float(counter.get_total_flops())
        if total <= 0:
            self.status = "not counted: the step dispatched no matmul, convolution or attention"
            return
        self.flops_per_step = total
        self.flops_by_dtype = dict(dtypes.flops) if dtypes is not None else {}
        self.status = "counted"

    def _leave(self) -> bool:
        """Leave both modes (innermost first); False where leaving failed."""
        ok = True
        if self._recomputes is not None:
            self._recomputes.__exit__(None, None, None)
            self.recomputed, self._recomputes = self._recomputes.count, None
        for mode in (self._dtypes, self._counter):
            if mode is None:
                continue
            try:
                mode.__exit__(None, None, None)
            except Exception as exc:
                self.status, ok = f"not counted: {type(exc).__name__}: {exc}", False
        self._dtypes = self._counter = None
        return ok

    def facts(self) -> dict[str, Any]:
        if self.flops_per_step is None:
            return {"flops_status": self.status}
        return {
            "flops_status": self.status,
            "flops_per_step": self.flops_per_step,
            "flops_by_dtype": self.flops_by_dtype,
            **({"flops_recomputed": self.recomputed} if self.recomputed else {}),
        }


# what this process measured, by dtype and torch threads: the benchmark takes half a second of
# matmuls, and a process that closes several windows (in-process trials, `@advise`) runs it once
_MEASURED_NOW: dict[tuple[str, int], Any] = {}
# where the runs of one `profile` keep what the first of them measured (`share_cpu_peak`)
_shared_file: Path | None = None


def share_cpu_peak(path: str | None) -> None:
    """Read the CPU peak from `path` where an earlier run of this profile measured it (the same
    dtype and torch threads), and write it there where this run measures it: its trials and its
    confirmation run are not given half a second of matmuls each, and their MFU has the
    baseline's denominator. None: this process measures its own."""
    global _shared_file
    _shared_file = Path(path) if path else None


def measure_cpu_peak_facts(flops_by_dtype: dict[str, float]) -> dict[str, Any]:
    """This CPU's matmul peak in the dtype the step's matmuls mostly ran in (a short benchmark:
    a CPU has no datasheet figure this tool could trust), as the run records it. Measured once a
    process for each dtype and thread count: later windows of the process are given the first
    one's figure, not half a second more of matmuls in the user's process."""
    from trainadvisor.compute.peaks import best_cpu_peak, measure_cpu_peak, share_peak, shared_peak

    by_dtype: dict[str, float] = {}
    for key, flops in flops_by_dtype.items():  # a convolution's FLOPs count for its dtype too
        by_dtype[key.removeprefix(CONV)] = by_dtype.get(key.removeprefix(CONV), 0.0) + flops
    name = max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else "torch.float32"
    dtype = getattr(torch, name.removeprefix("torch."), torch.float32)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        dtype = torch.float32
    once = (str(dtype), torch.get_num_threads())
    shared = _shared_file
    try:
        peak = _MEASURED_NOW.get(once) or (shared_peak(shared, *once) if shared else None)
        if peak is None:
            peak = measure_cpu_peak(dtype)
            if shared:
                share_peak(shared, *once, peak)
    except Exception as exc:  # a dtype this CPU cannot multiply: no peak, no MFU
        return {"status": f"not measured: {type(exc).__name__}: {exc}"}
    _MEASURED_NOW[once] = peak
    best = best_cpu_peak(peak)
    return {
        "flops_per_s": best.flops_per_s,
        "dtype": best.dtype,
        "device": best.device,
        "source": best.source,
        "how": best.how,
        "measured_now_flops_per_s": peak.flops_per_s,
    }
