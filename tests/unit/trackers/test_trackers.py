"""Experiment trackers, each for real, in this process: `@advise` logging into the training's own
MLflow run (a SQLite store, read back through MlflowClient), and Lightning's callback logging
beside the trainer's own TensorBoard logger (its event files read back with TensorBoard's own
reader). The tracking server, W&B and the trackers that are down are tests/e2e's."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import lightning_module

# Each tracker is imported by the test that uses it: at collection, mlflow and tensorboard cost
# every worker 3 s of the fast tiers' minute.
NEED = "the tracker tests need {}: pip install -e '.[dev]'"


def test_the_lightning_callback_logs_beside_the_trainers_own_tensorboard_logger(tmp_path: Path) -> None:
    """`log_to="auto"`: the report's metrics land in the TensorBoardLogger's own version folder,
    beside the training's curves, read back with TensorBoard's reader."""
    lightning = pytest.importorskip("lightning")
    pytest.importorskip("tensorboard", reason=NEED.format("tensorboard"))
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.data import DataLoader, TensorDataset

    from trainadvisor.integrations import LightningAdvisor

    data = DataLoader(TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,))), batch_size=8)
    logger = TensorBoardLogger(str(tmp_path / "tb"), name="run")
    callback = LightningAdvisor(
        warmup=2, steps=5, out=tmp_path / "r", min_time=0.0, max_warmup=None, log_to="auto"
    )
    trainer = lightning.Trainer(
        max_epochs=1, callbacks=[callback], accelerator="cpu", logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path, log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(lightning_module(lightning, log_loss=True), data)
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert "train_loss" in events.Tags()["scalars"]  # the training's own curve, in the same folder
    assert events.Scalars("trainadvisor/steps_per_s")[0].value > 0
