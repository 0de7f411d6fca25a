"""A fix's settings in the words of the framework that built the loop. Pure.

What a run changed to measure a fix (`records.Overrides`: DataLoader arguments by the call that
built the loader, torch switches by name) becomes the framework's own settings where the
framework owns the thing changed: the DataLoader a transformers `Trainer` builds is set through
`TrainingArguments(dataloader_num_workers=...)`, autocast through `Trainer(precision=...)` or
`Accelerator(mixed_precision=...)`. What the user owns stays a change of the user's code (`rest`):
the DataLoader a Lightning module or an accelerate loop builds, an optimizer's `fused=True`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from trainadvisor.records import FrameworkCall, LoaderInfo, Overrides, RawRun

# DataLoader argument -> TrainingArguments field
TRANSFORMERS_LOADER = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "batch_size": "per_device_train_batch_size",
}
LIGHTNING_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed"}


@dataclass
class Translation:
    """A fix's settings split between the framework's settings object and the user's code."""

    call: FrameworkCall  # the settings object the framework settings go to
    settings: dict[str, Any] = field(default_factory=dict)  # framework setting -> value
    rest: Overrides = field(default_factory=Overrides)  # changes of the user's own code
    lines: list[str] = field(default_factory=list)  # statements after the script's imports
    notes: list[str] = field(default_factory=list)  # what else to do, in words

    @property
    def framework(self) -> str:
        return self.call.framework


def loop_call(raw: RawRun) -> FrameworkCall | None:
    """The settings object of the framework that built the loop: a transformers
    TrainingArguments, a Lightning Trainer, or an Accelerator the user built (not one a
    transformers Trainer built inside). The last built of its kind: the one training uses."""
    calls = [c for c in raw.frameworks if not c.inside]
    for framework in ("transformers", "lightning", "accelerate"):
        found = [c for c in calls if c.framework == framework]
        if found:
            return found[-1]
    return None


def root_loader(site: str, loaders: list[LoaderInfo]) -> LoaderInfo | None:
    """The loader built at `site`, followed back to the one it was built from (accelerate's
    prepare() wraps the user's loader, a transformers Trainer's loader is wrapped again)."""
    by_site = {info.created_at: info for info in loaders}
    info, seen = by_site.get(site), set()
    while (
        info is not None and info.origin_site and info.origin_site in by_site and info.created_at not in seen
    ):
        seen.add(info.created_at)
        info = by_site[info.origin_site]
    return info


def translate(overrides: Overrides, raw: RawRun) -> Translation | None:
    """The overrides in the loop framework's terms; None when no framework built the loop (the
    fix's own code change applies as it is)."""
    call = loop_call(raw)
    if call is None:
        return None
    t = Translation(call)
    _loaders(t, overrides, raw.loaders)
    runtime = dict(overrides.runtime)
    {"transformers": _transformers, "lightning": _lightning, "accelerate": _accelerate}[call.framework](
        t, runtime, call.settings
    )
    t.rest = replace(t.rest, runtime=runtime)  # what the framework has no setting for
    return t


def _loaders(t: Translation, overrides: Overrides, loaders: list[LoaderInfo]) -> None:
    for site, arguments in overrides.loaders.items():
        root = root_loader(site, loaders)
        if root is not None and root.framework == "transformers" and t.framework == "transformers":
            t.settings.update(
                {TRANSFORMERS_LOADER[k]: v for k, v in arguments.items() if k in TRANSFORMERS_LOADER}
            )
        else:  # the user's own DataLoader (a Lightning module's, the one accelerate prepared)
            target = root.created_at if root is not None and not root.framework else site
            t.rest.loaders.setdefault(target, {}).update(arguments)
    if not overrides.non_blocking_h2d:
        return
    if t.framework == "transformers" and not t.rest.loaders:
        t.notes.append(
            "for non-blocking copies of pinned batches: "
            'TrainingArguments(accelerator_config={"non_blocking": True})'
        )
    elif t.framework == "accelerate":
        t.notes.append(
            "for non-blocking copies of pinned batches: "
            "Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))"
        )
    else:  # Lightning copies batches to the device itself, without blocking when pinned
        t.rest = replace(t.rest, non_blocking_h2d=t.framework != "lightning")


def _accumulated(current: dict[str, Any], key: str, micro_batches: int) -> int:
    return micro_batches * int(current.get(key) or 1)


def _transformers(t: Translation, runtime: dict[str, Any], current: dict[str, Any]) -> None:
    amp = runtime.pop("amp", None)
    if amp:
        t.settings["bf16" if amp == "bf16" else "fp16"] = True
    if runtime.pop("tf32", None):
        t.settings["tf32"] = True
    if runtime.pop("fused_optimizer", None):
        t.settings["optim"] = "adamw_torch_fused"
    mode = runtime.pop("compile", None)
    if mode:
        t.settings["torch_compile"] = True
        if mode != "default":
            t.settings["torch_compile_mode"] = mode
    k = runtime.pop("grad_accumulation", None)
    if k:
        t.settings["gradient_accumulation_steps"] = _accumulated(
            current, "gradient_accumulation_steps", int(k)
        )
    if runtime.pop("activation_checkpointing", None) is not None:  # the model's own layers
        t.settings["gradient_checkpointing"] = True
    if runtime.get("optimizer_foreach_off"):  # left to the user's code where it builds one
        t.notes.append(WHERE["transformers"]["optimizer-foreach"])


