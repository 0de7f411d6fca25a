"""How many training steps the script takes, so that windows fit in it: from a training
framework's settings (Hugging Face's TrainingArguments, Lightning's Trainer), or from a run of
the script that ended by itself. A plain `for epoch in range(...)` loop says nothing about its
epochs, so its length is known only once a run of it has ended. Pure."""

from __future__ import annotations

import math
from typing import Any

from trainadvisor.analyze.run.summary import main_loader
from trainadvisor.records import FrameworkCall, RawRun, RunLength


def run_length(raw: RawRun, earlier: RunLength | None = None) -> RunLength:
    """What `raw` (a run of the script, maybe still going) tells of the script's length, on top
    of what was known before."""
    seen = max(raw.steps_seen, earlier.seen_steps if earlier else 0)
    if raw.status == "script_ended" and raw.steps_seen:  # it ran to its own end
        return RunLength(raw.steps_seen, f"a run of the script ended after {raw.steps_seen} steps", seen)
    if earlier is not None and earlier.total_steps is not None:
        return RunLength(earlier.total_steps, earlier.source, seen)
    framework = _framework_length(raw)
    if framework is not None:
        return RunLength(framework[0], framework[1], seen)
    return RunLength(None, f"not known: a run of the script took at least {seen} steps", seen)


def _framework_length(raw: RawRun) -> tuple[int, str] | None:
    batches = _batches_per_epoch(raw)
    for call in raw.frameworks:
        found = (
            _transformers(call, batches)
            if call.framework == "transformers"
            else _lightning(call, batches)
            if call.framework == "lightning"
            else None
        )
        if found is not None:
            return found
    return None


def _batches_per_epoch(raw: RawRun) -> int | None:
    loader = main_loader(raw)
    return loader.length if loader is not None and loader.length else None


def _number(settings: dict[str, Any], name: str) -> float | None:
    value = settings.get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _transformers(call: FrameworkCall, batches: int | None) -> tuple[int, str] | None:
    """The Trainer's own count: max_steps when positive, else num_train_epochs x its updates per
    epoch (the loader's batches over gradient_accumulation_steps, rounded up)."""
    settings = call.settings
    max_steps = _number(settings, "max_steps")
    if max_steps is not None and max_steps > 0:
        return int(max_steps), f"TrainingArguments(max_steps={int(max_steps)}) at {call.site}"
    epochs = _number(settings, "num_train_epochs")
    accumulate = int(_number(settings, "gradient_accumulation_steps") or 1)
    if epochs is None or not batches:
        return None
    per_epoch = max(math.ceil(batches / max(accumulate, 1)), 1)
    total = math.ceil(epochs * per_epoch)
    return total, (
        f"TrainingArguments(num_train_epochs={epochs:g}) x {per_epoch} updates per epoch ({batches} "
        f"batches, gradient_accumulation_steps={accumulate})"
    )


def _lightning(call: FrameworkCall, batches: int | None) -> tuple[int, str] | None:
    """Lightning stops at max_steps (when not -1) or after max_epochs (1000 when neither is
    set), whichever comes first; an epoch is the loader's batches over accumulate_grad_batches."""
    settings = call.settings
    max_steps = _number(settings, "max_steps")
    max_epochs = _number(settings, "max_epochs")
    accumulate = int(_number(settings, "accumulate_grad_batches") or 1)
    by_steps = int(max_steps) if max_steps is not None and max_steps >= 0 else None
    per_epoch = max(math.ceil(batches / max(accumulate, 1)), 1) if batches else None
    epochs = int(max_epochs) if max_epochs is not None and max_epochs >= 0 else None
    by_epochs = epochs * per_epoch if epochs is not None and per_epoch else None
    if by_steps is not None and (by_epochs is None or by_steps <= by_epochs):
        return by_steps, f"Trainer(max_steps={by_steps}) at {call.site}"
    if by_epochs is not None:
        return by_epochs, f"Trainer(max_epochs={epochs}) x {per_epoch} steps per epoch"
    return None
