"""A compute-bound training loop: the whole data set is already in memory.

The batches come from a `TensorDataset` held in RAM, indexed a whole batch at a time (a
`BatchSampler` as the sampler: one gather per tensor instead of collating 256 samples one by one),
so taking the next batch costs a fraction of a millisecond while the forward and backward passes
of a wide MLP take tens of milliseconds.

What trainadvisor should find: no `data-stall` finding (the loop waits on data for well under
5% of each step); the time goes to compute.

    trainadvisor profile examples/compute_bound.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.samples, args.width, generator=generator)
    targets = (inputs[:, :10].argmax(dim=1)).long()  # a learnable labelling
    dataset = TensorDataset(inputs, targets)
    batches = BatchSampler(RandomSampler(dataset), batch_size=args.batch_size, drop_last=False)
    loader = DataLoader(dataset, sampler=batches, batch_size=None)  # each item is a whole batch
    model = nn.Sequential(
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 10),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
