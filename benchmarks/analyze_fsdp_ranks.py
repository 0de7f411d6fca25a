"""Issue 39.6: `analyze` of many FSDP rank traces made from real ones, and the cross-rank part
(critical path included) at 1,024 ranks.

Records one real FSDP2 job first (`examples/fsdp_train.py` on 2 gloo ranks of this CPU, rank 1
slower in its data: `trainadvisor profile --nproc-per-node 2 --no-fix`), then writes --ranks
traces of one job from its two: every rank a copy of the fast rank's trace but one, the
straggler, a copy of the slow rank's (each renumbered in its distributedInfo). It then runs
`analyze` on them with the local engine and the cross-rank part alone at 1,024 ranks, in child
processes of `benchmarks/analyze_cluster.py` (the same measurements as there: time, the driver's
peak RSS, the straggler found), and prints what the report says of the job's communication and
its critical path.

    .venv/bin/python benchmarks/analyze_fsdp_ranks.py [--ranks 256] [--work /tmp/trainadvisor-fsdp]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "benchmarks" / "analyze_cluster.py"


def record(work: Path) -> list[Path]:
    """The two rank traces of a real FSDP2 job, recorded once into `work`."""
    out = work / "recorded"
    traces = [out / "traces" / "baseline" / f"trainadvisor.rank{r}.pt.trace.json.gz" for r in (0, 1)]
    if not all(p.is_file() for p in traces):
        command = [
            sys.executable, "-m", "trainadvisor", "profile", "--nproc-per-node", "2", "--no-fix", "--out",
            str(out), str(ROOT / "examples" / "fsdp_train.py"), "--slow-rank", "1", "--slow-ms", "10",
        ]  # fmt: skip
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return traces


def renumbered(trace: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    info = dict(trace.get("distributedInfo") or {})
    info.update(rank=rank, world_size=world)
    info["pg_config"] = [{**g, "pg_size": world} for g in info.get("pg_config") or []]
    return {**trace, "distributedInfo": info}


def write_ranks(sources: list[Path], folder: Path, ranks: int, straggler: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fast, slow = (json.loads(gzip.decompress(p.read_bytes())) for p in sources)
    for rank in range(ranks):
        path = folder / f"rank{rank}.pt.trace.json.gz"
        if not path.exists():
            trace = renumbered(slow if rank == straggler else fast, rank, ranks)
            path.write_bytes(gzip.compress(json.dumps(trace).encode(), compresslevel=1))


def child(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(CLUSTER), *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--work", type=Path, default=Path("/tmp/trainadvisor-fsdp"))
    args = parser.parse_args()
    sources = record(args.work)
    folder = args.work / f"ranks{args.ranks}" / "traces"
    straggler = args.ranks * 2 // 3
    write_ranks(sources, folder, args.ranks, straggler)
    run = child("--drive", "local", str(folder))
    print(
        f"analyze, local engine: {run['ranks']} FSDP2 rank traces ({run['events'] / run['ranks']:,.0f} "
        f"events each) in {run['analyze_s']:.1f} s; driver peak RSS {run['peak_rss_mb']:.0f} MB; "
        f"straggler found: rank {run['straggler']} (made: rank {straggler}); load {run['load']:.1f}"
    )
    report = json.loads((folder.parent / "report-local" / "report.json").read_text())
    critical = (report.get("ranks") or {}).get("critical") or {}
    said = f"{critical.get('cause')}, in its {critical.get('phase')}"
    print(f"critical path: rank {critical.get('gating_rank')} gates the steps ({said})")
    first = report["traces"][0]["communication"] or {}
    print(f"rank 0's collectives by phase: {first.get('by_phase')}")
    cross = child("--cross-rank", str(folder), str(max(1, 1024 // args.ranks)))
    print(
        f"cross-rank part at {cross['ranks']} ranks (rules, rank table, overview, critical path, report): "
        f"{cross['cross_rank_s']:.2f} s; driver peak RSS {cross['peak_rss_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
