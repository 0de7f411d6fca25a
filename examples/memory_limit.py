"""A model sized to fill a chosen share of the device's memory.

A deep MLP whose batch is computed so that parameters, gradients, Adam's two moments and the
activations kept for backward take about `--memory-fraction` of the GPU's memory (default 0.9),
or `--size-gb` on a CPU. Near the limit the caching allocator retries allocations (flushing its
cache, which synchronises the device) and fragments.

What trainadvisor should find on a GPU: `memory-pressure` (peak reserved memory near the
device's total, allocator retries), with gradient accumulation, activation checkpointing, AMP
and expandable segments recommended. On a CPU: nothing (the rule reads CUDA memory statistics).

    trainadvisor profile examples/memory_limit.py --memory-fraction 0.9
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

LAYERS = 12
BYTES = 4  # fp32


def batch_for(budget_bytes: float, width: int) -> int:
    """The batch whose training state fits `budget_bytes`: per layer, 4 copies of the weights
    (parameter, gradient, two Adam moments) and 3 activations per sample kept for backward."""
    params = LAYERS * (width * width + width) * BYTES * 4
    per_sample = LAYERS * width * BYTES * 3
    return max(1, int((budget_bytes - params) / per_sample))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--memory-fraction", type=float, default=0.9, help="of the GPU's memory")
    parser.add_argument("--size-gb", type=float, default=0.5, help="the budget on a CPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda":
        budget = args.memory_fraction * torch.cuda.get_device_properties(device).total_memory
    else:
        budget = args.size_gb * 1e9
    batch = batch_for(budget, args.width)
    print(f"batch {batch} for a budget of {budget / 1e9:.1f} GB", flush=True)
    blocks: list[nn.Module] = []
    for _ in range(LAYERS):
        blocks += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*blocks).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        x = torch.randn(batch, args.width, generator=generator).to(device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
