"""A model trained under torch.compile: gated blocks of elementwise work between matmuls.

With `--compile reduce-overhead` on a GPU the compiled forward and backward replay as CUDA graphs,
whose outputs are static buffers that the next replay overwrites (the loss is one: it is computed
inside the compiled function): a profiler that keeps the loss as a view of that buffer reads a
later step's value, or an error ("accessing tensor output of CUDAGraphs that has been overwritten
by a subsequent run"). trainadvisor copies the loss at backward, so the report has every step's
loss. `--compile default` compiles with inductor (on a CPU too, where it fuses the elementwise
chains into C++ kernels); `--compile none` is eager.

What trainadvisor should find: the loop is compute-bound; every seeded step's loss is recorded.

    trainadvisor profile examples/compiled_step.py --compile reduce-overhead
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


class Gated(nn.Module):
    """x + W2 (gelu(W1 x) * sigmoid(W1' x)), normalised: a chain of elementwise ops around two
    matmuls, the kind of block inductor fuses."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.up(x).chunk(2, dim=-1)
        return self.norm(x + self.down(nn.functional.gelu(value) * torch.sigmoid(gate)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--width", type=int, default=None, help="default: 1024 on a GPU, 128 on a CPU")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--compile", choices=["none", "default", "reduce-overhead"], default="default")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    width = args.width or (1024 if device.type == "cuda" else 128)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.samples, width, generator=generator)
    targets = inputs[:, :10].argmax(dim=1)
    dataset = TensorDataset(inputs, targets)
    batches = BatchSampler(RandomSampler(dataset), batch_size=args.batch_size, drop_last=True)
    loader = DataLoader(dataset, sampler=batches, batch_size=None)
    model = nn.Sequential(*(Gated(width) for _ in range(args.blocks)), nn.Linear(width, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def forward_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x), y)

    # the loss is computed inside the compiled function: under reduce-overhead it is an output
    # of the CUDA graph, a static buffer the next replay overwrites
    step_loss = forward_loss if args.compile == "none" else torch.compile(forward_loss, mode=args.compile)
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = step_loss(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 20 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
