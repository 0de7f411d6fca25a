"""Training frameworks that build the loop for the user: Hugging Face transformers' `Trainer`,
PyTorch Lightning's `Trainer` and Hugging Face accelerate's `Accelerator`.

A fix is measured the same way whoever built the loop (the DataLoader's arguments at the call
that builds it, torch's switches in the process); what changes is where the user makes it
permanent. `watch` records, in the script's process, each framework settings object the script
builds (`TrainingArguments`, `Trainer`, `Accelerator`: where, and from code, the command line or
a config file) and which framework built each DataLoader; `vocab` says a fix's settings in the
framework's own terms; `change` turns them into a diff of the user's call, or the flags and
config keys to set when the values come from the command line or a file.

May import: fixes (their code changes, in a framework's terms), records."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Watched:
    """A class whose construction is recorded: in `module` (imported by the script, or by the
    framework itself), under `attribute`, patched at `method`."""

    framework: str
    module: str
    attribute: str
    method: str  # "__init__", or "__post_init__" for a dataclass (its subclasses' __init__ calls it)
    settings: tuple[str, ...]  # the settings a fix may change, read after construction


TRANSFORMERS_SETTINGS = (
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "per_device_train_batch_size", "gradient_accumulation_steps",
    "bf16", "fp16", "tf32", "optim", "gradient_checkpointing", "max_steps", "num_train_epochs",
)  # fmt: skip
LIGHTNING_SETTINGS = (
    "precision", "accumulate_grad_batches", "benchmark", "strategy", "max_steps", "max_epochs",
)  # fmt: skip
ACCELERATE_SETTINGS = ("mixed_precision", "gradient_accumulation_steps")

WATCHED = (
    Watched("transformers", "transformers.training_args", "TrainingArguments", "__post_init__",
            TRANSFORMERS_SETTINGS),
    Watched("lightning", "lightning.pytorch.trainer.trainer", "Trainer", "__init__", LIGHTNING_SETTINGS),
    Watched("lightning", "pytorch_lightning.trainer.trainer", "Trainer", "__init__", LIGHTNING_SETTINGS),
    Watched("accelerate", "accelerate.accelerator", "Accelerator", "__init__", ACCELERATE_SETTINGS),
)  # fmt: skip

# The packages whose code is each framework's (a frame there is not the user's).
PACKAGES = {
    "transformers": ("transformers",),
    "lightning": ("lightning", "pytorch_lightning", "lightning_fabric"),
    "accelerate": ("accelerate",),
}


@cache
def package_dirs() -> tuple[tuple[str, str], ...]:
    """(folder with a trailing separator, framework) of each installed framework package; found
    without importing them."""
    found = []
    for framework, packages in PACKAGES.items():
        for package in packages:
            try:
                spec = importlib.util.find_spec(package)
            except (ImportError, ValueError):
                continue
            for folder in (spec.submodule_search_locations or []) if spec else []:
                found.append((str(Path(folder).resolve()) + "/", framework))
                found.append((str(Path(folder)) + "/", framework))
    return tuple(found)


@cache
def _ours_and_torch() -> tuple[str, str]:
    import torch

    return str(Path(__file__).parent.parent) + "/", str(Path(torch.__file__).parent) + "/"


def ours_or_torch(filename: str) -> bool:
    """A file of trainadvisor's or torch's: a frame there is neither the user's nor a framework's."""
    return filename.startswith(_ours_and_torch())


def framework_of(filename: str) -> str:
    """The framework whose package holds this file, "" for any other file."""
    for folder, framework in package_dirs():
        if filename.startswith(folder):
            return framework
    return ""


__all__ = ["PACKAGES", "WATCHED", "Watched", "framework_of", "ours_or_torch", "package_dirs"]
