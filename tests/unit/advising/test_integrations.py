"""The framework callbacks of `@advise` (`advising.integrations`): `LightningAdvisor` and
`HuggingFaceAdvisor` are instances of one class per process built on the framework's own
callback class, each holding an Advisor named as the script calls it; their hooks, called here by
hand with stand-ins for the framework's trainer, arguments and loggers (the framework's own
Trainer would start a run), tell the advisor the framework's settings and where the training logs,
and drive its steps; they pickle as the factory call that made them. Where a framework is not
installed, the factory says what to install."""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainadvisor.advising import integrations
from trainadvisor.advising.integrations import HuggingFaceAdvisor, LightningAdvisor
from trainadvisor.errors import MissingDependencyError
from trainadvisor.records import FrameworkCall

HAS_LIGHTNING = any(importlib.util.find_spec(name) is not None for name in ("lightning", "pytorch_lightning"))
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
LIGHTNING_MISSING = "LightningAdvisor needs PyTorch Lightning: pip install lightning (or pytorch-lightning)"
TRANSFORMERS_MISSING = "HuggingFaceAdvisor needs transformers: pip install transformers"
# Windows of exactly `warmup` and `steps` steps (no steadiness test, no time floor).
EXACT: dict[str, Any] = {"min_time": 0.0, "max_warmup": None}
needs_lightning = pytest.mark.skipif(not HAS_LIGHTNING, reason="PyTorch Lightning is not installed")
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")


def _lightning_callback_class() -> type:
    """The base `_base_class` finds first: the new package name, else the old one."""
    name = "lightning.pytorch" if importlib.util.find_spec("lightning") is not None else "pytorch_lightning"
    return importlib.import_module(name).Callback  # type: ignore[no-any-return]


# Stand-ins for Lightning's loggers: the callback tells them apart by their class's name.
class TensorBoardLogger:
    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir


class MLFlowLogger:
    def __init__(self, run_id: str | None) -> None:
        self.run_id = run_id


class WandbLogger:
    def __init__(self) -> None:
        self.started = 0

    @property
    def experiment(self) -> object:
        self.started += 1  # Lightning's WandbLogger starts its run (`wandb.run`) here
        return object()


class _BrokenTensorBoard:
    """A logger that cannot say where it writes."""

    @property
    def log_dir(self) -> str:
        raise RuntimeError("no version folder yet")


_BrokenTensorBoard.__name__ = "TensorBoardLogger"


class Trainer:
    """What a Lightning Trainer shows a callback of the settings a fix may change."""

    def __init__(self, loggers: list[Any]) -> None:
        self.loggers = loggers
        self.precision, self.accumulate_grad_batches, self.benchmark = "bf16-mixed", 4, None
        self.strategy, self.max_steps, self.max_epochs = SimpleNamespace(), -1, 3


class TrainingArguments:
    """What transformers' TrainingArguments shows a callback."""

    def __init__(self, report_to: list[str], logging_dir: str | None) -> None:
        self.report_to, self.logging_dir = report_to, logging_dir
        self.dataloader_num_workers, self.dataloader_pin_memory = 0, True
        self.per_device_train_batch_size, self.gradient_accumulation_steps = 8, 1
        self.bf16, self.fp16, self.optim = False, False, "adamw_torch"
        self.max_steps, self.num_train_epochs = -1, 1.0


LIGHTNING_SETTINGS = {
    "precision": "bf16-mixed", "accumulate_grad_batches": 4, "benchmark": None,
    "strategy": "SimpleNamespace", "max_steps": -1, "max_epochs": 3,
}  # fmt: skip
TRANSFORMERS_SETTINGS = {
    "dataloader_num_workers": 0, "dataloader_pin_memory": True, "dataloader_persistent_workers": None,
    "dataloader_prefetch_factor": None, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
    "bf16": False, "fp16": False, "tf32": None, "optim": "adamw_torch", "gradient_checkpointing": None,
    "max_steps": -1, "num_train_epochs": 1.0,
}  # fmt: skip


def _ended_message(steps: int) -> str:
    """What the advisor says when training ends before its window of 3 warm-up steps, 4 timed,
    then the profiler's warm-up step and 4 traced (min(10, steps)) is complete."""
    return f"trainadvisor: training ended after {steps} steps, before the 12 the window needs: no report\n"


