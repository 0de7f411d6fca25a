"""DataLoaders inside the training process: where the user built each loader, what it was built
with, the overrides a fix asked for (applied only where they can work), and its iterator's
`__next__` timed as the step's wait for data."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import pickle
import signal
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from trainadvisor.frameworks import framework_of, ours_or_torch
from trainadvisor.frameworks.watch import loader_origin
from trainadvisor.records import LoaderInfo
from trainadvisor.units import signal_name

# DataLoader arguments an override may set, and the values that need workers.
_WORKER_ONLY = ("persistent_workers", "prefetch_factor")


def call_site(built: Any = None) -> str:
    """file:line of the first frame outside torch and trainadvisor: the user's DataLoader call,
    or the framework's that built it. A framework's wrapper of the constructor (Lightning wraps
    `DataLoader.__init__` to rebuild loaders later; accelerate's `DataLoaderShard.__init__`) is
    passed over: its first argument is the loader being built."""
    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_code.co_filename
        if not ours_or_torch(name) and not _constructing(frame, built):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "unknown"


def _constructing(frame: FrameType, built: Any) -> bool:
    """A framework's frame whose first argument is the loader being built."""
    code = frame.f_code
    if built is None or not code.co_argcount or not framework_of(code.co_filename):
        return False
    return frame.f_locals.get(code.co_varnames[0]) is built


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


def describe(args: dict[str, Any], index: int, site: str) -> LoaderInfo:
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
        dataset_id=id(dataset),
    )


def _length(loader: DataLoader) -> int | None:
    """Batches per pass (for the script's length, `analyze.run.length`); None where the loader has
    no length (an IterableDataset without __len__) or computing it fails."""
    try:
        return int(len(loader))
    except Exception:  # user code (a sampler's or dataset's __len__): a missing length, not an error
        return None


# What a DataLoader was built with that an iterator of no workers does not keep, and a stand-in
# loader with workers needs to draw its batches as the user's loader would with workers: the
# seeding each worker gets, how the workers start, and the generator the base seed is drawn from
BUILT_WITH = ("worker_init_fn", "multiprocessing_context", "generator")


def built_with(iterator: Any) -> dict[str, Any]:
    """`BUILT_WITH` of `iterator`'s loader: as noted when the iterator was made (`advise` notes
    it), else as a worker iterator keeps it (None where it is not kept)."""
    noted = getattr(iterator, "_trainadvisor_built_with", None)
    if noted is not None:
        return dict(noted)
    kept = {"generator": None}
    kept["worker_init_fn"] = getattr(iterator, "_worker_init_fn", None)
    kept["multiprocessing_context"] = getattr(iterator, "_multiprocessing_context", None)
    return kept


def describe_iterator(iterator: _BaseDataLoaderIter, index: int) -> LoaderInfo:
    """A loader known only by an iterator of it (`@advise` starts after the loaders are built):
    what the iterator was built with; where the loader was built is not known."""
    sampler = iterator._index_sampler
    collate = iterator._collate_fn
    default = collate is torch.utils.data.default_collate or collate is torch.utils.data.default_convert
    return LoaderInfo(
        index=index,
        created_at="unknown",
        dataset_class=type(iterator._dataset).__qualname__,
        iterable_dataset=isinstance(iterator._dataset, IterableDataset),
        batch_size=getattr(sampler, "batch_size", None) if iterator._auto_collation else None,
        num_workers=int(iterator._num_workers),
        pin_memory=bool(iterator._pin_memory),
        persistent_workers=bool(iterator._persistent_workers),
        prefetch_factor=getattr(iterator, "_prefetch_factor", None),
        start_method=_start_method(getattr(iterator, "_multiprocessing_context", None)),
        collate_fn=None if default else getattr(collate, "__qualname__", repr(collate)),
        dataset_id=id(iterator._dataset),
    )


NOTE_PREFIX = "trainadvisor: "  # of a note added to the script's exception
# What a worker's death by a signal most often means (`note_worker_deaths`).
_SIGNAL_CAUSES = {
    signal.SIGKILL: "killed from outside it: most often the kernel's out-of-memory killer (dmesg says so)",
    signal.SIGBUS: "most often shared memory (/dev/shm) too small for the batches in flight",
    signal.SIGSEGV: "a crash in native code the dataset, a transform or a library it calls ran",
}


