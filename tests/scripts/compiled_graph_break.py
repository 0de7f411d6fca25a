"""A training loop whose compiled model breaks its graph once: a NaN check written as a Python
`if` on a tensor (the line marked BREAK); tests/e2e/test_dynamo.py asserts that line."""

import argparse

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 32)
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(x))
        if torch.isnan(h).any():  # BREAK: a Python branch on a tensor's value
            raise ValueError("NaN in the activations")
        return self.head(h)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--backend", default="eager")  # "inductor" compiles as users do, slower
args = parser.parse_args()
torch.manual_seed(0)
model = torch.compile(Net(), backend=args.backend)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(args.steps):
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
