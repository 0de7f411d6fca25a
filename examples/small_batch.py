"""A small batch on a big device: little work per step, many tiny kernels.

An MLP trained with batches of 16 from an in-memory data set and a non-fused Adam: on a GPU each
step launches hundreds of kernels of a few microseconds, the GPU idles between them, and almost
all of its memory stays free. `--detect-anomaly` leaves autograd's anomaly detection on, a
debugging aid that slows every step.

What trainadvisor should find on a GPU: `gpu-underutilized` (fix `batch-size`, which searches
the batch size with the most samples per second) and `host-bound` (on the H100: 95 kernels a
step of about 3 us each, the GPU busy 4% of the step, the host 74% in its own work; fixes
`fused-optimizer`, `compile`, `batch-size`).
With `--detect-anomaly`, on any device: `anomaly-detection-on`.

    trainadvisor profile examples/small_batch.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--detect-anomaly", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.autograd.set_detect_anomaly(args.detect_anomaly)
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.samples, args.width, generator=generator)
    targets = inputs[:, :10].argmax(dim=1)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=args.batch_size, shuffle=True)
    blocks: list[nn.Module] = []
    for _ in range(args.layers):
        blocks += [nn.Linear(args.width, args.width), nn.LayerNorm(args.width), nn.GELU()]
    model = nn.Sequential(*blocks, nn.Linear(args.width, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