def worker_deaths(iterator: Any) -> list[str]:
    """How each of an iterator's DataLoader workers that is no longer running ended, by its exit
    status: a signal (with what it most often means) or an exit code."""
    deaths = []
    for worker in list(getattr(iterator, "_workers", None) or []):
        code = getattr(worker, "exitcode", None)
        if code is None or code == 0:
            continue
        if code < 0:
            name = signal_name(-code)
            cause = _SIGNAL_CAUSES.get(-code)
            said = f" ({cause})" if cause else ""
            deaths.append(f"worker pid {worker.pid} was killed by signal {name}{said}")
        else:
            deaths.append(f"worker pid {worker.pid} exited with code {code}")
    return deaths


def note_worker_deaths(iterator: Any, exc: BaseException) -> None:
    """Adds to torch's "DataLoader worker (pid(s) ...) exited unexpectedly" how the workers
    ended (a note, as Python 3.11 prints them: the exception stays the script's own); never
    raises."""
    try:
        if "DataLoader worker" not in str(exc) or not hasattr(exc, "add_note"):
            return
        deaths = worker_deaths(iterator)
        if deaths:
            exc.add_note(NOTE_PREFIX + "the DataLoader's " + "; ".join(deaths))
    except Exception:  # reading a worker's status: never the cause of another failure
        pass


def pinning_device_problem() -> str | None:
    """Why pinned memory would misbehave in this torchrun rank now, or None. The DataLoader's
    pinning thread runs on the CUDA device current when its iterator is created; a rank that
    never called `torch.cuda.set_device` has device 0 current, so every rank would open a CUDA
    context (hundreds of MB) on GPU 0."""
    local = os.environ.get("LOCAL_RANK")
    if local is None or not local.isdigit() or int(local) == 0 or torch.cuda.device_count() < 2:
        return None
    current = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if current == int(local):
        return None
    return (
        f"local rank {local} has not called torch.cuda.set_device({local}) before iterating its "
        f"DataLoader: with pin_memory=True its pinning thread would run on GPU {current} and every "
        "rank would open a CUDA context there; call "
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) first, then pin memory"
    )


def apply(
    args: dict[str, Any], wanted: dict[str, Any], info: LoaderInfo, pin_device_later: bool = False
) -> None:
    """Give a loader's arguments the overrides wanted, or record in `info` why they cannot apply.
    The device pinning would use is checked now, unless `pin_device_later`: for a loader the
    script builds, whose iterators come later (`check_pinning_device`)."""
    if not wanted:
        return
    workers = int(wanted.get("num_workers", args.get("num_workers", 0)))
    refused = (
        _unpicklable(args)
        if workers > 0 and _start_method(args.get("multiprocessing_context")) != "fork"
        else None
    )
    if wanted.get("pin_memory") and not torch.cuda.is_available():
        wanted = {k: v for k, v in wanted.items() if k != "pin_memory"}
    elif wanted.get("pin_memory") and not pin_device_later:
        refused = refused or pinning_device_problem()
    if refused:
        info.override_refused = refused
        return
    args.update(wanted)
    if workers == 0:
        for key in _WORKER_ONLY:
            args.pop(key, None)
    info.overrides_applied = dict(wanted)
    info.num_workers = workers
    info.pin_memory = bool(args.get("pin_memory", False))
    info.persistent_workers = bool(args.get("persistent_workers", False))
    info.prefetch_factor = args.get("prefetch_factor")


def check_pinning_device(loader: DataLoader, info: LoaderInfo, refuse: Callable[[str], None]) -> None:
    """Before an iterator of a loader given pin_memory by an override is made: torch picks the
    device its batches are pinned on then (`_BaseDataLoaderIter.__init__` and the pinning
    thread read the current device), not when the loader is built, so a rank may call
    set_device in between. Once one iterator passed, the loader's device is settled."""
    problem = pinning_device_problem()
    if problem is None:
        loader._trainadvisor_pin_check = False  # type: ignore[attr-defined]
        return
    info.override_refused = problem
    refuse(problem)


