"""Issue 14, item 7: `analyze` on a 1.9 GB trace. The trace is HTA's df_index_resolver trace
(216k events) repeated 40 times with shifted timestamps (8.6 M events); the yardstick is plain
`json.loads` of the same trace repeated 8 times (one fifth of the size). Each measurement runs in
a child process of its own, so wall time and peak RSS are that child's alone.

    .venv/bin/python benchmarks/analyze_scale.py [--copies 40] [--work /tmp/trainadvisor-scale] [--gzip]

Prints the time and peak RSS of each, and the ratio (target: <= 1.3x, peak <= 600 MB): --repeat
pairs of runs (3), alternated, and their median ratio; run it on a quiet machine (it warns when the
load average says otherwise: a test suite beside it slows the parallel read more than json.loads). A large
uncompressed trace is read by one worker process per core: the peak is given for the largest
single process and for the whole process tree at once (sampled every 20 ms). With --gzip
(issue 27), the trace analysed is the same 1.9 GB gzipped (level 6, 0.1 GB): it is decompressed
in one process and parsed on the others. The enlarged files are built once and kept in --work
(about 2.3 GB, 2.4 GB with --gzip)."""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"

_MEASURE = (
    "import resource, subprocess, sys, time; t = time.perf_counter();"
    "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL);"
    "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)"
)


def measured(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one child process."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *command], check=True, capture_output=True, text=True
    )
    wall, rss = out.stdout.split()
    return float(wall), float(rss)


def measured_tree(command: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS of the largest process, peak RSS of the process tree together)
    of a command, sampling the tree every 20 ms."""
    start = time.perf_counter()
    process = psutil.Popen(command, stdout=subprocess.DEVNULL)
    largest = tree = 0.0
    while process.poll() is None:
        try:
            rss = [p.memory_info().rss for p in [process, *process.children(recursive=True)]]
        except psutil.Error:
            continue
        largest, tree = max(largest, max(rss) / 2**20), max(tree, sum(rss) / 2**20)
        time.sleep(0.02)
    wall = time.perf_counter() - start
    if process.returncode:
        raise SystemExit(f"{command}: exit {process.returncode}")
    return wall, largest, tree


def enlarge(source: Path, target: Path, copies: int) -> int:
    """Write `copies` repetitions of the trace's events, each shifted past the previous one,
    streaming: one copy's events are held at a time."""
    document = json.loads(gzip.decompress(source.read_bytes()))
    events = document.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    with open(target, "w") as out:
        out.write('{"traceEvents": [')
        for copy in range(copies):
            shifted = []
            for event in events:
                event = dict(event)
                if isinstance(event.get("ts"), (int, float)):
                    event["ts"] += copy * span
                shifted.append(event)
            text = json.dumps(shifted)[1:-1]
            out.write(("," if copy else "") + text)
        out.write("], " + json.dumps(document)[1:])
    return len(events) * copies


def compressed(source: Path, target: Path) -> None:
    """`source` gzipped at level 6 (gzip's default), streaming."""
    with open(source, "rb") as plain, gzip.open(target, "wb", compresslevel=6) as out:
        while block := plain.read(16 << 20):
            out.write(block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=40)
    parser.add_argument("--work", type=Path, default=Path("/tmp/trainadvisor-scale"))
    parser.add_argument("--gzip", action="store_true", help="analyse the large trace gzipped")
    parser.add_argument(
        "--repeat", type=int, default=3, help="pairs of runs, alternated (the median ratio counts)"
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    big, small = args.work / f"x{args.copies}.json", args.work / f"x{args.copies // 5}.json"
    for path, copies in ((big, args.copies), (small, args.copies // 5)):
        if not path.exists():
            events = enlarge(TRACE, path, copies)
            print(f"built {path} ({path.stat().st_size / 1e9:.2f} GB, {events:,} events)", flush=True)
    if args.gzip:
        zipped = big.with_name(big.name + ".gz")
        if not zipped.exists():
            compressed(big, zipped)
            print(f"built {zipped} ({zipped.stat().st_size / 1e9:.2f} GB)", flush=True)
        big = zipped
    plain_loads = "import json, sys; json.loads(open(sys.argv[1], 'rb').read())"
    loads = [sys.executable, "-c", plain_loads, str(small)]
    command = [
        sys.executable,
        "-m",
        "trainadvisor.cli",
        "analyze",
        str(big),
        "--out",
        str(args.work / "report"),
    ]
    busy = psutil.getloadavg()[0]
    if busy > 0.5:
        print(f"warning: load average {busy:.1f} before the runs: both sides share the cores with it")
    ratios, loads_runs, ours_runs, ours_peaks = [], [], [], []
    for _ in range(args.repeat):  # alternated, so a disturbance weighs on both sides alike
        loads_s, loads_mb = measured(loads)
        ours_s, ours_mb = measured(command)
        loads_runs.append(loads_s)
        ours_runs.append(ours_s)
        ours_peaks.append(ours_mb)
        ratios.append(ours_s / loads_s)
    _, largest_mb, tree_mb = measured_tree(command)
    print(
        f"json.loads of {small.name} ({small.stat().st_size / 1e9:.2f} GB): "
        + ", ".join(f"{t:.1f}" for t in loads_runs)
        + f" s, {loads_mb:.0f} MB"
    )
    print(
        f"trainadvisor analyze {big.name} ({big.stat().st_size / 1e9:.2f} GB): "
        + ", ".join(f"{t:.1f}" for t in ours_runs)
        + " s"
    )
    print(
        "time relative to json.loads of the file one fifth the size, each pair: "
        + ", ".join(f"{r:.2f}x" for r in ratios)
        + f"; median {statistics.median(ratios):.2f}x (target <= 1.3x)"
    )
    peak_mb = max(ours_peaks)
    print(f"peak RSS, largest process: {peak_mb:.0f} MB (sampled: {largest_mb:.0f} MB; target <= 600 MB)")
    print(f"peak RSS, the analysis and its reader processes together (sampled): {tree_mb:.0f} MB")


if __name__ == "__main__":
    main()
