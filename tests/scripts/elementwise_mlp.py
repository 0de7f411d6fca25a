"""A compute-bound loop whose blocks chain elementwise ops around small matmuls (LayerNorm, GELU,
sigmoid, tanh, a residual add): eager runs each op as a kernel of its own, inductor fuses each
chain into one. The batches are made in memory (no data wait). `--steps` sets the run's length
(the compile fix weighs its compile time against it); `--dropout P` adds dropout to each block
(inductor draws its masks otherwise than eager)."""

import argparse

import torch


class Block(torch.nn.Module):
    def __init__(self, width: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.lin = torch.nn.Linear(width, width)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.lin(self.norm(x)))
        return x + torch.nn.functional.gelu(h) * torch.sigmoid(h) - 0.1 * torch.tanh(h)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    blocks = [Block(64, args.dropout) for _ in range(args.blocks)]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(512, 64), torch.randint(0, 10, (512,))
    for _step in range(args.steps):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