@dataclass
class LiveLoaders:
    """The DataLoaders this process built, for trial windows that change their settings while
    the loop runs (`training.session`): each loader's arguments as built, the loader itself (a
    weak reference: the script decides when it goes), and the iterator that served its last
    batch (the one the loop is calling)."""

    args: list[dict[str, Any]] = field(default_factory=list)
    refs: list[weakref.ref[DataLoader]] = field(default_factory=list)
    serving: dict[int, weakref.ref[_BaseDataLoaderIter]] = field(default_factory=dict)
    switched: set[int] = field(default_factory=set)  # loaders given a stand-in so far
    build: Callable[..., None] | None = None  # DataLoader.__init__ as torch defines it


@dataclass(frozen=True)
class Waiting:
    """What the workers of an iterator had loaded when the loop asked for its next batch, read
    once from torch's private fields: whether one was loaded (`loaded_ahead`), how many
    (`ready_batches`: queued, and held where they came out of order), and the two parts."""

    loaded_ahead: bool | None = None
    ready_batches: int | None = None
    queued: int = 0
    held: int = 0


def waiting(iterator: Any) -> Waiting:
    """What the workers of `iterator` had loaded and waiting when the loop asked for its next
    batch (`Waiting`); nothing told where torch's fields are not what this reads."""
    try:  # torch's private fields, read only: whatever another version holds there, training goes on
        info = getattr(iterator, "_task_info", None)
        queue = getattr(iterator, "_data_queue", None)
        if not isinstance(info, dict) or queue is None:
            return Waiting()
        next_held = _came_early(info.get(getattr(iterator, "_rcvd_idx", None)))
        held = _held(info)
    except Exception:
        return Waiting()
    try:
        queued = int(queue.qsize())
    except Exception:  # NotImplementedError: macOS's queues cannot count
        return Waiting(True if next_held else None, None, 0, held)
    return Waiting(next_held or queued > 0, queued + held, queued, held)


def served_ahead(before: Waiting, iterator: Any) -> bool | None:
    """Whether the batch the loop was just served had been loaded before it asked, told once it
    was: torch serves batches in order, so to reach it the loop read k batches from the queue,
    the k - 1 that came out of order now held; it was there only if `before.queued` >= k.
    Otherwise the loop waited for its worker, a wait more workers can hide: with 4 images a
    batch behind 15 ms each, 8 workers left one batch or more queued at 98% of the steps, which
    waited 1.8 ms (the median) as if for a hand-over, and 16 workers ran 26% faster."""
    if not before.loaded_ahead or before.ready_batches is None:
        return before.loaded_ahead
    try:
        info = getattr(iterator, "_task_info", None)
        if not isinstance(info, dict):
            return before.loaded_ahead
        held = _held(info)
    except Exception:
        return before.loaded_ahead
    return held - before.held + 1 <= before.queued


def _held(info: dict[Any, Any]) -> int:
    """How many of torch's `_task_info` tasks hold a batch that came back out of order."""
    return sum(1 for task in info.values() if _came_early(task))


def _came_early(task: Any) -> bool:
    """A task of torch's `_task_info` whose batch is back and held: (worker, batch)."""
    return isinstance(task, tuple) and len(task) == 2


def loaded_ahead(iterator: Any) -> bool | None:
    """Whether the workers of `iterator` had a batch loaded and waiting when the loop asked for
    its next one: the batch it needs next came early (out of order) and is held, or its result
    queue holds one (whether that one was the batch it needed, `served_ahead` tells once it is
    served). The loop's wait for such a batch is its hand-over (received from the worker and
    rebuilt in this process), which more workers cannot hide. None where it cannot be told: a
    loader without workers, an iterator that is not torch's, a queue that cannot count (macOS)."""
    return waiting(iterator).loaded_ahead


def ready_batches(iterator: Any) -> int | None:
    """How many batches the workers of `iterator` had loaded and waiting (in its result queue, or
    held where they came out of order) when the loop asked for its next one. A window whose count
    fell from its first step to its last ran partly on batches loaded before it
    (`analyze.run.summary.drained_batches`). None where it cannot be told (`loaded_ahead`)."""
    return waiting(iterator).ready_batches


