"""The report `@advise` writes from its window (`advising.report`): `advise_report` over a run
record of the kind an Advisor's window saves (tests/support/runs.py: timed steps of 10 ms with a
DataLoader, or without one), the script this process runs (`main_script`, read off `__main__`), the
`trainadvisor profile` command that measures the fixes (`profile_command`: beside the report, the
script's credentials masked), and the data-parallel modules alive now (`data_parallel_modules`).
The report's clock is a fake: its elapsed time is exact."""

from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.runs import raw
from torch import nn

from trainadvisor.advising import report
from trainadvisor.advising.report import advise_report, data_parallel_modules, main_script, profile_command
from trainadvisor.records import SCHEMA_VERSION, FixOutcome, FrameworkCall, Overrides
from trainadvisor.records.identity import run_id

MEASURED = (
    "Measured in-process by {called}: fixes are not applied here. `trainadvisor profile` reruns the "
    "script with each fix and measures it before and after."
)
SCRIPT = "for step in range(10):\n    pass\n"
# A rule of the user's own (advise(rules=[...])) that names a fix trainadvisor does not know.
RULE = """
id = "slow-steps"
title = "Steps are slow"
threshold_source = "the test's own"
message = "{steps_per_s:.0f} steps/s"
fixes = ["rebuild-kernels"]
[[when]]
severity = "low"
condition = "steps_per_s < 150"
[recommendation]
text = "r"
anti_pattern = "bad()"
best_practice = "good()"
"""


def _main(monkeypatch: pytest.MonkeyPatch, **attributes: str) -> None:
    """This process's `__main__`, with these attributes (a script's `__file__`, or none)."""
    module = types.ModuleType("__main__")
    for name, value in attributes.items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, "__main__", module)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's `time.monotonic` reads 130 s: a report started at 100 s took 30 s."""
    monkeypatch.setattr(report, "time", SimpleNamespace(monotonic=lambda: 130.0))


