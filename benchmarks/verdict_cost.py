"""Issue 36's figures: what a full verdict costs against a diagnosis-only run, on a quiet machine
and beside another process that keeps one core busy (started by this benchmark).

    .venv/bin/python benchmarks/verdict_cost.py [--busy] [--part PART|all]

slow-start  the slow-input example behind 8 s of set-up (loading, building the model): the wall
            time of `profile --no-fix` and of the full verdict, their ratio (target <= 1.5 quiet,
            <= 2.5 busy), the fix kept and its speedup.
cpu-start   the same behind 8 CPU-seconds of set-up instead of a sleep: the ratio, and the
            baseline's steps/s in both runs (a set-up beside the baseline's window must leave
            it as `--no-fix` measures it).
ceiling     a loader bound by storage latency (5 ms a sample, 64 a batch): the kept setting's
            steps/s against the same loop without the latency, measured quietly (the busy
            process stopped meanwhile; target >= 0.5 quiet, >= 0.3 busy) and the loss check;
            with --busy, also against the loop without the latency beside the busy core.
ceiling-light  the same with a light loop, as on the held-out script (a ceiling of hundreds of
            steps/s, which a busy core leaves within reach): 15 ms a sample, 4 a batch; the same
            figures. Both parts also measure what 8, 16, 32 and 64 workers reach by themselves with
            the latency (the most any count can bring). On `ceiling`'s heavy loop, the loop's own
            compute beside a busy core (its torch threads sharing the free core) caps what any
            worker count reaches.
short       a script that runs about 10 s by itself (300 steps): how long its profile takes
            (target <= 120 s whatever the load).
compile     a compile-friendly model (`--fix compile`), its inductor cache empty: wall time, the
            verdict and its figure.
budget      the slow-input example under `--budget 30s`: how far past it the command ended
            (target <= 10%).
Every part prints the progress line's first estimate ("about N left") against what the rest took
(target within 30%).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "slow_input_mnist.py"
COMPILE = ROOT / "tests" / "scripts" / "elementwise_mlp.py"
SLOW_START = """\
import runpy, sys, time
time.sleep({setup_s})  # loading checkpoints, dataset indexes, building the model...
sys.argv = [{example!r}, *sys.argv[1:]]
runpy.run_path({example!r}, run_name="__main__")
"""
CPU_START = """\
import runpy, sys, time
started = time.process_time()
while time.process_time() - started < {setup_s}:  # building an index, tokenizing... on one core
    sum(i * i for i in range(1000))
