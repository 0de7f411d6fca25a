"""What torch's intra-op threads cost a loop fed by DataLoader workers beside another busy process
(issue 36, item 5: the workers fix on a storage-latency loader with one of 2 cores busy).

    .venv/bin/python benchmarks/busy_threads.py

Runs `examples/slow_input_mnist.py` by itself (no profiler), with the workers the `ceiling` case
of `verdict_cost.py` keeps, on a quiet machine and beside a process that keeps one core busy,
once with torch's default intra-op threads and once with `torch.set_num_threads(1)`, and prints
the steps/s of its epoch. Nothing here is a setting trainadvisor chooses: it shows how far the
loop's own compute, not its loading, falls beside a busy core.
"""

from __future__ import annotations

import os
import re
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


def main() -> None:
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