def test_a_data_stalled_window_reports_each_fix_with_the_command_that_measures_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: None
) -> None:
    """Steps of 10 ms, 8 of them waiting on a DataLoader without workers, in a transformers
    Trainer's loop: the worker fix needs a restart, given as the masked profile command, and is
    set in TrainingArguments; the user's rule's unknown fix is not applicable."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "slow-steps.toml").write_text(RULE)
    _main(monkeypatch, __file__=str(script))
    monkeypatch.setattr(sys, "argv", [str(script), "--hf-token", "hf_abc", "--lr", "0.1"])
    run = raw([10.0] * 6, [8.0] * 6, workers=0)
    run.frameworks = [FrameworkCall("transformers", "TrainingArguments", "train.py:3")]
    asked: list[Path | None] = []
    command = ["trainadvisor", "profile", str(script), "--hf-token", "***", "--lr", "0.1"]

    def command_for(found: Path | None) -> list[str]:
        asked.append(found)
        return command

    made, values = advise_report(run, tmp_path, [tmp_path / "rules"], 100.0, command_for)
    assert asked == [script]
    assert [(f.rule, f.severity) for f in made.findings] == [("data-stall", "high"), ("slow-steps", "low")]
    assert made.findings[1].message == "100 steps/s"
    restart = f"measure it with: trainadvisor profile {script} --hf-token '***' --lr 0.1"
    assert made.fix_outcomes == [
        FixOutcome(
            "dataloader-workers", "data-stall", "needs_restart", restart, Overrides(), [],
            setting_change=(
                "`dataloader_num_workers` and `dataloader_persistent_workers=True` in TrainingArguments"
            ),
        ),
        FixOutcome(
            "rebuild-kernels", "slow-steps", "not_applicable", "no fix of this id is known to trainadvisor",
            Overrides(), [],
        ),
    ]  # fmt: skip
    assert made.notes == [
        MEASURED.format(called="@advise"),
        "The values of --hf-token look like credentials and are shown as *** in this report; fill them in "
        "to run the command again.",
    ]
    digest = hashlib.sha256(SCRIPT.encode()).hexdigest()
    assert (made.content_digest, made.command, made.script) == (digest, command, str(script))
    assert made.run_id == run_id(digest, ["--hf-token", "hf_abc", "--lr", "0.1"], run.device, 1)
    assert (made.schema_version, made.environment, made.elapsed_s) == (SCHEMA_VERSION, run.device, 30.0)
    baseline = made.baseline
    assert (baseline.steps, baseline.steps_per_s, baseline.samples_per_s) == (6, 100.0, 3200.0)
    assert baseline.breakdown_pct == {"data_wait": 80.0, "h2d_copy": 0.0, "compute": 20.0}
    assert baseline.trace == {}  # the window traced nothing
    assert (values["data_wait_pct"], values["num_workers"], values["framework"]) == (80.0, 0, "transformers")


def test_a_notebooks_window_without_a_dataloader_says_where_its_input_went_and_has_no_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: None
) -> None:
    """No script (a notebook), a decorated step whose loop spends 6 ms of 10 outside it: no
    finding, no command (the credential on the kernel's command line is not named either)."""
    _main(monkeypatch)  # a notebook's __main__ has no __file__
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py", "--token=abc"])
    run = raw([10.0] * 4)
    run.loaders = []
    run.step_source = "@advise"
    for step in run.steps:
        step.outside_call_ms = 6.0
    asked: list[Path | None] = []

    def command_for(found: Path | None) -> None:
        asked.append(found)

    made, values = advise_report(run, tmp_path, [], 100.0, command_for, called="advise()")
    assert asked == [None] and made.findings == [] and made.fix_outcomes == []
    assert made.notes == [
        MEASURED.format(called="advise()"),
        "No DataLoader was seen: input time is part of the step (data wait is timed inside DataLoader "
        "`__next__`); 60% of the step was spent outside the decorated function (the loop's input and "
        "whatever else it runs between calls).",
    ]
    digest = hashlib.sha256(b"advise()").hexdigest()
    assert (made.content_digest, made.command, made.script) == (digest, ["advise()"], "<in-process>")
    assert made.run_id == run_id(digest, ["--token=abc"], run.device, 1)
    assert made.baseline.breakdown_pct == {"h2d_copy": 0.0, "outside_call": 60.0, "compute": 40.0}
    assert (values["data_wait_pct"], values["dataloaders"]) == (0.0, 0)


def test_the_profile_command_writes_beside_the_report_and_masks_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    rules = [tmp_path / "rules-a", tmp_path / "rules-b"]
    monkeypatch.setattr(sys, "argv", [str(script), "--api-key=abc", "--epochs", "2"])
    assert profile_command(script, tmp_path / "report", 4, 12, rules) == [
        "trainadvisor", "profile", "--warmup", "4", "--steps", "12",
        "--out", str(tmp_path / "report-profile"), "--seed", "0",
        "--rules", str(rules[0]), "--rules", str(rules[1]),
        str(script), "--api-key=***", "--epochs", "2",
    ]  # fmt: skip


def test_no_profile_command_without_a_script_file(tmp_path: Path) -> None:
    assert profile_command(None, tmp_path / "report", 4, 12, []) is None  # a notebook
    assert profile_command(tmp_path / "gone.py", tmp_path / "report", 4, 12, []) is None
    assert profile_command(tmp_path, tmp_path / "report", 4, 12, []) is None  # a folder


@pytest.mark.parametrize(
    ("main_file", "expected"),
    [("/work/train.py", Path("/work/train.py")), ("/work/run.ipynb", None), (None, None)],
    ids=["script", "not-python", "no-file"],
)
def test_the_main_script_is_the_python_file_main_runs(
    monkeypatch: pytest.MonkeyPatch, main_file: str | None, expected: Path | None
) -> None:
    monkeypatch.setattr(sys, "argv", ["/elsewhere/launcher.py"])  # not what is read
    if main_file is None:
        _main(monkeypatch)
    else:
        _main(monkeypatch, __file__=main_file)
    assert main_script() == expected


def test_no_main_module_is_no_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "__main__")
    assert main_script() is None


class _Replicated(nn.DataParallel):  # type: ignore[type-arg]
    pass


class _Disguised:
    """An object that says it is a DataParallel (`__class__`), and is not."""

    device_ids = [0, 1]

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return nn.DataParallel


def _over(module: nn.DataParallel, device_ids: list[int]) -> nn.DataParallel:  # type: ignore[type-arg]
    """A DataParallel as over these GPUs (on a CPU, torch gives it none)."""
    module.device_ids = device_ids
    return module


def test_data_parallel_modules_over_two_or_more_gpus_are_counted() -> None:
    before = data_parallel_modules()
    kept = [
        _over(nn.DataParallel(nn.Linear(2, 2)), [0, 1]),
        _over(_Replicated(nn.Linear(2, 2)), [0, 1, 2, 3]),  # a subclass counts
        _over(nn.DataParallel(nn.Linear(2, 2)), [0]),  # one GPU: nothing replicated
        nn.DataParallel(nn.Linear(2, 2)),  # as torch builds it without a GPU: no device ids
        _Disguised(),
    ]
    assert isinstance(kept[4], nn.DataParallel)  # isinstance would take it for one
    assert data_parallel_modules() - before == 2
    del kept
