"""Record small real CPU Kineto traces of tiny training loops into tests/data/traces/.

Each trace profiles a 2-layer MLP (64->128->10, MSE loss) in a known way: with or without a
profiler schedule, with the legacy autograd profiler, without an optimizer, in inference mode,
with user annotations, or with record_shapes under bfloat16 autocast. Most loops take batches
of 8 from a DataLoader over a map-style Dataset whose __getitem__ sleeps 1 ms per sample, so
the data wait is visible. See tests/data/traces/README.md for what each file holds.

    .venv/bin/python scripts/record_traces.py

Re-running overwrites the files; the structure is deterministic (torch is seeded), timings
are not.
"""

from __future__ import annotations

import gzip
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "traces"
BATCH = 8
ITERS = 6


class SleepyDataset(Dataset):
    """Map-style dataset of random (input, target) pairs; each item costs ~1 ms."""

    def __init__(self, samples: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(samples, 64, generator=gen)
        self.y = torch.randn(samples, 10, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)
        return self.x[index], self.y[index]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def make_loader(iters: int = ITERS, workers: int = 0) -> DataLoader:
    return DataLoader(
        SleepyDataset(iters * BATCH),
        batch_size=BATCH,
        shuffle=False,
        num_workers=workers,
        persistent_workers=False,
    )


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x, y) -> None:
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def train_loop(opt_cls=torch.optim.SGD, workers: int = 0, step_fn=None, annotate=False) -> Callable:
    """A closure that runs ITERS training iterations over a fresh DataLoader."""
    model = make_model()
    opt = opt_cls(model.parameters(), lr=0.01)
    loader = make_loader(workers=workers)

    def run() -> None:
        for x, y in loader:
            if annotate:
                with record_function("train_iteration"):
                    train_step(model, opt, x, y)
            else:
                train_step(model, opt, x, y)
            if step_fn is not None:
                step_fn()

    return run


def cpu_profile(**kwargs) -> profile:
    return profile(activities=[ProfilerActivity.CPU], **kwargs)


def export(prof, name: str) -> Path:
    """Export a Chrome trace and gzip it (mtime 0, no file name in the gzip header).

    The export runs in a temporary folder with a relative path, so the trace's traceName
    is the bare file name rather than a machine-specific absolute path.
    """
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    stem = name.removesuffix(".gz")
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            prof.export_chrome_trace(stem)
            data = Path(stem).read_bytes()
        finally:
            os.chdir(cwd)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(data)
    return path


def no_schedule(workers: int) -> profile:
    run = train_loop(workers=workers)
    with cpu_profile() as prof:
        run()
    return prof


def autograd_profiler():
    run = train_loop(opt_cls=torch.optim.Adam)
    with torch.autograd.profiler.profile() as prof:
        run()
    return prof


def schedule_no_step() -> profile:
    run = train_loop()
    with cpu_profile(schedule=schedule(wait=0, warmup=0, active=10)) as prof:
        run()  # the common mistake: prof.step() is never called
    return prof


def profiler_steps() -> profile:
    prof = cpu_profile(schedule=schedule(wait=1, warmup=1, active=4))
    run = train_loop(step_fn=prof.step)
    with prof:
        run()
    return prof


def backward_only() -> profile:
    model, lr = make_model(), 0.01
    with cpu_profile() as prof:
        for _ in range(5):
            x, y = torch.randn(BATCH, 64), torch.randn(BATCH, 10)
            nn.functional.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    assert p.grad is not None
                    p.sub_(lr * p.grad)  # p -= lr * p.grad
                    p.grad = None
    return prof


def inference() -> profile:
    model, loader = make_model().eval(), make_loader()
    with cpu_profile() as prof, torch.inference_mode():
        for x, y in loader:
            nn.functional.mse_loss(model(x), y)
    return prof


def annotated_steps() -> profile:
    run = train_loop(annotate=True)
    with cpu_profile() as prof:
        run()
    return prof


def record_shapes_bf16() -> profile:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with cpu_profile(record_shapes=True) as prof:
        for _ in range(4):
            x, y = torch.randn(BATCH, 64), torch.randn(BATCH, 10)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            loss = nn.functional.mse_loss(out.float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return prof


RECORDERS: dict[str, Callable] = {
    "no_schedule_workers0.json.gz": lambda: no_schedule(0),
    "no_schedule_workers2.json.gz": lambda: no_schedule(2),
    "autograd_profiler.json.gz": autograd_profiler,
    "schedule_no_step.json.gz": schedule_no_step,
    "profiler_steps.json.gz": profiler_steps,
    "backward_only.json.gz": backward_only,
    "inference.json.gz": inference,
    "annotated_steps.json.gz": annotated_steps,
    "record_shapes_bf16.json.gz": record_shapes_bf16,
}


def main() -> None:
    torch.manual_seed(0)
    for name, record in RECORDERS.items():
        start = time.perf_counter()
        path = export(record(), name)
        took = time.perf_counter() - start
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes ({took:.1f} s)")


if __name__ == "__main__":
    main()
