"""Timings of `profile` under torchrun (2 ranks of examples/ddp_train.py on this machine's CPUs),
kept out of the tests, which check structure only:

- the workers fix measured under torchrun: its speedup and the run's wall time;
- a hung rank: how long after `--timeout 10` the whole run has ended;
- the DDP and FSDP settings fixes (39.4), each on the example that needs it: the fix's outcome,
  its gain, its trials, and the verdict's wall time against a diagnosis-only run's (`--no-fix`)
  of the same command.

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


FSDP = ROOT / "examples" / "fsdp_train.py"
SETTINGS = {  # the fix, its script and arguments
    "ddp-settings, a needless search and tiny buckets": (
        "ddp-settings", DDP, ("--find-unused", "--bucket-cap-mb", "0.01", "--depth", "6"),
    ),
    "ddp-settings, gradient accumulation without no_sync": (
        "ddp-settings", DDP, ("--accumulate", "4", "--depth", "4"),
    ),
    "fsdp-settings, 6 blocks resharding after forward": ("fsdp-settings", FSDP, ("--blocks", "6")),
}  # fmt: skip


def profile(out: Path, *args: str, steps: int = 10) -> tuple[float, int]:
    started = time.monotonic()
    command = [
        sys.executable, "-m", "trainadvisor", "profile", "--nproc-per-node", "2", "--warmup", "3",
        "--steps", str(steps), "--out", str(out), *args,
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
        for name, (fix, script, args) in SETTINGS.items():
            settings(Path(work), name, fix, script, args)


def settings(work: Path, name: str, fix: str, script: Path, args: tuple[str, ...]) -> None:
    """One settings fix measured: its outcome, trials and the verdict's cost."""
    out = work / fix
    wall_s, code = profile(out, "--fix", fix, str(script), *args, steps=20)
    diagnosis_s, _ = profile(work / f"{fix}-no-fix", "--no-fix", str(script), *args, steps=20)
    report = json.loads((out / "report.json").read_text())
    [outcome] = [o for o in report["fix_outcomes"] if o["fix"] == fix]
    trials = "; ".join(f"{t['label']}: {t['steps_per_s'] or 0:.1f} steps/s" for t in outcome["trials"])
    baseline = report["baseline"]["steps_per_s"] or 0.0
    print(
        f"{name}: exit {code}, {outcome['status']} ({outcome.get('reason') or ''}); baseline "
        f"{baseline:.1f} steps/s; trials: {trials}; wall {wall_s:.1f} s against {diagnosis_s:.1f} s "
        f"diagnosis only ({wall_s / diagnosis_s:.1f}x)"
    )


if __name__ == "__main__":
    main()
