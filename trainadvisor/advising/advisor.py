"""`@advise`: the profiler inside the user's own process, for steps that cannot be handed to
`trainadvisor profile` (notebooks, framework trainers, a step buried in a larger program).

    @advise                       # or @advise(warmup=5, steps=20, out="report")
    def train_step(batch): ...

    with advise() as advisor:     # around a loop
        for batch in loader:
            ...
            advisor.step()

The window is the one `profile` measures: `warmup` steps, then `steps` steps timed with clocks
alone, then up to 10 traced with torch.profiler. A decorated function's step runs from the end
of the previous call to the end of this one. Data wait is timed where data is fetched, inside
DataLoader `__next__` (a framework's loop fetches through it too), never inferred from the time
between two calls: that time holds whatever the loop does around the function (its input where
it has no DataLoader; Lightning's backward and optimizer step around a decorated
`training_step`), and is reported as its own part, outside the decorated function. In a `with`
block a step runs from one `advisor.step()` to the next. When the window ends the advisor writes
the same report folder as `profile`, prints the diagnosis and removes everything it installed;
training goes on untouched. Fixes are not applied in-process: each is listed with the
`trainadvisor profile` command that measures it.

Nothing the advisor does may break training: any error inside it is reported once as a warning
and the advisor switches itself off, leaving the step to run as if undecorated."""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data.dataloader import _BaseDataLoaderIter

from trainadvisor import trackers
from trainadvisor.advising import sites
from trainadvisor.advising.report import advise_report, data_parallel_modules, main_script, profile_command
from trainadvisor.errors import UsageError
from trainadvisor.measure.runner import PROFILE_STEPS, attach_samples
from trainadvisor.measure.sampling import Sampler
from trainadvisor.measure.settle import MAX_WARMUP_S, MIN_TIME_S, Settling
from trainadvisor.options.table import default
from trainadvisor.records import FrameworkCall, LoaderInfo, ProfileReport, RawRun
from trainadvisor.report import notebook
from trainadvisor.report.folder import check_out_dir, hold_out_dir
from trainadvisor.report.mdtext import terminal
from trainadvisor.report.paths import published
from trainadvisor.report.render import terminal_summary, write_report
from trainadvisor.resources import templates_dir
from trainadvisor.training import gpu, hooks, loaders
from trainadvisor.training.window import Window
from trainadvisor.training.window_plan import Clock, WindowPlan, start_profiler

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_OUT = Path("trainadvisor-report")
OUT_OPTION = "advise(out=...)"  # how errors name the report folder
_open_window: Advisor | None = None  # the advisor whose window runs in this process
_announced: set[Path] = set()  # report folders already announced in this process
_OWNING = threading.Lock()  # the first thread to call an advisor becomes the one it measures

# `profile`'s defaults, defined once in its option table
WARMUP_STEPS: int = default("warmup")
TIMED_STEPS: int = default("steps")


def _note_built_with() -> Callable[[], None]:
    """Each DataLoader iterator made from now on notes what its loader was built with that an
    iterator of no workers does not keep (`loaders.BUILT_WITH`): a trial's stand-in loader with workers
    gets the user's worker_init_fn, context and generator (`windows.stand_in`). Returns the undo."""
    original = _BaseDataLoaderIter.__init__

    def noting_init(iterator: _BaseDataLoaderIter, loader: Any) -> None:
        original(iterator, loader)
        iterator._trainadvisor_built_with = {  # type: ignore[attr-defined]
            name: getattr(loader, name, None) for name in loaders.BUILT_WITH
        }

    return hooks.replace_attribute(_BaseDataLoaderIter, "__init__", noting_init)


