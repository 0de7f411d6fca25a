"""The `profile` command's decisions that need no run (`profile.command`): why trials restart the
script, why no fix is tried, each planned fix before its trials, the note on how the trials ran,
what is refused before anything runs (the script, the fixes named, the rule folders), the
diagnosis of a saved baseline with its notes and the plan `--fix` narrows, the memory the fixes'
search may count on, and the report saved again when a run is interrupted. No script is run: the
stage that runs it is replaced where the command is driven whole."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import DATA
from support.race import _windows_at

from trainadvisor import rulebook
from trainadvisor.errors import UsageError
from trainadvisor.profile import command
from trainadvisor.profile.command import (
    INTERRUPTED,
    _diagnose_baseline,
    _Diagnosed,
    _modes_note,
    _not_tried,
    _prepare,
    _tuning,
    _why_no_fixes,
    _why_restart,
    profile,
)
from trainadvisor.profile.runs import ProfileOptions, size_for, window_words
from trainadvisor.records import FixOutcome, Overrides, PlannedFix, ProfileReport, Run, RunLength
from trainadvisor.report.render import load_report

OPTIONS = ProfileOptions(Path("train.py"), [], Path("out"))
TWO_RANKS = ["--nproc-per-node", "2", "--standalone"]
TWO_NODES = ["--nproc-per-node", "2", "--nnodes", "2", "--rdzv-endpoint", "host:29400"]
RULE = """id = "{id}"
title = "{title}"
threshold_source = "s"
message = "m"
[[when]]
severity = "medium"
condition = "steps > 1"
[recommendation]
text = "r"
anti_pattern = "bad()"
best_practice = "good()"
"""


def _saved() -> ProfileReport:
    report = load_report(DATA / "report")  # a data-stall found; dataloader-workers kept
    assert isinstance(report, ProfileReport)
    return report


def _saved_baseline() -> Run:
    baseline = _saved().baseline
    assert baseline is not None
    return baseline


def _failed(oom: bool) -> Run:
    baseline = _windows_at(10.0)
    baseline.raw.status = "script_failed"
    baseline.raw.runtime = {"oom": {"kind": "cuda", "request_bytes": 2**27}} if oom else {}
    return baseline


def test_trials_restart_the_script_for_the_first_reason_that_applies() -> None:
    assert _why_restart(OPTIONS) is None  # windows of the baseline's own process
    assert _why_restart(replace(OPTIONS, apply_fixes=False, trials="restart")) == "diagnosis only"
    assert _why_restart(replace(OPTIONS, trials="restart", run_to_end=True)) == "--trials restart was given"
    assert _why_restart(replace(OPTIONS, torchrun=TWO_RANKS, run_to_end=True)) == (
        "under torchrun every rank would have to switch its setting at the same step"
    )
    assert _why_restart(replace(OPTIONS, run_to_end=True)) == "--run-to-end lets the baseline run finish"


def test_no_fix_is_tried_after_a_failure_other_than_out_of_memory_or_on_several_nodes() -> None:
    assert _why_no_fixes(OPTIONS, _windows_at(10.0)) is None
    assert _why_no_fixes(OPTIONS, _failed(oom=False)) == "The script failed, so no fix was tried."
    assert _why_no_fixes(OPTIONS, _failed(oom=True)) is None  # its memory fixes are tried
    several = (
        "Fixes are not measured on several nodes: each node would choose its trials from its own ranks and "
        "start different runs against one rendezvous. Measure them on one node (--nproc-per-node) or apply "
        "them by hand."
    )
    assert _why_no_fixes(replace(OPTIONS, torchrun=TWO_NODES), _windows_at(10.0)) == several
    assert _why_no_fixes(replace(OPTIONS, torchrun=["--node-rank", "1"]), _windows_at(10.0)) == several
    assert _why_no_fixes(replace(OPTIONS, torchrun=TWO_RANKS), _windows_at(10.0)) is None  # one node
    assert _why_no_fixes(replace(OPTIONS, torchrun=TWO_NODES, apply_fixes=False), _windows_at(10.0)) is None
    # a failure is said first, on one node or several
    assert _why_no_fixes(replace(OPTIONS, torchrun=TWO_NODES), _failed(oom=False)) == (
        "The script failed, so no fix was tried."
    )


def test_each_planned_fix_starts_not_run_or_not_applicable_with_why() -> None:
    plan = [
        PlannedFix("dataloader-workers", "data-stall", True, ""),
        PlannedFix("amp", "no-mixed-precision", False, "no CUDA device was used"),
    ]
    assert _not_tried(plan) == [
        FixOutcome(
            "dataloader-workers", "data-stall", "not_run",
            "not measured: the run ended before this fix's trials", Overrides(), [],
        ),
        FixOutcome("amp", "no-mixed-precision", "not_applicable", "no CUDA device was used", Overrides(), []),
    ]  # fmt: skip
    assert _not_tried([]) == []


def _mode(fix: str, mode: str, why: str = "") -> FixOutcome:
    return FixOutcome(fix, "rule", "no_gain", "r", Overrides(), [], mode=mode, mode_reason=why)


def test_the_modes_note_names_the_fixes_of_each_way_of_running_trials_where_any_restarted() -> None:
    windows = [_mode("tf32", "in_process"), _mode("amp", "in_process"), _mode("compile", "", "")]
    assert _modes_note(windows) is None  # windows alone: the windows' table says so
    assert _modes_note([]) is None
    restarted = [_mode("batch-size", "restart", "it changes the batch"), _mode("compile", "restart")]
    assert _modes_note(windows + restarted) == (
        "Trials measured in windows of the baseline's own process, without restarting it: tf32, amp; trials "
        "measured in fresh runs of the script: batch-size (it changes the batch); compile."
    )
    assert _modes_note(restarted[1:]) == "Trials measured in fresh runs of the script: compile."


def test_a_missing_script_is_refused_before_anything_runs(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.py"
    with pytest.raises(UsageError) as refused:
        _prepare(replace(OPTIONS, script=missing))
    assert str(refused.value) == f"{missing}: no such script; give the path of a Python training script"
    with pytest.raises(UsageError, match="no such script"):
        _prepare(replace(OPTIONS, script=tmp_path))  # a folder


def test_an_unknown_fix_is_refused_naming_the_first_and_every_fix_there_is(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    with pytest.raises(UsageError) as refused:
        _prepare(replace(OPTIONS, script=script, only_fixes=["tf32", "warp-drive", "hyper"]))
    assert str(refused.value) == (
        "--fix warp-drive: no such fix; the fixes are activation-checkpointing, amp, batch-size, compile, "
        "cudnn-benchmark, dataloader-workers, ddp-settings, fsdp-mixed-precision, fsdp-settings, "
        "fused-optimizer, grad-accumulation, optimizer-foreach, pin-memory, tf32"
    )


def test_the_rules_are_the_shipped_ones_with_the_users_replacing_theirs_by_id(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "mine.toml").write_text(RULE.format(id="mine", title="Mine"))
    (folder / "data-stall.toml").write_text(RULE.format(id="data-stall", title="My data stall"))
    shipped = _prepare(replace(OPTIONS, script=script, only_fixes=["tf32"]))
    rules = _prepare(replace(OPTIONS, script=script, rule_dirs=[folder]))
    assert [r.id for r in rules] == [r.id for r in shipped] + ["mine"]  # a replaced rule keeps its place
    by_id = {r.id: r for r in rules}
    assert (by_id["data-stall"].title, by_id["data-stall"].path) == (
        "My data stall",
        folder / "data-stall.toml",
    )
    assert by_id["host-sync"].path == next(r.path for r in shipped if r.id == "host-sync")


def test_a_rules_folder_that_is_not_one_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    with pytest.raises(rulebook.RuleError, match="not a folder of rule files"):
        _prepare(replace(OPTIONS, script=script, rule_dirs=[script]))


def test_the_saved_baselines_diagnosis_plans_its_fix_and_fix_narrows_the_plan(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    rules = rulebook.rules_for([])
    baseline = _saved_baseline()
    diagnosed = _diagnose_baseline(replace(OPTIONS, script=script), rules, baseline)
    assert [f.rule for f in diagnosed.diagnosis.findings] == ["data-stall"]
    assert diagnosed.plan == [PlannedFix("dataloader-workers", "data-stall", True, "")]
    assert (
        diagnosed.notes == [] and diagnosed.baseline is baseline
    )  # its steps ended at the optimizer; a loader
    other = tmp_path / "other.py"
    other.write_text("pass  # changed\n")
    assert _diagnose_baseline(replace(OPTIONS, script=other), rules, baseline).content != diagnosed.content
    narrowed = _diagnose_baseline(
        replace(OPTIONS, script=script, only_fixes=["pin-memory", "amp"]), rules, baseline
    )
    assert narrowed.plan == [
        PlannedFix(
            "dataloader-workers",
            "data-stall",
            False,
            "not measured in this run: --fix named only pin-memory, amp",
        )
    ]


def test_a_baseline_under_torchrun_or_without_an_optimizer_is_noted(tmp_path: Path) -> None:
    baseline = copy.deepcopy(_saved_baseline())
    baseline.raw.step_source = "backward"
    options = replace(OPTIONS, script=tmp_path / "train.py", torchrun=TWO_RANKS, warmup=8, steps=30)
    diagnosed = _diagnose_baseline(options, rulebook.rules_for([]), baseline)
    assert diagnosed.notes == [
        "Under torchrun each window is a count of steps (8 warm-up, 30 timed), with no steadiness test or "
        "time floor: every rank must stop at the same step. Raise --warmup and --steps where steps take well "
        "under a millisecond.",
        "No torch.optim optimizer was built, so each backward() ended a training step (a loop that updates "
        "its parameters by hand); call trainadvisor.step() to mark steps yourself.",
    ]


def _diagnosed(plan: list[PlannedFix], values: dict[str, Any]) -> _Diagnosed:
    return _Diagnosed(_windows_at(10.0), rulebook.Diagnosis(values, []), plan, [])


def test_the_fixes_search_counts_the_memory_free_less_a_run_started_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Memory:
        available = 8 * 2**30

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory())
    plan = [PlannedFix("dataloader-workers", "data-stall", True, "")]
    diagnosed = _diagnosed(plan, {"num_workers": 0, "cpu_count": 2})
    tuning = _tuning(OPTIONS, diagnosed, lambda line: None, 0.0, beside_bytes=3 * 2**30)
    # and what the baseline told of the script's length: the 25 steps it was seen to take
    seen = {"run_seen_steps": 25}
    assert tuning.values == {"num_workers": 0, "cpu_count": 2, "memory_available_bytes": 5 * 2**30, **seen}
    assert tuning.outcomes == _not_tried(plan) and tuning.plan is plan
    capped = _tuning(
        replace(OPTIONS, max_workers=8), diagnosed, lambda line: None, 0.0, beside_bytes=9 * 2**30
    )
    assert capped.values == {
        "num_workers": 0, "cpu_count": 2, "memory_available_bytes": 0, "worker_cap": 8, **seen,
    }  # fmt: skip
    assert diagnosed.diagnosis.values == {"num_workers": 0, "cpu_count": 2}  # not written into


def _words(options: ProfileOptions) -> str:
    return window_words(options, size_for(options, Overrides()))


def test_the_first_line_says_the_window_as_it_will_be_measured() -> None:
    assert _words(OPTIONS) == (
        "warm-up until step time settles, at least 5 steps; timing at least 20 steps and 1 s; "
        "then tracing 10 with torch.profiler"
    )
    exact = replace(OPTIONS, warmup=2, steps=6, max_warmup_s=0.0, min_time_s=0.0)
    assert _words(exact) == "a warm-up of 2 steps; timing 6 steps; then tracing 10 with torch.profiler"
    counted = replace(OPTIONS, torchrun=TWO_RANKS, steps=30)  # under torchrun a window is a count
    assert _words(counted) == "a warm-up of 5 steps; timing 30 steps; then tracing 10 with torch.profiler"
    floor_only = replace(OPTIONS, max_warmup_s=0.0, min_time_s=0.3)
    assert _words(floor_only).startswith("a warm-up of 5 steps; timing at least 20 steps and 0.3 s;")


def test_the_length_a_baseline_cut_short_told_reaches_the_trials() -> None:
    """A baseline the script's end cut short told the script's length (32 steps); the fitted one
    measured in its place stopped after its window (25 steps seen, the end not reached): the
    trials are fitted into the 32 steps, not into a script of unknown length (where a restart
    trial would run into the script's end and be measured once more)."""
    plan = [PlannedFix("dataloader-workers", "data-stall", True, "")]
    told = RunLength(32, "a run of the script ended after 32 steps", 32)
    diagnosed = replace(_diagnosed(plan, {"num_workers": 0}), length=told)
    assert diagnosed.baseline.raw.status == "window_complete" and diagnosed.baseline.raw.steps_seen == 25
    tuning = _tuning(OPTIONS, diagnosed, lambda line: None, 0.0)
    assert tuning.length == RunLength(32, "a run of the script ended after 32 steps", 32)
    assert (tuning.values["run_total_steps"], tuning.values["run_seen_steps"]) == (32, 32)
    unknown = _tuning(OPTIONS, _diagnosed(plan, {"num_workers": 0}), lambda line: None, 0.0)
    assert unknown.length is not None and unknown.length.total_steps is None
    assert "run_total_steps" not in unknown.values


def test_an_interrupted_profile_saves_its_last_report_again_saying_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    report = _saved()
    saved: list[tuple[ProfileReport, Any]] = []

    def stage(job: Any) -> ProfileReport:  # the baseline's report, then Ctrl-C during the trials
        assert job.options.stage_dir is not None and job.options.stage_dir.is_relative_to(tmp_path / "out")
        job.keep(report)
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "_profile", stage)
    options = replace(OPTIONS, script=script, out_dir=tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        profile(options, lambda line: None, lambda r, publish: saved.append((r, publish)))
    assert [r.notes for r, _ in saved] == [report.notes, [*report.notes, INTERRUPTED]]
    assert INTERRUPTED == (
        "The run was interrupted: fixes marked not run or unconfirmed were not measured to the end."
    )
    assert saved[1][1]() is None  # its traces are in place already: nothing published again


def test_an_interrupted_profile_with_no_report_yet_saves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    saved: list[ProfileReport] = []

    def stage(job: Any) -> ProfileReport:
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "_profile", stage)
    with pytest.raises(KeyboardInterrupt):
        profile(
            replace(OPTIONS, script=script, out_dir=tmp_path / "out"),
            lambda line: None,
            lambda r, p: saved.append(r),
        )
    assert saved == [] and not (tmp_path / "out").exists()  # the folder it made, left empty, is gone


def test_a_profile_refused_before_it_runs_makes_no_report_folder(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such script"):
        profile(replace(OPTIONS, script=tmp_path / "nowhere.py", out_dir=tmp_path / "out"), lambda line: None)
    assert not (tmp_path / "out").exists()
