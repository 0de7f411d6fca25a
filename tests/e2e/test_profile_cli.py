"""`trainadvisor profile` end to end: real scripts, real child processes, no mocks of torch."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import (
    EXAMPLES,
    SCRIPTS,
    SETTLE_CAP,
    SHORT,
    WORKER_CAP,
    kept_or_loaded,
    load_report,
    processes_running,
    published,
    run_cli,
)

from trainadvisor.profile.judge import KEEP_MIN_SPEEDUP

RUN_KEYS = {"steps", "step_time_ms", "steps_per_s", "samples_per_s", "breakdown_pct"}
# Windows of exactly --warmup and --steps steps: no steadiness test, no time floor (for tests of
# what a run records step by step; tests/e2e/test_gpu_speed.py times windows)
EXACT = ("--max-warmup", "0", "--min-time", "0")


@pytest.mark.xdist_group("slow_input_report")  # one run of it, on one worker
def test_slow_input_is_diagnosed_fixed_and_reported(
    slow_input_report: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    result, out = slow_input_report
    assert result.returncode == 0, result.stderr
    report = load_report(out)
    assert (report["schema_version"], report["kind"], report["producer"]) == (2, "profile", "trainadvisor")
    assert report["run_id"].startswith("sha256:")
    for run in ("baseline", "after"):
        assert RUN_KEYS <= set(report[run])
        assert report[run]["steps"] >= 10
        assert {"median", "p90"} <= set(report[run]["step_time_ms"])
        assert "data_wait" in report[run]["breakdown_pct"]
    # at least 10 timed steps, over at least 0.5 s (the time floor), after a warm-up until settled
    shape = report["baseline"]["raw"]["shape"]
    assert report["baseline"]["steps"] == report["baseline"]["raw"]["window_steps"] >= 10
    assert shape["timed_s"] >= 0.5 and shape["warmup_end"] == "settled" and shape["warmup_steps"] >= 3
    assert report["baseline"]["samples_per_s"] == report["baseline"]["steps_per_s"] * 64
    [finding] = report["findings"]
    assert {"rule", "severity", "message", "evidence", "fixes"} <= set(finding)
    assert (finding["rule"], finding["severity"], finding["fixes"]) == (
        "data-stall",
        "high",
        ["dataloader-workers"],
    )
    evidence = {e["measurement"]: e["value"] for e in finding["evidence"]}
    assert evidence["num_workers"] == 0 and evidence["batch_size"] == 64
    # each batch reads 64 samples at 1 ms of latency: at least 64 ms of data wait per step
    assert evidence["data_wait_ms_per_step"] >= 64.0
    assert evidence["dataloader_call_site"].endswith("slow_input_mnist.py:56")
    assert report["applied_fixes"] == ["dataloader-workers"]
    # kept means: 5% faster or more, and the slow windows after beat the fast ones before
    assert report["speedup"] >= KEEP_MIN_SPEEDUP and report["comparison"]["speedup_low"] > 1.0
    trials = report["fix_outcomes"][0]["trials"]
    # the first count is 2, or where the baseline's loading was seen waiting (its sleeps), the
    # count that would hide its wait, at most four per core (fixes.dataloader_workers.first_count)
    assert trials[0]["label"] in ("num_workers=2", "num_workers=4", "num_workers=8")
    site = next(iter(trials[0]["overrides"]["loaders"]))
    assert site.endswith("slow_input_mnist.py:56")
    assert all(t["overrides"]["loaders"][site]["persistent_workers"] for t in trials)
    # The change to make in the script: the DataLoader(...) call, rewritten with the kept settings.
    diff = report["fix_outcomes"][0]["diff"].splitlines()
    assert diff[:2] == ["--- a/slow_input_mnist.py", "+++ b/slow_input_mnist.py"]
    assert "-        num_workers=args.num_workers," in diff
    added = [line for line in diff if line.startswith("+ ")]  # one per line, as the call is laid out
    chosen = report["fix_outcomes"][0]["settings"]["loaders"][site]
    assert added == [f"+        {k}={v!r}," for k, v in chosen.items()]
    check = report["comparison"]["loss_check"]
    assert check["equivalent"] is True and check["max_abs_diff"] == 0.0 and check["same_batches"] is True
    # every step both runs recorded: warm-up, timed, the profiler's warmup and 10 traced
    recorded = min(len(report["baseline"]["raw"]["losses"]), len(report["after"]["raw"]["losses"]))
    assert check["steps_compared"] == recorded >= 3 + 10 + 1 + 10
    # The terminal diagnosis names the finding, the fix, the speedup and the report.
    assert "data-stall" in result.stdout and "x faster" in result.stdout
    assert f"report: {published(out / 'report.html', out.parent)}" in result.stdout


@pytest.mark.xdist_group("slow_input_report")  # one run of it, on one worker
def test_report_files_are_written(slow_input_report: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = slow_input_report
    html = (out / "report.html").read_text()
    assert "<svg" in html and "data-stall" in html
    for external in ("http://", "https://", "<script", "<link"):
        # The only URLs allowed are the threshold source's, printed as text.
        assert external not in html.replace(
            "https://www.tensorflow.org/guide/profiler#input_pipeline_analyzer", ""
        )
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("### trainadvisor:") and "| step time, median |" in markdown
    # a pull-request comment: what is shown unfolded stays short (code changes, recommendations
    # and how the run was measured fold away in <details>)
    unfolded = re.sub(r"<details>.*?</details>", "", markdown, flags=re.S)
    assert len(unfolded.splitlines()) < 50
    assert "<details><summary>Code change for <code>dataloader-workers</code></summary>" in markdown
    assert "```diff\n--- a/slow_input_mnist.py" in markdown
    assert (
        '<pre class="diff">' in html
        and '<span class="del">-        num_workers=args.num_workers,</span>' in html
    )
    for run in ("baseline", "after"):
        trace = out / "traces" / run / "trainadvisor.pt.trace.json.gz"
        events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
        steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
        assert len(steps) == 10
        # the profiler's warmup step (CUPTI's start-up), then the 10 it recorded, each matched
        # to its ProfilerStep#N
        traced = [s["trace_step"] for s in load_report(out)[run]["raw"]["steps"] if s["profiled"]]
        assert traced == [None, *range(1, 11)]


@pytest.mark.xdist_group("slow_input_report")  # one run of it, on one worker
def test_no_process_is_left_behind(slow_input_report: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    assert processes_running("slow_input_mnist.py", slow_input_report[1]) == []


def test_compute_bound_example_is_compute_bound_with_its_mfu(tmp_path: Path) -> None:
    """No data stall; the step's FLOPs counted exactly (three Linear layers 1024x1024,
    1024x1024, 1024x10 on batch 256: forward 2*256*1024*(2*1024+10), backward twice that
    but the first layer's input gradient), its MFU against this CPU's measured peak, and the
    compute-bound finding (its compile fix is not measured here: --no-fix)."""
    out = tmp_path / "report"
    result = run_cli(
        "profile", "--warmup", "2", "--steps", "10", "--no-fix", "--out", out,
        EXAMPLES / "compute_bound.py", "--epochs", "50", cwd=tmp_path,  # steps to outlast its windows
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = load_report(out)
    forward = 2 * 256 * 1024 * (2 * 1024 + 10)
    use = report["baseline"]["utilization"]
    assert use["flops_per_step"] == 3 * forward - 2 * 256 * 1024 * 1024
    assert use["peak_how"] == "measured" and 0 < use["mfu_pct"] < 100
    # its matmuls are the peak benchmark's own kind of work: MFU near the 60% line, so whether
    # compute-bound fires (low) is the machine's to say; nothing else may
    assert {f["rule"] for f in report["findings"]} <= {"compute-bound"}
    assert report["after"] is None and report["applied_fixes"] == []
    assert report["baseline"]["breakdown_pct"]["data_wait"] < 5
    assert f"MFU {use['mfu_pct']:.1f}%" in result.stdout


def test_script_that_raises_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_cli(
        "profile", "--warmup", "2", "--steps", "10", *EXACT, "--out", out, SCRIPTS / "raises.py", cwd=tmp_path
    )
    assert result.returncode == 3
    assert "RuntimeError: boom at step 5" in result.stderr  # the script's own traceback
    assert 'raises.py", line 10' in result.stderr
    assert "trainadvisor: error:" in result.stderr and "Traceback" not in result.stdout
    report = load_report(out)
    assert report["baseline"]["steps"] == 3  # steps 2, 3 and 4 completed inside the window
    assert report["baseline"]["raw"]["status"] == "script_failed"
    assert report["baseline"]["raw"]["error"] == "RuntimeError: boom at step 5"


def test_missing_script(tmp_path: Path) -> None:
    result = run_cli("profile", "does_not_exist.py", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "trainadvisor: error: does_not_exist.py: no such script; give the path of a Python training script"
    )


def test_script_without_steps(tmp_path: Path) -> None:
    result = run_cli("profile", "--out", tmp_path / "r", SCRIPTS / "no_steps.py", cwd=tmp_path)
    assert result.returncode == 2
    assert "evaluated 10 batches" in result.stdout  # the script's output is shown
    [message] = [line for line in result.stderr.splitlines() if line.startswith("trainadvisor: error:")]
    assert "no training step was seen" in message
    assert "optimizer.step()" in message and "trainadvisor.step()" in message


def test_manual_steps_and_script_arguments(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = run_cli(
        "profile",
        "--warmup",
        "2",
        "--steps",
        "6",
        *EXACT,
        "--out",
        out,
        SCRIPTS / "manual_steps.py",
        "40",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "final loss" not in result.stdout  # stopped after the window
    report = load_report(out)
    assert report["baseline"]["steps"] == 6
    assert report["baseline"]["raw"]["steps_seen"] == 15  # warmup 2, 6 timed, the profiler's warmup, 6 traced
    losses = report["baseline"]["raw"]["losses"]
    assert losses[0] == 140.0  # sum((0 - k)^2 for k in 0..7), the first step's loss


def test_run_to_end_lets_the_script_finish(tmp_path: Path) -> None:
    result = run_cli(
        "profile",
        "--warmup",
        "2",
        "--steps",
        "4",
        *EXACT,
        "--run-to-end",
        "--no-fix",
        "--out",
        tmp_path / "r",
        SCRIPTS / "manual_steps.py",
        "12",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "final loss" in result.stdout
    assert load_report(tmp_path / "r")["baseline"]["raw"]["steps_seen"] == 12


def test_a_script_stopped_after_its_window_ends_as_it_would_by_itself(tmp_path: Path) -> None:
    """Its exit handler runs, and a log it never closed (its globals, which its function and its
    exit handler refer to, are freed by the interpreter's last garbage collections) holds every
    line it wrote: a faster exit that froze the objects alive at exit (`gc.freeze`) lost them."""
    result = run_cli(
        "profile", "--warmup", "2", "--steps", "4", *EXACT, "--no-fix", "--out", tmp_path / "r",
        SCRIPTS / "leaves_files_open.py", "--out-dir", tmp_path, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    steps_seen = load_report(tmp_path / "r")["baseline"]["raw"]["steps_seen"]
    lines = (tmp_path / "steps.log").read_text().splitlines()
    # the last step stopped in its optimizer.step(), before its line
    assert lines == [f"step {step}" for step in range(steps_seen - 1)]
    assert (tmp_path / "exit_handler.txt").read_text() == "ran\n"


def test_too_few_steps_for_the_warmup(tmp_path: Path) -> None:
    result = run_cli(
        "profile", "--warmup", "20", "--out", tmp_path / "r", SCRIPTS / "manual_steps.py", "5", cwd=tmp_path
    )
    assert result.returncode == 2
    assert "ran only 5 step(s), too few to time any after a warm-up of at least 20" in result.stderr


@pytest.mark.xdist_group("iterable_unsharded_report")  # one run of it, on one worker
def test_unsharded_iterable_dataset_fix_is_refused(
    iterable_unsharded_report: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    result, out = iterable_unsharded_report
    assert result.returncode == 0, result.stderr
    report = load_report(out)
    assert report["findings"][0]["rule"] == "data-stall"
    [outcome] = report["fix_outcomes"]
    assert outcome["status"] == "changed_training"
    assert "get_worker_info" in outcome["reason"]
    assert report["applied_fixes"] == [] and report["after"] is None


def test_lambda_collate_with_spawn_fix_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = run_cli(
        "profile",
        "--warmup",
        "2",
        "--steps",
        "10",
        "--out",
        out,
        SCRIPTS / "lambda_collate_spawn.py",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    [outcome] = load_report(out)["fix_outcomes"]
    assert outcome["status"] == "refused"
    assert "collate_fn (<lambda>) cannot be pickled" in outcome["reason"]
    assert "'spawn'" in outcome["reason"]


def test_out_folder_of_the_user_is_not_overwritten(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    result = run_cli("profile", "--out", folder, SCRIPTS / "manual_steps.py", cwd=tmp_path)
    assert result.returncode == 2
    assert "is not a trainadvisor report" in result.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_user_rule_folder(tmp_path: Path) -> None:
    rules = tmp_path / "myrules"
    rules.mkdir()
    (rules / "slow-steps.toml").write_text("""
id = "slow-steps"
title = "Steps slower than a budget"
threshold_source = "our team's budget"
message = "median step {step_time_ms_median:.1f} ms"
[[when]]
severity = "low"
condition = "step_time_ms_median > 0"
[recommendation]
text = "Make it faster."
anti_pattern = "slow()"
best_practice = "fast()"
""")
    out = tmp_path / "r"
    result = run_cli(
        "profile",
        "--rules",
        rules,
        "--warmup",
        "2",
        "--steps",
        "4",
        *EXACT,  # 30 steps of microseconds: a window that fits them (one run, not a second fitted)
        "--out",
        out,
        SCRIPTS / "manual_steps.py",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    [finding] = load_report(out)["findings"]
    assert (finding["rule"], finding["severity"], finding["fixes"]) == ("slow-steps", "low", [])


def test_help_teaches() -> None:
    result = run_cli("profile", "--help", cwd=Path.cwd())
    assert result.returncode == 0
    for words in (
        "--warmup",
        "--steps",
        "--out",
        "--rules",
        "--run-to-end",
        "trainadvisor.step()",
        "Exit codes",
    ):
        assert words in result.stdout


@pytest.mark.xdist_group("loader_variants_report")  # one run of it, on one worker
def test_loader_variants_get_the_fix_at_their_call_site(
    loader_variants_report: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    result, out = loader_variants_report
    assert result.returncode == 0, result.stderr
    report = load_report(out)
    loaders = report["baseline"]["raw"]["loaders"]
    assert len(loaders) >= 2  # a new loader every 12 steps
    assert {(ld["dataset_class"], ld["batch_size"], ld["collate_fn"]) for ld in loaders} == {
        ("Slow", None, "collate")
    }
    assert report["baseline"]["samples_per_s"] == report["baseline"]["steps_per_s"] * 16
    [outcome] = report["fix_outcomes"]
    # kept; or, where the report names other processes' CPU during its windows (the suite's
    # other worker and a busy core beside it: 2.69x kept beside two busy processes, inconclusive
    # once in a busy CI run), inconclusive, with no change given: issue 36's answer on a loaded
    # machine, which this test does not judge
    loaded = any(note.startswith("Other processes used") for note in report["notes"])
    # (no_gain too: a third busy run's 4-worker trial gained nothing beside that load)
    unkept = ("inconclusive", "no_gain")
    assert outcome["status"] == "kept" or (loaded and outcome["status"] in unkept), outcome
    if outcome["status"] != "kept":
        assert not outcome["diff"] and report["applied_fixes"] == [], outcome
    if outcome["status"] == "kept" or report["after"] is not None:  # the confirmation ran
        after_loaders = report["after"]["raw"]["loaders"]
        assert len(after_loaders) >= 2
        assert all(ld["num_workers"] > 0 and ld["overrides_applied"] for ld in after_loaders)
        assert report["comparison"]["loss_check"]["same_batches"] is True


def test_random_augmentation_compares_the_mean_loss(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = run_cli(
        "profile",
        "--warmup",
        "2",
        "--steps",
        "10",
        *SHORT,
        *SETTLE_CAP,
        *WORKER_CAP,
        "--out",
        out,
        SCRIPTS / "random_augment.py",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = load_report(out)
    check = report["comparison"]["loss_check"]
    assert check["same_batches"] is False and check["tolerance_rel"] == 0.1
    assert check["equivalent"] is True and check["mean_rel_diff"] < 0.1
    held, shown = kept_or_loaded(report, "dataloader-workers")
    assert held, shown
    assert report["applied_fixes"] == (["dataloader-workers"] if shown[0] == "kept" else [])


def test_script_that_exits_non_zero(tmp_path: Path) -> None:
    result = run_cli(
        "profile",
        "--warmup",
        "2",
        "--steps",
        "10",
        *EXACT,
        "--out",
        tmp_path / "r",
        SCRIPTS / "exits.py",
        cwd=tmp_path,
    )
    assert result.returncode == 3
    assert "exits.py failed: the script exited with code 4" in result.stderr
    assert load_report(tmp_path / "r")["baseline"]["steps"] == 4


def test_a_loop_that_updates_parameters_by_hand_is_profiled(tmp_path: Path) -> None:
    """No optimizer and no trainadvisor.step(): each backward() ends a step, and the report says so."""
    result = run_cli(
        "profile", "--warmup", "3", "--steps", "10", *EXACT, "--no-fix", "--out", tmp_path / "r",
        SCRIPTS / "hand_sgd.py", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = load_report(tmp_path / "r")
    assert report["baseline"]["raw"]["step_source"] == "backward" and report["baseline"]["steps"] == 10
    assert report["baseline"]["raw"]["steps_seen"] == 3 + 10 + 1 + 10  # stopped after the window
    assert any(
        note.startswith("No torch.optim optimizer was built, so each backward() ended")
        for note in report["notes"]
    )
    losses = [s["loss"] for s in report["baseline"]["raw"]["steps"]]
    assert all(loss is not None for loss in losses) and losses[0] > losses[-1]  # it trains


def test_a_diagnosis_only_run_reports_no_fix_outcome(tmp_path: Path) -> None:
    result = run_cli(
        "profile", "--warmup", "2", "--steps", "4", "--no-fix", "--out", tmp_path / "r",
        EXAMPLES / "slow_input_mnist.py", "--samples", "2000", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = load_report(tmp_path / "r")
    assert [f["rule"] for f in report["findings"]] == ["data-stall"]
    assert report["fix_outcomes"] == [] and [p["fix"] for p in report["plan"]] == ["dataloader-workers"]
