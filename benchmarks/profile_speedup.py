"""Issue 2 targets: on the slow-input example, the rerun's throughput against the baseline's
(target: at least 3x on a 2-core machine) and the wall time of a whole `trainadvisor profile`
run, profile + tuning + confirmation + report (target: under 60 s).

    .venv/bin/python benchmarks/profile_speedup.py [--repeats 3] [-- extra example args]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(out: Path, example_args: list[str]) -> tuple[float, dict]:
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainadvisor",
            "profile",
            "--out",
            str(out),
            str(ROOT / "examples" / "slow_input_mnist.py"),
            *example_args,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.monotonic() - started, json.loads((out / "report.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("example_args", nargs="*", help="passed to examples/slow_input_mnist.py")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; example args: {args.example_args or '(defaults)'}")
    walls, speedups = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            wall_s, report = one_run(Path(tmp) / f"run{i}", args.example_args)
            c = report["comparison"] or {}
            outcome = report["fix_outcomes"][0] if report["fix_outcomes"] else {}
            walls.append(wall_s)
            speedups.append(report["speedup"] or 0.0)
            print(
                f"run {i + 1}: {wall_s:5.1f} s wall;"
                f" baseline {report['baseline']['steps_per_s']:.1f} steps/s,"
                f" after {(report['after'] or {}).get('steps_per_s') or 0:.1f} steps/s;"
                f" speedup {report['speedup'] or 0:.2f}x (range {c.get('speedup_low') or 0:.2f}-"
                f"{c.get('speedup_high') or 0:.2f}x); kept: {outcome.get('chosen') or outcome.get('status')}"
            )
    print(f"speedup: median {statistics.median(speedups):.2f}x, min {min(speedups):.2f}x (target >= 3x)")
    print(f"wall time: median {statistics.median(walls):.1f} s, max {max(walls):.1f} s (target < 60 s)")


if __name__ == "__main__":
    main()
