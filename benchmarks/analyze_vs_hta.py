"""Issue 3 target: `trainadvisor analyze` end to end (read, measure, rules, report) against
Holistic Trace Analysis' trace load, side by side, on the HTA df_index_resolver trace (54 MB of
JSON, 216k events) and on an 8x enlarged copy (the benchmark builds it: the events repeated with
shifted timestamps). Each tool runs in a child process of its own; wall time and peak RSS are
read from that child alone.

HTA is not a dependency of trainadvisor: install it into a separate virtual environment and
name its Python, e.g.

    python3 -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install holistictraceanalysis==0.5.0
    .venv/bin/python benchmarks/analyze_vs_hta.py --hta-python /tmp/htavenv/bin/python
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
HTA_LOAD = "import sys; from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1])"


def measured(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one child process."""
    runner = (
        "import resource, subprocess, sys, time; t = time.perf_counter();"
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL);"
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)"
    )
    out = subprocess.run([sys.executable, "-c", runner, *command], check=True, capture_output=True, text=True)
    wall, rss = out.stdout.split()
    return float(wall), float(rss)


def enlarge(source: Path, target: Path, times: int) -> int:
    document = json.loads(gzip.decompress(source.read_bytes()))
    events = document["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    enlarged = []
    for copy in range(times):
        for event in events:
            event = dict(event)
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] += copy * span
            if event.get("ph") in ("s", "f") and "id" in event:
                event["id"] = f"{event['id']}-{copy}"
            enlarged.append(event)
    document["traceEvents"] = enlarged
    target.write_text(json.dumps(document))
    return len(enlarged)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hta-python", required=True, help="a Python with holistictraceanalysis installed")
    parser.add_argument("--times", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        small, large = tmp / "small", tmp / "large"
        small.mkdir()
        large.mkdir()
        shutil.copy(TRACE, small / "rank-1.json.gz")
        started = time.perf_counter()
        events = enlarge(TRACE, large / "rank-1.json", args.times)
        size_mb = (large / "rank-1.json").stat().st_size / 1e6
        print(
            f"built the {args.times}x trace: {events} events, {size_mb:.0f} MB of JSON "
            f"({time.perf_counter() - started:.0f} s)"
        )
        rows = []
        for label, folder in (("df_index_resolver (54 MB)", small), (f"{args.times}x enlarged", large)):
            trace = next(folder.iterdir())
            ours = measured(
                [
                    sys.executable,
                    "-m",
                    "trainadvisor",
                    "analyze",
                    "--json",
                    "--out",
                    str(tmp / f"report-{folder.name}"),
                    str(trace),
                ]
            )
            hta = measured([args.hta_python, "-c", HTA_LOAD, str(folder)])
            rows.append((label, ours, hta))
            print(
                f"{label}: trainadvisor analyze {ours[0]:.2f} s / {ours[1]:.0f} MB peak RSS; "
                f"HTA load {hta[0]:.2f} s / {hta[1]:.0f} MB; "
                f"{hta[0] / ours[0]:.1f}x faster, {ours[1] / hta[1]:.2f} of HTA's RSS"
            )
    (_, (t1, _), _), (_, (t8, _), _) = rows
    print(
        f"time growth for {args.times}x the events: {t8 / t1:.1f}x (linear would be {args.times}x; "
        "both include ~0.5 s of interpreter start-up)"
    )


if __name__ == "__main__":
    main()
