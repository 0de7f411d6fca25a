"""What the user is told when trainadvisor's own bookkeeping fails."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from trainadvisor import _serial, fixes
from trainadvisor.measure.results import read_result
from trainadvisor.measure.runner import RunSpec
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
    raw = read_result(result_file, spec, 0, None)
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
