"""Issue 13's figures: trial windows in one process against a restart per trial.

    .venv/bin/python benchmarks/trial_windows.py [--part slow-start|ceiling|agreement|all]

slow-start   a copy of the slow-input example that spends 8 s setting up before its first step:
             the wall time of `profile --no-fix` and of the full verdict, their ratio (target
             <= 1.8), and the speedup kept (target >= 3x).
ceiling      a loader bound by storage latency (5 ms per sample, 64 per batch): the throughput of
             the kept setting against the same loop with the latency removed (target >= 0.3).
agreement    the slow-input example 5 times in each mode: the worker count each chooses, and in
             how many runs the in-process choice is within one doubling of the restart one
             (target: 4 of 5).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "slow_input_mnist.py"

SLOW_START = """\
import runpy, sys, time
time.sleep({setup_s})  # loading checkpoints, dataset indexes, building the model...
sys.argv = [{example!r}, *sys.argv[1:]]
runpy.run_path({example!r}, run_name="__main__")
"""


def profile(work: Path, *args: str | Path) -> tuple[float, dict[str, Any]]:
    out = work / f"r{time.monotonic_ns()}"
    started = time.monotonic()
    command = [sys.executable, "-m", "trainadvisor", "profile", "--out", str(out), *map(str, args)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
    return time.monotonic() - started, json.loads((out / "report.json").read_text())


def workers_chosen(report: dict[str, Any]) -> int | None:
    for outcome in report["fix_outcomes"]:
        if outcome["fix"] == "dataloader-workers" and outcome["settings"]["loaders"]:
            return int(next(iter(outcome["settings"]["loaders"].values()))["num_workers"])
    return None


def slow_start(work: Path) -> None:
    script = work / "slow_start.py"
    script.write_text(SLOW_START.format(setup_s=8, example=str(EXAMPLE)))
    args = ("--warmup", "3", "--steps", "10", script, "--samples", "20000")
    diagnose_s, _ = profile(work, "--no-fix", *args)
    verdict_s, report = profile(work, *args)
    print(f"slow start (8 s of set-up): --no-fix {diagnose_s:.1f} s, full verdict {verdict_s:.1f} s, ")
    print(f"  ratio {verdict_s / diagnose_s:.2f} (target <= 1.8); speedup kept {report['speedup'] or 0:.2f}x")
    print(f"  workers chosen: {workers_chosen(report)}; windows: {len(report['trial_windows'])}")


def ceiling(work: Path) -> None:
    loader = ("--samples", "200000", "--latency-ms", "5", "--batch-size", "64")
    _, report = profile(work, "--warmup", "3", "--steps", "10", EXAMPLE, *loader)
    # the ceiling: the same loop with the latency removed, at the best of a few worker counts
    # (its samples still cost their decoding)
    top = 0.0
    for workers in ("0", "2", str(workers_chosen(report) or 8)):
        _, fast = profile(
            work, "--no-fix", "--warmup", "20", "--steps", "40", EXAMPLE, "--samples", "200000",
            "--latency-ms", "0", "--num-workers", workers,
        )  # fmt: skip
        top = max(top, fast["baseline"]["steps_per_s"])
    kept = report["after"]["steps_per_s"] if report["after"] else report["baseline"]["steps_per_s"]
    print(f"storage-latency loader: kept {kept:.0f} steps/s with {workers_chosen(report)} workers; ")
    print(f"  without the latency {top:.0f} steps/s: {kept / top:.2f} of the ceiling (target >= 0.3)")
    for outcome in report["fix_outcomes"]:
        if outcome["fix"] == "dataloader-workers":
            print(f"  search: {outcome['search']}")


def agreement(work: Path, runs: int = 5) -> None:
    args = ("--warmup", "3", "--steps", "10", EXAMPLE, "--samples", "20000")
    agreed = 0
    for i in range(runs):
        in_process_s, windows = profile(work, *args)
        restart_s, restarts = profile(work, "--trials", "restart", *args)
        a, b = workers_chosen(windows), workers_chosen(restarts)
        close = a is not None and b is not None and abs(math.log2(a) - math.log2(b)) <= 1
        agreed += close
        print(
            f"run {i + 1}: in-process {a} workers ({in_process_s:.0f} s), restarts {b} workers "
            f"({restart_s:.0f} s){'' if close else '  <- more than one doubling apart'}"
        )
    print(f"agreement within one doubling: {agreed} of {runs} (target: 4 of 5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="all", choices=["slow-start", "ceiling", "agreement", "all"])
    part = parser.parse_args().part
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for name, run in (("slow-start", slow_start), ("ceiling", ceiling), ("agreement", agreement)):
            if part in (name, "all"):
                run(work)


if __name__ == "__main__":
    main()
