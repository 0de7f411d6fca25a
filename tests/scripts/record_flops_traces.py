"""Record the small CPU traces with shapes in tests/data/own/ that `analyze` counts FLOPs from.

    .venv/bin/python tests/scripts/record_flops_traces.py

Each is a few training steps of a tiny model under torch.profiler with record_shapes=True and
with_flops=True, a schedule of 1 warm-up and 3 recorded steps and `prof.step()` after each (so
ProfilerStep#1-3 mark them). Before profiling, one step runs under torch.utils.flop_counter's
FlopCounterMode: its count is printed, the figure tests/integration/test_trace_mfu.py expects per step."""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[2]


def linear_step() -> Callable[[], None]:
    """Linear(64, 32) on a batch of 16, SGD: one addmm forward, one mm backward (the weight's
    gradient; the input needs none)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 64)

    def step() -> None:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    return step


def conv_attention_step() -> Callable[[], None]:
    """A strided Conv2d (forward, and the weight's gradient), fused attention (query, key and
    value of one head size: the flash kernel for CPU) and a bmm, forward and backward."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
    q = torch.randn(2, 4, 10, 8, requires_grad=True)
    k = torch.randn(2, 4, 12, 8, requires_grad=True)
    v = torch.randn(2, 4, 12, 8, requires_grad=True)
    a = torch.randn(3, 5, 7, requires_grad=True)
    b = torch.randn(3, 7, 6, requires_grad=True)
    x = torch.randn(4, 3, 16, 16)

    def step() -> None:
        out = conv(x).sum() + F.scaled_dot_product_attention(q, k, v).sum() + torch.bmm(a, b).sum()
        out.backward()

    return step


STEPS = {"linear_flops_cpu": linear_step, "conv_attention_flops_cpu": conv_attention_step}


def record(name: str, step: Callable[[], None], target: Path) -> None:
    with FlopCounterMode(display=False) as counter:
        step()
    with tempfile.TemporaryDirectory() as work:
        trace = Path(work) / "trace.json"
        with profile(
            activities=[ProfilerActivity.CPU],
            record_shapes=True,
            with_flops=True,
            schedule=schedule(wait=0, warmup=1, active=3),
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
        ) as prof:
            for _ in range(4):
                step()
                prof.step()
        out = target / f"{name}.pt.trace.json.gz"
        with open(trace, "rb") as source, gzip.GzipFile(out, "wb", mtime=0) as sink:
            shutil.copyfileobj(source, sink)
    print(f"wrote {out}: FlopCounterMode counts {counter.get_total_flops()} FLOPs per step")


def main() -> None:
    target = ROOT / "tests" / "data" / "own"
    target.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for name, make in STEPS.items():
        record(name, make(), target)


if __name__ == "__main__":
    main()
