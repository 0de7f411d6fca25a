"""Eager and compiled step time, compile time and break-even steps of the compute examples'
models, as the `compile` fix weighs them (one process per model: dynamo's state is global).

    .venv/bin/python benchmarks/compile_break_even.py [--steps 100] [--mode default]

Each model trains on in-memory batches: eager steps are timed after a warm-up, then the model's
forward is compiled (inductor; its cache on disk makes a second run of this script compile
faster, and the figure printed says which it was: cold or cached), the first compiled step (the
forward's and backward's compilation) is timed on its own, and the compiled steps after a
warm-up. Break-even = compile time / (eager step - compiled step)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

MODELS = ("compute_bound_mlp", "elementwise_mlp")


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if name == "compute_bound_mlp":  # examples/compute_bound.py's model, width 512
        width = 512
        model = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
            torch.nn.ReLU(), torch.nn.Linear(width, 10),
        )  # fmt: skip
        return model, torch.randn(256, width), torch.randint(0, 10, (256,))
    sys.path.insert(0, "tests/scripts")
    from elementwise_mlp import Block  # tests/scripts/elementwise_mlp.py's model

    model = torch.nn.Sequential(*[Block(64) for _ in range(6)], torch.nn.Linear(64, 10))
    return model, torch.randn(512, 64), torch.randint(0, 10, (512,))


def measure(name: str, steps: int, mode: str) -> dict[str, float]:
    model, x, y = build(name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def timed(n: int) -> float:
        for _ in range(max(n // 5, 5)):
            step()
        started = time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - started) / n

    eager_s = timed(steps)
    options = {} if mode == "default" else {"mode": mode}
    model._compiled_call_impl = torch.compile(model.forward, **options)  # type: ignore[call-overload]
    started = time.perf_counter()
    step()
    compile_s = time.perf_counter() - started
    compiled_s = timed(steps)
    return {"eager_ms": 1e3 * eager_s, "compiled_ms": 1e3 * compiled_s, "compile_s": compile_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--mode", default="default")
    parser.add_argument("--one", choices=MODELS, help=argparse.SUPPRESS)  # a child's model
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.steps, args.mode)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, mode={args.mode}")
    header = ("eager ms", 9), ("compiled ms", 12), ("speedup", 8), ("compile s", 10), ("break-even", 11)
    print(f"{'model':<20} " + " ".join(f"{name:>{width}}" for name, width in header))
    for name in MODELS:
        command = [sys.executable, __file__, "--one", name, "--steps", str(args.steps), "--mode", args.mode]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        saved_s = (r["eager_ms"] - r["compiled_ms"]) / 1e3
        even = f"{r['compile_s'] / saved_s:11.0f}" if saved_s > 0 else f"{'never':>11}"
        print(
            f"{name:<20} {r['eager_ms']:9.2f} {r['compiled_ms']:12.2f} "
            f"{r['eager_ms'] / r['compiled_ms']:7.2f}x {r['compile_s']:10.1f} {even}"
        )


if __name__ == "__main__":
    main()
