"""Data-parallel training with DistributedDataParallel, launched by torchrun: gloo on CPUs, NCCL on
GPUs. `--slow-rank R --slow-ms MS` makes one rank spend MS more per step: every other rank then
waits for it in the gradient all-reduce. `--slow-in` says where: `host` (by default: host work
before its forward pass, a logger say), `data` (its DataLoader, a slower disk) or `compute` (more
compute in its forward pass, a throttled GPU).

    torchrun --nproc-per-node 2 examples/ddp_train.py --slow-rank 1
    trainadvisor profile --nproc-per-node 2 examples/ddp_train.py --slow-rank 1

What trainadvisor should find with a slow rank: `straggler`, naming that rank. `--fail-rank` and
`--hang-rank` make a rank fail or hang, to see the whole run end with that rank named;
`--latency-ms` slows every sample's read (a data stall, for the dataloader-workers fix).
`--find-unused --bucket-cap-mb 0.05 --depth 6` builds DDP as many scripts copied from a forum
do: a search for unused parameters at every step (there are none) and tiny gradient buckets,
for the ddp-settings rule and fix. `--accumulate K` accumulates gradients over K micro-batches
per optimizer step without `no_sync()`: DDP all-reduces them after every micro-batch.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset


class SlowStorage(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Samples that take `latency_ms` each to read, as from a network file system."""

    def __init__(self, data: TensorDataset, latency_ms: float) -> None:
        self.data, self.latency_s = data, latency_ms / 1000

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.latency_s:
            time.sleep(self.latency_s)
        return self.data[index]  # type: ignore[no-any-return]


def burn(ms: float) -> None:
    """Compute for about `ms`: matrix products until the time is up."""
    a, deadline = torch.ones(96, 96), time.perf_counter() + ms / 1000
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--slow-rank", type=int, default=-1, help="the rank to slow down (-1: none)")
    parser.add_argument("--slow-ms", type=float, default=30.0)
    parser.add_argument("--slow-in", choices=("host", "data", "compute"), default="host")
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank raises at --fail-step")
    parser.add_argument("--hang-rank", type=int, default=-1, help="this rank stops at --fail-step")
    parser.add_argument("--fail-step", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="storage latency per sample")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--depth", type=int, default=1, help="hidden layers of --width")
    parser.add_argument("--find-unused", action="store_true", help="DDP(find_unused_parameters=True)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's gradient bucket size")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    args = parser.parse_args()

    # one GPU per local rank, or every rank on the CPU (a 2-rank job on a 1-GPU machine would
    # ask for cuda:1, which is not there)
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.samples, args.width, generator=generator)
    targets = inputs[:, :10].argmax(dim=1)
    dataset = SlowStorage(TensorDataset(inputs, targets), args.latency_ms)
    sampler = DistributedSampler(dataset, seed=0)
    slow_data = rank == args.slow_rank and args.slow_in == "data"

    def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        if slow_data:
            time.sleep(args.slow_ms / 1000)  # this rank's storage is slower
        return torch.utils.data.default_collate(samples)  # type: ignore[no-any-return]

    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers, collate_fn=collate
    )
    hidden = [layer for _ in range(args.depth) for layer in (nn.Linear(args.width, args.width), nn.ReLU())]
    net = nn.Sequential(*hidden, nn.Linear(args.width, 10)).to(device)
    model = DistributedDataParallel(
        net,
        device_ids=[local_rank] if cuda else None,
        find_unused_parameters=args.find_unused,
        bucket_cap_mb=args.bucket_cap_mb,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            if rank == args.slow_rank and args.slow_in == "host":
                time.sleep(args.slow_ms / 1000)
            if step == args.fail_step and rank == args.fail_rank:
                raise RuntimeError(f"rank {rank} failed on purpose at step {step}")
            if step == args.fail_step and rank == args.hang_rank:
                time.sleep(3600)  # a hung rank: the others wait for it in the all-reduce
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            if rank == args.slow_rank and args.slow_in == "compute":
                burn(args.slow_ms)
            (loss / args.accumulate).backward()  # all-reduced at every micro-batch: no no_sync()
            if (step + 1) % args.accumulate == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if step % 50 == 0 and rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
