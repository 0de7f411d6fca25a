"""Instrumentation installed inside the user's process (see `measure.child`).

Steps are found through torch's global optimizer step hook (or `trainadvisor.step()`); the
DataLoader's iterator `__next__` is timed; the scalar `.backward()` is called on is kept as the
step's loss. After `warmup` steps, `steps` steps are timed with clocks alone, then
`profile_steps` more are traced with `torch.profiler` (whose overhead would bias the timing).
Then the measurements are written and, unless asked to run to the end, the script is stopped.
Outside the window the hooks cost about 10-20 us a step (benchmarks/hook_cost.py)."""

from __future__ import annotations

import gzip
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from trainadvisor import _serial, fixes
from trainadvisor.measure import gpu, loaders, switches
from trainadvisor.measure.config import ChildConfig, failed_write_file
from trainadvisor.measure.window import close_window
from trainadvisor.records import DeviceInfo, LoaderInfo, RawRun, StepRecord

ACTIVE: Recorder | None = None

# Steps the profiler runs before recording: the first traced step carries CUPTI's start-up.
PROFILER_WARMUP_STEPS = 1


class WindowComplete(BaseException):
    """Raised out of the step hook to stop the script once the window is measured.

    A BaseException, so a training loop's `except Exception` does not swallow it."""


