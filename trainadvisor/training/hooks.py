"""Instrumentation installed inside the user's process (see `training.child`).

Steps are found through torch's global optimizer step hook (or `trainadvisor.step()`); the
DataLoader's iterator `__next__` is timed; the scalar `.backward()` is called on is kept as the
step's loss. After `warmup` steps, `steps` steps are timed with clocks alone, then
`profile_steps` more are traced with `torch.profiler` (whose overhead would bias the timing).
Then the measurements are written and, unless asked to run to the end, the script is stopped.
Outside the window the hooks cost about 10-20 us a step (benchmarks/hook_cost.py)."""

from __future__ import annotations

import contextlib
import gzip
import os
import platform
import shutil
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from trainadvisor import _serial, fixes
from trainadvisor.fixes import flags, switches
from trainadvisor.frameworks import watch
from trainadvisor.measure.config import ChildConfig, WindowSize, failed_write_file
from trainadvisor.memory.blocks import find_trained, repeated_blocks
from trainadvisor.records import DeviceInfo, FrameworkCall, LoaderInfo, RawRun
from trainadvisor.training import failure, gpu, loaders, parallel
from trainadvisor.training.window import Window
from trainadvisor.training.window_plan import Clock, WindowPlan

ACTIVE: Recorder | None = None


class WindowComplete(BaseException):
    """Raised out of the step hook to stop the script once the window is measured.

    A BaseException, so a training loop's `except Exception` does not swallow it."""


