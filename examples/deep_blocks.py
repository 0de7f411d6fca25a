"""A deep stack of residual MLP blocks whose activations fill most of a step's memory.

Each block keeps its LayerNorm's output, its hidden layer (four times as wide) and its GELU for
backward: with a batch of 512 that is most of the step's peak, more than the parameters, their
gradients and AdamW's two moments together. Activation checkpointing keeps only each block's
input and recomputes the rest in backward; gradient accumulation halves the batch each update
is made of.

What trainadvisor should find, run against a budget smaller than its peak (on a CPU the budget
stands for the card the run is meant for):

    trainadvisor profile examples/deep_blocks.py --memory-budget 30MB

`over-memory-budget`, with activation checkpointing and gradient accumulation measured: each
one's peak and its cost in speed, and the fastest that fits the budget.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    inputs = torch.randn(args.samples, args.width)
    targets = inputs.sum(dim=1, keepdim=True).tanh()
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=args.batch_size, shuffle=True)
    model = Net(args.width, args.depth).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