sys.argv = [{example!r}, *sys.argv[1:]]
runpy.run_path({example!r}, run_name="__main__")
"""
CONFIRMING = "confirming the chosen settings"
LEFT = re.compile(r"about (?:(\d+)m)?(\d+)s left")


SPINNING: list[subprocess.Popen[bytes]] = []  # the busy process, while `busy_core` runs


@contextmanager
def busy_core(on: bool) -> Iterator[None]:
    """Another process that keeps one core busy for as long as the block runs."""
    if not on:
        yield
        return
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    SPINNING.append(spin)
    try:
        yield
    finally:
        SPINNING.remove(spin)
        spin.kill()
        spin.wait()


@contextmanager
def quiet_meanwhile() -> Iterator[None]:
    """The busy process stopped (SIGSTOP) while the block runs: the no-latency ceiling is the
    loop's, measured quietly. Beside a busy core it read 7-9 steps/s in most runs and 109 in one
    (torch's second thread shares a core with the busy process, or not): no bound to judge by."""
    for spin in SPINNING:
        spin.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for spin in SPINNING:
            spin.send_signal(signal.SIGCONT)


def profile(work: Path, *args: str | Path) -> tuple[float, dict[str, Any], str]:
    """(wall seconds, report.json, what the first progress line's estimate said against what the
    rest took, and how long the diagnosis, the trials with their pairs and the confirmation took)."""
    out = work / f"r{time.monotonic_ns()}"
    command = [sys.executable, "-m", "trainadvisor", "profile", "--out", str(out), *map(str, args)]
    started = time.monotonic()
    first: tuple[float, float] | None = None  # (when, estimate_s)
    confirming: float | None = None  # when the confirmation run began
    with subprocess.Popen(
        command, cwd=work, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            found = LEFT.search(line)
            if found and first is None:
                first = (time.monotonic(), 60 * int(found[1] or 0) + int(found[2]))
            if CONFIRMING in line and confirming is None:
                confirming = time.monotonic()
    wall_s = time.monotonic() - started
    if proc.returncode != 0:  # its figures would be a report saved before it failed
        print(f"  the profile exited {proc.returncode}: {' '.join(map(str, args))}", flush=True)
    estimate = "no progress line"
    if first is not None:
        rest_s = started + wall_s - first[0]
        share = first[1] / max(rest_s, 1e-9)
        estimate = f"first estimate {first[1]:.0f} s left, the rest took {rest_s:.0f} s ({share:.2f}x)"
        if confirming is not None:  # where the verdict's time went
            estimate += (
                f"; diagnosis {first[0] - started:.1f} s, trials and pairs {confirming - first[0]:.1f} s, "
                f"confirmation and report {started + wall_s - confirming:.1f} s"
            )
    return wall_s, json.loads((out / "report.json").read_text()), estimate


def windows(report: dict[str, Any]) -> str:
    """Each window in order: its label, setting and steps/s (the pairs' show how many it took)."""
    shown = [
        f"{w['label']} {w['setting']} {w['steps_per_s']:.1f}"
        if w.get("steps_per_s")
        else f"{w['label']} {w['status']}"
        for w in report["trial_windows"]
    ]
    return "; ".join(shown)


def outcome_of(report: dict[str, Any], fix: str) -> str:
    for outcome in report["fix_outcomes"]:
        if outcome["fix"] == fix:
            chosen = f" ({outcome['chosen']})" if outcome.get("chosen") else ""
            return f"{outcome['status']}{chosen}: {outcome['reason'][:160]}"
    return "not planned"


def behind_setup(work: Path, name: str, template: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The slow-input example behind 8 s of `template`'s set-up, profiled with `--no-fix` and as a
    full verdict: the two wall times and their ratio printed; both reports and the verdict's
    estimate line returned."""
    script = work / f"{name.replace('-', '_')}.py"
    script.write_text(template.format(setup_s=8, example=str(EXAMPLE)))
    args = (script, "--samples", "400000", "--latency-ms", "1")
    diagnose_s, alone, _ = profile(work, "--no-fix", *args)
    verdict_s, report, estimate = profile(work, *args)
    ratio = verdict_s / diagnose_s
    print(f"{name}: --no-fix {diagnose_s:.1f} s, full verdict {verdict_s:.1f} s: {ratio:.2f}x")
    return alone, report, estimate


def slow_start(work: Path) -> None:
    _, report, estimate = behind_setup(work, "slow-start", SLOW_START)
    print(f"  dataloader-workers {outcome_of(report, 'dataloader-workers')}")
    print(f"  windows: {len(report['trial_windows'])}; {estimate}")
    print(f"  {windows(report)}")


def cpu_start(work: Path) -> None:
    alone, report, estimate = behind_setup(work, "cpu-start", CPU_START)
    before, after = alone["baseline"]["steps_per_s"], report["baseline"]["steps_per_s"]
    print(f"  the baseline: {before:.1f} steps/s in --no-fix, {after:.1f} in the full verdict")
    print(f"  dataloader-workers {outcome_of(report, 'dataloader-workers')}")
    print(f"  {estimate}")


def by_workers(work: Path, loader: tuple[str, ...], counts: tuple[str, ...]) -> list[float]:
    """The loop's steps/s as the script runs (`--no-fix`, one window) with each of `counts` workers."""
    rates = []
    for workers in counts:
        _, alone, _ = profile(work, "--no-fix", EXAMPLE, *loader, "--num-workers", workers)
        rates.append(alone["baseline"]["steps_per_s"] or 0.0)
    return rates


def no_latency(work: Path, batch_size: str) -> list[float]:
    """The loop's steps/s without the storage latency, with 0, 2 and 4 workers."""
    fast_args = ("--samples", "400000", "--latency-ms", "0", "--batch-size", batch_size)
    return by_workers(work, fast_args, ("0", "2", "4"))


REACH_COUNTS = ("8", "16", "32", "64")


def reach(work: Path, loader: tuple[str, ...]) -> str:
    """What each of REACH_COUNTS workers reaches by itself on the loop with its latency, and the
    most of them: what any count can bring."""
    rates = by_workers(work, loader, REACH_COUNTS)
    shown = ", ".join(f"{workers}: {rate:.0f}" for workers, rate in zip(REACH_COUNTS, rates))
    return f"{max(rates):.0f} steps/s at most ({shown})"


def ceiling(work: Path, latency_ms: str = "5", batch_size: str = "64", name: str = "ceiling") -> None:
    loader = ("--samples", "400000", "--latency-ms", latency_ms, "--batch-size", batch_size)
    wall_s, report, estimate = profile(work, EXAMPLE, *loader)
    with quiet_meanwhile():
        top = max(no_latency(work, batch_size))
        reached = reach(work, loader)
    after = report["after"]
    kept = after["steps_per_s"] if after and report["applied_fixes"] else report["baseline"]["steps_per_s"]
    check = (report.get("comparison") or {}).get("loss_check") or {}
    print(f"{name}: kept {kept:.0f} steps/s, without the latency {top:.0f}: {kept / top:.2f} of the ceiling")
    print(f"  with the latency, each worker count by itself (quietly): {reached}")
    if SPINNING:  # what the loop's own compute reaches beside the busy core, for the record
        loaded = no_latency(work, batch_size)
        shown = ", ".join(f"{rate:.0f}" for rate in loaded)
        print(
            f"  beside the busy core, without the latency: {shown} steps/s (0, 2, 4 workers): "
            f"the kept setting is {kept / max(loaded):.2f} of the best"
        )
        print(f"  with the latency, each worker count by itself beside the busy core: {reach(work, loader)}")
    print(f"  dataloader-workers {outcome_of(report, 'dataloader-workers')}")
    print(f"  loss check: {check.get('steps_compared')} steps compared, equivalent {check.get('equivalent')}")
    print(f"  profile took {wall_s:.0f} s; {estimate}")


def ceiling_light(work: Path) -> None:
    ceiling(work, latency_ms="15", batch_size="4", name="ceiling-light")


def short(work: Path) -> None:
    args = (EXAMPLE, "--samples", str(300 * 64), "--latency-ms", "0.5")
    started = time.monotonic()
    subprocess.run([sys.executable, str(EXAMPLE), *args[1:]], check=True, capture_output=True)
    alone_s = time.monotonic() - started
    wall_s, report, estimate = profile(work, *args)
    print(f"short: the script alone {alone_s:.1f} s, its profile {wall_s:.1f} s (target <= 120 s)")
    print(f"  dataloader-workers {outcome_of(report, 'dataloader-workers')}; {estimate}")


def compile_fix(work: Path) -> None:
    # an inductor cache of its own, empty: a model new to the machine compiles cold (a cache that
    # holds its graphs from an earlier run makes compiling take a second or two)
    cache, yours = work / f"inductor-{time.monotonic_ns()}", os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    try:
        wall_s, report, estimate = profile(work, "--fix", "compile", COMPILE, "--blocks", "2")
    finally:
        if yours is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = yours
    print(f"compile: profile {wall_s:.1f} s; compile {outcome_of(report, 'compile')}")
    print(f"  {estimate}")


def budget(work: Path) -> None:
    wall_s, report, _ = profile(work, "--budget", "30s", EXAMPLE, "--samples", "400000")
    over = 100 * (wall_s / 30.0 - 1)
    print(f"budget 30 s: the command took {wall_s:.1f} s ({over:+.0f}%, target <= +10%)")
    for outcome in report["fix_outcomes"]:
        print(f"  {outcome['fix']}: {outcome['status']}")


PARTS = {
    "slow-start": slow_start,
    "cpu-start": cpu_start,
    "ceiling": ceiling,
    "ceiling-light": ceiling_light,
    "short": short,
    "compile": compile_fix,
    "budget": budget,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="all", choices=[*PARTS, "all"])
    parser.add_argument("--busy", action="store_true", help="keep one core busy with another process")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; {'one kept busy by another process' if args.busy else 'quiet'}")
    with tempfile.TemporaryDirectory() as folder, busy_core(args.busy):
        for name, run in PARTS.items():
            if args.part in (name, "all"):
                run(Path(folder))


if __name__ == "__main__":
    main()
