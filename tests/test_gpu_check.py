"""scripts/gpu_check.py: what it checks in each report, and its refusal where there is no GPU."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from conftest import DATA, ROOT, load_report

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402

SLOW = next(c for c in gpu_check.CHECKS if c.name == "slow-input")


def test_a_report_with_the_finding_an_honest_fix_and_the_same_training_passes() -> None:
    report = load_report(DATA / "report")
    assert gpu_check.judge(SLOW, 0, report) == (True, [])
    row = gpu_check.row(SLOW, report, [])
    assert row == ["slow-input", "data-stall", "dataloader-workers: kept", "8.16x", "PASS"]


def test_a_missing_finding_a_crashed_trial_or_changed_training_fails() -> None:
    report: dict[str, Any] = load_report(DATA / "report")
    report["findings"] = []
    report["fix_outcomes"][0].update(status="failed", reason="trial 1: killed by signal SIGSEGV")
    report["comparison"]["loss_check"]["equivalent"] = False
    passed, problems = gpu_check.judge(SLOW, 3, report)
    assert not passed and problems == [
        "profile exited 3",
        "data-stall did not fire",
        "fix dataloader-workers: failed (trial 1: killed by signal SIGSEGV)",
        "the kept fixes changed training",
    ]
    assert gpu_check.judge(SLOW, 1, None) == (False, ["no report (profile exited 1)"])


def test_every_check_names_an_example_and_rules_that_exist() -> None:
    rules = {p.stem for p in (ROOT / "rules").glob("*.toml")}
    for check in gpu_check.CHECKS:
        assert (gpu_check.EXAMPLES / check.script).is_file()
        assert set(check.findings) <= rules, check.name


def test_without_a_gpu_it_says_so_and_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "gpu_check: no CUDA GPU is visible to this Python" in result.stderr
