"""Instrumentation installed inside the user's process (see `_child`).

Steps are found through torch's global optimizer step hook (or `trainadvisor.step()`); the
DataLoader's iterator `__next__` is timed; the scalar `.backward()` is called on is kept as the
step's loss. After `warmup` steps, `steps` steps are timed with clocks alone, then
`profile_steps` more are traced with `torch.profiler` (whose overhead would bias the timing).
Then the measurements are written and, unless asked to run to the end, the script is stopped.
Outside the window the hooks cost about 10-20 us a step (benchmarks/hook_cost.py)."""

from __future__ import annotations

import gzip
import inspect
import json
import multiprocessing
import os
import pickle
import platform
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from trainadvisor import _serial
from trainadvisor._config import ChildConfig
from trainadvisor.model import DeviceInfo, LoaderInfo, RawRun, StepRecord

ACTIVE: Recorder | None = None

# DataLoader arguments an override may set, and the values that need workers.
_WORKER_ONLY = ("persistent_workers", "prefetch_factor")


class WindowComplete(BaseException):
    """Raised out of the step hook to stop the script once the window is measured.

    A BaseException, so a training loop's `except Exception` does not swallow it."""


class Recorder:
    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self.steps_seen = 0
        self.manual = False
        self.first_optimizer: int | None = None
        self.in_window = False
        self.window_done = False
        self.last_mark = time.perf_counter()
        self.window_t0 = 0.0
        self.window_start_unix_s: float | None = None
        self.data_wait_s = 0.0
        self.samples: int | None = None
        self.loss: torch.Tensor | None = None
        self.losses: list[torch.Tensor | None] = []  # by step index, up to the window's end
        self.records: list[StepRecord] = []
        self.loaders: list[LoaderInfo] = []
        self.step_batches: list[str] = []  # fingerprints of the batches drawn in this step
        self.batch_fingerprints: list[str | None] = []  # by step index, up to the window's end
        self.profiler: torch.profiler.profile | None = None
        self.result: RawRun | None = None
        self.optimizer: torch.optim.Optimizer | None = None  # the one whose steps are counted
        self.data_parallel_modules = 0
        self.runtime: dict[str, Any] = {}
        self.optimizer_ids: set[int] = set()
        self.backward_at: float | None = None  # when the step's first backward() was called
        # What a fix does to the loss before backward (fp16 loss scaling, 1/k for accumulation).
        self.loss_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._undo: list[Callable[[], None]] = []

    def patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original))

    def uninstall(self) -> None:
        """Put back everything `install` changed: torch is as it was before."""
        global ACTIVE
        while self._undo:
            self._undo.pop()()
        if ACTIVE is self:
            ACTIVE = None

    # ---- step boundaries ----

    def optimizer_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.optimizer_ids.add(id(optimizer))
        if self.manual:
            return
        # With several optimizers (GANs, multi-task) the first one to step defines the step.
        if self.first_optimizer is None:
            self.first_optimizer = id(optimizer)
            self.optimizer = optimizer
        if id(optimizer) == self.first_optimizer:
            self.boundary()

    def manual_step(self) -> None:
        if not self.manual and self.steps_seen and not self.in_window and not self.window_done:
            # Optimizer steps were counted before the first trainadvisor.step(): count afresh,
            # so a loop that does both is not counted twice.
            self.steps_seen = 0
            self.losses.clear()
            self.batch_fingerprints.clear()
        self.manual = True
        self.boundary()

    def boundary(self) -> None:
        now = time.perf_counter()
        self.steps_seen += 1
        if not self.window_done:
            self.losses.append(self.loss)
            self.batch_fingerprints.append("|".join(self.step_batches) or None)
        self.step_batches = []
        if self.in_window:
            self.records.append(
                StepRecord(
                    index=self.steps_seen - 1,
                    start_ms=(self.last_mark - self.window_t0) * 1e3,
                    step_ms=(now - self.last_mark) * 1e3,
                    data_wait_ms=self.data_wait_s * 1e3,
                    samples=self.samples,
                    profiled=self.profiler is not None,
                    pre_backward_ms=(self.backward_at - self.last_mark) * 1e3 if self.backward_at else None,
                )
            )
            recorded = len(self.records)
            if recorded == self.config.steps + self.config.profile_steps:
                self.end_window()
            elif recorded == self.config.steps:
                self.start_profiler()
            elif self.profiler is not None:
                self.profiler.step()
        elif not self.window_done and self.steps_seen == self.config.warmup:
            self.start_window()
        self.data_wait_s = 0.0
        self.samples = None
        self.loss = None
        self.backward_at = None
        self.last_mark = time.perf_counter()
        if self.window_done and self.config.stop_after_window:
            raise WindowComplete()

    def start_window(self) -> None:
        if self.config.runtime_overrides:
            _apply_flags(self.config.runtime_overrides)  # again, in case the script reset them
        self.runtime = _flags(self)
        self.in_window = True
        self.window_start_unix_s = time.time()
        self.window_t0 = time.perf_counter()

    def start_profiler(self) -> None:
        """One profiler session per process (a second session in the same process crashes
        torch 2.13 now and then, at exit or when it starts). Python stacks only when asked
        (`with_stack`, the separate sites run): the Python tracer adds about 15% host time."""
        if self.config.trace_file is not None and self.config.profile_steps > 0:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(
                activities=activities,
                schedule=lambda _step: torch.profiler.ProfilerAction.RECORD,
                with_stack=self.config.with_stack,
            )
            self.profiler.start()

    def end_window(self) -> None:
        self.in_window = False
        self.window_done = True
        self.write("window_complete", exit_code=None, error=None)

    # ---- data loading ----

    def data_wait(self, seconds: float, batch: Any) -> None:
        self.data_wait_s += seconds
        if self.window_done:
            return
        tensors = list(batch_tensors(batch))
        if self.config.non_blocking_h2d:
            for tensor in tensors:
                if tensor.is_pinned():
                    tensor._trainadvisor_batch = True  # type: ignore[attr-defined]
        host = [_fingerprint(t) for t in tensors if t.device.type == "cpu"]
        if host:
            self.step_batches.append(",".join(host))
        if self.in_window and tensors and tensors[0].dim() > 0:
            self.samples = (self.samples or 0) + int(tensors[0].shape[0])

    def loss_candidate(self, tensor: torch.Tensor) -> None:
        if self.backward_at is None:
            self.backward_at = time.perf_counter()
        if not self.window_done and tensor.numel() == 1:
            self.loss = tensor.detach()

    # ---- results ----

    def write(self, status: str, exit_code: int | None, error: str | None) -> None:
        """Save the measurements. Called once when the window ends and again when the script
        exits (then only the step count and the exit are updated). Never raises: a failure of
        trainadvisor must not break the user's training."""
        try:
            if self.result is None:
                self.result = self._collect(status, exit_code, error)
            else:
                self.result.steps_seen = self.steps_seen
                self.result.exit_code, self.result.error = exit_code, error
            self.result.ended_unix_s = time.time()
            _serial.save_json(self.result, Path(self.config.result_file))
        except Exception as exc:  # report it, let training go on
            print(f"[trainadvisor] could not record the measurements: {exc!r}", file=sys.stderr)

    def _collect(self, status: str, exit_code: int | None, error: str | None) -> RawRun:
        if self.profiler is not None:
            self.profiler.stop()
            export_trace(self.profiler, Path(str(self.config.trace_file)))
            self.profiler = None
        # One host sync for all steps, after the window: the loop itself never waits for it.
        losses = [float(loss.float().item()) if loss is not None else None for loss in self.losses]
        for record in self.records:
            record.loss = losses[record.index]
        trace = self.config.trace_file
        self.runtime.update(optimizer_facts(self.optimizer))
        self.runtime["optimizers"] = len(self.optimizer_ids)
        if self.runtime.get("cuda_used"):
            self.runtime["cuda_memory"] = cuda_memory()
        return RawRun(
            label=self.config.label,
            status=status,
            exit_code=exit_code,
            error=error,
            warmup_steps=self.config.warmup,
            window_steps=self.config.steps,
            profile_steps=self.config.profile_steps,
            steps_seen=self.steps_seen,
            steps=self.records,
            loaders=self.loaders,
            device=device_info(),
            window_start_unix_s=self.window_start_unix_s,
            batch_fingerprints=self.batch_fingerprints,
            losses=losses,
            trace_file=trace if trace and Path(trace).exists() else None,
            runtime=self.runtime,
        )


