"""MNIST-style feed-forward network whose input pipeline is slow.

Each sample is "read from storage" with a fixed latency (as from network or object storage,
default 1 ms per sample) and decoded on the host; the DataLoader uses num_workers=0, so
the training loop waits for every batch to be read one sample after another.

What trainadvisor should find: `data-stall` (high severity: most of each step is spent in
DataLoader `__next__`), fixed by `dataloader-workers`: more worker processes read samples in
parallel. On a 2-core CPU machine the tuned run is several times faster; the loss values of the
same steps stay identical because the batches are the same.

    trainadvisor profile examples/slow_input_mnist.py --epochs 1
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowMNIST(Dataset):
    """Synthetic 28x28 digits, deterministic per index, each behind a storage latency."""

    def __init__(self, size: int, latency_ms: float) -> None:
        self.size = size
        self.latency_s = latency_ms / 1000.0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)  # reading one sample from storage
        generator = torch.Generator().manual_seed(index)
        label = index % 10
        image = torch.rand(1, 28, 28, generator=generator)
        image[:, 2 * label : 2 * label + 4, :] += 1.0  # a class-dependent stroke to learn
        return (image - 0.1307) / 0.3081, label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--latency-ms", type=float, default=1.0)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    loader = DataLoader(
        SlowMNIST(args.samples, args.latency_ms),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
    )
    model = nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 512),
        nn.ReLU(),
        nn.Linear(512, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        started = time.perf_counter()
        for step, (images, labels) in enumerate(loader):
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
        print(f"epoch {epoch} took {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