@needs_lightning
def test_lightning_advisor_is_a_lightning_callback_holding_an_advisor_named_as_the_script_calls_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    callback = LightningAdvisor(warmup=3, steps=4, out=tmp_path / "r", rules=["extra"], **EXACT)
    try:
        assert isinstance(callback, _lightning_callback_class())
        cls = type(callback)
        assert (cls.__name__, cls.__module__, integrations.LightningAdvisorCallback) == (
            "LightningAdvisorCallback", "trainadvisor.advising.integrations", cls,
        )  # fmt: skip
        advisor = callback.advisor
        assert (advisor.warmup, advisor.steps, advisor.out, advisor.rule_dirs) == (
            3,
            4,
            tmp_path / "r",
            [Path("extra")],
        )
        assert (advisor.called, advisor.min_time_s, advisor.max_warmup_s, advisor.log_to) == (
            "LightningAdvisor",
            0.0,
            None,
            [],
        )
        assert callback._options == (3, 4, tmp_path / "r", ["extra"], 0.0, None, None)
        assert type(LightningAdvisor(out=tmp_path / "s")) is cls  # one class for the process
        assert capsys.readouterr().err.startswith(
            f"trainadvisor: advising after 3 warmup steps; the report goes to {(tmp_path / 'r').resolve()} "
            "(LightningAdvisor(out=...) to choose)\n"
        )
    finally:
        callback.advisor.close()


@needs_lightning
def test_lightnings_hooks_tell_the_advisor_the_trainer_and_its_loggers_then_count_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    callback = LightningAdvisor(warmup=3, steps=4, out=tmp_path / "r", log_to="auto", **EXACT)
    advisor = callback.advisor
    wandb = WandbLogger()
    loggers = [
        _BrokenTensorBoard(),
        TensorBoardLogger("/logs/tb"),
        MLFlowLogger(None),
        MLFlowLogger("run-7"),
        wandb,
    ]
    trainer, module = Trainer(loggers), object()
    callback.on_fit_start(trainer, module)
    assert advisor.frameworks == [
        FrameworkCall("lightning", "Trainer", "unknown", settings=LIGHTNING_SETTINGS)
    ]
    assert advisor.joined == {"tensorboard": "/logs/tb", "mlflow": "run-7"} and wandb.started == 1
    capsys.readouterr()
    for index in range(2):
        callback.on_train_batch_start(trainer, module, ([1.0, 2.0], [0]), index)
        callback.on_train_batch_end(trainer, module, {"loss": 0.5}, ([1.0, 2.0], [0]), index)
    assert (advisor.calls, advisor.window.steps_done, advisor.window.phase) == (2, 2, "warmup")
    assert advisor._owner == threading.get_ident()  # the loop's thread is the one measured
    callback.on_train_end(trainer, module)
    assert not advisor.active and advisor.report is None
    assert capsys.readouterr().err == _ended_message(2)


@needs_lightning
def test_lightnings_loggers_are_left_alone_unless_the_report_goes_where_they_write(tmp_path: Path) -> None:
    callback = LightningAdvisor(warmup=3, steps=4, out=tmp_path / "r", **EXACT)
    wandb = WandbLogger()
    callback.on_fit_start(Trainer([TensorBoardLogger("/logs/tb"), wandb]), object())
    assert callback.advisor.joined == {} and wandb.started == 0
    assert [call.name for call in callback.advisor.frameworks] == ["Trainer"]
    callback.on_exception(None, None, RuntimeError("out of memory"))  # the advisor goes, silently
    assert not callback.advisor.active


@needs_lightning
def test_a_trainer_whose_settings_cannot_be_read_leaves_the_advice_generic(tmp_path: Path) -> None:
    class Strict(Trainer):
        @property
        def precision(self) -> str:
            raise RuntimeError("not attached")

        @precision.setter
        def precision(self, value: str) -> None:
            pass

    callback = LightningAdvisor(warmup=3, steps=4, out=tmp_path / "r", **EXACT)
    callback.on_fit_start(Strict([]), object())
    assert callback.advisor.frameworks == [] and callback.advisor.active
    callback.advisor.close()


@needs_lightning
def test_a_lightning_callback_pickles_as_a_fresh_advisor_from_the_same_call(tmp_path: Path) -> None:
    callback = LightningAdvisor(warmup=2, steps=3, out=tmp_path / "r", log_to=["wandb"], **EXACT)
    assert callback.__reduce__() == (LightningAdvisor, (2, 3, tmp_path / "r", None, 0.0, None, ["wandb"]))
    copy = pickle.loads(pickle.dumps(callback))
    assert type(copy) is type(callback) and copy.advisor is not callback.advisor
    assert (copy.advisor.warmup, copy.advisor.steps, copy.advisor.out, copy.advisor.log_to) == (
        2, 3, tmp_path / "r", ["wandb"],
    )  # fmt: skip
    for made in (callback, copy):
        made.advisor.close()


