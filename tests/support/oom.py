"""What e2e/test_oom.py and integration/test_oom.py share."""

from __future__ import annotations

import json
import pickle
from typing import Any

from conftest import gpu_run

from trainadvisor import rulebook

# torch.cuda.set_per_process_memory_fraction(0.04) on the H100: the allocator's limit
LIMIT_BYTES = int(0.04 * 85017493504)


LIVE_BYTES = 3290632704  # allocated_bytes.all.current at the error


LARGEST = [
    {"site": "residual_stack.py:16", "bytes": 2417491968, "blocks": 47, "holds": "",
     "stack": ["residual_stack.py:16", "residual_stack.py:27", "train_oom.py:20"]},
    {"site": "train_oom.py:18", "bytes": 805999104, "blocks": 146, "holds": "", "stack": ["train_oom.py:18"]},
    {"site": "train_oom.py:19", "bytes": 33587200, "blocks": 2, "holds": "", "stack": ["train_oom.py:19"]},
]  # fmt: skip


SITES_TEXT = (
    "residual_stack.py:16 (2.25 GiB in 47 blocks, from residual_stack.py:27 < train_oom.py:20); "
    "train_oom.py:18 (768.66 MiB in 146 blocks); train_oom.py:19 (32.03 MiB in 2 blocks)"
)


RULES = rulebook.rules_for([])


def _artifacts() -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The H100's error text (without its type), statistics and snapshot at the error."""
    folder = gpu_run("artifacts")
    message = (folder / "oom_message.txt").read_text().strip().removeprefix("torch.OutOfMemoryError: ")
    stats = json.loads((folder / "memory_stats_at_oom.json").read_text())
    snapshot = pickle.loads((folder / "memory_snapshot_oom.pickle").read_bytes())
    return message, stats, snapshot
