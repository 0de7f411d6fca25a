"""scripts/gpu_check.py, the acceptance run for a GPU owner: what it checks in each report and
trace, read on the first H100 runs (../shared/gpu-runs/h100-2026-11-24), and its refusal where
there is no GPU."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT, gpu_run

sys.path.insert(0, str(ROOT / "scripts"))


import gpu_check  # noqa: E402


def _h100(name: str) -> tuple[dict[str, Any], Path]:
    folder = gpu_run(name)
    return json.loads((folder / "report.json").read_text()), folder


def _check(name: str) -> gpu_check.Check:
    return next(c for c in gpu_check.CHECKS if c.name == name)


def test_the_first_h100_reports_fail_for_what_issue_24_found_while_their_gpu_facts_hold() -> None:
    """The verdicts the first H100 runs gave are the ones the acceptance run must refuse: slow
    input measured 33x and kept nothing, amp was kept on one combined figure, the batch size's
    18x was "changed training". Their GPU facts hold (NVML, CUDA events, memory, kernels and
    copies); the trials' switches were not yet counted then."""
    mnist, folder = _h100("mnist")
    passed, problems = gpu_check.judge(_check("slow-input"), 0, mnist, folder)
    assert (
        not passed
        and "dataloader-workers was not kept (failed: the script ended after 313 steps" in " ".join(problems)
    )
    fp32, fp32_folder = _h100("fp32")
    assert (
        "amp was kept with a gain of its own of None, less than 1.3x"
        in gpu_check.judge(_check("fp32-matmul"), 0, fp32, fp32_folder)[1]
    )
    smallb, smallb_folder = _h100("smallb")
    assert (
        "batch-size is not an opportunity (changed_training)"
        in gpu_check.judge(_check("small-batch"), 0, smallb, smallb_folder)[1]
    )
    facts = gpu_check.gpu_facts(mnist, folder)
    assert facts and all(p.endswith(("copied without blocking", "in low precision")) for p in facts), facts


def test_a_report_that_shows_every_gpu_fact_and_the_expected_verdict_passes() -> None:
    """The H100 slow-input report as it should be: the fix kept with its own gain, and each
    trial's window counting what its switch did."""
    report, folder = _h100("mnist")
    report = copy.deepcopy(report)
    for outcome in report["fix_outcomes"]:
        outcome.update(status="no_gain", reason="no candidate was at least 5% faster")
        for trial in outcome["trials"]:
            if trial.get("raw"):
                trial["raw"]["runtime"]["switched"] = {"autocast_outputs": 40, "non_blocking_copies": 80}
    workers = report["fix_outcomes"][0]
    workers.update(status="kept", reason="measured 33.60x steps/s", gain=33.6)
    assert gpu_check.judge(_check("slow-input"), 0, report, folder)[1] == [
        "no energy measured (None: None)"  # the first runs had no energy figures yet
    ]
    report["baseline"]["energy"] = {"method": "nvml-energy", "energy_j": 41.0, "j_per_step": 2.05}
    assert gpu_check.judge(_check("slow-input"), 0, report, folder) == (True, [])
    [amp] = [o for o in report["fix_outcomes"] if o["fix"] == "amp"]
    amp_trial = amp["trials"][0]
    amp_trial["raw"]["runtime"]["switched"]["autocast_outputs"] = 0
    assert gpu_check.judge(_check("slow-input"), 0, report, folder)[1] == [
        "amp's trial torch.autocast(dtype=torch.bfloat16) around the forward pass: no module output "
        "came back from autocast in low precision"
    ]


def test_a_compiled_model_must_have_every_timed_steps_loss() -> None:
    report, _ = _h100("compute")
    assert gpu_check.every_loss_read(report) == []
    report = copy.deepcopy(report)
    timed = [s for s in report["baseline"]["raw"]["steps"] if not s["profiled"]]
    timed[3]["loss"] = None
    assert gpu_check.every_loss_read(report) == [f"no loss recorded for 1 of {len(timed)} timed steps"]


def test_a_crashed_trial_changed_training_or_no_report_fails() -> None:
    report, _ = _h100("hf")
    report = copy.deepcopy(report)
    report["findings"] = []
    report["fix_outcomes"][0].update(status="failed", reason="trial 1: killed by signal SIGSEGV")
    report["comparison"]["loss_check"]["equivalent"] = False
    passed, problems = gpu_check.judge(gpu_check.Check("hf", "x.py", [], ["data-stall"]), 3, report)
    assert not passed and problems == [
        "profile exited 3",
        "data-stall did not fire",
        "fix dataloader-workers: failed (trial 1: killed by signal SIGSEGV)",
        "the kept fixes changed training",
    ]
    assert gpu_check.judge(_check("slow-input"), 1, None) == (False, ["no report (profile exited 1)"])


def test_every_check_names_an_example_and_rules_that_exist() -> None:
    rules = {p.stem for p in (ROOT / "rules").glob("*.toml")}
    for check in gpu_check.CHECKS:
        assert (gpu_check.EXAMPLES / check.script).is_file()
        assert set(check.findings) <= rules, check.name


def test_mfu_memory_compile_and_memory_verdicts_read_what_only_a_gpu_run_measures() -> None:
    """The first H100 fp32 report predates MFU and the memory of one step: both verdicts say
    so; filled in as a run measures them now, they hold, and an MFU past 100% or parts that do
    not add up to the peak do not."""
    fp32, _ = _h100("fp32")
    assert gpu_check.mfu_measured(fp32) == ["no MFU (None)"]
    assert gpu_check.memory_step_adds_up(fp32) == ["no memory of one step (None)"]
    report = copy.deepcopy(fp32)
    report["baseline"]["utilization"] = {"status": "measured", "mfu_pct": 38.5, "peak_dtype": "tf32"}
    peak = {"parameters": 40, "gradients": 40, "optimizer_state": 80, "activations": 830, "other": 10}
    report["baseline"]["memory"] = {"status": "measured", "peak_bytes": 1000, "breakdown": peak}
    assert gpu_check.mfu_measured(report) == gpu_check.memory_step_adds_up(report) == []
    report["baseline"]["utilization"]["mfu_pct"] = 512.0
    report["baseline"]["memory"]["breakdown"]["activations"] = 600
    assert gpu_check.mfu_measured(report) == ["MFU 512.0% is outside (0, 100]"]
    assert gpu_check.memory_step_adds_up(report) == ["the step's parts add up to 770 of 1000 bytes"]
    assert gpu_check.compile_measured(report) == ["compile was not proposed"]
    report["fix_outcomes"] = [
        {
            "fix": "compile",
            "status": "no_gain",
            "reason": "r",
            "trials": [{"status": "measured"}],
            "compile_s": None,
        },
        {"fix": "activation-checkpointing", "status": "kept", "reason": "r", "trials": [], "peak_bytes": 900},
    ]
    assert gpu_check.compile_measured(report) == ["compile is no_gain without its compile time"]  # none saved
    report["fix_outcomes"][0]["compile_s"] = 41.2
    assert gpu_check.compile_measured(report) == []
    report["baseline"]["memory"]["budget_bytes"] = 800
    fits = gpu_check.fits_budget("activation-checkpointing")
    assert fits(report) == ["activation-checkpointing's peak 900 bytes is over the budget of 800"]
    assert gpu_check.rescued(report) == []
    report["fix_outcomes"][1]["status"] = "no_gain"
    assert gpu_check.rescued(report) == [
        "no fix let the script run within the memory (compile: no_gain, activation-checkpointing: no_gain)"
    ]
