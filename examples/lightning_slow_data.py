"""A PyTorch Lightning `Trainer` fitting a small MLP whose `LightningDataModule` reads slowly.

Each sample is "read from storage" with a fixed latency (default 1 ms); the DataModule's
DataLoader has no worker processes, so every training batch is read in the training process.
The Trainer's own settings are left at their defaults (`precision="32-true"`, no gradient
accumulation).

What trainadvisor should find: `data-stall`, fixed by `dataloader-workers`; the change is a
diff of the DataLoader in `train_dataloader()`. On a GPU it also finds the missing mixed
precision, written as `Trainer(precision="bf16-mixed")`.

    trainadvisor profile examples/lightning_slow_data.py
"""

from __future__ import annotations

import argparse
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowVectors(Dataset):
    """Synthetic 64-feature samples in 4 classes, deterministic per index, behind a latency."""

    def __init__(self, size: int, latency_ms: float) -> None:
        self.size, self.latency_s = size, latency_ms / 1000.0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)  # reading one sample from storage
        label = index % 4
        features = torch.randn(64, generator=torch.Generator().manual_seed(index))
        features[label * 16 : label * 16 + 16] += 1.0  # a class-dependent block to learn
        return features, label


class SlowData(L.LightningDataModule):
    def __init__(self, samples: int, latency_ms: float, batch_size: int) -> None:
        super().__init__()
        self.samples, self.latency_ms, self.batch_size = samples, latency_ms, batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            SlowVectors(self.samples, self.latency_ms),
            batch_size=self.batch_size,
            shuffle=True,
        )


class Classifier(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4)
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        features, labels = batch
        loss = nn.functional.cross_entropy(self.net(features), labels)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--latency-ms", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    L.seed_everything(0)
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(lr=1e-3), SlowData(args.samples, args.latency_ms, args.batch_size))


if __name__ == "__main__":
    main()