class Recorder:
    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self.steps_seen = 0
        self.manual = False
        # What ends a step: the first optimizer's step(), trainadvisor.step(), or, in a loop with
        # no torch.optim optimizer at all (parameters updated by hand), each backward().
        self.step_source = "optimizer"
        self.optimizers_built = 0
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
        self.device: int | None = None  # the GPU the losses were computed on
        self.device_announced = False
        self.gpu = gpu.GpuWindow()
        # What a fix does to the loss before backward (fp16 loss scaling, 1/k for accumulation).
        self.loss_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._undo: list[Callable[[], None]] = []

    def patch(self, owner: Any, name: str, replacement: Any) -> None:
        """Replace `owner.name`; undone by `uninstall`. The attribute may be inherited (torch's
        `Tensor.to` and `.cuda` live on `torch._C.TensorBase`): then the replacement is set on
        `owner` and removed again, so the inherited one shows through as before."""
        own = name in owner.__dict__
        original = owner.__dict__[name] if own else getattr(owner, name)
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original) if own else delattr(owner, name))

    def on_uninstall(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def refuse(self, reason: str) -> None:
        """A DataLoader override this run was started for cannot be applied: record why, stop."""
        self.write("refused", 0, reason)
        raise WindowComplete()

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
        if not self.manual:
            # Optimizer steps (or backward calls) were counted before the first
            # trainadvisor.step(): count afresh, so a loop that does both is not counted twice.
            self.count_afresh()
        self.manual = True
        self.step_source = "trainadvisor.step()"
        self.boundary()

    def count_afresh(self) -> None:
        if self.steps_seen and not self.in_window and not self.window_done:
            if self.step_source == "backward" and self.loss is None and self.losses:
                # backward() closed the step that ends now: it keeps that step's loss and batches
                self.loss = self.losses[-1]
                self.step_batches = [b for b in self.batch_fingerprints[-1:] if b]
            self.steps_seen = 0
            self.losses.clear()
            self.batch_fingerprints.clear()

    def optimizer_built(self) -> None:
        """A torch.optim optimizer exists: its steps, not backward(), end training steps."""
        self.optimizers_built += 1
        if self.step_source == "backward":
            self.count_afresh()
            self.step_source = "optimizer"

    def backward_done(self) -> None:
        """In a loop without any optimizer (and without trainadvisor.step()), a backward() of a
        scalar ends the step."""
        if not self.manual and not self.optimizers_built:
            self.step_source = "backward"
            self.boundary()

    def boundary(self) -> None:
        if self.in_window and len(self.records) + 1 == self.config.steps:
            self.gpu.sync()  # the last timed step ends when its GPU work does
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
            if recorded <= self.config.steps:
                self.gpu.mark()
            if recorded == self.config.steps + self.traced_steps():
                self.end_window()
            elif recorded == self.config.steps:
                self.start_profiler()
            elif self.profiler is not None:
                self.profiler.step()
        elif not self.window_done and self.steps_seen == self.config.warmup:
            self.start_window()
        # until the window ends (a CPU run would otherwise ask torch.cuda at every step)
        if (
            not self.device_announced
            and not self.window_done
            and self.config.device_file
            and gpu.cuda_in_use()
        ):
            self.announce_device()
        self.data_wait_s = 0.0
        self.samples = None
        self.loss = None
        self.backward_at = None
        self.last_mark = time.perf_counter()
        if self.window_done and self.config.stop_after_window:
            raise WindowComplete()

    def traced_steps(self) -> int:
        """Steps after the timed ones: the profiler's warmup step, then those it records."""
        return PROFILER_WARMUP_STEPS + self.config.profile_steps if self.config.profile_steps else 0

    def start_window(self) -> None:
        runtime = self.config.overrides.runtime
        if runtime.get("tf32") or runtime.get("cudnn_benchmark"):  # again, in case the script reset them
            gpu.switch_flags(
                tf32=bool(runtime.get("tf32")), cudnn_benchmark=bool(runtime.get("cudnn_benchmark"))
            )
        self.runtime = _flags(self)
        self.in_window = True
        self.window_start_unix_s = time.time()
        self.gpu.start(self.training_device())
        self.window_t0 = time.perf_counter()

    def training_device(self) -> int | None:
        """The GPU the losses were on; the current device before any loss was seen."""
        return self.device if self.device is not None else gpu.training_device(None)

    def announce_device(self) -> None:
        """Tell the parent's NVML sampler which GPU this process trains on (once CUDA is up)."""
        self.device_announced = True
        try:
            gpu.announce_device(Path(str(self.config.device_file)), int(self.training_device() or 0))
        except Exception as exc:  # sampling is a nicety: never break training for it
            print(f"[trainadvisor] could not name the GPU for sampling: {exc!r}", file=sys.stderr)

    def start_profiler(self) -> None:
        """One profiler session per process (a second session in the same process crashes
        torch 2.13 now and then, at exit or when it starts). Python stacks only when asked
        (`with_stack`, the separate sites run): the Python tracer adds about 15% host time."""
        if self.config.trace_file is not None and self.config.profile_steps > 0:
            self.profiler = start_profiler(self.config.profile_steps, self.config.with_stack)

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
        if self.config.overrides.non_blocking_h2d:
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
        if self.device is None and tensor.device.type == "cuda":
            self.device = tensor.device.index
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
            try:  # a line for the parent, which would otherwise see only a missing result
                failed_write_file(self.config.result_file).write_text(f"{type(exc).__name__}: {exc}")
            except OSError:
                pass

    def _collect(self, status: str, exit_code: int | None, error: str | None) -> RawRun:
        if self.profiler is not None:
            self.profiler.stop()
            export_trace(self.profiler, Path(str(self.config.trace_file)))
            self.profiler = None
        losses = close_window(
            self.records, self.losses, self.gpu, self.runtime, self.optimizer, len(self.optimizer_ids)
        )
        for record in self.records:
            record.loss = losses[record.index]
        trace = self.config.trace_file
        return RawRun(
            label=self.config.label,
            status=status,
            exit_code=exit_code,
            error=error,
            warmup_steps=self.config.warmup,
            window_steps=self.config.steps,
            profile_steps=self.config.profile_steps,
            steps_seen=self.steps_seen,
            step_source=self.step_source,
            steps=self.records,
            loaders=self.loaders,
            device=device_info(),
            window_start_unix_s=self.window_start_unix_s,
            batch_fingerprints=self.batch_fingerprints,
            losses=losses,
            trace_file=trace if trace and Path(trace).exists() else None,
            runtime=self.runtime,
        )


def _flags(recorder: Recorder) -> dict[str, Any]:
    return gpu.torch_facts(recorder.data_parallel_modules, recorder.config.overrides.runtime.get("amp"))


def start_profiler(profile_steps: int, with_stack: bool = False) -> torch.profiler.profile:
    """torch.profiler for `profile_steps` steps after one warmup step (CUPTI's start-up stays
    out of the recorded steps), CUDA activity included when the script uses a GPU."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if gpu.cuda_in_use():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(
            wait=0, warmup=PROFILER_WARMUP_STEPS, active=profile_steps, repeat=1
        ),
        with_stack=with_stack,
    )
    profiler.start()
    return profiler


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
    recorder.on_uninstall(register_optimizer_step_post_hook(recorder.optimizer_step).remove)
    loaders.install(recorder, config.overrides.loaders, recorder.refuse)
    _patch_autograd(recorder)
    _patch_data_parallel(recorder)
    if config.overrides.non_blocking_h2d and torch.cuda.is_available():
        switches.install_non_blocking_copies(recorder)
    fixes.install(recorder, config.overrides)  # each fix's switch that the overrides ask for
    return recorder


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
        recorder.optimizer_built()

    recorder.patch(torch.optim.Optimizer, "__init__", optimizer_init)


def _patch_data_parallel(recorder: Recorder) -> None:
    original_dp_init = torch.nn.DataParallel.__init__

    def data_parallel_init(self: torch.nn.DataParallel, *args: Any, **kwargs: Any) -> None:
        original_dp_init(self, *args, **kwargs)
        if len(getattr(self, "device_ids", None) or []) >= 2:  # one device: DataParallel does nothing
            recorder.data_parallel_modules += 1

    recorder.patch(torch.nn.DataParallel, "__init__", data_parallel_init)


__all__ = ["ACTIVE", "ChildConfig", "Recorder", "WindowComplete", "install"]