class Patches:
    """Attributes replaced for a while, each put back by `undo` (last first). What a fix's
    switch patches (`fixes.Fix.install`) for one trial window."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def patch(self, owner: Any, name: str, replacement: Any) -> None:
        """Replace `owner.name` until `undo`. The attribute may be inherited (torch's `Tensor.to`
        and `.cuda` live on `torch._C.TensorBase`): then the replacement is set on `owner` and
        removed again, so the inherited one shows through as before."""
        self._undo.append(replace_attribute(owner, name, replacement))

    def on_uninstall(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


class Recorder(Patches):
    """Finds the script's steps and feeds them to the measuring window (`training.window`); owns
    every patch installed in the process, and writes what the baseline window measured."""

    def __init__(self, config: ChildConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or Clock()
        self.steps_seen = 0
        self.manual = False
        # What ends a step: the first optimizer's step(), trainadvisor.step(), or, in a loop with
        # no torch.optim optimizer at all (parameters updated by hand), each backward().
        self.step_source = "optimizer"
        self.optimizers_built = 0
        self._first_built: Callable[[], Any] = lambda: None  # the first optimizer built (a weak reference)
        self.first_optimizer: int | None = None
        self.loaders: list[LoaderInfo] = []
        self.framework_calls: list[FrameworkCall] = []  # TrainingArguments, Trainer, Accelerator built
        self.live_loaders = loaders.LiveLoaders()
        self.result: RawRun | None = None  # the baseline window's, once written
        self.write_failed = False  # then no trial window follows: the run ends at the window
        self.heartbeat: Any = None  # the stall watchdog's step count (`measure.watchdog`)
        self.wrappers = parallel.Wrappers()  # the data-parallel wrappers the script built
        self.device_announced = False
        self.non_blocking_h2d = config.overrides.non_blocking_h2d  # mark batches for async copies
        # What a fix does to the loss before backward (fp16 loss scaling, 1/k for accumulation).
        self.loss_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
        # DataLoader arguments by call site for loaders built from now on (a trial window's)
        self.loader_overrides = config.overrides.loaders
        # Trial windows after the baseline's, in this process (`training.session`), or None.
        self.session: Any = None
        # A run started ahead of its settings (`training.gate`): called once, at the script's
        # first DataLoader, backward() or step, it waits for them and applies them.
        self.gate: Callable[[], None] | None = None
        self.held_facts: dict[str, Any] = {}  # what standing by left (`training.gate`)
        self.death_facts: dict[str, Any] = {}  # what an out-of-memory left (`training.failure`)
        self.model_blocks: dict[str, Any] = {}  # the trained model's repeated blocks (`memory.blocks`)
        super().__init__()
        self.window = self.new_window()

    def new_window(self) -> Window:
        """The run's own window, as its config says (before any step was counted)."""
        config = self.config
        plan = window_plan(
            config.warmup,
            config.steps,
            config.size,
            config.profile_steps if config.trace_file is not None else 0,
            config.with_stack,
            config.memory_step,
        )
        return Window(plan, self.clock, on_open=self._window_opens, on_close=self._window_closes)

    @property
    def window_done(self) -> bool:
        """The baseline window is measured and written."""
        return self.result is not None

    def refuse(self, reason: str) -> None:
        """A DataLoader override this run was started for cannot be applied: record why, stop."""
        self.write("refused", 0, reason)
        raise WindowComplete()

    def uninstall(self) -> None:
        """Put back everything `install` changed: torch is as it was before."""
        global ACTIVE
        self.undo()
        if ACTIVE is self:
            ACTIVE = None

    # ---- step boundaries ----

    def optimizer_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        # With several optimizers (GANs, multi-task) the first one to step defines the step.
        if self.first_optimizer is None and not self.manual:
            self.first_optimizer = id(optimizer)
        counted = id(optimizer) == self.first_optimizer
        self.window.optimizer_stepped(optimizer, counted)
        if counted and not self.manual:
            self.boundary()

    @property
    def data_parallel_modules(self) -> int:
        return self.wrappers.data_parallel

    def manual_step(self) -> None:
        if not self.manual:
            # Optimizer steps (or backward calls) were counted before the first
            # trainadvisor.step(): count afresh, so a loop that does both is not counted twice.
            self.count_afresh()
        self.manual = True
        self.step_source = "trainadvisor.step()"
        self.boundary()

    def count_afresh(self) -> None:
        """Count from zero again (what ends a step has just changed), unless the window began."""
        old = self.window
        if not self.steps_seen or old.phase != "warmup" or self.window_done:
            return
        self.steps_seen = 0
        self.window = self.new_window()
        self.window.device = old.device
        if self.step_source == "backward" and old.loss is None and old.losses:
            # backward() closed the step that ends now: it keeps that step's loss and batches
            self.window.loss = old.losses[-1]
            self.window.batches = [b for b in old.batch_fingerprints[-1:] if b]

    def optimizer_built(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """A torch.optim optimizer exists: its steps, not backward(), end training steps."""
        self.optimizers_built += 1
        if optimizer is not None and self.optimizers_built == 1:
            self._first_built = weakref.ref(optimizer)
        if self.step_source == "backward":
            self.count_afresh()
            self.step_source = "optimizer"

    def backward_done(self) -> None:
        """In a loop without any optimizer (and without trainadvisor.step()), a backward() of a
        scalar ends the step."""
        if not self.manual and not self.optimizers_built:
            self.step_source = "backward"
            self.boundary()

    def pass_gate(self) -> None:
        if self.gate is not None:
            gate, self.gate = self.gate, None
            gate()

    def boundary(self) -> None:
        self.pass_gate()
        self.steps_seen += 1
        if self.heartbeat is not None:
            self.heartbeat.beat()
        window = self.window
        window.boundary()
        # until the window ends (a CPU run would otherwise ask torch.cuda at every step)
        if not self.device_announced and not self.window_done and self.config.device_file:
            if gpu.cuda_in_use():
                self.announce_device()
        if window.phase == "done" and self.config.stop_after_window:
            if self.session is not None and not self.write_failed and self.session.next_window(self):
                return  # a trial window runs from this step on
            raise WindowComplete()

    def first_optimizer_built(self) -> torch.optim.Optimizer | None:
        return self._first_built()

    def died(self, exc: BaseException) -> None:
        """The script raised `exc`: what an out-of-memory left is recorded with the run."""
        self.death_facts = failure.died(exc, self)

    def _window_opens(self, window: Window) -> dict[str, Any]:
        failure.stop_history()  # no timed step pays for the allocator's history
        runtime = self.config.overrides.runtime
        if runtime.get("tf32") or runtime.get("cudnn_benchmark"):  # again, in case the script reset them
            flags.switch_flags(
                tf32=bool(runtime.get("tf32")), cudnn_benchmark=bool(runtime.get("cudnn_benchmark"))
            )
        facts = gpu.torch_facts(self.data_parallel_modules, runtime.get("amp"), window.device)
        return {**facts, **self.wrappers.ddp_facts(), **parallel.fsdp_facts()}

    def _window_closes(self, window: Window) -> None:
        self.write("window_complete", exit_code=None, error=None)

    def announce_device(self) -> None:
        """Tell the parent's NVML sampler which GPU this process trains on (once CUDA is up)."""
        self.device_announced = True
        device = self.window.device if self.window.device is not None else gpu.training_device(None)
        try:
            gpu.announce_device(Path(str(self.config.device_file)), int(device or 0))
        except Exception as exc:  # sampling is a nicety: never break training for it
            print(f"[trainadvisor] could not name the GPU for sampling: {exc!r}", file=sys.stderr)

    # ---- data loading ----

    def data_wait(
        self,
        seconds: float,
        batch: Any,
        loader_index: int | None = None,
        ready: bool | None = None,
        ready_count: int | None = None,
    ) -> None:
        if self.heartbeat is not None:  # a batch, in training or evaluation: progress
            self.heartbeat.beat()
        window = self.window
        window.add_data_wait(seconds, ready, ready_count)
        if window.phase == "done":
            return
        tensors = list(batch_tensors(batch))
        if self.non_blocking_h2d:
            for tensor in tensors:
                if tensor.is_pinned():
                    tensor._trainadvisor_batch = True  # type: ignore[attr-defined]
        # batches are fingerprinted for the baseline's loss check (trial windows need none)
        host = [fingerprint(t) for t in tensors if t.device.type == "cpu"] if not self.window_done else []
        samples = int(tensors[0].shape[0]) if tensors and tensors[0].dim() > 0 else None
        window.add_batch(samples, ",".join(host) if host else None)
        if window.measuring and loader_index is not None and not self.window_done:
            self.loaders[loader_index].batches_in_window += 1

    def loss_candidate(self, tensor: torch.Tensor) -> None:
        self.pass_gate()
        self.window.mark_backward()
        self.window.set_loss(tensor)

    # ---- results ----

    def write(self, status: str, exit_code: int | None, error: str | None) -> None:
        """Save the measurements. Called once when the window ends and again when the script
        exits (then only the step count and the exit are updated). Never raises: a failure of
        trainadvisor must not break the user's training."""
        try:
            if self.result is None:
                if status != "window_complete":
                    self.window.cut_short()
                with self.heartbeat.busy() if self.heartbeat is not None else contextlib.nullcontext():
                    self.result = self._collect(status, exit_code, error)
            else:
                if self.session is not None:  # a trial window the script's end cut short
                    self.session.ended(self, status, error)
                self.result.steps_seen = self.steps_seen
                self.result.exit_code, self.result.error = exit_code, error
            for key, value in {**self.model_blocks, **self.death_facts, **self.held_facts}.items():
                self.result.runtime.setdefault(key, value)  # the window's own facts stay
            self.result.ended_unix_s = time.time()
            _serial.save_json(self.result, Path(self.config.result_file))
        except Exception as exc:  # report it, let training go on
            self.write_failed = True
            print(f"[trainadvisor] could not record the measurements: {exc!r}", file=sys.stderr)
            try:  # a line for the parent, which would otherwise see only a missing result
                failed_write_file(self.config.result_file).write_text(f"{type(exc).__name__}: {exc}")
            except OSError:
                pass

    def _collect(self, status: str, exit_code: int | None, error: str | None) -> RawRun:
        window = self.window
        profiler = window.stop_profiler()
        if profiler is not None:
            export_trace(profiler, Path(str(self.config.trace_file)))
        trace = self.config.trace_file
        return window_run(
            window,
            label=self.config.label,
            status=status,
            exit_code=exit_code,
            error=error,
            steps_seen=self.steps_seen,
            step_source=self.step_source,
            loaders=self.loaders,
            frameworks=self.framework_calls,
            trace_file=trace if trace and Path(trace).exists() else None,
        )


def window_plan(
    warmup: int,
    steps: int,
    size: WindowSize,
    profile_steps: int = 0,
    with_stack: bool = False,
    memory_step: bool = False,
) -> WindowPlan:
    """The window a config or a trial window's command asks for."""
    return WindowPlan(
        warmup, steps, profile_steps, with_stack, size.min_time_s, size.settle, size.max_steps, memory_step,
        size.race_below, size.race_warmup,
    )  # fmt: skip


def window_run(window: Window, **fields: Any) -> RawRun:
    """What a window measured (all of it, or as far as it got), as the run record both profile
    and `@advise` save."""
    losses = window.read_back()
    opened = window.phase != "warmup"
    return RawRun(
        warmup_steps=window.shape.warmup_steps if opened else window.steps_done,
        window_steps=sum(1 for record in window.records if not record.profiled),
        profile_steps=window.plan.profile_steps,
        steps=window.records,
        device=device_info(),
        window_start_unix_s=window.start_unix_s,
        batch_fingerprints=window.batch_fingerprints,
        losses=losses,
        runtime=window.facts.runtime,
        shape=window.shape if opened else None,
        **fields,
    )


def replace_attribute(owner: Any, name: str, replacement: Any) -> Callable[[], None]:
    """Set `owner.name`; returns what puts it back (deleting it where it was inherited)."""
    own = name in owner.__dict__
    original = owner.__dict__[name] if own else getattr(owner, name)
    setattr(owner, name, replacement)
    return lambda: setattr(owner, name, original) if own else delattr(owner, name)


_SAMPLED = 4096  # elements of a tensor that enter its fingerprint
_WEIGHTS = torch.randint(1, 2**31, (_SAMPLED * 8,), generator=torch.Generator().manual_seed(0x7A17))


def fingerprint(tensor: torch.Tensor) -> str:
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
    try:
        profiler.export_chrome_trace(str(plain))
        with open(plain, "rb") as source, gzip.open(path, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target)
    except BaseException:  # a full disk: no part-written trace is left as if it were one
        path.unlink(missing_ok=True)
        raise
    finally:  # Kineto writes through a temporary beside it, left behind when the write fails
        for leftover in (plain, plain.with_name(plain.name + ".tmp")):
            leftover.unlink(missing_ok=True)


def batch_tensors(batch: Any) -> Any:
    """The tensors of a batch: in any mapping (a dict, Hugging Face's `BatchEncoding`, a
    `UserDict`) or sequence (lists, tuples, named tuples), nested."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from batch_tensors(value)
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        for value in batch:
            yield from batch_tensors(value)


def device_info() -> DeviceInfo:
    cuda_used = gpu.cuda_in_use()
    return DeviceInfo(
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        cpu_count=os.cpu_count() or 1,
        cuda_used=cuda_used,
        cuda_version=torch.version.cuda or getattr(torch.version, "hip", None),
        gpu_name=torch.cuda.get_device_name() if cuda_used else None,
    )


def install(config: ChildConfig) -> Recorder:
    """Install every hook for one run; returns the recorder they report to."""
    global ACTIVE
    recorder = Recorder(config)
    ACTIVE = recorder
    failure.record_history()  # until the window times steps: where an out-of-memory's tensors came from
    recorder.on_uninstall(register_optimizer_step_post_hook(recorder.optimizer_step).remove)
    loaders.install(recorder, recorder.refuse)
    watch.install(recorder)
    _patch_autograd(recorder)
    parallel.watch(recorder, recorder.wrappers)
    _find_blocks(recorder)
    if config.overrides.non_blocking_h2d and torch.cuda.is_available():
        switches.install_non_blocking_copies(recorder)
    fixes.install(recorder, config.overrides)  # each fix's switch that the overrides ask for
    return recorder


def _find_blocks(recorder: Recorder) -> None:
    """The trained model's repeated blocks, read at its first call (what activation
    checkpointing would wrap; known even where the script dies before its window)."""
    elements: dict[int, int] = {}

    def trained() -> dict[int, int]:
        optimizer = recorder.first_optimizer_built()
        if optimizer is not None and not elements:
            elements.update({id(p): p.numel() for g in optimizer.param_groups for p in g["params"]})
        return elements

    def found(model: torch.nn.Module) -> None:
        try:
            recorder.model_blocks = repeated_blocks(model) or {}
        except Exception:  # a model whose modules cannot be walked: nothing to checkpoint
            recorder.model_blocks = {}

    handle = find_trained(trained, found)
    recorder.on_uninstall(handle.remove)


def _patch_autograd(recorder: Recorder) -> None:
    """backward(): the step's loss (and the fixes' loss transform); with no optimizer built,
    the end of a step. Optimizer construction: an optimizer exists."""
    original_backward = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        recorder.loss_candidate(self)
        if recorder.loss_transform is not None and self.numel() == 1 and self.requires_grad:
            result = original_backward(recorder.loss_transform(self), *args, **kwargs)
        else:
            result = original_backward(self, *args, **kwargs)
        if self.numel() == 1:
            recorder.backward_done()
        return result

    recorder.patch(torch.Tensor, "backward", backward)
    original_optimizer_init = torch.optim.Optimizer.__dict__["__init__"]

    def optimizer_init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original_optimizer_init(self, *args, **kwargs)
        recorder.optimizer_built(self)

    recorder.patch(torch.optim.Optimizer, "__init__", optimizer_init)


__all__ = ["ACTIVE", "ChildConfig", "Recorder", "WindowComplete", "install"]
