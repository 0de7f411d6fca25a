"""Fix `activation-checkpointing`: each repeated block of the trained model (a ModuleList or
Sequential of modules of one type: transformer layers, residual blocks; `memory.blocks`) run
through torch.utils.checkpoint, so that backward keeps only each block's input and recomputes
the rest, trading compute for memory.

Applied at run time without editing the script: the blocks' forwards are wrapped before the
model's first call (non-reentrant checkpointing, the RNG state kept so dropout draws the same:
the loss of each step must match the baseline's). Its trials restart the script. It is a memory
fix (`MemoryFix`): recommended from its own runs, with its peak and its cost in speed, never
applied silently. The code change wraps the same blocks after the line that builds the model;
for a Hugging Face model, `gradient_checkpointing=True` in TrainingArguments (or
`model.gradient_checkpointing_enable()`); for Lightning, the same lines in the LightningModule's
`__init__`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import MemoryFix, Setting, overrides
from trainadvisor.records import Overrides, Trial


class ActivationCheckpointing(MemoryFix):
    id = "activation-checkpointing"
    restarts_because = "the blocks must be wrapped before the model's first call"
    min_speed = 0.65  # recomputing the forward costs about a third of a step
    no_gain = (
        "checkpointing the blocks did not lower the peak by 10% at 65% of the baseline's speed or "
        "better, nor fit the run into its memory budget"
    )

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if "blocks_path" not in values:
            return (
                "the trained model has no repeated blocks (a ModuleList or Sequential of modules "
                "of one type) to checkpoint"
            )
        return None

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        if trials:
            return None
        return Setting(_words(values), overrides(activation_checkpointing=str(values["blocks_path"])))

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        return f"{_words(values)}: {self.cost(trial, values)}"

    def install(self, recorder: Any, overrides: Overrides) -> None:
        path = overrides.runtime.get("activation_checkpointing")
        if path is None:
            return
        from trainadvisor.memory.blocks import checkpoint_blocks, on_trained_module

        def wrap(model: Any) -> None:
            recorder.on_uninstall(checkpoint_blocks(model, str(path)))

        on_trained_module(recorder, wrap)

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        path = overrides.runtime.get("activation_checkpointing")
        return checkpoint_change(source, str(path)) if path is not None else None


def _words(values: dict[str, Any]) -> str:
    where = f"model.{values['blocks_path']}" if values.get("blocks_path") else "model"
    return f"checkpoint each of the {values.get('blocks')} {values.get('blocks_type')} blocks of {where}"


CHECKPOINT_LINES = """\
for block in {container}:  # activation checkpointing: each block's activations recomputed in backward
    block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)"""


def checkpoint_change(source: str, path: str) -> str | None:
    """The lines that checkpoint each block of `<model>.<path>` after the statement that builds
    the model (`codechange.after_model`), with their imports; None where that is not found."""
    from trainadvisor.fixes.codechange import after_imports, after_model  # libcst: not in the measured run

    def lines(name: str) -> list[str]:
        return [CHECKPOINT_LINES.format(container=f"{name}.{path}" if path else name)]

    code = after_model(source, lines)
    if code is None:
        return None
    imports = [
        i for i in ("import functools", "from torch.utils.checkpoint import checkpoint") if i not in code
    ]
    return after_imports(code, imports) if imports else code
