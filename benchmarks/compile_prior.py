"""What a compile trial costs beyond the script's own run, against the aten ops of its step: the
measurements behind `fixes.compile.COMPILE_FIXED_S` and `COMPILE_PER_OP_S`, the prior the
progress line's estimate and `--budget` count for a compile trial before one has run.

    .venv/bin/python benchmarks/compile_prior.py [--cached]

Each model is profiled with `--fix compile` in a process of its own, with an empty inductor
cache (a first-time user's cold compile; `--cached` keeps one cache for all, as a second run
would), and the report gives: the baseline's aten ops per traced step (`model_aten_ops_per_step`),
dynamo's compile time, and what the compile trial's run took beyond the baseline's run (its
wall time less the baseline's). A least-squares line through the last column is printed with
each model's error against it. The models: tests/scripts/elementwise_mlp.py with 1 to 12
blocks, and a small transformer encoder (1 and 2 layers) written here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ELEMENTWISE = ROOT / "tests" / "scripts" / "elementwise_mlp.py"
TRANSFORMER = """\
import sys
import torch

layers = int(sys.argv[1])
torch.manual_seed(0)
encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), layers)
model = torch.nn.Sequential(encoder, torch.nn.Flatten(), torch.nn.Linear(64 * 16, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
inputs, targets = torch.randn(8, 16, 64), torch.randint(0, 10, (8,))
for _ in range(100000):
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def models(work: Path) -> list[tuple[str, list[str]]]:
    transformer = work / "transformer.py"
    transformer.write_text(TRANSFORMER)
    cases = [(f"elementwise, {n} blocks", [str(ELEMENTWISE), "--blocks", str(n)]) for n in (1, 4, 12)]
    return cases + [(f"transformer, {n} layers", [str(transformer), str(n)]) for n in (1, 2)]


def profile(work: Path, name: str, args: list[str], cache: Path) -> dict[str, float]:
    out = work / name.replace(" ", "_").replace(",", "")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "trainadvisor", "profile", "--out", str(out), "--fix", "compile", *args]
    subprocess.run(command, cwd=work, env=env, check=True, capture_output=True)
    report = json.loads((out / "report.json").read_text())
    trial = report["fix_outcomes"][0]["trials"][0]
    baseline_s = float(report["baseline"]["raw"]["wall_s"])
    return {
        "ops": float(report["baseline"]["trace"]["model_aten_ops_per_step"]),
        "compile_s": float(trial["raw"]["runtime"]["compile"]["compile_s"]),
        "extra_s": float(trial["raw"]["wall_s"]) - baseline_s,
        "baseline_s": baseline_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cached", action="store_true", help="one inductor cache for every model")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; inductor cache {'shared' if args.cached else 'empty for each model'}")
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, script in models(work):
            cache = work / ("cache" if args.cached else f"cache-{len(rows)}")
            rows.append((name, profile(work, name, script, cache)))
            r = rows[-1][1]
            print(
                f"  {name:<24} {r['ops']:6.0f} ops/step  compile {r['compile_s']:5.1f} s  "
                f"trial's run +{r['extra_s']:5.1f} s (the baseline's {r['baseline_s']:.1f} s)"
            )
    xs, ys = [r["ops"] for _, r in rows], [r["extra_s"] for _, r in rows]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    fixed = mean_y - slope * mean_x
    print(f"fit: trial's run + {fixed:.1f} s + {1e3 * slope:.1f} ms per aten op of the step")
    for name, r in rows:
        fitted = fixed + slope * r["ops"]
        print(
            f"  {name:<24} measured +{r['extra_s']:5.1f} s, "
            f"fit +{fitted:5.1f} s ({fitted / r['extra_s']:.2f}x)"
        )


if __name__ == "__main__":
    main()
