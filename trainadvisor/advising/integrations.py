"""The advisor of `@advise` inside training frameworks: a PyTorch Lightning `Callback` and a
Hugging Face `TrainerCallback`. This module imports without either library; each factory
imports its library when called and says what to install when it is missing.

    trainer = lightning.Trainer(callbacks=[LightningAdvisor(warmup=5, steps=20)])
    trainer = transformers.Trainer(..., callbacks=[HuggingFaceAdvisor()])

A training step is one optimizer step of the framework's loop: from the end of the previous
batch (Lightning: `on_train_batch_end`; Hugging Face: `on_step_end`) to the end of this one. The
wait for data is timed where the framework fetches it, inside DataLoader `__next__` (both
frameworks fetch through it); the rest of the time before the batch starts
(`on_train_batch_start`, `on_step_begin`) is the framework's own work, never counted as data
wait."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from trainadvisor.advising.advisor import TIMED_STEPS, WARMUP_STEPS, Advisor
from trainadvisor.errors import MissingDependencyError
from trainadvisor.frameworks.watch import described
from trainadvisor.measure.settle import MAX_WARMUP_S, MIN_TIME_S


def _base_class(places: tuple[tuple[str, str], ...], missing: str) -> type:
    """The framework's callback class, from the first module that has it, those the script has
    already imported first (with both `lightning` and `pytorch_lightning` installed, a script of
    the old name trains with its Trainer, which takes only its own Callbacks); `missing` (what to
    install) when none does."""
    imported = [place for place in places if place[0] in sys.modules]
    for module, name in [*imported, *places]:
        try:
            return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
        except ImportError:
            continue
    raise MissingDependencyError(missing)


_classes: dict[tuple[str, type], type] = {}  # each callback class, built once from its base


def _callback_class(name: str, base: type, methods: dict[str, Any]) -> type:
    """One class per framework base for the whole process (isinstance sees one type), the first
    registered in this module under `name`, where pickle looks for it."""
    if (name, base) not in _classes:
        cls = type(name, (base,), {**methods, "__module__": __name__, "__qualname__": name})
        _classes[(name, base)] = cls
        globals().setdefault(name, cls)
    return _classes[(name, base)]


def _set_up(callback: Any, factory: Any, options: tuple[Any, ...]) -> None:
    """The state of a callback: its advisor, named as the script calls it, and the factory
    call that made it."""
    callback._factory, callback._options = factory, options
    warmup, steps, out, rules, min_time, max_warmup, log_to = options
    callback.advisor = Advisor(
        warmup=warmup, steps=steps, out=out, rules=rules, min_time=min_time, max_warmup=max_warmup,
        name=factory.__name__, log_to=log_to,
    )  # fmt: skip


def _told(advisor: Advisor, framework: str, settings: Any) -> None:
    """The framework's settings object, as its callback sees it: the report speaks its terms."""
    try:
        advisor.frameworks[:] = [described(framework, settings)]
    except Exception:  # the advice stays generic; training goes on
        pass


def _joined_lightning(advisor: Advisor, loggers: list[Any]) -> None:
    """Where the Trainer's own loggers write: the report goes there too (`log_to="auto"`)."""
    for logger in loggers:
        kind = type(logger).__name__
        try:
            if kind == "TensorBoardLogger":
                advisor.joined["tensorboard"] = str(logger.log_dir)
            elif kind == "MLFlowLogger" and logger.run_id:
                advisor.joined["mlflow"] = str(logger.run_id)
            elif kind == "WandbLogger":
                logger.experiment  # noqa: B018 - starts its run: `wandb.run`, which the report joins
        except Exception:  # a logger that cannot say: the report stays in its folder
            continue


def _reduce(self: Any) -> tuple[Any, tuple[Any, ...]]:
    """Pickled as the factory call that made it (Lightning's `ddp_spawn` pickles callbacks into
    new processes; an advisor holds threads and hooks that cannot travel, so each process builds
    its own)."""
    return self._factory, self._options


