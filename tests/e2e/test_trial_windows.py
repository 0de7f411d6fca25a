"""Trial windows in the baseline's own process (issue 13): the mode chosen, the windows in
order, the pairs that catch drift, and each case that falls back to restarting the script."""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    EXAMPLES,
    SCRIPTS,
    SETTLE_CAP,
    SHORT,
    WORKER_CAP,
    kept_or_loaded,
    load_report,
    published,
    run_cli,
)
from torch.utils.data import DataLoader, Dataset

from trainadvisor.fixes.common import KEEP_MIN_SPEEDUP
from trainadvisor.training.loaders import loaded_ahead, ready_batches, served_ahead, waiting

# Windows of exactly --warmup and --steps steps (no steadiness test, no time floor), for the tests
# that count where a script's end falls among the windows
EXACT = ("--max-warmup", "0", "--min-time", "0")


def _profile(tmp_path: Path, *args: str | Path) -> dict[str, Any]:
    out = tmp_path / "r"
    command = ("profile", "--warmup", "3", "--steps", "10", *SHORT, *WORKER_CAP, "--out", out, *args)
    result = run_cli(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_report(out)


def _outcome(report: dict[str, Any], fix: str) -> dict[str, Any]:
    [outcome] = [o for o in report["fix_outcomes"] if o["fix"] == fix]
    return outcome


@pytest.mark.xdist_group("slow_input_report")  # one run of it, on one worker
def test_workers_are_tried_in_windows_of_one_run_then_paired_with_the_baseline(
    slow_input_report: tuple[Any, Path],
) -> None:
    result, out = slow_input_report
    report = load_report(out)
    outcome = _outcome(report, "dataloader-workers")
    assert (outcome["mode"], outcome["status"]) == ("in_process", "kept")
    windows = report["trial_windows"]
    # the choice then measured in a pair of adjacent windows: the script's setting, then the chosen
    # one; or, where the chosen trial's window was the last, it and the script's setting after it
    assert windows[0]["label"] == "baseline"
    chosen = outcome["chosen"].replace(", persistent_workers=True", "")
    reused = windows[-1]["label"] == "baseline-pair-1"
    if reused:
        assert not windows[-2]["label"].startswith("baseline") and windows[-2]["setting"] == chosen
        assert any("was its trial's own, just before" in note for note in report["details"])
    else:
        assert [w["label"] for w in windows[-2:]] == ["baseline-pair-1", "dataloader-workers-pair-1"]
        assert windows[-1]["setting"] == chosen
    trials = [w for w in windows if w["fix"] == "dataloader-workers" and "-pair-" not in w["label"]]
    assert [w["label"] for w in trials] == [t["raw"]["label"] for t in outcome["trials"]]
    assert [w["setting"] for w in trials] == [t["label"] for t in outcome["trials"]]
    started = [w["started_s"] for w in windows]
    assert started == sorted(started) and started[0] == 0.0  # in the order they ran
    # each trial window ran on after the one before it, in the same process (no restart)
    indices = [t["raw"]["steps"][0]["index"] for t in outcome["trials"]]
    assert indices == sorted(indices) and indices[0] > report["baseline"]["raw"]["steps"][-1]["index"]
    assert any(
        "dataloader-workers: " in note and "in 1 pair of adjacent windows with the script's own" in note
        for note in report["details"]
    ), report["details"]
    # the search says why it stopped
    assert outcome["search"].startswith("stopped")
    assert "[" in result.stderr and "elapsed, about" in result.stderr  # the progress line
    # each step of a window with workers says whether its batch was loaded ahead; the baseline's
    # loads in the loop's own __next__ (no workers): it cannot say
    told = [s["loaded_ahead"] for t in outcome["trials"] for s in t["raw"]["steps"]]
    assert told and None not in told
    assert {s["loaded_ahead"] for s in report["baseline"]["raw"]["steps"]} == {None}
    counted = [s["ready_batches"] for t in outcome["trials"] for s in t["raw"]["steps"]]  # and how many
    assert all(isinstance(n, int) and n >= 0 for n in counted)
    assert {s["ready_batches"] for s in report["baseline"]["raw"]["steps"]} == {None}


class _Gated(Dataset[torch.Tensor]):
    """Samples that wait until `opened` is set: no batch is loaded before it."""

    def __init__(self, opened: Any) -> None:
        self.opened = opened

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        self.opened.wait(60)
        return torch.tensor([float(index)])


def test_torchs_worker_iterator_says_whether_a_batch_was_loaded_ahead_and_how_many() -> None:
    context = multiprocessing.get_context("fork")
    opened = context.Event()
    loader = DataLoader(_Gated(opened), batch_size=4, num_workers=2, multiprocessing_context=context)
    iterator = iter(loader)
    assert loaded_ahead(iterator) is False  # its workers wait for `opened`: nothing loaded yet
    opened.set()
    deadline = time.monotonic() + 60
    while not loaded_ahead(iterator) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loaded_ahead(iterator) is True
    deadline = time.monotonic() + 60  # both workers' first two batches: prefetch_factor 2 each
    while (ready_batches(iterator) or 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ready_batches(iterator) == 4
    assert [int(x) for x in next(iterator)] == [0, 1, 2, 3]
    assert loaded_ahead(iter(DataLoader(_Gated(opened), batch_size=4))) is None  # no workers
    del iterator


class _FirstGated(_Gated):
    """The first batch's samples wait until `opened` is set; every other sample comes at once."""

    def __getitem__(self, index: int) -> torch.Tensor:
        if index < 4:
            self.opened.wait(60)
        return torch.tensor([float(index)])


def test_a_batch_queued_that_is_not_the_one_needed_leaves_the_loop_waiting_for_its_worker() -> None:
    """torch's iterator serves batches in order: with batch 0's worker still loading, the queue
    holds batch 1; the loop, asking for batch 0, waits for that worker (`served_ahead` False),
    while batch 1, held meanwhile, is served as loaded ahead."""
    context = multiprocessing.get_context("fork")
    opened = context.Event()
    loader = DataLoader(_FirstGated(opened), batch_size=4, num_workers=2, multiprocessing_context=context)
    iterator = iter(loader)
    deadline = time.monotonic() + 60
    while (ready_batches(iterator) or 0) < 2 and time.monotonic() < deadline:  # worker 1's two
        time.sleep(0.01)
    before = waiting(iterator)
    assert before.loaded_ahead is True and before.queued == 2  # batches 1 and 3, not batch 0
    threading.Timer(0.2, opened.set).start()
    assert [int(x) for x in next(iterator)] == [0, 1, 2, 3]
    assert served_ahead(before, iterator) is False
    before = waiting(iterator)
    assert [int(x) for x in next(iterator)] == [4, 5, 6, 7]
    assert served_ahead(before, iterator) is True
    del iterator


@pytest.mark.long_run
def test_input_that_gets_faster_by_itself_is_not_credited_to_a_fix(tmp_path: Path) -> None:
    """Reads serialised by one lock: workers cannot help, but every later window is faster.
    Judged against the first baseline window alone, the first trial would have passed."""
    # a warm-up capped at 2 s: waiting for the loop to settle would wait out the warming itself;
    # the reads' latency halves over the 6 s from the first, within the trials (over 10 s, a CI
    # run under -n 2 ended its trials before its windows read 5% faster; counted from the
    # script's start, a busy CI run's start-up outlasted the warming)
    report = _profile(tmp_path, "--max-warmup", "2s", SCRIPTS / "warming_cache.py", "--warm-s", "6")
    outcome = _outcome(report, "dataloader-workers")
    windows = report["trial_windows"]
    first = windows[0]["steps_per_s"]
    # the script's own setting measured again later (the pairs'); else the later windows, whose
    # workers cannot read in parallel (three runs beside two busy cores: 1.70-1.75x the first;
    # read a sample at a time, one run under -n measured 1.03x: tests/scripts/warming_cache.py)
    own = [w["steps_per_s"] for w in windows[1:] if w["setting"] == windows[0]["setting"]]
    again = max(own or [w["steps_per_s"] for w in windows[1:]])
    # the reads got faster by themselves: by more than the 5% a kept fix must gain, so that the
    # first trial judged against the first window alone would pass
    assert again > 1.05 * first
    # the bracket catches it; where a trial's own noise got past it, the confirmation run does: no
    # gain, or inconclusive where other processes used CPU beside it (a test beside it under -n)
    assert outcome["status"] in ("no_gain", "inconclusive"), outcome
    assert "drift" in outcome["reason"] or "not a reliable gain" in outcome["reason"], outcome["reason"]


@pytest.mark.xdist_group("loader_variants_report")  # one run of it, on one worker
def test_a_loader_built_every_epoch_restarts_the_script_per_trial(
    loader_variants_report: tuple[Any, Path],
) -> None:
    """tests/scripts/loader_variants.py builds its DataLoader anew every epoch of 12 steps."""
    report = load_report(loader_variants_report[1])
    outcome = _outcome(report, "dataloader-workers")
    assert outcome["mode"] == "restart"
    assert "is built anew every epoch" in outcome["mode_reason"]
    assert report["trial_windows"] == []  # no fix ran in windows
    assert f"dataloader-workers ({outcome['mode_reason']})" in " ".join(report["details"])


@pytest.mark.xdist_group("iterable_unsharded_report")  # one run of it, on one worker
def test_an_iterable_dataset_restarts_the_script_per_trial(
    iterable_unsharded_report: tuple[Any, Path],
) -> None:
    report = load_report(iterable_unsharded_report[1])
    outcome = _outcome(report, "dataloader-workers")
    assert outcome["mode"] == "restart" and "is an IterableDataset" in outcome["mode_reason"]
    assert outcome["status"] == "changed_training"  # as before: the fresh runs see the repeats


@pytest.mark.long_run
def test_a_script_that_ends_before_the_trials_falls_back_to_restarts(tmp_path: Path) -> None:
    """30 steps in all: the baseline takes 24, the first trial window needs 3 + 2 + 10 more. The
    window the script's end cut short says how long the script is: the fresh runs fit into it."""
    report = _profile(tmp_path, *EXACT, SCRIPTS / "short_run.py", "--max-steps", "30")
    outcome = _outcome(report, "dataloader-workers")
    assert outcome["mode"] == "restart"
    assert (
        outcome["mode_reason"] == "the script ended during trial window dataloader-workers-1, after 30 steps"
    )
    assert outcome["status"] == "kept"
    assert [w["status"] for w in report["trial_windows"]] == ["measured", "failed"]  # baseline, trial 1
    assert all(t["raw"]["steps_seen"] <= 30 for t in outcome["trials"])
    after = report["after"]["raw"]  # fitted: 7 warm-up and 12 timed steps, 11 traced
    assert (after["warmup_steps"], after["window_steps"], after["steps_seen"]) == (7, 12, 30)


def test_a_script_that_ends_during_the_trials_keeps_the_windows_measured(tmp_path: Path) -> None:
    """70 steps in all: the baseline takes 24, the first trial window (8 workers) 11 + 24 (its
    share of the steps left), the second (16) does not fit. Each sample's read takes 20 ms, a
    batch 640 ms: 8 workers load 12.5 a second, a third of what the loop's 16 ms steps take even
    on a loaded machine, so the search goes on (where they keep up, it stops there)."""
    script = (SCRIPTS / "short_run.py", "--max-steps", "70", "--read-ms", "20")
    report = _profile(tmp_path, *EXACT, "--max-workers", "16", *script)
    outcome = _outcome(report, "dataloader-workers")
    assert outcome["mode"] == "in_process" and outcome["status"] == "kept"
    assert [t["status"] for t in outcome["trials"]] == ["measured", "failed"]
    assert (
        "the script ended during trial window dataloader-workers-2, after 70 steps: dataloader-workers "
        "was decided by the windows measured before that."
    ) in report["notes"]


@pytest.mark.long_run
def test_a_short_script_keeps_the_gain_its_trials_measured(tmp_path: Path) -> None:
    """The first H100 runs: a 200-step script measured 12.3x and kept nothing, its windows counted
    in steps outrunning it. Here 200 steps of slow input: the confirmation run is fitted into them
    (or measured on what fitted), and the fix is kept."""
    script = (EXAMPLES / "slow_input_mnist.py", "--samples", "12800", "--latency-ms", "0.5")
    report = _profile(tmp_path, *SETTLE_CAP, *script)
    held, shown = kept_or_loaded(report, "dataloader-workers")
    assert held, shown
    # kept is the judge's verdict on a confirmed gain (about 4x quiet, 2.87x read once on a
    # loaded machine, which a bound of 3x failed): the figure is only checked to be a gain
    assert report["after"]["raw"]["steps_seen"] <= 200
    assert shown[0] == "inconclusive" or report["speedup"] > KEEP_MIN_SPEEDUP


def test_a_spent_budget_lists_the_fix_with_the_command_that_measures_it(tmp_path: Path) -> None:
    report = _profile(tmp_path, "--budget", "1s", EXAMPLES / "slow_input_mnist.py", "--samples", "20000")
    outcome = _outcome(report, "dataloader-workers")
    assert outcome["status"] == "not_run" and outcome["trials"] == []
    assert re.search(
        r"^not measured: its trials \(about \d+s each\) would have run past the --budget of 1s \(0s left\); "
        "measure it alone with: trainadvisor profile ",
        outcome["reason"],
    ), outcome["reason"]
    command = outcome["reason"].split("with: ")[1]
    assert "--fix dataloader-workers" in command and "--budget" not in command
    beside = published(tmp_path / "r-dataloader-workers", tmp_path)
    assert f"--out {beside}" in command  # beside this report, not over it


@pytest.mark.parametrize(
    ("value", "message"),
    [("10x", "'10x' is not a duration"), ("0", "a duration must be more than zero")],
)
def test_budget_values_are_checked(tmp_path: Path, value: str, message: str) -> None:
    result = run_cli("profile", "--budget", value, EXAMPLES / "slow_input_mnist.py", cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr


def test_an_unknown_fix_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    result = run_cli("profile", "--fix", "workers", EXAMPLES / "slow_input_mnist.py", cwd=tmp_path)
    assert result.returncode == 2
    assert (
        "--fix workers: no such fix; the fixes are activation-checkpointing, amp, batch-size" in result.stderr
    )


@pytest.mark.long_run
def test_fresh_runs_on_a_machine_that_sped_up_since_the_baseline_are_inconclusive(tmp_path: Path) -> None:
    """`--trials restart`: every read takes twice as long in the script's first run (the
    baseline) as in the later ones, and no DataLoader setting helps on a steady machine (reads
    serialised by one lock). Compared with that baseline alone, the workers' fresh runs measured
    about 2x and were kept with a diff; the script's own setting measured next to the
    confirmation run shows the machine sped up, and the fix is inconclusive: not kept, no change
    given."""
    launches = tmp_path / "launches"
    report = _profile(
        tmp_path, "--trials", "restart", "--max-warmup", "2s", "--max-workers", "2",
        SCRIPTS / "machine_speeds_up.py", "--launches", launches,
    )  # fmt: skip
    outcome = _outcome(report, "dataloader-workers")
    # each candidate a fresh run because it was asked for, and the command says so
    assert (outcome["mode"], outcome["mode_reason"]) == ("restart", "--trials restart was given")
    assert report["trial_windows"] == []
    assert report["command"][report["command"].index("--trials") + 1] == "restart"
    assert outcome["status"] == "inconclusive", outcome
    assert "the machine's speed changed between runs: the script's own setting measured" in outcome["reason"]
    assert not outcome["diff"] and report["applied_fixes"] == []
    assert len(launches.read_text().split()) >= 4  # baseline, a trial, the confirmation, and beside it
    assert "inconclusive: dataloader-workers" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.long_run
@pytest.mark.skipif(
    len(getattr(os, "sched_getaffinity", lambda pid: ())(0)) < 2,
    reason="needs two cores to pin to (os.sched_getaffinity, Linux): the loop's and its workers'",
)
def test_a_gain_that_only_a_process_beside_the_loop_makes_is_not_kept(tmp_path: Path) -> None:
    """A loop pinned to the first core, its DataLoader workers to the others, each sample 1 ms of
    CPU under one lock: quietly, workers gain nothing (no_gain). A process busy on that first core
    halves the loop's own reads and not the workers': they measure about 2x, and were kept with
    a diff. The loop's waits for a CPU (the kernel's run-queue count) are measured: the gain
    judged without them is not one, and the fix is not kept."""
    import subprocess
    import sys

    spin = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\nwhile True: pass",
        ]
    )
    try:
        report = _profile(tmp_path, "--max-workers", "2", SCRIPTS / "pinned_reads.py")
    finally:
        spin.kill()
        spin.wait()
    outcome = _outcome(report, "dataloader-workers")
    # inconclusive; or no_gain, where the suite's other tests beside it slowed the workers too
    assert outcome["status"] in ("inconclusive", "no_gain"), outcome
    assert not outcome["diff"] and report["applied_fixes"] == [], outcome
    waits = [s["main_queued_pct"] for s in report["baseline"]["raw"]["host_samples"] if s["t_ms"] >= 0]
    read = [pct for pct in waits if pct is not None]
    # the loop shares its core: its waits were read (19-49% of its time in the runs beside it)
    assert len(read) >= 3 and sum(read) / len(read) > 5.0, waits
    if outcome["status"] == "inconclusive":  # kept as measured, not without the waits; or no gain
        # in the confirmation where its trial gained, beside the load (`confirm._Judge.contradicted`)
        reason = outcome["reason"]
        without_waits = "judged with those waits taken out of its steps" in reason
        assert (without_waits and reason.endswith("a quiet machine would not keep it")) or (
            "not a reliable gain; but other processes used" in reason
            and reason.endswith("the load may have decided, not the fix; measure again on a quiet machine")
        ), reason


@pytest.mark.long_run
def test_beside_a_process_that_keeps_a_core_busy_the_workers_fix_is_still_kept(tmp_path: Path) -> None:
    """A shared node: another process keeps one of the cores busy for the whole profile. The
    trials' warm-ups are capped from the baseline's settling, the choice is checked in pairs of
    adjacent windows, and the workers fix (a gain of several times, on a loader that sleeps on
    storage latency) is kept, with the loss check intact; the report names the busy process."""
    import subprocess
    import sys

    spin = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.perf_counter()"])
    try:
        report = _profile(tmp_path, "--max-workers", "4", *SETTLE_CAP, EXAMPLES / "slow_input_mnist.py",
                          "--samples", "200000", "--latency-ms", "1")  # fmt: skip
    finally:
        spin.kill()
        spin.wait()
    outcome = _outcome(report, "dataloader-workers")
    assert outcome["status"] == "kept", outcome["reason"]
    assert report["speedup"] > 1.5 and report["comparison"]["loss_check"]["equivalent"] is True
    assert any("Other processes used" in note for note in report["notes"]), report["notes"]
