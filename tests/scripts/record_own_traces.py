"""Record the small current-format traces of this project's examples in tests/data/own/.

    .venv/bin/python tests/scripts/record_own_traces.py

Each is what `trainadvisor profile` traces (3 steps after 2 warmup and 3 timed), on whatever
machine runs this; SOURCE.md says which machine recorded the committed ones."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from trainadvisor.measure.runner import RunSpec, measure  # noqa: E402

RUNS = {
    "host_tensors": ["--epochs", "1", "--samples", "4096"],
    "small_batch": ["--epochs", "1", "--samples", "2048"],
}


def main() -> None:
    target = ROOT / "tests" / "data" / "own"
    target.mkdir(parents=True, exist_ok=True)
    for name, args in RUNS.items():
        with tempfile.TemporaryDirectory() as work:
            raw = measure(
                RunSpec(name, ROOT / "examples" / f"{name}.py", args, Path(work), 2, 3, show_output=False)
            )
            if raw.trace_file is None:
                raise SystemExit(f"{name}: no trace ({raw.status}: {raw.error})")
            device = "cuda" if raw.device and raw.device.cuda_used else "cpu"
            out = target / f"{name}_{device}.pt.trace.json.gz"
            shutil.copyfile(Path(work) / raw.trace_file, out)
            print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
