"""Fully sharded data parallel training (FSDP2, `fully_shard`), launched by torchrun: gloo on
CPUs, NCCL on GPUs. Each block of the model is its own FSDP unit (its parameters gathered for
its forward and backward, sharded again after, unless --no-reshard), the whole model the root.

    torchrun --nproc-per-node 2 examples/fsdp_train.py
    trainadvisor profile --nproc-per-node 2 examples/fsdp_train.py

What trainadvisor should say of it: the job in one line ("FSDP2 over 2 ranks: 5 units, ..."),
its collectives by phase (all-gathers in the forward and backward passes, reduce-scatters in the
backward pass) and its memory per rank. `--slow-rank R --slow-ms MS` makes one rank load each
batch MS later (a slower disk): the critical path names it and its data loading.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--no-reshard", action="store_true", help="keep each block gathered after forward")
    parser.add_argument("--slow-rank", type=int, default=-1, help="the rank whose data is slower (-1: none)")
    parser.add_argument("--slow-ms", type=float, default=10.0)
    args = parser.parse_args()

    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here
    dist.init_process_group("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.samples, args.width, generator=generator)
    targets = inputs[:, :10].argmax(dim=1)
    dataset = TensorDataset(inputs, targets)
    sampler = DistributedSampler(dataset, seed=0)
    slow = dist.get_rank() == args.slow_rank

    def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        if slow:
            time.sleep(args.slow_ms / 1000)  # this rank's storage is slower
        return torch.utils.data.default_collate(samples)  # type: ignore[no-any-return]

    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, collate_fn=collate)
    blocks = [nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.blocks)]
    model = nn.Sequential(*blocks, nn.Linear(args.width, 10)).to(device)
    for block in blocks:
        fully_shard(block, reshard_after_forward=not args.no_reshard)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 50 == 0 and dist.get_rank() == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