def install(recorder: Any, refuse: Callable[[str], None]) -> None:
    """Every DataLoader built is recorded (where, with what) and given the overrides of its call
    site (`recorder.loader_overrides`; `refuse` ends the run when they cannot apply); its
    iterator's `__next__` is timed (`recorder.data_wait`), and the batches it serves inside the
    window are counted. A loader
    given a stand-in by a trial window (`_trainadvisor_shadow`) starts its epochs from it, and an
    iterator given a delegate (`_trainadvisor_delegate`) serves the delegate's batches."""
    original_next = _BaseDataLoaderIter.__next__
    clock = recorder.clock.perf_s
    live: LiveLoaders = recorder.live_loaders

    def timed_next(self: _BaseDataLoaderIter) -> Any:
        t0 = clock()
        serving = getattr(self, "_trainadvisor_delegate", None) or self
        before = waiting(serving)  # one read of the workers' queue a draw, and one after
        try:
            batch = original_next(serving)
        except StopIteration:
            again = getattr(self, "_trainadvisor_again", None)  # a stand-in's next pass
            if again is None:
                recorder.window.add_data_wait(clock() - t0)
                raise
            delegate = self._trainadvisor_delegate = again()  # type: ignore[attr-defined]
            batch = original_next(delegate)
        except RuntimeError as exc:  # torch's "worker ... exited unexpectedly": why it did
            note_worker_deaths(getattr(self, "_trainadvisor_delegate", None) or self, exc)
            raise
        waited_s = clock() - t0
        index = getattr(self, "_trainadvisor_loader", None)
        served = getattr(self, "_trainadvisor_delegate", None) or self
        ready = served_ahead(before, serving) if served is serving else None  # a next pass began
        recorder.data_wait(waited_s, batch, index, ready, before.ready_batches)
        if index is not None:
            live.serving[index] = weakref.ref(self)
        return batch

    recorder.patch(_BaseDataLoaderIter, "__next__", timed_next)
    original_get_iterator = DataLoader._get_iterator
    original_iter = DataLoader.__iter__

    def get_iterator(self: DataLoader) -> _BaseDataLoaderIter:
        if getattr(self, "_trainadvisor_pin_check", False):
            info = recorder.loaders[self._trainadvisor_loader]  # type: ignore[attr-defined]
            check_pinning_device(self, info, refuse)
        iterator = original_get_iterator(self)
        iterator._trainadvisor_loader = getattr(self, "_trainadvisor_loader", None)  # type: ignore[attr-defined]
        return iterator

    def iterate(self: DataLoader) -> Any:
        shadow = getattr(self, "_trainadvisor_shadow", None)
        return original_iter(shadow if shadow is not None else self)

    recorder.patch(DataLoader, "_get_iterator", get_iterator)
    recorder.patch(DataLoader, "__iter__", iterate)
    _record_construction(recorder, refuse)


def _record_construction(recorder: Any, refuse: Callable[[str], None]) -> None:
    """DataLoader(...): where and with what, the overrides of its call site, its arguments kept
    for trial windows (`LiveLoaders`)."""
    live: LiveLoaders = recorder.live_loaders
    original_init = DataLoader.__init__
    live.build = original_init
    signature = inspect.signature(original_init)

    def init(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        recorder.pass_gate()  # a run started ahead of its settings gets them here
        call = dict(signature.bind(self, *args, **kwargs).arguments)
        call.pop("self")
        site = call_site(self)
        info = describe(call, len(recorder.loaders), site)
        info.framework = framework_of(site)
        info.origin_site = loader_origin(recorder.loaders) if info.framework else ""
        apply(call, dict(recorder.loader_overrides.get(site, {})), info, pin_device_later=True)
        recorder.loaders.append(info)
        if info.override_refused:  # the run cannot measure what it was started for
            refuse(info.override_refused)
        original_init(self, **call)
        info.length = _length(self)
        self._trainadvisor_loader = info.index  # type: ignore[attr-defined]
        self._trainadvisor_pin_check = bool(info.overrides_applied.get("pin_memory"))  # type: ignore[attr-defined]
        live.args.append(call)
        live.refs.append(weakref.ref(self))

    recorder.patch(DataLoader, "__init__", init)
