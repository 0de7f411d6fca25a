"""A training loop over token batches whose sequence length grows by --grow each step (8, 9,
10, ... by default), compiled with dynamic=False: every new length fails the size guard and
recompiles, until dynamo's recompile limit (8) leaves the model uncompiled. --grow 0 gives one
length: a model that compiles once and never again."""

import argparse

import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens)).mean(dim=1)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--grow", type=int, default=1)
parser.add_argument("--backend", default="eager")  # "inductor" compiles as users do, slower
args = parser.parse_args()
torch.manual_seed(0)
model = torch.compile(Tagger(), backend=args.backend, dynamic=False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    tokens = torch.randint(0, 100, (4, 8 + args.grow * step))
    loss = nn.functional.mse_loss(model(tokens), torch.ones(4, 1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
