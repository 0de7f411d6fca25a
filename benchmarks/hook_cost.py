"""The absolute cost of trainadvisor's hooks outside the profiled window, in microseconds per
training step, measured in one process: the same tiny step (a DataLoader batch, a backward, an
optimizer step) timed before and after the hooks are installed. Compare it with real step times
(milliseconds) to see why steps outside the window run at the plain script's speed.

    .venv/bin/python benchmarks/hook_cost.py [--steps 20000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainadvisor.training import hooks


def step_time_us(loader: DataLoader, weight: torch.Tensor, optimizer: torch.optim.Optimizer) -> float:
    """Mean time of one tiny training step over the loader, in microseconds."""
    started = time.perf_counter()
    for (x,) in loader:
        loss = (weight * x).sum()
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - started) / len(loader) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    weight = torch.zeros(4, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(args.steps, 4)), batch_size=1)
    step_time_us(loader, weight, optimizer)  # warm up
    plain, hooked = [], []
    with tempfile.TemporaryDirectory() as tmp:
        # A window of one step after one warmup step: every measured step comes after the window,
        # as in a --run-to-end run. (Warmup and window steps also fingerprint their batches and
        # keep their losses: tens of microseconds more, for a few dozen steps.)
        config = hooks.ChildConfig(
            label="bench",
            result_file=str(Path(tmp) / "r.json"),
            trace_file=None,
            warmup=1,
            steps=1,
            profile_steps=0,
            stop_after_window=False,
            seed=None,
        )
        for _ in range(args.rounds):  # alternate, so drift of the machine hits both alike
            plain.append(step_time_us(loader, weight, optimizer))
            recorder = hooks.install(config)
            hooked.append(step_time_us(loader, weight, optimizer))
            recorder.uninstall()
    cost_us = statistics.median(h - p for h, p in zip(hooked, plain))
    print(
        f"tiny step: {statistics.median(plain):.1f} us plain, {statistics.median(hooked):.1f} us with hooks "
        f"(medians of {args.rounds} alternating rounds of {args.steps} steps)"
    )
    print(
        f"hook cost outside the window: {cost_us:.1f} us per step = {cost_us / 10:.2f}% of a 1 ms step, "
        f"{cost_us / 100:.3f}% of a 10 ms step"
    )


if __name__ == "__main__":
    main()