# Optimizers with a fused (single-kernel) implementation in torch.
_FUSABLE = ("Adam", "AdamW", "SGD", "Adagrad")


def _flags(recorder: Recorder) -> dict[str, Any]:
    return torch_facts(recorder.data_parallel_modules, recorder.config.runtime_overrides.get("amp"))


def torch_facts(data_parallel_modules: int | None, amp_override: str | None) -> dict[str, Any]:
    """torch's switches as the training loop runs with them (read at the window's start)."""
    cuda_used = torch.cuda.is_available() and torch.cuda.is_initialized()
    facts: dict[str, Any] = {
        "cuda_used": cuda_used,
        "anomaly_detection": torch.is_anomaly_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "data_parallel_modules": data_parallel_modules,
        "amp_override": amp_override,
    }
    if cuda_used:
        facts.update(
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            tf32_enabled=bool(torch.backends.cuda.matmul.allow_tf32),
            cuda_device_count=torch.cuda.device_count(),
            bf16_supported=_native_bf16(),
        )
    return facts


def _native_bf16() -> bool:
    """bf16 in hardware (Ampere and newer): torch's default check also counts emulation, which
    is true on Volta and Turing and slower than fp32 there."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch before 2.3 had no emulation and no argument
        return bool(torch.cuda.is_bf16_supported())


def optimizer_facts(optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    if optimizer is None:
        return {}
    name = type(optimizer).__name__
    defaults = optimizer.defaults
    return {
        "optimizer": name,
        # torch's LR schedulers wrap the optimizer's step and mark the wrapper.
        "lr_scheduler": bool(getattr(optimizer.step, "_wrapped_by_lr_sched", False)),
        "optimizer_fused": bool(defaults.get("fused")),
        "optimizer_foreach": defaults.get("foreach"),
        "optimizer_fusable": name in _FUSABLE and type(optimizer).__module__.startswith("torch.optim"),
    }


def cuda_memory() -> dict[str, Any]:
    stats = torch.cuda.memory_stats()
    return {
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        "total_bytes": int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory),
        "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "ooms": int(stats.get("num_ooms", 0)),
    }


def _apply_flags(overrides: dict[str, Any]) -> None:
    if overrides.get("tf32"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if overrides.get("cudnn_benchmark"):
        torch.backends.cudnn.benchmark = True


def _restore_flags() -> Callable[[], None]:
    matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
    cudnn_tf32, benchmark = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark

    def restore() -> None:
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = cudnn_tf32, benchmark

    return restore


def _install_runtime_overrides(recorder: Recorder, overrides: dict[str, Any]) -> None:
    """The in-process switches of the fixes `tf32`, `cudnn-benchmark`, `amp`, `fused-optimizer`,
    `grad-accumulation`; `Recorder.uninstall` undoes them all."""
    recorder._undo.append(_restore_flags())
    _apply_flags(overrides)
    if overrides.get("amp"):
        _install_autocast(recorder, torch.bfloat16 if overrides["amp"] == "bf16" else torch.float16)
    if overrides.get("fused_optimizer"):
        _install_fused_optimizers(recorder)
    scaler = None
    if overrides.get("amp") == "fp16":
        scaler = torch.amp.GradScaler("cuda" if torch.cuda.is_available() else "cpu")
    accumulate = int(overrides.get("grad_accumulation") or 1)
    if scaler is not None or accumulate > 1:
        _install_step_control(recorder, scaler, accumulate)


def _install_step_control(recorder: Recorder, scaler: Any, accumulate: int) -> None:
    """fp16 loss scaling and gradient accumulation, for a script with one optimizer.

    The loss is multiplied by the scaler's scale and divided by `accumulate` before backward.
    Every optimizer built gets an instance-level `step` that applies the update only on every
    `accumulate`-th call, and with a scaler first unscales the gradients and skips the update
    (and lowers the scale) when they overflowed, as `GradScaler.step` does; `zero_grad` (of the
    optimizer or a module) clears gradients only when an update has just been applied, so the
    micro-batches in between add up."""
    calls = [0]

    def transform(loss: torch.Tensor) -> torch.Tensor:
        scaled = scaler.scale(loss) if scaler is not None else loss
        return scaled / accumulate if accumulate > 1 else scaled

    recorder.loss_transform = transform
    original_init = torch.optim.Optimizer.__dict__["__init__"]

    def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        step, zero_grad = self.step, self.zero_grad

        def controlled_step(*step_args: Any, **step_kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] % accumulate:
                return None  # a micro-batch: let the gradients add up
            if scaler is None:
                return step(*step_args, **step_kwargs)
            scaler.unscale_(self)
            overflowed = any(v.item() for v in scaler._found_inf_per_device(self).values())
            result = None if overflowed else step(*step_args, **step_kwargs)
            scaler.update()
            if overflowed:
                recorder.optimizer_step(self)  # a skipped update still ends the training step
            return result

        def controlled_zero_grad(*zero_args: Any, **zero_kwargs: Any) -> None:
            if calls[0] % accumulate == 0:
                zero_grad(*zero_args, **zero_kwargs)

        self.step = controlled_step  # type: ignore[method-assign]
        self.zero_grad = controlled_zero_grad  # type: ignore[method-assign]

    recorder.patch(torch.optim.Optimizer, "__init__", init)
    if accumulate > 1:
        original_module_zero_grad = torch.nn.Module.__dict__["zero_grad"]

        def module_zero_grad(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            if calls[0] % accumulate == 0:
                original_module_zero_grad(self, *args, **kwargs)

        recorder.patch(torch.nn.Module, "zero_grad", module_zero_grad)


def _install_autocast(recorder: Recorder, dtype: torch.dtype) -> None:
    """Run every outermost module call (the model's forward, a loss module) under autocast.
    Backward runs outside it, as torch.amp recommends: its ops take the forward's dtypes."""
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    original_call = torch.nn.Module.__call__
    state = threading.local()  # per thread: DataParallel runs its replicas in threads of their own

    def call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if getattr(state, "depth", 0):
            return original_call(self, *args, **kwargs)
        state.depth = 1
        try:
            with torch.autocast(device_type, dtype=dtype):
                return original_call(self, *args, **kwargs)
        finally:
            state.depth = 0

    recorder.patch(torch.nn.Module, "__call__", call)


def _install_fused_optimizers(recorder: Recorder) -> None:
    """Construct torch's Adam/AdamW/SGD/Adagrad with `fused=True` unless the script chose
    `fused` or `foreach` itself."""
    for name in _FUSABLE:
        cls = getattr(torch.optim, name)
        original = cls.__dict__["__init__"]

        def init(self: Any, params: Any, *args: Any, __original: Any = original, **kwargs: Any) -> None:
            explicit = any(key in kwargs for key in ("fused", "foreach")) or kwargs.get("differentiable")
            if not explicit:
                kwargs["fused"] = True
            __original(self, params, *args, **kwargs)

        recorder.patch(cls, "__init__", init)


_SAMPLED = 4096  # elements of a tensor that enter its fingerprint
_WEIGHTS = torch.randint(1, 2**31, (_SAMPLED * 8,), generator=torch.Generator().manual_seed(0x7A17))


def _fingerprint(tensor: torch.Tensor) -> str:
    """A cheap content hash of a host tensor, in torch ops alone (numpy may be absent): shape,
    dtype, and a weighted sum of the bytes of at most 4096 evenly spaced elements. Enough to tell
    whether two runs drew the same batches, and far cheaper than hashing every byte (a 7 MB
    batch would cost tens of ms inside the step)."""
    flat = tensor.detach().reshape(-1)
    if flat.numel() > _SAMPLED:
        flat = flat[:: flat.numel() // _SAMPLED][:_SAMPLED]
    data = flat.contiguous().view(torch.uint8).to(torch.int64)
    digest = int((data * _WEIGHTS[: data.numel()]).sum())
    return f"{tuple(tensor.shape)}:{str(tensor.dtype)[6:]}:{digest & 0xFFFFFFFFFFFF:012x}"


def export_trace(profiler: torch.profiler.profile, path: Path) -> None:
    """Chrome trace, gzipped (a tenth of the size; TensorBoard and Perfetto open .json.gz)."""
    plain = path.with_suffix("")  # x.pt.trace.json.gz -> x.pt.trace.json
    profiler.export_chrome_trace(str(plain))
    with open(plain, "rb") as source, gzip.open(path, "wb", compresslevel=6) as target:
        shutil.copyfileobj(source, target)
    plain.unlink()


def batch_tensors(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for value in batch.values():
            yield from batch_tensors(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from batch_tensors(value)


def device_info() -> DeviceInfo:
    cuda_used = torch.cuda.is_available() and torch.cuda.is_initialized()
    return DeviceInfo(
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        cpu_count=os.cpu_count() or 1,
        cuda_used=cuda_used,
        cuda_version=torch.version.cuda or getattr(torch.version, "hip", None),
        gpu_name=torch.cuda.get_device_name() if cuda_used else None,
    )


# ---- DataLoader construction: record it, apply overrides the fix asked for ----


def _call_site() -> str:
    """file:line of the first frame outside torch and trainadvisor: the user's DataLoader call."""
    frame = inspect.currentframe()
    here = str(Path(__file__).parent)
    torch_dir = str(Path(torch.__file__).parent)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith((here, torch_dir)):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "unknown"


def _start_method(context: Any) -> str:
    if context is None:
        return (
            multiprocessing.get_start_method(allow_none=True) or (multiprocessing.get_all_start_methods()[0])
        )
    if isinstance(context, str):
        return context
    return str(context.get_start_method())


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def _unpicklable(args: dict[str, Any]) -> str | None:
    """Why workers started with spawn/forkserver could not receive the loader's parts."""
    for name in ("dataset", "collate_fn", "worker_init_fn"):
        value = args.get(name)
        if value is None:
            continue
        try:
            pickle.Pickler(_Discard()).dump(value)  # the bytes are not kept: datasets can be large
        except Exception as exc:  # pickling runs user code: any error means "cannot send"
            what = getattr(value, "__qualname__", type(value).__qualname__)
            return (
                f"the DataLoader's {name} ({what}) cannot be pickled ({type(exc).__name__}: "
                f"{exc}), and worker processes started with "
                f"'{_start_method(args.get('multiprocessing_context'))}' need it pickled; "
                f"define it at module level"
            )
    return None


def _describe(args: dict[str, Any], index: int, site: str) -> LoaderInfo:
    dataset = args["dataset"]
    collate = args.get("collate_fn")
    return LoaderInfo(
        index=index,
        created_at=site,
        dataset_class=type(dataset).__qualname__,
        iterable_dataset=isinstance(dataset, IterableDataset),
        batch_size=args.get("batch_size", 1) if args.get("batch_sampler") is None else None,
        num_workers=int(args.get("num_workers", 0)),
        pin_memory=bool(args.get("pin_memory", False)),
        persistent_workers=bool(args.get("persistent_workers", False)),
        prefetch_factor=args.get("prefetch_factor"),
        start_method=_start_method(args.get("multiprocessing_context")),
        collate_fn=getattr(collate, "__qualname__", repr(collate)) if collate else None,
    )


def _apply(args: dict[str, Any], wanted: dict[str, Any], info: LoaderInfo) -> None:
    if not wanted:
        return
    workers = int(wanted.get("num_workers", args.get("num_workers", 0)))
    if workers > 0 and _start_method(args.get("multiprocessing_context")) != "fork":
        refused = _unpicklable(args)
        if refused:
            info.override_refused = refused
            return
    if wanted.get("pin_memory") and not torch.cuda.is_available():
        wanted = {k: v for k, v in wanted.items() if k != "pin_memory"}
    args.update(wanted)
    if workers == 0:
        for key in _WORKER_ONLY:
            args.pop(key, None)
    info.overrides_applied = dict(wanted)
    info.num_workers = workers
    info.pin_memory = bool(args.get("pin_memory", False))
    info.persistent_workers = bool(args.get("persistent_workers", False))
    info.prefetch_factor = args.get("prefetch_factor")


def install(config: ChildConfig) -> Recorder:
    """Install every hook for one run; returns the recorder they report to."""
    global ACTIVE
    recorder = Recorder(config)
    ACTIVE = recorder
    recorder._undo.append(register_optimizer_step_post_hook(recorder.optimizer_step).remove)

    original_next = _BaseDataLoaderIter.__next__

    def timed_next(self: _BaseDataLoaderIter) -> Any:
        t0 = time.perf_counter()
        try:
            batch = original_next(self)
        except StopIteration:
            recorder.data_wait_s += time.perf_counter() - t0
            raise
        recorder.data_wait(time.perf_counter() - t0, batch)
        info_index = getattr(self, "_trainadvisor_loader", None)
        if recorder.in_window and info_index is not None:
            recorder.loaders[info_index].batches_in_window += 1
        return batch

    recorder.patch(_BaseDataLoaderIter, "__next__", timed_next)

    original_get_iterator = DataLoader._get_iterator

    def get_iterator(self: DataLoader) -> _BaseDataLoaderIter:
        iterator = original_get_iterator(self)
        iterator._trainadvisor_loader = getattr(self, "_trainadvisor_loader", None)  # type: ignore[attr-defined]
        return iterator

    recorder.patch(DataLoader, "_get_iterator", get_iterator)

    original_init = DataLoader.__init__
    signature = inspect.signature(original_init)

    def init(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        call = dict(bound.arguments)
        call.pop("self")
        site = _call_site()
        info = _describe(call, len(recorder.loaders), site)
        _apply(call, dict(config.loader_overrides.get(site, {})), info)
        recorder.loaders.append(info)
        if info.override_refused:  # the run cannot measure what it was started for
            recorder.write("refused", 0, info.override_refused)
            raise WindowComplete()
        original_init(self, **call)
        self._trainadvisor_loader = info.index  # type: ignore[attr-defined]

    recorder.patch(DataLoader, "__init__", init)

    original_backward = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        recorder.loss_candidate(self)
        if recorder.loss_transform is not None and self.numel() == 1 and self.requires_grad:
            return original_backward(recorder.loss_transform(self), *args, **kwargs)
        return original_backward(self, *args, **kwargs)

    recorder.patch(torch.Tensor, "backward", backward)

    if config.non_blocking_h2d and torch.cuda.is_available():
        _install_non_blocking_copies(recorder)

    original_dp_init = torch.nn.DataParallel.__init__

    def data_parallel_init(self: torch.nn.DataParallel, *args: Any, **kwargs: Any) -> None:
        original_dp_init(self, *args, **kwargs)
        if len(getattr(self, "device_ids", None) or []) >= 2:  # one device: DataParallel does nothing
            recorder.data_parallel_modules += 1

    recorder.patch(torch.nn.DataParallel, "__init__", data_parallel_init)
    if config.runtime_overrides:
        _install_runtime_overrides(recorder, config.runtime_overrides)
    return recorder


def _install_non_blocking_copies(recorder: Recorder) -> None:
    """Make `.to('cuda')`/`.cuda()` of pinned DataLoader batches non-blocking.

    Only tensors the DataLoader handed out are touched (`data_wait` marks them): the pin-memory
    thread gives each batch a fresh pinned buffer, so nothing writes the source while the copy is
    in flight. A pinned staging buffer the script refills itself keeps its blocking copy."""
    original_to = torch.Tensor.to
    original_cuda = torch.Tensor.cuda

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_trainadvisor_batch", False) and "non_blocking" not in kwargs and len(args) < 2:
            kwargs["non_blocking"] = True
        return original_to(self, *args, **kwargs)

    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_trainadvisor_batch", False) and "non_blocking" not in kwargs and len(args) < 2:
            kwargs["non_blocking"] = True
        return original_cuda(self, *args, **kwargs)

    recorder.patch(torch.Tensor, "to", to)
    recorder.patch(torch.Tensor, "cuda", cuda)


def load_config(path: str) -> ChildConfig:
    return ChildConfig(**json.loads(Path(path).read_text()))


__all__ = ["ACTIVE", "ChildConfig", "Recorder", "WindowComplete", "install", "load_config"]
