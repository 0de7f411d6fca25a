"""Timings of `profile` under torchrun (2 ranks of examples/ddp_train.py on this machine's CPUs),
kept out of the tests, which check structure only:

- the workers fix measured under torchrun: its speedup and the run's wall time;
- a hung rank: how long after `--timeout 10` the whole run has ended.

    .venv/bin/python benchmarks/distributed.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDP = ROOT / "examples" / "ddp_train.py"


def profile(out: Path, *args: str) -> tuple[float, int]:
    started = time.monotonic()
    command = [
        sys.executable, "-m", "trainadvisor", "profile", "--nproc-per-node", "2", "--warmup", "3",
        "--steps", "10", "--out", str(out), *args,
    ]  # fmt: skip
    code = subprocess.run(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=out.parent
    ).returncode
    return time.monotonic() - started, code


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        wall_s, code = profile(Path(work) / "fix", str(DDP), "--latency-ms", "0.5", "--batch-size", "32")
        report = json.loads((Path(work) / "fix" / "report.json").read_text())
        comparison = report.get("comparison") or {}
        print(
            f"workers fix under torchrun: exit {code}, speedup {report.get('speedup') or 0:.2f}x "
            f"(range {comparison.get('speedup_low') or 0:.2f}-{comparison.get('speedup_high') or 0:.2f}x), "
            f"wall {wall_s:.1f} s"
        )
        options = ["--no-fix", "--timeout", "10"]
        wall_s, code = profile(
            Path(work) / "hang", *options, str(DDP), "--hang-rank", "1", "--fail-step", "8"
        )
        print(f"hung rank with --timeout 10: exit {code} after {wall_s:.1f} s")


if __name__ == "__main__":
    main()
