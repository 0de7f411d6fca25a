"""The advisor of `@advise` inside training frameworks: a PyTorch Lightning `Callback` and a
Hugging Face `TrainerCallback`. This module imports without either library; each factory
imports its library when called and says what to install when it is missing.

    trainer = lightning.Trainer(callbacks=[LightningAdvisor(warmup=5, steps=20)])
    trainer = transformers.Trainer(..., callbacks=[HuggingFaceAdvisor()])

A training step is one optimizer step of the framework's loop: from the end of the previous
batch (Lightning: `on_train_batch_end`; Hugging Face: `on_step_end`) to the end of this one; the
time before the batch starts (`on_train_batch_start`, `on_step_begin`) is the wait for data."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from trainadvisor.advisor import Advisor
from trainadvisor.errors import MissingDependencyError


def _base_class(places: tuple[tuple[str, str], ...], missing: str) -> type:
    """The framework's callback class, from the first module that has it; `missing` (what to
    install) when none does."""
    for module, name in places:
        try:
            return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
        except ImportError:
            continue
    raise MissingDependencyError(missing)


def LightningAdvisor(  # noqa: N802 - used like the class it returns an instance of
    warmup: int = 5, steps: int = 20, out: str | Path | None = None, rules: list[str | Path] | None = None
) -> Any:
    """A `lightning.pytorch.Callback` that profiles `steps` training batches after `warmup`."""
    base = _base_class(
        (("lightning.pytorch", "Callback"), ("pytorch_lightning", "Callback")),  # new and old names
        "LightningAdvisor needs PyTorch Lightning: pip install lightning (or pytorch-lightning)",
    )

    class _LightningAdvisor(base):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__()
            self.advisor = Advisor(warmup=warmup, steps=steps, out=out, rules=rules)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.advisor.call_started((batch,))

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.advisor.call_ended(outputs)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.advisor.__exit__(None, None, None)

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            self.advisor.close()

    return _LightningAdvisor()


def HuggingFaceAdvisor(  # noqa: N802 - used like the class it returns an instance of
    warmup: int = 5, steps: int = 20, out: str | Path | None = None, rules: list[str | Path] | None = None
) -> Any:
    """A `transformers.TrainerCallback` that profiles `steps` optimizer steps after `warmup`."""
    base = _base_class(
        (("transformers", "TrainerCallback"),),
        "HuggingFaceAdvisor needs transformers: pip install transformers",
    )

    class _HuggingFaceAdvisor(base):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            self.advisor = Advisor(warmup=warmup, steps=steps, out=out, rules=rules)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.advisor.call_started()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.advisor.call_ended()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.advisor.__exit__(None, None, None)

    return _HuggingFaceAdvisor()


__all__ = ["HuggingFaceAdvisor", "LightningAdvisor"]
