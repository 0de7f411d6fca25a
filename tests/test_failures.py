"""What the user is told when trainadvisor's own bookkeeping fails."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, load_report, processes_running

from trainadvisor import _serial, fixes
from trainadvisor.measure.runner import RunSpec, _result
from trainadvisor.training import hooks


def test_a_child_that_cannot_save_its_measurements_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "ended with exit code 0 before anything was recorded": the write's own error."""
    result_file = tmp_path / "baseline.result.json"
    recorder = hooks.Recorder(hooks.ChildConfig("baseline", str(result_file), None, 0, 1, 0, True, None))

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_serial, "save_json", full)
    recorder.write("window_complete", 0, None)  # never raises into training
    spec = RunSpec("baseline", tmp_path / "train.py", [], tmp_path, 1, 1)
    raw = _result(result_file, spec, 0, None)
    assert (raw.status, raw.error) == (
        "script_failed",
        "trainadvisor could not save the measurements in the script's process (OSError: [Errno 28] No "
        "space left on device); the script's own exit code was 0",
    )


def test_a_memory_fix_without_gain_is_explained_in_memory_terms() -> None:
    assert fixes.REGISTRY["grad-accumulation"].no_gain == (
        "no candidate lowered peak memory by 10% at 80% of the baseline's speed or better, nor fit the "
        "run into its memory budget"
    )
    assert fixes.REGISTRY["tf32"].no_gain == "no candidate was at least 5% faster than the baseline"
    assert fixes.REGISTRY["batch-size"].no_gain.startswith("no batch size gave at least 5% more samples")


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
