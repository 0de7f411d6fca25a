"""Peak memory and step time of each memory fix on the examples, measured as `profile` measures
a fix's trial: the script run in a child process with the fix's run-time switch, its steps timed
after a warm-up, then one untimed step whose memory is measured (`memory.step`: on a CPU the
most training's tensors held at once, on a GPU the allocator's peak).

    .venv/bin/python benchmarks/memory_fixes.py [--steps 20]

For each example: the baseline, activation checkpointing of its repeated blocks (where it has
some), gradient accumulation in 2 and 4 micro-batches, and bf16 autocast (its effect on memory:
on a CPU autocast keeps fp32 weights and makes bf16 copies, so it may not lower the peak)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from trainadvisor.measure.config import WindowSize
from trainadvisor.measure.runner import RunSpec, measure
from trainadvisor.records import Overrides, RawRun, timed_steps

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "deep_blocks.py": ["--epochs", "2", "--samples", "8192"],
    "memory_limit.py": ["--steps", "60", "--width", "512", "--size-gb", "0.1"],
}


def run(script: str, args: list[str], overrides: Overrides, steps: int, out: Path) -> RawRun:
    spec = RunSpec(
        "bench", ROOT / "examples" / script, args, out, 3, steps, profile=False, show_output=False,
        overrides=overrides, size=WindowSize(min_time_s=0.5),
    )  # fmt: skip
    return measure(spec)


def line(name: str, raw: RawRun, base_ms: float | None) -> tuple[str, float | None]:
    steps = timed_steps(raw)
    memory = raw.runtime.get("memory") or {}
    if raw.status != "window_complete" or not steps or memory.get("peak_bytes") is None:
        return f"  {name:<34} {raw.status}: {raw.error or memory.get('status')}", None
    step_ms = sum(s.step_ms for s in steps) / len(steps)
    cost = f"  {step_ms / base_ms:5.2f}x the step time" if base_ms else ""
    return f"  {name:<34} peak {memory['peak_bytes'] / 1e6:8.1f} MB   step {step_ms:8.1f} ms{cost}", step_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        for script, args in EXAMPLES.items():
            print(script, " ".join(args))
            base = run(script, args, Overrides(), options.steps, out)
            text, base_ms = line("baseline", base, None)
            print(text)
            candidates: list[tuple[str, Overrides]] = []
            blocks = base.runtime.get("blocks_path")
            if blocks is not None:
                candidates.append(
                    ("activation checkpointing", Overrides(runtime={"activation_checkpointing": blocks}))
                )
            loader = base.loaders[0] if base.loaders else None
            for k in (2, 4):
                if loader is not None and isinstance(loader.batch_size, int) and loader.batch_size % k == 0:
                    site = {loader.created_at: {"batch_size": loader.batch_size // k}}
                    candidates.append(
                        (
                            f"grad accumulation, {k} micro-batches",
                            Overrides(site, runtime={"grad_accumulation": k}),
                        )
                    )
            candidates.append(("bf16 autocast", Overrides(runtime={"amp": "bf16"})))
            for name, overrides in candidates:
                print(line(name, run(script, args, overrides, options.steps, out), base_ms)[0])


if __name__ == "__main__":
    main()
