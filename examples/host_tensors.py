"""Tensors created on the host inside the step, and a loss read back every step.

Each step draws input noise with `torch.randn(shape).to(device)` and builds class weights with
`torch.tensor(list).to(device)`: on a GPU both are made in host memory, then copied (the
performance guides' "create tensors directly on the GPU"). Every step also calls
`loss.item()`, which makes the host wait for the GPU. `--on-device` writes both the way the
guides recommend (`device=`), for a before/after by hand.

What trainadvisor should find on a GPU: `cpu-tensor-creation` (2 per step, in `train_step`),
`host-sync` (1 per step), `pageable-h2d-copy`. On a CPU: none of these (nothing is copied).

    trainadvisor profile examples/host_tensors.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def train_step(model, optimizer, x, y, device, on_device: bool, class_weights: list[float]):  # type: ignore[no-untyped-def]
    if on_device:
        noise = torch.randn(x.shape, device=device)
        weights = torch.tensor(class_weights, device=device)
    else:
        noise = torch.randn(x.shape).to(device)  # made on the host, then copied
        weights = torch.tensor(class_weights).to(device)  # made on the host, then copied
    logits = model(x + 0.01 * noise)
    loss = nn.functional.cross_entropy(logits, y, weight=weights)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--on-device", action="store_true", help="create the tensors with device=")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.samples, args.width, generator=generator)
    targets = inputs[:, :10].argmax(dim=1)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    class_weights = [1.0 + 0.1 * i for i in range(10)]
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = train_step(model, optimizer, x, y, device, args.on_device, class_weights)
            value = loss.item()  # a host sync every step
            if step % 20 == 0:
                print(f"epoch {epoch} step {step} loss {value:.4f}", flush=True)


if __name__ == "__main__":
    main()
