"""The confirmation run started ahead (`profile.ahead`): started beside the baseline where a
DataLoader fix may be tried on a machine without a GPU, by a user who may raise a lowered
priority back; kept after the diagnosis only where every applicable fix it plans is a DataLoader
setting and no CUDA was used, else cancelled. `Prestarted` is a stand-in that records its spec,
its waits for the imports and its cancelling."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainadvisor.measure import priority
from trainadvisor.measure.spec import RunSpec
from trainadvisor.profile import ahead
from trainadvisor.profile.ahead import PRESTART_IMPORTS_S, _gpu_here, kept_ahead, start_ahead
from trainadvisor.profile.runs import ProfileOptions
from trainadvisor.records import PlannedFix

OPTIONS = ProfileOptions(Path("train.py"), [], Path("out"), stage_dir=Path("stage"))


class Started:
    """Prestarted's stand-in: the spec it would have launched, its waits, whether it was cancelled."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.waited_s: list[float] = []  # how long the trials would wait for its imports, at most
        self.cancelled = False

    def imported(self, most_s: float) -> None:
        self.waited_s.append(most_s)

    def cancel(self) -> None:
        self.cancelled = True


def _start(
    monkeypatch: pytest.MonkeyPatch,
    fixes: list[str] | None = None,
    gpu: bool = False,
    restorable: bool = True,
) -> Any:
    monkeypatch.setattr(ahead, "Prestarted", Started)
    monkeypatch.setattr(ahead, "_gpu_here", lambda: gpu)
    monkeypatch.setattr(priority, "restorable", lambda: restorable)
    return start_ahead(replace(OPTIONS, only_fixes=fixes or []))


def _planned(fix: str, applicable: bool = True) -> PlannedFix:
    return PlannedFix(fix, "data-stall", applicable, "" if applicable else "not here")


@pytest.mark.parametrize(
    "fixes",
    [None, ["dataloader-workers"], ["compile", "pin-memory"], ["no-such-fix", "pin-memory"]],
)
def test_the_confirmation_run_starts_beside_the_baseline_where_a_loader_fix_may_be_tried(
    monkeypatch: pytest.MonkeyPatch, fixes: list[str] | None
) -> None:
    started = _start(monkeypatch, fixes)
    assert isinstance(started, Started)
    spec = started.spec
    assert (spec.label, spec.show_output, spec.out_dir) == ("after", False, Path("stage"))
    assert spec.gate_file == Path("stage/.work/after.gate.json")
    assert started.waited_s == []  # the baseline goes on beside its imports: they are not waited for


@pytest.mark.parametrize(
    ("fixes", "gpu", "restorable"),
    [
        (["compile", "amp"], False, True),  # --fix names no DataLoader fix
        (None, True, True),  # a GPU driver on this machine: GPU memory beside the baseline
        (None, False, False),  # a priority lowered could not be raised back: it would measure starved
    ],
)
def test_no_confirmation_run_starts_ahead_where_it_could_not_confirm_or_would_hold_the_gpu(
    monkeypatch: pytest.MonkeyPatch, fixes: list[str] | None, gpu: bool, restorable: bool
) -> None:
    assert _start(monkeypatch, fixes, gpu, restorable) is None


def test_a_plan_of_dataloader_settings_only_keeps_the_run_started_ahead_once_it_has_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = _start(monkeypatch)
    plan = [_planned("dataloader-workers"), _planned("pin-memory"), _planned("tf32", False)]
    assert kept_ahead(started, plan, {}) is started
    assert started.waited_s == [PRESTART_IMPORTS_S] and not started.cancelled


@pytest.mark.parametrize(
    ("plan", "values"),
    [
        ([], {}),  # nothing to confirm
        ([("tf32", False)], {}),  # nothing applicable
        ([("dataloader-workers", True), ("tf32", True)], {}),  # a fix that needs a restart's set-up
        ([("dataloader-workers", True)], {"cuda_used": True}),  # GPU memory beside the trials
    ],
)
def test_a_run_started_ahead_is_cancelled_where_the_diagnosis_plans_what_it_cannot_confirm(
    monkeypatch: pytest.MonkeyPatch, plan: list[tuple[str, bool]], values: dict[str, Any]
) -> None:
    started = _start(monkeypatch)
    assert kept_ahead(started, [_planned(fix, ok) for fix, ok in plan], values) is None
    assert started.cancelled and started.waited_s == []


def test_no_run_started_ahead_keeps_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kept_ahead(None, [_planned("dataloader-workers")], {}) is None


@pytest.mark.parametrize(
    ("files", "found"),
    [
        ([], False),
        (["nvidiactl", "nvidia-uvm"], False),  # the driver's control files alone: no device
        (["nvidiactl", "nvidia0"], True),
        (["nvidia12"], True),
        (["kfd"], True),  # AMD
        (["dxg"], True),  # WSL
    ],
)
def test_a_gpu_is_here_where_its_device_files_are(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: list[str], found: bool
) -> None:
    for name in files:
        (tmp_path / name).touch()
    monkeypatch.setattr(ahead, "Path", lambda path: tmp_path if path == "/dev" else Path(path))
    assert _gpu_here() is found
