"""What `@advise` costs a training step outside its window, in nanoseconds per call.

    .venv/bin/python benchmarks/advise_overhead.py

A step function that does nearly nothing is called plain, decorated during warmup, and decorated
after the window has been reported; each is timed over many calls, best of several repeats."""

from __future__ import annotations

import tempfile
import time
import timeit
from pathlib import Path

from trainadvisor.advising.advisor import Advisor

CALLS = 200_000


def step(x: int) -> int:
    return x + 1


def per_call_ns(fn: object) -> float:
    timer = timeit.Timer(lambda: fn(1))  # type: ignore[operator]
    return min(timer.repeat(repeat=5, number=CALLS)) / CALLS * 1e9


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        plain = per_call_ns(step)
        warmup = Advisor(warmup=10**9, steps=1, out=Path(out) / "w", echo=lambda _: None)(step)
        in_warmup = per_call_ns(warmup)
        done = Advisor(warmup=1, steps=2, out=Path(out) / "d", echo=lambda _: None)
        after = done(step)
        started = time.perf_counter()
        for _ in range(20):
            after(1)
        window_s = time.perf_counter() - started
        after_window = per_call_ns(after)
    print(f"plain call:                 {plain:8.0f} ns")
    print(f"@advise during warmup:      {in_warmup:8.0f} ns  (+{in_warmup - plain:.0f} ns)")
    print(f"@advise after its window:   {after_window:8.0f} ns  (+{after_window - plain:.0f} ns)")
    print(f"window of 1+2+2 steps incl. analysis and report: {window_s:.2f} s")


if __name__ == "__main__":
    main()