def _lightning(t: Translation, runtime: dict[str, Any], current: dict[str, Any]) -> None:
    amp = runtime.pop("amp", None)
    if amp:
        t.settings["precision"] = LIGHTNING_PRECISION[amp]
    if runtime.pop("cudnn_benchmark", None):
        t.settings["benchmark"] = True
    if runtime.pop("tf32", None):  # Lightning's own advice for Tensor Cores in fp32
        t.lines.append('torch.set_float32_matmul_precision("high")')
    k = runtime.pop("grad_accumulation", None)
    if k:
        t.settings["accumulate_grad_batches"] = _accumulated(current, "accumulate_grad_batches", int(k))


def _accelerate(t: Translation, runtime: dict[str, Any], current: dict[str, Any]) -> None:
    amp = runtime.pop("amp", None)
    if amp:
        t.settings["mixed_precision"] = amp
    k = runtime.pop("grad_accumulation", None)
    if k:
        t.settings["gradient_accumulation_steps"] = _accumulated(
            current, "gradient_accumulation_steps", int(k)
        )
        t.notes.append(
            "run each step inside `with accelerator.accumulate(model):` so the update and the "
            "gradient sync happen once per accumulated batch"
        )


def flags(settings: dict[str, Any], prefix: str = "--") -> str:
    """Command-line flags as HfArgumentParser and LightningCLI read them."""
    return " ".join(f"{prefix}{name} {value}" for name, value in settings.items())


def keys(settings: dict[str, Any], style: str) -> str:
    """Config-file entries: JSON ("key": value) or YAML (key: value)."""
    if style == "json":
        return ", ".join(f"{json.dumps(name)}: {json.dumps(value)}" for name, value in settings.items())
    return ", ".join(
        f"{name}: {json.dumps(value) if not isinstance(value, str) else value}"
        for name, value in settings.items()
    )


# Where each fix's setting lives in each framework, in words (for advice without a measured
# value: a callback's report, a fix that could not be tried).
WHERE = {
    "transformers": {
        "dataloader-workers": (
            "`dataloader_num_workers` and `dataloader_persistent_workers=True` in TrainingArguments"
        ),
        "pin-memory": "`dataloader_pin_memory=True` in TrainingArguments",
        "batch-size": "`per_device_train_batch_size` in TrainingArguments",
        "grad-accumulation": (
            "a smaller `per_device_train_batch_size` with `gradient_accumulation_steps` in TrainingArguments"
        ),
        "amp": "`bf16=True` (or `fp16=True`) in TrainingArguments",
        "tf32": "`tf32=True` in TrainingArguments",
        "fused-optimizer": '`optim="adamw_torch_fused"` in TrainingArguments',
        "compile": "`torch_compile=True` in TrainingArguments",
        "activation-checkpointing": "`gradient_checkpointing=True` in TrainingArguments",
        "optimizer-foreach": (  # `optim_args` does not reach torch's AdamW
            "an optimizer built with `foreach=False` given as `Trainer(optimizers=(optimizer, None))`"
        ),
    },
    "lightning": {
        "dataloader-workers": (
            "`num_workers` and `persistent_workers=True` of the DataLoader your LightningDataModule returns"
        ),
        "pin-memory": "`pin_memory=True` of the DataLoader your LightningDataModule returns",
        "batch-size": "`batch_size` of the DataLoader your LightningDataModule returns",
        "grad-accumulation": (
            "`Trainer(accumulate_grad_batches=k)` with the DataLoader's batch_size divided by k"
        ),
        "amp": '`Trainer(precision="bf16-mixed")` (or "16-mixed")',
        "tf32": '`torch.set_float32_matmul_precision("high")`',
        "cudnn-benchmark": "`Trainer(benchmark=True)`",
        "fused-optimizer": "`fused=True` on the optimizer configure_optimizers returns",
        "optimizer-foreach": "`foreach=False` on the optimizer configure_optimizers returns",
        "compile": "`model = torch.compile(model)` before `trainer.fit(model)`",
        "activation-checkpointing": (
            "each repeated block wrapped in `torch.utils.checkpoint.checkpoint` in your "
            "LightningModule's forward (or the blocks' forwards wrapped before `trainer.fit`)"
        ),
    },
    "accelerate": {
        "dataloader-workers": (
            "`num_workers` and `persistent_workers=True` of the DataLoader you give accelerator.prepare()"
        ),
        "pin-memory": "`pin_memory=True` of the DataLoader you give accelerator.prepare()",
        "amp": '`Accelerator(mixed_precision="bf16")` (or "fp16")',
        "grad-accumulation": (
            "`Accelerator(gradient_accumulation_steps=k)` with the step inside "
            "`with accelerator.accumulate(model):`"
        ),
    },
}


def where_set(fix_id: str, framework: str) -> str:
    """The framework setting a fix changes, in words ("" when it has none)."""
    return WHERE.get(framework, {}).get(fix_id, "")
