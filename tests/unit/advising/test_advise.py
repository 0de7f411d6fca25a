"""`@advise` and the framework callbacks, in this test process: real training steps, real
profiler windows, real report folders."""

from __future__ import annotations

import inspect
import json
import pickle
import time
import typing
import warnings
from pathlib import Path

import pytest
import torch
from conftest import lightning_module
from support.advise import EXACT, _batches, _model, _Slow, _state
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from trainadvisor import advise
from trainadvisor.advising.advisor import Advisor
from trainadvisor.errors import MissingDependencyError
from trainadvisor.report.paths import repository_root

ORIGINAL_NEXT = _BaseDataLoaderIter.__next__


def _train(step: typing.Callable[..., torch.Tensor], n: int = 30) -> list[float]:
    return [step(x, y).item() for x, y in _batches(n)]


class _Trainer:
    """A model and its optimizer, fresh from the same seed on every `reset()`, and a step."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.model, self.optimizer = _model()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss


def _quiet(_: str) -> None:
    pass


def test_a_decorated_step_trains_exactly_as_undecorated_and_leaves_nothing_behind(tmp_path: Path) -> None:
    trainer = _Trainer()
    plain = _train(trainer.step)
    plain_weights = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.reset()
    before = _state()
    advised = advise(warmup=3, steps=10, out=tmp_path / "report", **EXACT)(trainer.step)
    assert _train(advised) == plain  # the same losses, step by step
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), plain_weights))
    assert _state() == before
    advisor: Advisor = advised.advisor  # type: ignore[attr-defined]
    assert advisor.report is not None and not advisor.active
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["baseline"]["steps"] == 10  # the timed steps; then the profiler's warmup, 10 traced
    assert [r["loss"] for r in report["baseline"]["raw"]["steps"]] == pytest.approx(plain[3:24])
    assert report["baseline"]["raw"]["runtime"]["optimizer"] == "SGD"
    assert {"report.html", "report.md", "report.json"} <= {p.name for p in (tmp_path / "report").iterdir()}
    assert (tmp_path / "report" / "traces" / "advise" / "trainadvisor.pt.trace.json.gz").is_file()


def test_decorating_keeps_signature_hints_return_values_and_exceptions(tmp_path: Path) -> None:
    def scaled(x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        """Double it."""
        if factor < 0:
            raise ValueError("negative")
        return x * factor

    advised = advise(warmup=1, steps=2, out=tmp_path / "r", **EXACT)(scaled)
    assert inspect.signature(advised) == inspect.signature(scaled)
    assert typing.get_type_hints(advised) == typing.get_type_hints(scaled)
    assert (advised.__name__, advised.__doc__, advised.__wrapped__) == ("scaled", "Double it.", scaled)  # type: ignore[attr-defined]
    x = torch.ones(3)
    assert torch.equal(advised(x, factor=3.0), x * 3.0)
    with pytest.raises(ValueError, match="negative"):
        advised(x, factor=-1.0)
    for _ in range(12):
        advised(x)  # the window completes after the failed call was dropped
    assert advised.advisor.report is not None  # type: ignore[attr-defined]


def test_bare_decorator_on_a_method(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    class Trainer(_Trainer):
        @advise
        def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return super().step(x, y)

    trainer = Trainer()
    # by default: a warm-up until step time settles (at most 60 s, where a loaded machine keeps it
    # from settling), then at least 20 steps and 1 s timed: the deadline leaves room for the cap
    batches, deadline = _batches(40), time.monotonic() + 120.0
    while not (tmp_path / "trainadvisor-report" / "report.json").is_file() and time.monotonic() < deadline:
        for x, y in batches:
            trainer.step(x, y)
    assert (tmp_path / "trainadvisor-report" / "report.json").is_file()


def test_the_time_between_calls_is_outside_the_function_not_data_wait(tmp_path: Path) -> None:
    """A loop without a DataLoader that spends 20 ms between calls and 1 ms in the step: no
    data wait is inferred from the gap (it could be anything the loop does there); the gap is
    its own part of the step, and the report says no DataLoader was seen."""
    step = advise(warmup=2, steps=10, out=tmp_path / "r", **EXACT)(_Trainer().step)
    for x, y in _batches(25):
        time.sleep(0.02)  # the loop's own input, or anything else between calls
        step(x, y)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    timed = [s for s in report["baseline"]["raw"]["steps"] if not s["profiled"]]
    assert len(timed) == 10 and max(s["data_wait_ms"] for s in timed) == 0.0
    assert min(s["outside_call_ms"] for s in timed) >= 20.0  # the sleep, between calls
    assert "data_wait" not in report["baseline"]["breakdown_pct"]
    assert report["baseline"]["breakdown_pct"]["outside_call"] > 80
    assert not [f for f in report["findings"] if f["rule"] == "data-stall"]
    said = "No DataLoader was seen: input time is part of the step"
    assert any(note.startswith(said) for note in report["notes"])


def test_a_with_block_times_steps_and_dataloader_waits(tmp_path: Path) -> None:
    model, optimizer = _model()
    # 4 samples x 10 ms a batch: the wait is most of the step whatever else the step costs on
    # this machine (at 2 ms a sample it was about 20% of it, the rule's threshold: noise decided)
    loader = DataLoader(_Slow(sample_s=0.01), batch_size=4)
    line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    built_at = f"{Path(__file__).resolve().relative_to(repository_root(Path.cwd()))}:{line}"  # published
    with advise(warmup=2, steps=6, out=tmp_path / "r", **EXACT) as advisor:
        for _ in range(8):
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                advisor.step(loss)
    assert _BaseDataLoaderIter.__next__ is ORIGINAL_NEXT
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    waits = [s["data_wait_ms"] for s in report["baseline"]["raw"]["steps"]]
    assert len(waits) == 13 and min(waits) >= 40.0  # 6 timed, 1 + 6 traced; 4 samples x 10 ms each
    assert report["findings"][0]["rule"] == "data-stall"
    # the loader was built before advise() began: its line is found by its name in this frame
    assert [info["created_at"] for info in report["baseline"]["raw"]["loaders"]] == [built_at]
    evidence = {e["measurement"]: e["value"] for e in report["findings"][0]["evidence"]}
    assert evidence["dataloader_call_site"] == built_at


def test_a_with_block_that_ends_early_writes_nothing_and_cleans_up(tmp_path: Path) -> None:
    messages: list[str] = []
    before = _state()
    with Advisor(warmup=2, steps=10, out=tmp_path / "r", echo=messages.append, **EXACT) as advisor:
        for _ in range(5):
            advisor.step()
    assert _state() == before and not (tmp_path / "r").exists()
    assert (
        messages[-1]
        == "trainadvisor: the block ended after 5 steps, before the 23 the window needs: no report"
    )


def test_an_error_inside_the_advisor_is_a_warning_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = _Trainer()
    plain = _train(trainer.step)
    trainer.reset()
    before = _state()
    advised = advise(warmup=2, steps=4, out=tmp_path / "r", **EXACT)(trainer.step)

    def broken(self: Advisor) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Advisor, "_start_profiler", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _train(advised) == plain
    assert [str(w.message) for w in caught] == [
        "trainadvisor: the advisor stopped (OSError: disk full); training goes on unchanged. Set "
        "TRAINADVISOR_DEBUG=1 to see where."
    ]
    assert _state() == before and not advised.advisor.active  # type: ignore[attr-defined]


def test_the_report_folder_is_announced_once(tmp_path: Path) -> None:
    messages: list[str] = []
    Advisor(out=tmp_path / "once", echo=messages.append)
    Advisor(out=tmp_path / "once", echo=messages.append)
    assert messages == [
        f"trainadvisor: advising after 5 warmup steps; the report goes to {tmp_path / 'once'} "
        "(advise(out=...) to choose)"
    ]


def test_a_folder_of_the_users_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        advised = advise(warmup=1, steps=2, out=tmp_path / "mine", **EXACT)(lambda x: x)
        # said when decorating, not after a window was measured for nothing; in advise's words
        assert len(caught) == 1 and f"advise(out=...) {tmp_path / 'mine'}: the folder has files" in str(
            caught[0].message
        )
        for _ in range(6):
            assert advised(1) == 1
    assert len(caught) == 1 and not advised.advisor.active  # type: ignore[attr-defined]
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_lightning_callback(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning")
    from trainadvisor.integrations import LightningAdvisor

    data = DataLoader(TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,))), batch_size=8)
    callback = LightningAdvisor(warmup=2, steps=5, out=tmp_path / "r", **EXACT)
    trainer = lightning.Trainer(
        max_epochs=1, callbacks=[callback], accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(lightning_module(lightning), data)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["baseline"]["steps"] == 5
    assert all(s["loss"] is not None for s in report["baseline"]["raw"]["steps"])
    assert report["baseline"]["raw"]["runtime"]["optimizer"] == "SGD"


def test_hugging_face_callback(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from trainadvisor.integrations import HuggingFaceAdvisor

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": nn.functional.cross_entropy(self.net(x), labels)}

    class Data(Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 256

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": torch.full((16,), float(i % 7)), "labels": torch.tensor(i % 4)}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=8, num_train_epochs=1,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    callback = HuggingFaceAdvisor(warmup=2, steps=5, out=tmp_path / "r", **EXACT)
    transformers.Trainer(model=Model(), args=args, train_dataset=Data(), callbacks=[callback]).train()
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["baseline"]["steps"] == 5 and report["baseline"]["raw"]["runtime"]["optimizer"] == "AdamW"


def test_integrations_import_without_their_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from trainadvisor import integrations

    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    with pytest.raises(MissingDependencyError, match="pip install lightning"):
        integrations.LightningAdvisor()
    with pytest.raises(MissingDependencyError, match="pip install transformers"):
        integrations.HuggingFaceAdvisor()


def test_one_window_per_process_and_close_ends_an_unfinished_one(tmp_path: Path) -> None:
    messages: list[str] = []
    before = _state()
    first = Advisor(warmup=1, steps=50, out=tmp_path / "a", echo=messages.append, **EXACT)
    second = Advisor(warmup=1, steps=50, out=tmp_path / "b", echo=messages.append, **EXACT)
    step_a, step_b = first(lambda: None), second(lambda: None)
    for _ in range(3):
        step_a()
        step_b()
    assert first.active and not second.active  # a second profiler session could crash torch
    assert (
        messages[-1] == f"trainadvisor: another advisor is measuring ({tmp_path / 'a'}); this one stands down"
    )
    first.close()  # the loop stopped early: everything goes, no report
    assert _state() == before and not first.active and not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="warmup and steps must be at least 1"):
        Advisor(warmup=0)


def test_the_restart_command_is_profiles_own_and_writes_beside_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setattr("sys.argv", [str(script), "--lr", "0.1"])
    advisor = Advisor(warmup=3, steps=10, out=tmp_path / "r", echo=_quiet, **EXACT)
    assert advisor._profile_command(script) == [
        "trainadvisor", "profile", "--warmup", "3", "--steps", "10", "--out", str(tmp_path / "r-profile"),
        "--seed", "0", str(script), "--lr", "0.1",
    ]  # fmt: skip
    assert advisor._profile_command(None) is None  # a notebook: no script to rerun


def test_framework_callbacks_are_one_class_and_pickle_as_fresh_advisors(tmp_path: Path) -> None:
    """Lightning's ddp_spawn pickles the trainer's callbacks into new processes."""
    pytest.importorskip("lightning")
    from trainadvisor.integrations import LightningAdvisor

    first, second = (
        LightningAdvisor(out=tmp_path / "a"),
        LightningAdvisor(warmup=2, out=tmp_path / "b", **EXACT),
    )
    assert type(first) is type(second) and type(first).__module__ == "trainadvisor.advising.integrations"
    copy = pickle.loads(pickle.dumps(second))
    assert type(copy) is type(second) and copy.advisor is not second.advisor
    assert (copy.advisor.warmup, copy.advisor.out) == (2, tmp_path / "b")
    for callback in (first, second, copy):
        callback.advisor.close()
