"""scripts/gpu_check.py, the acceptance run for a GPU owner: what it checks in each report and
trace, read on the first H100 runs (../shared/gpu-runs/h100-2026-11-24), and its refusal where
there is no GPU."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))


import gpu_check  # noqa: E402


def test_without_a_gpu_it_says_so_and_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "gpu_check: no CUDA GPU is visible to this Python" in result.stderr


def test_the_checks_run_a_group_at_a_time_each_within_one_device_command() -> None:
    """Each group is one device command: its checks' minutes add up to at most 8 (a command
    may run 10, the machine's start aside); `--list` names them."""
    groups: dict[str, float] = {}
    for check in gpu_check.CHECKS:
        groups[check.group] = groups.get(check.group, 0.0) + check.minutes
    assert set(groups) == {"input", "precision", "batch", "compile", "memory", "multi"}
    assert max(groups.values()) <= 8.0
    listed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--list"], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0
    assert [line.split()[:2] for line in listed.stdout.splitlines()] == [
        [c.group, c.name] for c in gpu_check.CHECKS
    ]
