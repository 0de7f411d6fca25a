"""A loop with an LR scheduler and gradient clipping (the two things an injected fp16 GradScaler
must respect). With --norms FILE it appends the gradient norm clip_grad_norm_ saw each step.

    python tests/scripts/scheduled_clipped.py [--steps N] [--norms FILE] [--tf32-new-api]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--norms", default=None)
    parser.add_argument("--tf32-new-api", action="store_true", help="set TF32 the torch>=2.9 way")
    args = parser.parse_args()
    if args.tf32_new_api:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.steps * 16, 32, generator=generator)
    targets = inputs[:, :4].sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=16)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        if args.norms:
            with open(args.norms, "a") as f:
                f.write(f"{float(norm)}\n")
        optimizer.step()
        scheduler.step()


if __name__ == "__main__":
    main()
