"""A loop that updates its parameters by hand, as PyTorch's word_language_model example does
without --use-optimizer: no torch.optim optimizer, no trainadvisor.step(). Each backward() ends a
training step."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

generator = torch.Generator().manual_seed(0)
inputs = torch.randn(60 * 16, 32, generator=generator)
targets = inputs[:, :4].sum(dim=1, keepdim=True)
model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
lr = 0.05
for x, y in DataLoader(TensorDataset(inputs, targets), batch_size=16):
    model.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
print("trained by hand")
