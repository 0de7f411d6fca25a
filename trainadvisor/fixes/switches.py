"""Run-time mechanisms that several fixes' switches share, installed in the training process
before the script runs: autocast around outermost module calls (`amp`), the optimizer step
control of fp16 loss scaling and gradient accumulation (`amp`, `grad-accumulation`), and
non-blocking copies of pinned DataLoader batches (every fix that pins memory). Each is undone by
the recorder's `uninstall` (torch as it was before)."""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch


class Patcher(Protocol):
    """What a switch needs of the recorder (see `training.hooks.Recorder`)."""

    loss_transform: Callable[[torch.Tensor], torch.Tensor] | None

    def patch(self, owner: Any, name: str, replacement: Any) -> None: ...

    def on_uninstall(self, undo: Callable[[], None]) -> None: ...

    def optimizer_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None: ...


def grad_scaler() -> Any:
    """A GradScaler for the GPU in use (the CPU's where none is). torch.amp.GradScaler(device)
    came in torch 2.3; before it, only torch.cuda.amp.GradScaler (CUDA and ROCm alike)."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda" if torch.cuda.is_available() else "cpu")
    return torch.cuda.amp.GradScaler()


def _unscaled(scaler: Any, optimizer: torch.optim.Optimizer) -> bool:
    try:
        from torch.amp.grad_scaler import OptState
    except ImportError:  # torch < 2.3 keeps the scaler in torch.cuda.amp
        from torch.cuda.amp.grad_scaler import OptState  # type: ignore[no-redef]

    return scaler._per_optimizer_states[id(optimizer)]["stage"] is OptState.UNSCALED


def install_step_control(recorder: Patcher, scaler: Any, accumulate: int) -> None:
    """fp16 loss scaling and gradient accumulation, for a script with one optimizer.

    The loss is multiplied by the scaler's scale and divided by `accumulate` before backward.
    Every optimizer built gets an instance-level `step` method (bound, so an LR scheduler can
    wrap it as it wraps the class's) that applies the update only on every `accumulate`-th call,
    and with a scaler first unscales the gradients and skips the update (lowering the scale)
    when they overflowed, as `GradScaler.step` does; `zero_grad` (of the optimizer or a module)
    clears gradients only when an update has just been applied, so the micro-batches in between
    add up. Gradient clipping unscales first (`torch.amp`'s recipe): clipping scaled gradients
    would shrink every update by the scale."""
    calls = [0]
    built: list[torch.optim.Optimizer] = []

    def transform(loss: torch.Tensor) -> torch.Tensor:
        scaled = scaler.scale(loss) if scaler is not None else loss
        return scaled / accumulate if accumulate > 1 else scaled

    recorder.loss_transform = transform
    original_init = torch.optim.Optimizer.__dict__["__init__"]

    def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        built.append(self)
        step, zero_grad = self.step, self.zero_grad

        def controlled_step(optimizer: torch.optim.Optimizer, *step_args: Any, **step_kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] % accumulate:
                return None  # a micro-batch: let the gradients add up
            if scaler is None:
                return step(*step_args, **step_kwargs)
            if not _unscaled(scaler, optimizer):
                scaler.unscale_(optimizer)
            overflowed = any(v.item() for v in scaler._found_inf_per_device(optimizer).values())
            result = None if overflowed else step(*step_args, **step_kwargs)
            scaler.update()
            if overflowed:
                recorder.optimizer_step(optimizer)  # a skipped update still ends the training step
            return result

        def controlled_zero_grad(
            _optimizer: torch.optim.Optimizer, *zero_args: Any, **zero_kwargs: Any
        ) -> None:
            if calls[0] % accumulate == 0:
                zero_grad(*zero_args, **zero_kwargs)

        self.step = types.MethodType(controlled_step, self)  # type: ignore[method-assign]
        self.zero_grad = types.MethodType(controlled_zero_grad, self)  # type: ignore[method-assign]

    recorder.patch(torch.optim.Optimizer, "__init__", init)
    if scaler is not None:
        _unscale_before_clipping(recorder, scaler, built, lambda: (calls[0] + 1) % accumulate == 0)
    if accumulate > 1:
        _module_zero_grad_on_updates(recorder, lambda: calls[0] % accumulate == 0)


def _module_zero_grad_on_updates(recorder: Patcher, updated: Callable[[], bool]) -> None:
    """`module.zero_grad()` clears gradients only right after an update was applied."""
    original = torch.nn.Module.__dict__["zero_grad"]

    def module_zero_grad(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        if updated():
            original(self, *args, **kwargs)

    recorder.patch(torch.nn.Module, "zero_grad", module_zero_grad)


def _unscale_before_clipping(
    recorder: Patcher, scaler: Any, optimizers: list[torch.optim.Optimizer], updating: Callable[[], bool]
) -> None:
    """`clip_grad_norm_`/`clip_grad_value_` see true gradients: the optimizer's gradients are
    unscaled first when the next `step()` applies an update (once; `step` then skips it)."""
    import torch.nn.utils.clip_grad as clip_grad

    def unscale() -> None:
        if updating():
            for optimizer in optimizers:
                if not _unscaled(scaler, optimizer):
                    scaler.unscale_(optimizer)

    for module in (torch.nn.utils, clip_grad):
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            original = getattr(module, name)

            def clip(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
                unscale()
                return __original(*args, **kwargs)

            recorder.patch(module, name, clip)


# What the switches did in this process, counted: a measuring window reads the counts when its
# timed steps begin and after its last step, so the report shows each switch in effect in its
# window (bf16 outputs under autocast, pinned batches copied without blocking), not only installed.
SWITCHED: dict[str, int] = {"autocast_outputs": 0, "non_blocking_copies": 0}


def _to_fp32(value: Any, dtype: torch.dtype) -> Any:
    """Autocast's low-precision outputs as fp32 (tensors inside tuples, lists and mappings too):
    a loss computed outside a module then runs in fp32, as torch.amp recommends, not in bf16."""
    if isinstance(value, torch.Tensor):
        if value.dtype != dtype:
            return value
        SWITCHED["autocast_outputs"] += 1
        return value.float()
    if isinstance(value, tuple):
        items = [_to_fp32(v, dtype) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, list):
        return [_to_fp32(v, dtype) for v in value]
    if isinstance(value, Mapping):
        converted = {k: _to_fp32(v, dtype) for k, v in value.items()}
        try:
            return type(value)(converted)  # type: ignore[call-arg]  # dict, OrderedDict, ModelOutput
        except Exception:  # a mapping that cannot be built from a dict: change it in place
            for key, item in converted.items():
                value[key] = item  # type: ignore[index]
            return value
    return value


def install_autocast(recorder: Patcher, dtype: torch.dtype) -> None:
    """Run every outermost module call (the model's forward, a loss module) under autocast, and
    hand its floating-point outputs back in fp32. Backward runs outside autocast, as torch.amp
    recommends: its ops take the forward's dtypes."""
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    original_call = torch.nn.Module.__call__
    state = threading.local()  # per thread: DataParallel runs its replicas in threads of their own

    def call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if getattr(state, "depth", 0):
            return original_call(self, *args, **kwargs)
        state.depth = 1
        try:
            with torch.autocast(device_type, dtype=dtype):
                output = original_call(self, *args, **kwargs)
        finally:
            state.depth = 0
        return _to_fp32(output, dtype)

    recorder.patch(torch.nn.Module, "__call__", call)


def install_non_blocking_copies(recorder: Patcher) -> None:
    """Make `.to('cuda')`/`.cuda()` of pinned DataLoader batches non-blocking.

    Only tensors the DataLoader handed out are touched (`Recorder.data_wait` marks them): the
    pin-memory thread gives each batch a fresh pinned buffer, so nothing writes the source while
    the copy is in flight. A pinned staging buffer the script refills itself keeps its blocking
    copy. `to`/`cuda` are inherited from torch._C.TensorBase: the patch shadows them on Tensor."""
    original_to = torch.Tensor.to
    original_cuda = torch.Tensor.cuda

    def non_blocking(self: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if getattr(self, "_trainadvisor_batch", False) and "non_blocking" not in kwargs and len(args) < 2:
            kwargs["non_blocking"] = True
            SWITCHED["non_blocking_copies"] += 1
        return kwargs

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return original_to(self, *args, **non_blocking(self, args, kwargs))

    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return original_cuda(self, *args, **non_blocking(self, args, kwargs))

    recorder.patch(torch.Tensor, "to", to)
    recorder.patch(torch.Tensor, "cuda", cuda)
