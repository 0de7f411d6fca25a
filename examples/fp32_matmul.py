"""A matmul-heavy model trained in plain fp32.

Wide linear layers on large batches: nearly all GPU time is matrix multiplication, in fp32, so
a GPU with Tensor Cores leaves them idle. The data set is in memory and the loop has no syncs,
so matrix math is the only thing left to speed up.

What trainadvisor should find on a GPU with Tensor Cores: `no-mixed-precision` (fixes `amp`,
bf16 autocast where the GPU supports it, and `tf32` on Ampere and newer; both measured, and the
loss compared with a looser, reported tolerance). On a CPU: nothing GPU-specific.

    trainadvisor profile examples/fp32_matmul.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--width", type=int, default=None, help="default: 4096 on a GPU, 512 on a CPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    width = args.width or (4096 if device.type == "cuda" else 512)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.samples, 256, generator=generator)
    targets = inputs[:, :10].argmax(dim=1)
    dataset = TensorDataset(inputs, targets)
    batches = BatchSampler(RandomSampler(dataset), batch_size=args.batch_size, drop_last=True)
    loader = DataLoader(dataset, sampler=batches, batch_size=None)
    model = nn.Sequential(
        nn.Linear(256, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, 10),
    ).to(device)  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