def LightningAdvisor(  # noqa: N802 - used like the class it returns an instance of
    warmup: int = WARMUP_STEPS,
    steps: int = TIMED_STEPS,
    out: str | Path | None = None,
    rules: list[str | Path] | None = None,
    min_time: float = MIN_TIME_S,
    max_warmup: float | None = MAX_WARMUP_S,
    log_to: list[str] | str | None = None,
) -> Any:
    """A `lightning.pytorch.Callback` that profiles training batches: at least `steps` (and
    `min_time` seconds) after a warm-up of at least `warmup` that lasts until step time settles
    (at most `max_warmup` seconds), as `advise` does. `log_to="auto"`: the report goes where the
    Trainer's loggers write (a TensorBoardLogger's folder, a WandbLogger's run, an MLFlowLogger's
    run), as `advise(log_to=...)` says."""
    base = _base_class(
        (("lightning.pytorch", "Callback"), ("pytorch_lightning", "Callback")),  # new and old names
        "LightningAdvisor needs PyTorch Lightning: pip install lightning (or pytorch-lightning)",
    )

    def init(self: Any, *options: Any) -> None:
        base.__init__(self)  # type: ignore[misc]  # the framework's Callback, built with no arguments
        _set_up(self, LightningAdvisor, options)

    def on_fit_start(self: Any, trainer: Any, pl_module: Any) -> None:
        _told(self.advisor, "lightning", trainer)
        if self.advisor.auto_log:
            _joined_lightning(self.advisor, getattr(trainer, "loggers", []))

    def on_train_batch_start(self: Any, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.advisor.call_started((batch,))

    def on_train_batch_end(
        self: Any, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.advisor.call_ended(outputs)

    def on_train_end(self: Any, trainer: Any, pl_module: Any) -> None:
        self.advisor.__exit__(None, None, None)

    def on_exception(self: Any, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.advisor.close()

    methods = {
        "__init__": init, "__reduce__": _reduce, "on_fit_start": on_fit_start,
        "on_train_batch_start": on_train_batch_start,
        "on_train_batch_end": on_train_batch_end, "on_train_end": on_train_end, "on_exception": on_exception,
    }  # fmt: skip
    options = (warmup, steps, out, rules, min_time, max_warmup, log_to)
    return _callback_class("LightningAdvisorCallback", base, methods)(*options)


def HuggingFaceAdvisor(  # noqa: N802 - used like the class it returns an instance of
    warmup: int = WARMUP_STEPS,
    steps: int = TIMED_STEPS,
    out: str | Path | None = None,
    rules: list[str | Path] | None = None,
    min_time: float = MIN_TIME_S,
    max_warmup: float | None = MAX_WARMUP_S,
    log_to: list[str] | str | None = None,
) -> Any:
    """A `transformers.TrainerCallback` that profiles optimizer steps: at least `steps` (and
    `min_time` seconds) after a warm-up of at least `warmup` that lasts until step time settles
    (at most `max_warmup` seconds), as `advise` does. `log_to="auto"`: the report goes where the
    Trainer's `report_to` sends its logs (W&B's and MLflow's active runs, TensorBoard's
    `logging_dir`)."""
    base = _base_class(
        (("transformers", "TrainerCallback"),),
        "HuggingFaceAdvisor needs transformers: pip install transformers",
    )

    def init(self: Any, *options: Any) -> None:
        _set_up(self, HuggingFaceAdvisor, options)

    def on_train_begin(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _told(self.advisor, "transformers", args)
        reports = getattr(args, "report_to", None) or []
        if self.advisor.auto_log and "tensorboard" in reports and getattr(args, "logging_dir", None):
            self.advisor.joined["tensorboard"] = str(args.logging_dir)

    def on_step_begin(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.advisor.call_started()

    def on_step_end(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.advisor.call_ended()

    def on_train_end(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.advisor.__exit__(None, None, None)

    methods = {
        "__init__": init, "__reduce__": _reduce, "on_train_begin": on_train_begin,
        "on_step_begin": on_step_begin, "on_step_end": on_step_end,
        "on_train_end": on_train_end,
    }  # fmt: skip
    options = (warmup, steps, out, rules, min_time, max_warmup, log_to)
    return _callback_class("HuggingFaceAdvisorCallback", base, methods)(*options)


__all__ = ["HuggingFaceAdvisor", "LightningAdvisor"]