@needs_transformers
def test_hugging_face_advisor_is_a_trainer_callback_driven_by_optimizer_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import TrainerCallback

    callback = HuggingFaceAdvisor(warmup=3, steps=4, out=tmp_path / "r", log_to="auto", **EXACT)
    advisor = callback.advisor
    assert isinstance(callback, TrainerCallback) and type(callback).__name__ == "HuggingFaceAdvisorCallback"
    assert (
        integrations.HuggingFaceAdvisorCallback is type(callback) and advisor.called == "HuggingFaceAdvisor"
    )
    args, state, control = TrainingArguments(["tensorboard", "wandb"], "/logs/hf"), object(), object()
    callback.on_train_begin(args, state, control, model=None)
    assert advisor.frameworks == [
        FrameworkCall("transformers", "TrainingArguments", "unknown", settings=TRANSFORMERS_SETTINGS)
    ]
    assert advisor.joined == {"tensorboard": "/logs/hf"}
    capsys.readouterr()
    for _ in range(3):
        callback.on_step_begin(args, state, control)
        callback.on_step_end(args, state, control)
    assert (advisor.calls, advisor.window.steps_done, advisor.window.phase) == (3, 3, "timed")
    callback.on_train_end(args, state, control)
    assert not advisor.active and capsys.readouterr().err == _ended_message(3)


@pytest.mark.parametrize(
    ("report_to", "logging_dir", "log_to"),
    [(["tensorboard"], "/logs/hf", None), (["wandb"], "/logs/hf", "auto"), (["tensorboard"], None, "auto")],
    ids=["not-auto", "no-tensorboard", "no-logging-dir"],
)
@needs_transformers
def test_hugging_faces_logging_dir_is_joined_only_where_tensorboard_gets_the_logs(
    tmp_path: Path, report_to: list[str], logging_dir: str | None, log_to: str | None
) -> None:
    callback = HuggingFaceAdvisor(warmup=3, steps=4, out=tmp_path / "r", log_to=log_to, **EXACT)
    callback.on_train_begin(TrainingArguments(report_to, logging_dir), None, None)
    assert callback.advisor.joined == {}
    callback.advisor.close()


@needs_transformers
def test_a_hugging_face_callback_pickles_as_a_fresh_advisor_from_the_same_call(tmp_path: Path) -> None:
    callback = HuggingFaceAdvisor(warmup=5, steps=6, out=tmp_path / "r", rules=[tmp_path], **EXACT)
    copy = pickle.loads(pickle.dumps(callback))
    assert type(copy) is type(callback) and copy.advisor is not callback.advisor
    assert copy._options == callback._options == (5, 6, tmp_path / "r", [tmp_path], 0.0, None, None)
    assert copy.advisor.rule_dirs == [tmp_path]
    for made in (callback, copy):
        made.advisor.close()


def test_each_factory_says_what_to_install_where_its_framework_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    with pytest.raises(MissingDependencyError) as lightning:
        LightningAdvisor()
    with pytest.raises(MissingDependencyError) as transformers:
        HuggingFaceAdvisor()
    assert (str(lightning.value), str(transformers.value)) == (LIGHTNING_MISSING, TRANSFORMERS_MISSING)


@pytest.mark.skipif(HAS_LIGHTNING, reason="PyTorch Lightning is installed: the callback is built")
def test_without_lightning_installed_the_factory_says_what_to_install() -> None:
    with pytest.raises(MissingDependencyError) as missing:
        LightningAdvisor()
    assert str(missing.value) == LIGHTNING_MISSING


@pytest.mark.skipif(HAS_TRANSFORMERS, reason="transformers is installed: the callback is built")
def test_without_transformers_installed_the_factory_says_what_to_install() -> None:
    with pytest.raises(MissingDependencyError) as missing:
        HuggingFaceAdvisor()
    assert str(missing.value) == TRANSFORMERS_MISSING


def test_the_callback_subclasses_the_framework_the_script_imported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Both package names installed (here two stand-in modules): the new name's Callback unless
    the script imported only the old one; each base gets its own class, built once."""
    from trainadvisor.advising import integrations

    modules = ("fake_new_framework", "fake_old_framework")
    for module in modules:
        (tmp_path / f"{module}.py").write_text("class Callback:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(integrations, "_classes", {})
    places = ((modules[0], "Callback"), (modules[1], "Callback"))
    try:
        old = importlib.import_module(modules[1]).Callback
        assert integrations._base_class(places, "install one") is old  # the script's framework
        sys.modules.pop(modules[1])
        new = integrations._base_class(places, "install one")
        assert new.__module__ == modules[0]
        on_new = integrations._callback_class("FakeAdvisorCallback", new, {})
        on_old = integrations._callback_class("FakeAdvisorCallback", old, {})
        assert on_new is not on_old and issubclass(on_new, new) and issubclass(on_old, old)
        assert integrations._callback_class("FakeAdvisorCallback", old, {}) is on_old
        assert integrations.__dict__["FakeAdvisorCallback"] is on_new  # where pickle looks
    finally:
        integrations.__dict__.pop("FakeAdvisorCallback", None)
        for module in modules:
            sys.modules.pop(module, None)
