"""What torch's intra-op threads cost a loop fed by DataLoader workers, beside another busy process
and on a quiet machine (issue 36, item 5: the workers fix on a storage-latency loader).

    .venv/bin/python benchmarks/busy_threads.py [--part epochs|paired|all]

`--part epochs` (the default) runs `examples/slow_input_mnist.py` by itself (no profiler),
with the workers the `ceiling` case of `verdict_cost.py` keeps, on a quiet machine and beside a
process that keeps one core busy, once with torch's default intra-op threads and once with
`torch.set_num_threads(1)`, and prints the steps/s of its epoch. Nothing here is a setting
trainadvisor chooses: it shows how far the loop's own compute, not its loading, falls beside a
busy core.

`--part paired`: the light loop of `verdict_cost.py`'s `ceiling-light` case (15 ms a sample, 4
a batch) fed by 8, 16 and 32 workers on a quiet machine, in one process a count: windows of
1.5 s with torch's default intra-op threads and with one, in turn, each pair in the other
order from the last (A B, B A: a drift in the machine's pace shows in both of a pair, and
favours neither setting), and the median of the pairs' ratios. Processes on this 2-vCPU
machine draw paces up to 2x apart, so threads are compared within a process, not between two.
Then how far the losses of 60 seeded steps differ on the default threads and on one, at 4
and at 64 a batch: a matmul split among other threads sums in another order.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "slow_input_mnist.py"
# the example, its intra-op threads set first where THREADS is given
WRAPPER = """\
import os, runpy, sys, torch
if os.environ.get("THREADS"):
    torch.set_num_threads(int(os.environ["THREADS"]))
sys.argv = [{example!r}, *sys.argv[1:]]
runpy.run_path({example!r}, run_name="__main__")
"""
# what both children below start with: the example's dataset, and its model anew
EXAMPLE_MODEL = """\
import importlib.util, sys, time, torch
from torch import nn
from torch.utils.data import DataLoader
spec = importlib.util.spec_from_file_location("example", {example!r})
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

def new_model():
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)
    )
"""
PAIRED = (
    EXAMPLE_MODEL
    + """\
workers, batch, rounds = int(sys.argv[1]), int(sys.argv[3]), int(sys.argv[4])
latency_ms = float(sys.argv[2])
loader = DataLoader(
    example.SlowMNIST(10**6, latency_ms), batch_size=batch, shuffle=True,
    num_workers=workers, persistent_workers=workers > 0,
)
torch.manual_seed(0)
model = new_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
batches = iter(loader)
default = torch.get_num_threads()

def window(seconds):
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        images, labels = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(images), labels).backward()
        optimizer.step()
        steps += 1
    return steps / (time.perf_counter() - started)

window(4.0)  # the workers started, their first batches in
for k in range(rounds):  # each pair in the other order from the last: A B, B A, A B...
    found = {{}}
    for threads in (default, 1) if k % 2 == 0 else (1, default):
        torch.set_num_threads(threads)
        found[threads] = window(1.5)
    print(default, found[default], found[1], flush=True)
"""
)
# the same seeded steps (the light loop's model and batches, no latency) with the default threads
# and with one: their losses, as trainadvisor's loss check compares them
LOSSES = (
    EXAMPLE_MODEL
    + """\
batch, steps = int(sys.argv[1]), int(sys.argv[2])
dataset, default = example.SlowMNIST(batch * steps, 0.0), torch.get_num_threads()

def losses(threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    found = []
    for step in range(steps):
        samples = [dataset[i] for i in range(step * batch, (step + 1) * batch)]
        images, labels = torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        found.append(loss.item())
    return found

many, one = losses(default), losses(1)
print(default, max(abs(a - b) / abs(a) for a, b in zip(many, one)))
"""
)
TOOK = re.compile(r"epoch 0 took ([\d.]+) s")
CASES = [  # (batch size, workers, steps): the ceiling case's loader, and one of small batches
    (64, 16, 600),
    (8, 8, 3000),
]


def steps_per_s(batch: int, workers: int, steps: int, threads: int | None) -> float:
    args = ["--samples", str(batch * steps), "--latency-ms", "5", "--batch-size", str(batch)]
    env = {"THREADS": str(threads)} if threads else {}
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER.format(example=str(EXAMPLE)), *args, "--num-workers", str(workers)],
        capture_output=True,
        text=True,
        check=True,
        env={**{k: v for k, v in os.environ.items() if k != "THREADS"}, **env},
    )
    found = TOOK.search(done.stdout)
    if found is None:
        raise SystemExit(f"the example printed no epoch time:\n{done.stdout[-2000:]}")
    return steps / float(found[1])


def paired(workers: int, latency_ms: float = 15.0, batch: int = 4, rounds: int = 6) -> None:
    """`rounds` pairs of windows, the default threads and one, in one process (`PAIRED`): the
    machine as it is (run it with nothing else busy for the quiet figures)."""
    printed = _child(PAIRED, workers, latency_ms, batch, rounds)
    pairs = [tuple(float(x) for x in line.split()) for line in printed.splitlines() if line.strip()]
    many, one = [p[1] for p in pairs], [p[2] for p in pairs]
    ratios = [b / a for a, b in zip(many, one)]
    print(
        f"{latency_ms:g} ms a sample, batch {batch}, {workers} workers: {int(pairs[0][0])} threads "
        f"{_span(many)} steps/s, one {_span(one)}; one over the default in {len(pairs)} pairs: "
        f"median {_span(ratios, '.2f', 'x')}",
        flush=True,
    )


def losses(batch: int, steps: int = 60) -> None:
    """How far the losses of the same seeded steps lie apart on the default threads and on one."""
    threads, apart = _child(LOSSES, batch, steps).split()
    print(
        f"batch {batch}, {steps} seeded steps: the losses on {threads} threads and on one differ by up to "
        f"{float(apart):.1e} of the loss",
        flush=True,
    )


def _child(source: str, *args: object) -> str:
    """What a child running `source` (the example's path filled in) with `args` printed."""
    command = [sys.executable, "-c", source.format(example=str(EXAMPLE)), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def _span(values: list[float], form: str = ".0f", unit: str = "") -> str:
    """The median of `values`, then their range, in `form`."""
    mid, low, high = (format(v, form) for v in (statistics.median(values), min(values), max(values)))
    return f"{mid}{unit} ({low}-{high}{unit})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("epochs", "paired", "all"), default="epochs")
    part = parser.parse_args().part
    if part in ("paired", "all"):
        for workers in (8, 16, 32):
            paired(workers)
        for batch in (4, 64):
            losses(batch)
    if part in ("epochs", "all"):
        epochs()


def epochs() -> None:
    import torch

    print(f"torch's default intra-op threads here: {torch.get_num_threads()}")
    for busy in (False, True):
        spin = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for batch, workers, steps in CASES:
                default = steps_per_s(batch, workers, steps, None)
                one = steps_per_s(batch, workers, steps, 1)
                where = "beside a busy core" if busy else "quiet"
                print(
                    f"{where}: batch {batch}, {workers} workers: {default:.0f} steps/s with the default "
                    f"threads, {one:.0f} with one ({one / default:.2f}x)",
                    flush=True,
                )
        finally:
            if spin is not None:
                spin.kill()
                spin.wait()


if __name__ == "__main__":
    main()
