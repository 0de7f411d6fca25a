"""What the user is told when trainadvisor's own bookkeeping fails."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLES, load_report, processes_running


def test_sigterm_while_fixes_are_measured_keeps_the_baseline_report(tmp_path: Path) -> None:
    """What Slurm and Kubernetes send: the run stops at once, every process of it goes, and the
    report saved after the baseline's diagnosis stays, saying what was not measured."""
    out = tmp_path / "r"
    command = [
        sys.executable, "-m", "trainadvisor", "profile", "--warmup", "3", "--steps", "10", "--out", str(out),
        str(EXAMPLES / "slow_input_mnist.py"), "--samples", "20000",
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "measuring fix dataloader-workers" in line:
                break
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    finally:  # whatever happened above, nothing this test started outlives it: trainadvisor
        if proc.poll() is None:  # killed, its guard process ends every process of the run
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 143
    assert "trainadvisor: interrupted; the script and its workers were stopped" in rest
    report = load_report(out)
    assert [f["rule"] for f in report["findings"]] == ["data-stall"]
    [outcome] = report["fix_outcomes"]
    assert outcome["status"] == "not_run" and report["after"] is None
    assert report["notes"][-1].startswith("The run was interrupted")
    assert processes_running("slow_input_mnist.py", out) == []
