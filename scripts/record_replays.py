"""Record the real `profile` runs that tests/integration/test_replays.py replays through the pure
stages (measurements -> findings -> plan -> each fix's trial decision -> the confirmation's loss
check and verdict), in milliseconds and without running a script.

Each run is a command below (most are an e2e test's: its script, arguments and options; the
others profile a bundled example), on this machine; its report.json, written by trainadvisor's
own serialiser, is kept gzipped in tests/data/replays/<name>.json.gz, and tests/data/replays/
SOURCE.md lists the commands and what each run decided.

    .venv/bin/python scripts/record_replays.py [NAME ...]

Re-running overwrites the files: timings differ from run to run, the decisions the replays
check are whatever each recording's own measurements decide.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "replays"
EXAMPLES = ROOT / "examples"
SCRIPTS = ROOT / "tests" / "scripts"
# the window options of the e2e tests' shared profile runs (tests/conftest.py: _shared_profile)
WINDOWS = ("--warmup", "3", "--steps", "10", "--min-time", "0.5s", "--max-workers", "8")

RUNS: dict[str, tuple[str, ...]] = {
    # a storage-latency loader: the workers fix chosen in windows, paired, confirmed, kept
    "slow-input": (*WINDOWS, str(EXAMPLES / "slow_input_mnist.py"), "--samples", "400000"),
    # a loader built anew every epoch: the workers' trials restart the script
    "loader-variants": (
        *WINDOWS,
        "--max-warmup",
        "1s",
        "--max-workers",
        "4",
        str(SCRIPTS / "loader_variants.py"),
    ),  # fmt: skip
    # an IterableDataset whose workers repeat each other's samples: the workers fix refused
    "iterable-unsharded": (*WINDOWS, str(SCRIPTS / "iterable_unsharded.py")),
    # an example that makes its tensors on the host every step (a data-stall on this CPU)
    "host-tensors": (*WINDOWS, str(EXAMPLES / "host_tensors.py")),
    # many small steps: compute-bound on this CPU, compile tried and no faster
    "small-batch": (*WINDOWS, str(EXAMPLES / "small_batch.py")),
    # fp32 matmuls: compute-bound on this CPU, compile tried and no faster
    "fp32-matmul": (*WINDOWS, str(EXAMPLES / "fp32_matmul.py")),
    # diagnosis only
    "no-fix": (*WINDOWS, "--no-fix", str(EXAMPLES / "slow_input_mnist.py"), "--samples", "400000"),
    # torch.compile measured with its compile time and break-even; without the e2e test's
    # --steps 200000 the run's length is unknown: faster, but recommended, not kept blind
    "compile": (*WINDOWS, "--fix", "compile", str(SCRIPTS / "elementwise_mlp.py"), "--blocks", "2"),
    # workers that draw their own random augmentation: the mean loss compared, not each step's
    "random-augment": (
        "--warmup",
        "2",
        *WINDOWS[2:],
        "--max-warmup",
        "3s",
        str(SCRIPTS / "random_augment.py"),
    ),
    # each candidate in a fresh run, judged against a baseline measured next to it
    "restart-trials": (
        *WINDOWS,
        "--trials",
        "restart",
        "--max-warmup",
        "1s",
        "--max-workers",
        "2",
        str(EXAMPLES / "slow_input_mnist.py"),
        "--samples",
        "20000",
    ),  # fmt: skip
    # a memory budget below the step's peak: the memory fixes measured, the fastest that fits named
    "memory-budget": (
        "--fix",
        "activation-checkpointing",
        "--fix",
        "grad-accumulation",
        "--min-time",
        "0.3s",
        "--max-warmup",
        "5s",
        "--memory-budget",
        "5MB",
        str(EXAMPLES / "deep_blocks.py"),
        "--epochs",
        "3",
        "--samples",
        "4096",
        "--batch-size",
        "256",
        "--width",
        "64",
        "--depth",
        "6",
    ),  # fmt: skip
}


def record(name: str, args: tuple[str, ...]) -> str:
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "report"
        command = [sys.executable, "-m", "trainadvisor", "profile", "--out", str(out), *args]
        started = time.monotonic()
        result = subprocess.run(command, cwd=work, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{name}: profile exited {result.returncode}\n{result.stderr[-2000:]}")
        data = (out / "report.json").read_bytes()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json.gz").write_bytes(gzip.compress(data, mtime=0))
    shown = " ".join(a.replace(str(ROOT) + "/", "") for a in args)
    return f"{name}: {time.monotonic() - started:.0f} s: trainadvisor profile {shown}"


def main() -> None:
    names = sys.argv[1:] or list(RUNS)
    for name in names:
        print(record(name, RUNS[name]), flush=True)


if __name__ == "__main__":
    main()
