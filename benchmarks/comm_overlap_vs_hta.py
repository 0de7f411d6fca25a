"""Issue 39.2: communication/computation overlap from `trainadvisor analyze` beside Holistic Trace
Analysis' `get_comm_comp_overlap`, on HTA's own multi-rank and NCCL test traces in
../shared/traces/hta, and each trace's time per collective (all_reduce, send_recv, ...) with its
exposed part.

HTA is not a dependency of trainadvisor: install it into a separate virtual environment and
name its Python, e.g.

    python3 -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install holistictraceanalysis==0.5.0
    .venv/bin/python benchmarks/comm_overlap_vs_hta.py --hta-python /tmp/htavenv/bin/python
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from trainadvisor.analyze.trace.analysis import analyze_trace

ROOT = Path(__file__).resolve().parent.parent
HTA = ROOT.parent / "shared" / "traces" / "hta"
SETS = {  # each a folder of one job's rank traces, as HTA reads them
    "trace_filter (2 ranks)": ["trace_filter/sampled_rank-0.json.gz", "trace_filter/sampled_rank-1.json.gz"],
    "nccl_parser_config": ["nccl_parser_config/nccl_data.json.gz"],
}
# HTA drops the kernels of a trace's last ProfilerStep by default (include_last_profiler_step=
# False: it may be incomplete); trainadvisor keeps a last step whose device work the trace holds.
# Side by side on the same steps means HTA with the last step included; its default is printed too.
HTA_OVERLAP = (
    "import sys; from hta.trace_analysis import TraceAnalysis; "
    "df = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=sys.argv[2] == 'last')"
    ".get_comm_comp_overlap(visualize=False); "
    "print(' '.join(f'{r}:{p}' for r, p in zip(df['rank'], df['comp_comm_overlap_pctg'])))"
)


def hta_overlap(python: str, files: list[Path], last: bool) -> dict[int, float]:
    with tempfile.TemporaryDirectory() as folder:
        for path in files:
            shutil.copy(path, folder)
        command = [python, "-c", HTA_OVERLAP, folder, "last" if last else "default"]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
    pairs = (item.split(":") for item in out.stdout.split()[-len(files) :])
    return {int(rank): float(pct) for rank, pct in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hta-python", help="a Python with holistictraceanalysis installed")
    args = parser.parse_args()
    for name, relative in SETS.items():
        files = [HTA / r for r in relative]
        same = hta_overlap(args.hta_python, files, last=True) if args.hta_python else {}
        default = hta_overlap(args.hta_python, files, last=False) if args.hta_python else {}
        for path in files:
            a = analyze_trace(path)
            ours = a.communication.overlap_efficiency_pct if a.communication else None
            rank = a.rank if a.rank is not None else 0
            hta, hta_default = same.get(rank), default.get(rank)
            beside = (
                f", HTA {hta:.2f}% on the same steps ({(ours or 0) - hta:+.2f} pp); HTA's default "
                f"(its last step dropped) {hta_default:.2f}%"
                if hta is not None and hta_default is not None
                else ""
            )
            print(f"{name}: {path.name} rank {a.rank}: overlap efficiency {ours:.2f}%{beside}")
            for kind, (ms, exposed) in sorted(a.collectives.items()):
                print(f"    {kind}: {ms:.3f} ms per step, {exposed:.3f} ms exposed")


if __name__ == "__main__":
    main()