class Advisor:
    """One profiling window inside this process. Use it through `advise`."""

    def __init__(
        self,
        warmup: int = WARMUP_STEPS,
        steps: int = TIMED_STEPS,
        out: str | Path | None = None,
        rules: list[str | Path] | None = None,
        echo: Callable[[str], None] | None = None,
        clock: Clock | None = None,
        trials: bool = False,
        min_time: float = MIN_TIME_S,
        max_warmup: float | None = MAX_WARMUP_S,
        name: str = "advise",  # what the script called: a framework's callback says its own name
        log_to: list[str] | str | None = None,  # experiment trackers the report goes to, or "auto"
    ) -> None:
        if warmup < 1 or steps < 1:
            raise ValueError(f"{name}: warmup and steps must be at least 1")
        self.name = name
        self.out_option = OUT_OPTION if name == "advise" else f"{name}(out=...)"
        self.warmup, self.steps = warmup, steps
        self.min_time_s, self.max_warmup_s = min_time, max_warmup
        self.clock = clock or Clock()
        self.window = Window(
            WindowPlan(warmup, steps, min(PROFILE_STEPS, steps), False, min_time, self.settling(0)),
            self.clock,
            on_open=self._window_opens,
            on_close=self._window_closes,
            profiler=lambda _steps, _stack: self._start_profiler(),
        )
        self.out = Path(out) if out is not None else DEFAULT_OUT
        self.rule_dirs = [Path(r) for r in rules or []]
        self.auto_log = log_to == "auto"  # the trackers the training itself logs to
        wanted = [] if log_to is None or log_to == "auto" else [log_to] if isinstance(log_to, str) else log_to
        unknown = [t for t in wanted if t not in trackers.BACKENDS]
        if unknown:
            raise ValueError(
                f"{name}: log_to={unknown}: give 'auto' or some of {', '.join(trackers.BACKENDS)}"
            )
        self.log_to = list(wanted)
        self.joined: dict[str, str] = {}  # a framework logger's run id or folder, by tracker
        self.echo = echo or (lambda text: print(terminal(text), file=sys.stderr, flush=True))
        self.active = True  # False once the window is reported or the advisor failed
        self.decorated = False  # steps are calls of a decorated function (their arguments: the batch)
        self.report: ProfileReport | None = None
        self.calls = 0  # steps ended so far
        self.call_start: float | None = None
        self.loaders: list[LoaderInfo] = []
        self.frameworks: list[FrameworkCall] = []  # the framework's settings, told by its callback
        self._loader_wait_s = 0.0  # DataLoader waits timed since the last step ended
        self._outside_s: dict[int, float] = {}  # step index -> time outside the decorated call
        self.trials_wanted = trials  # measure the in-process fixes in windows after this one
        self.trials: Any = None  # advise_trials.AdviseTrials, while they run
        self.values: dict[str, Any] = {}  # the window's measurements, as the rules saw them
        self._serving: tuple[Any, int] | None = None  # (weakref to the loop's iterator, loader)
        self.sampler: Sampler | None = None
        self._undo: list[Callable[[], None]] = []
        self._started = time.monotonic()
        self._owner: int | None = None  # the thread whose steps are measured (`owns`)
        self._others_told = False
        if hooks.ACTIVE is not None:
            # Under `trainadvisor profile`, which measures this script already (and a second
            # profiler session in one process can crash torch).
            self.active = False
            return
        try:
            check_out_dir(self.out, self.out_option)  # a folder that cannot be the report: say so now
        except UsageError as exc:
            self._fail(exc)
            return
        if self.out not in _announced:
            _announced.add(self.out)
            self.echo(
                f"trainadvisor: advising after {warmup} warmup steps; the report goes to "
                f"{self.out.resolve()} ({self.out_option} to choose)"
            )

    @property
    def called(self) -> str:
        """How the script asked for this advisor, as its messages and report name it:
        `@advise`, `advise()` or a framework's callback (`LightningAdvisor`)."""
        if self.name != "advise":
            return self.name
        return "@advise" if self.decorated else "advise()"

    @property
    def traced_steps(self) -> int:
        return self.window.plan.traced_steps

    def settling(self, workers: int) -> Settling | None:
        """The warm-up's steadiness test (None: `warmup` steps exactly, `max_warmup=None`)."""
        if not self.max_warmup_s:
            return None
        return Settling(max_s=self.max_warmup_s).for_workers(workers)

    # ---- the step boundaries (each guarded: an advisor error never reaches training) ----

    def owns(self, claim: bool = True) -> bool:
        """Whether the calling thread is the one this advisor measures: the first to take a
        step through it (`claim`: a step's entry point; a hook that sees a batch or an optimizer
        step claims nothing). One window at a time, on one thread: torch.profiler must start and
        stop on the thread that started it (Kineto aborts the process otherwise), and one
        window's steps are one loop's. Other threads' calls, batches and optimizer steps pass
        through untouched."""
        ident = threading.get_ident()
        if self._owner is None and not claim:
            return False
        if self._owner is None:
            with _OWNING:
                if self._owner is None:
                    self._owner = ident
        if self._owner == ident:
            return True
        if not self._others_told and self.active:
            self._others_told = True
            self.echo(
                f"trainadvisor: {self.called} was called from another thread too: only the first "
                "thread's steps are measured; the other threads' calls run untouched"
            )
        return False

    def call_started(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> None:
        if not self.active or not self.owns():
            return
        try:
            window = self.window
            self.call_start = self.clock.perf_s()
            if window.measuring:
                if self.decorated:  # outside the function: the loop around it, not data wait
                    gap = max(self.call_start - window.last_mark - self._loader_wait_s, 0.0)
                    self._outside_s[window.first_index + window.steps_done] = gap
                tensors = list(hooks.batch_tensors([args, kwargs or {}]))
                if tensors and tensors[0].dim() > 0:
                    window.add_batch(int(tensors[0].shape[0]))
            self._loader_wait_s = 0.0
        except Exception as exc:
            self._fail(exc)

    def call_ended(self, result: Any = None) -> None:
        """The end of a step: a decorated call returned, or `advisor.step()` was called."""
        if not self.active or not self.owns():
            return
        try:
            window = self.window
            # The losses are read in the window only; the last warmup step's also names the GPU
            # the window is timed on (a warmup call costs no more than that).
            if window.measuring or window.steps_done + 1 == self.warmup:
                loss = _loss_of(result)
                if loss is not None:
                    window.set_loss(loss)
            self.calls += 1
            self.call_start = None
            self._loader_wait_s = 0.0
            window.boundary()
        except Exception as exc:
            self._fail(exc)

    def call_failed(self) -> None:
        """The step raised: its timing is dropped, the next step starts now."""
        if self.active and self.owns():
            self.window.restart_step()
            self.call_start = None

    def step(self, loss: Any = None) -> None:
        """Mark the end of one training step in a `with advise()` block (optionally with its
        loss, for the report)."""
        self.call_ended(loss)

    # ---- the window ----

    def _window_opens(self, window: Window) -> dict[str, Any]:
        global _open_window
        if _open_window is not None and _open_window is not self:
            # One window per process: a second profiler session in one process can crash torch
            # (a re-run notebook cell, two decorated functions).
            self.active = False
            self.echo(
                f"trainadvisor: another advisor is measuring ({_open_window.out}); this one stands down"
            )
            return {}
        _open_window = self
        atexit.register(self.close)
        device = window.device if window.device is not None else gpu.training_device(None)
        named = {f"GPU {device}": gpu.device_identity(device)} if device is not None else {}
        self.sampler = Sampler(os.getpid(), devices=lambda: named)
        self.sampler.start()
        self._time_loaders()
        self._undo.append(register_optimizer_step_post_hook(self._optimizer_stepped).remove)
        return gpu.torch_facts(data_parallel_modules(), None, device)

    def _optimizer_stepped(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if self.owns(claim=False):
            self.window.optimizer_stepped(optimizer, counted=True)

    def _time_loaders(self) -> None:
        """Time DataLoader `__next__` while the window runs (used by `with` blocks, where there
        is no call to time around), and note each loader and the batches it serves."""
        original = _BaseDataLoaderIter.__next__
        advisor, clock = self, self.clock.perf_s

        def timed_next(iterator: _BaseDataLoaderIter) -> Any:
            if not advisor.owns(claim=False):  # another thread's loader: not this window's
                return original(iterator)
            t0 = clock()
            try:
                batch = original(getattr(iterator, "_trainadvisor_delegate", None) or iterator)
            except StopIteration:
                again = getattr(iterator, "_trainadvisor_again", None)  # a trial stand-in's next pass
                if again is None:
                    raise
                iterator._trainadvisor_delegate = again()  # type: ignore[attr-defined]
                batch = original(iterator._trainadvisor_delegate)  # type: ignore[attr-defined]
            finally:
                waited = clock() - t0
                advisor.window.add_data_wait(waited)
                advisor._loader_wait_s += waited
            if getattr(iterator, "_trainadvisor_delegate", None) is not None and advisor.trials is not None:
                advisor.trials.served += 1  # a stand-in's batch: a step the script would not have taken
            advisor._loader_batch(iterator, batch)
            return batch

        self._undo.append(hooks.replace_attribute(_BaseDataLoaderIter, "__next__", timed_next))
        self._undo.append(_note_built_with())

    def _loader_batch(self, iterator: _BaseDataLoaderIter, batch: Any) -> None:
        index = getattr(iterator, "_trainadvisor_advised", None)
        if index is None:  # a new iterator: of a loader met before (its next epoch), or a new one
            info = sites.loader_of(iterator, self.loaders)
            index = iterator._trainadvisor_advised = info.index  # type: ignore[attr-defined]
            if index == len(self.loaders):
                self.loaders.append(info)
        self._serving = (weakref.ref(iterator), index)
        if self.window.measuring and self.trials is None:
            self.loaders[index].batches_in_window += 1
        tensors = list(hooks.batch_tensors(batch))
        counted = tensors and tensors[0].dim() > 0 and not self.decorated  # else the call's arguments
        samples = int(tensors[0].shape[0]) if counted else None
        host = [hooks.fingerprint(t) for t in tensors if t.device.type == "cpu"]
        self.window.add_batch(samples, ",".join(host) if host else None)

    def _start_profiler(self) -> Any:
        return start_profiler(self.window.plan.profile_steps)

    def _cleanup(self) -> None:
        """Stop the profiler and the sampler thread and undo the patches: torch as it was. Each
        step is done even when an earlier one fails; nothing here raises."""
        global _open_window
        self.active = False
        steps: list[Callable[[], None]] = [self.window.stop_profiler]
        if self.trials is not None:  # a trial's stand-in loader and switches go first
            steps.append(self.trials.abandon)
        if self.sampler is not None:
            steps.append(self.sampler.stop)
        steps += reversed(self._undo)
        self.sampler, self._undo = None, []
        for undo in steps:
            try:
                undo()
            except Exception:  # the rest must still be undone
                pass
        if _open_window is self:
            _open_window = None
        atexit.unregister(self.close)

    def close(self) -> None:
        """End the advisor now (a loop that stopped before the window was full): the profiler,
        the sampler and every patch go; no report is written. Also run at interpreter exit."""
        if self.active:
            self._cleanup()

    def _fail(self, exc: BaseException) -> None:
        self._cleanup()
        try:
            warnings.warn(
                f"trainadvisor: the advisor stopped ({type(exc).__name__}: {exc}); training goes on "
                "unchanged. Set TRAINADVISOR_DEBUG=1 to see where.",
                RuntimeWarning,
                stacklevel=3,
            )
        except Exception:  # warnings turned into errors (-W error): still never break training
            pass
        if os.environ.get("TRAINADVISOR_DEBUG"):
            raise exc

    def _window_closes(self, window: Window) -> None:
        """The window is measured: write the report, print the diagnosis, remove everything.
        Under torch.distributed only rank 0 writes (the ranks would share one folder)."""
        if (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_rank() != 0
        ):
            self._cleanup()
            return
        trace_rel = "traces/advise/trainadvisor.pt.trace.json.gz"
        # One writer at a time; the trace is staged and published with the report that names
        # it, so an earlier report stays whole until then (`report.folder`).
        with hold_out_dir(self.out, self.out_option) as folder:
            profiler, sampler = window.stop_profiler(), self.sampler
            if profiler is not None:
                (folder.stage / trace_rel).parent.mkdir(parents=True, exist_ok=True)
                hooks.export_trace(profiler, folder.stage / trace_rel)
            trials = self.trials_wanted
            if sampler is not None and not trials:
                sampler.stop()
                self.sampler = None
            if not trials:
                self._cleanup()
            self.outside_calls(window)
            raw = hooks.window_run(
                window,
                label="advise",
                status="window_complete",
                exit_code=None,
                error=None,
                steps_seen=self.calls,
                step_source=self.called if self.called != "advise()" else "advisor.step()",
                loaders=self.loaders,
                frameworks=self.frameworks,
                trace_file=trace_rel if profiler is not None else None,
            )
            if sampler is not None:
                attach_samples(raw, sampler, until_unix_s=time.time())
            self.report = self._report(raw, folder.stage)
            shown = published(self.report)
            write_report(shown, self.out, templates_dir(), folder.publish)
        if not (trials and self._start_trials(self.report)):
            self._announce(shown)  # once: after the trials where they run

    def _announce(self, shown: ProfileReport) -> None:
        """The published report where the user looks: the terminal, the notebook's cell, the
        trackers."""
        self.echo(terminal_summary(shown, self.out))
        notebook.show(shown, self.out)
        trackers.export(shown, self.out, self._trackers(), self.echo, self.joined)

    def _trackers(self) -> list[str]:
        """The trackers to log into: those given; with "auto", those the training logs to (an
        active W&B or MLflow run, a framework logger's folder or run)."""
        if not self.auto_log:
            return self.log_to
        found = list(self.joined)
        wandb, mlflow = sys.modules.get("wandb"), sys.modules.get("mlflow")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            found.append("wandb")
        if mlflow is not None and hasattr(mlflow, "active_run") and mlflow.active_run() is not None:
            found.append("mlflow")
        return list(dict.fromkeys([*self.log_to, *found]))

    def outside_calls(self, window: Window) -> None:
        """The window's steps gain the time their loop spent outside the decorated function."""
        for record in window.records:
            record.outside_call_ms = (
                self._outside_s[record.index] * 1e3 if record.index in self._outside_s else None
            )
        self._outside_s = {}

    # ---- trial windows (advise(trials=True)) ----

    def _start_trials(self, report: ProfileReport) -> bool:
        """The trial windows started; False where there are none to measure."""
        from trainadvisor.advising.windows import AdviseTrials

        self.trials = AdviseTrials(self, report, self.values)
        names = ", ".join(self.trials.fix_ids())  # before the first window takes its fix
        first = self.trials.next_window() if self.trials.any() else None
        if first is None:
            self.trials = None
            self._cleanup()
            return False
        self.echo(
            f"trainadvisor: measuring {names} in windows of this process (they train your model on "
            "extra batches; the report says how many)"
        )
        self.window = first
        return True

    def serving(self) -> tuple[Any, LoaderInfo] | None:
        """The DataLoader iterator the loop is calling, and its loader's description."""
        if self._serving is None:
            return None
        iterator = self._serving[0]()
        return (iterator, self.loaders[self._serving[1]]) if iterator is not None else None

    def attach_window_samples(self, raw: RawRun) -> None:
        if self.sampler is not None:
            attach_samples(raw, self.sampler, raw.window_start_unix_s or 0.0, time.time())

    def trial_window_closes(self, window: Window) -> None:
        """A trial window is measured: the next one, or the end of the trials."""
        trials = self.trials
        trials.window_done(window)
        following = trials.next_window()
        if following is not None:
            self.window = following
            return
        final = trials.finish(self._profile_command(main_script()))
        self.trials = None
        self._cleanup()
        self.report = final
        shown = published(final)
        with hold_out_dir(self.out, self.out_option):
            write_report(shown, self.out, templates_dir())
        self._announce(shown)

    def _report(self, raw: RawRun, traces_in: Path) -> ProfileReport:
        report, self.values = advise_report(
            raw, traces_in, self.rule_dirs, self._started, self._profile_command, self.called
        )
        return report

    def _profile_command(self, script: Path | None) -> list[str] | None:
        return profile_command(script, self.out, self.warmup, self.steps, self.rule_dirs)

    # ---- `with advise() as advisor:` ----

    def __enter__(self) -> Advisor:
        self.owns()  # a `with` block's steps are its own thread's
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.active:  # the block ended before the window did: leave nothing behind
            self.close()
            if kind is None:
                self.echo(
                    f"trainadvisor: {'the block' if self.name == 'advise' else 'training'} ended after "
                    f"{self.calls} steps, {self._needs()}: no report"
                )

    def _needs(self) -> str:
        """What the window still needed, in words."""
        plan = self.window.plan
        if plan.settle is None and not plan.min_time_s:
            return f"before the {plan.warmup + plan.steps + plan.traced_steps} the window needs"
        return (
            f"before the window was complete (a warm-up until step time settles, then at least "
            f"{plan.steps} steps and {plan.min_time_s:g} s timed, then {plan.traced_steps} traced)"
        )

    # ---- `@advise(...)` ----

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        self.decorated = True
        return _wrap(fn, self)


def _loss_of(result: Any) -> torch.Tensor | None:
    """The step's loss: a returned scalar tensor (or a float), or `loss` in a returned dict."""
    if isinstance(result, dict):
        result = result.get("loss")
    elif isinstance(result, (tuple, list)) and result:
        result = result[0]
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        return result.detach()
    if isinstance(result, float):
        return torch.tensor(result)
    return None


def _wrap(fn: Callable[P, R], advisor: Advisor) -> Callable[P, R]:
    @functools.wraps(fn)
    def advised(*args: P.args, **kwargs: P.kwargs) -> R:
        if not advisor.active or not advisor.owns():  # off, or another thread's call
            return fn(*args, **kwargs)
        advisor.call_started(args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            advisor.call_failed()
            raise
        advisor.call_ended(result)
        return result

    advised.advisor = advisor  # type: ignore[attr-defined]
    return advised


@overload
def advise(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def advise(
    fn: None = None,
    /,
    *,
    warmup: int = WARMUP_STEPS,
    steps: int = TIMED_STEPS,
    out: str | Path | None = None,
    rules: list[str | Path] | None = None,
    trials: bool = False,
    min_time: float = MIN_TIME_S,
    max_warmup: float | None = MAX_WARMUP_S,
    log_to: list[str] | str | None = None,
) -> Advisor: ...


def advise(
    fn: Callable[P, R] | None = None,
    /,
    *,
    warmup: int = WARMUP_STEPS,
    steps: int = TIMED_STEPS,
    out: str | Path | None = None,
    rules: list[str | Path] | None = None,
    trials: bool = False,
    min_time: float = MIN_TIME_S,
    max_warmup: float | None = MAX_WARMUP_S,
    log_to: list[str] | str | None = None,
) -> Callable[P, R] | Advisor:
    """Profile a training step where it runs: `@advise`, `@advise(warmup=5, steps=20)`, or
    `with advise() as advisor: ... advisor.step()`. The warm-up lasts at least `warmup` steps
    and until step time settles (at most `max_warmup` seconds; None: `warmup` steps exactly);
    then at least `steps` steps are timed, over at least `min_time` seconds. With `trials=True`
    the fixes that can switch while the loop runs are measured in windows after it.
    `log_to=["wandb", "mlflow", "tensorboard"]` logs the report into the training's own active
    run of each tracker (`trackers`); `log_to="auto"`, into those the training logs to. See the
    module's documentation."""
    advisor = Advisor(
        warmup=warmup,
        steps=steps,
        out=out,
        rules=rules,
        trials=trials,
        min_time=min_time,
        max_warmup=max_warmup,
        log_to=log_to,
    )
    return advisor(fn) if fn is not None else advisor
