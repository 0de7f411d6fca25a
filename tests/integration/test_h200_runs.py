"""The first runs of this project on an H200 (tests/data/own/SOURCE.md, h200-2026-11-30): what the
acceptance run (scripts/gpu_check.py) read in them, and what changed since in what they showed.
Real GPU reports and traces: NVML, CUDA events, kernels, torch's compile pool on 16 cores."""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from conftest import DATA, ROOT

from trainadvisor import fixes, rulebook
from trainadvisor.analyze.run.summary import named_measurements
from trainadvisor.profile.trials import decide
from trainadvisor.records import PlannedFix, ProfileReport
from trainadvisor.report.render import load_report

sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402

RUNS = DATA / "own" / "h200-2026-11-30"


def _run(name: str, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """The run's folder as `profile --out` wrote it (its report.json unzipped), and its report."""
    folder = tmp_path / name
    shutil.copytree(RUNS / name, folder)
    zipped = folder / "report.json.gz"
    (folder / "report.json").write_bytes(gzip.decompress(zipped.read_bytes()))
    zipped.unlink()
    return json.loads((folder / "report.json").read_text()), folder


def _check(name: str) -> gpu_check.Check:
    return next(c for c in gpu_check.CHECKS if c.name == name)


def test_the_h200_fp32_matmul_run_passes_with_its_gpu_facts_mfu_and_energy(tmp_path: Path) -> None:
    """amp and tf32 kept and confirmed beside the script's own setting; MFU against the H200's
    datasheet fp32 peak; NVML's energy counter per step, before and after."""
    report, folder = _run("fp32_matmul", tmp_path)
    assert gpu_check.judge(_check("fp32-matmul"), 0, report, folder) == (True, [])
    baseline, after = report["baseline"], report["after"]
    assert baseline["raw"]["device"]["gpu_name"] == "NVIDIA H200"
    mfu = baseline["utilization"]
    assert (round(mfu["mfu_pct"], 1), mfu["peak_tflops"], mfu["peak_dtype"], mfu["peak_device"]) == (
        53.2,
        67.0,
        "fp32",
        "H200 SXM",
    )
    assert round(after["utilization"]["peak_tflops"], 1) == 989.5  # the after run's matmuls are bf16
    joules = [round(run["energy"]["j_per_step"], 2) for run in (baseline, after)]
    assert joules == [3.44, 1.11]
    assert [o["fix"] for o in report["fix_outcomes"] if o["status"] == "kept"] == ["amp", "tf32"]
    assert round(report["speedup"], 2) == 1.57


def test_the_h200_compile_run_that_lacked_its_compile_time_carries_it_when_decided_now(
    tmp_path: Path,
) -> None:
    """gpu_check failed the first compile run: compiling measured no gain, and the outcome did
    not keep the 9.6 s dynamo recorded. Decided again from the same trials, it does."""
    plain, folder = _run("compile_fix", tmp_path)
    passed, problems = gpu_check.judge(_check("compile-fix"), 0, plain, folder)
    assert not passed and "compile is no_gain without its compile time" in problems
    report = load_report(folder)
    assert isinstance(report, ProfileReport)
    saved = next(o for o in report.fix_outcomes if o.fix == "compile")
    values = {"steps_per_s": report.baseline.steps_per_s, "optimizer": "AdamW"}
    outcome = decide(PlannedFix("compile", "host-bound", True, ""), saved.trials, values, [report.baseline])
    assert (outcome.status, outcome.compile_s, outcome.break_even_steps) == ("no_gain", 9.5674, None)
    plain["fix_outcomes"] = [{**o, "compile_s": outcome.compile_s} if o["fix"] == "compile" else o
                             for o in plain["fix_outcomes"]]  # fmt: skip
    assert gpu_check.compile_measured(plain) == []


def test_the_compile_trials_steps_ran_beside_torchs_starting_compile_pool(tmp_path: Path) -> None:
    """The recorded evidence that compute.compilepool and docs/how-it-measures.md cite (the
    window's handling of it is tested in tests/unit/measure/test_window.py): in both compile runs
    the trial's child process, torch's compile sidecar (its workers appear only near the end), used
    a core from the compile to past the timed steps, and the loop's batches (gathered on the host,
    spread over every core) waited 13.9x and 22.0x as long as the eager baseline's."""
    for name, busy_s, slower in (("compile_fix", 12.2, 13.9), ("compile_fix_pool", 11.8, 22.0)):
        report, _ = _run(name, tmp_path)
        outcome = next(o for o in report["fix_outcomes"] if o["fix"] == "compile")
        raw = outcome["trials"][0]["raw"]
        busy = [s["t_ms"] for s in raw["host_samples"] if s["workers_cpu_pct"] > 50 and s["workers"] >= 1]
        assert round((max(busy) - min(busy)) / 1e3, 1) == busy_s
        assert min(busy) < 0 < raw["shape"]["timed_s"] * 1e3 < max(busy)  # across the timed steps
        waits = statistics.median(s["data_wait_ms"] for s in raw["steps"])
        eager = statistics.median(s["data_wait_ms"] for s in report["baseline"]["raw"]["steps"])
        assert round(waits / eager, 1) == slower


def _slow_input(tmp_path: Path) -> tuple[ProfileReport, dict[str, Any]]:
    plain, folder = _run("slow_input", tmp_path)
    report = load_report(folder)
    assert isinstance(report, ProfileReport)
    values = dict(rulebook.diagnose(named_measurements(report.baseline), rulebook.rules_for([])).values)
    return report, values


def test_the_h200_batch_size_search_ran_as_many_candidates_as_the_estimate_now_counts(tmp_path: Path) -> None:
    """The slow-input run (stopped in its confirmation): the memory-aware batch-size search ran four
    fresh runs (115 s) against a budget of 149 GB for a peak of 92 MB reserved, where the progress line's
    estimate counted one ("about 41s left" at 50 s, console.log)."""
    report, values = _slow_input(tmp_path)
    searched = next(o for o in report.fix_outcomes if o.fix == "batch-size")
    walls = [t.raw.wall_s for t in searched.trials if t.raw is not None]
    assert (len(walls), round(sum(walls))) == (4, 115)
    assert (values["memory_budget_bytes"], values["peak_reserved_bytes"] // 10**6) == (149_310_013_440, 92)
    assert fixes.REGISTRY["batch-size"].expected_trials(values) == 4


def test_the_h200_amp_trial_on_a_loop_waiting_on_its_input_says_how_little_it_could_gain(
    tmp_path: Path,
) -> None:
    """amp, tf32 and pin-memory measured no gain while the loop waited on its input for 96% of
    each step: decided again from their trials, amp and tf32 say that 1.04x was the most any fix
    of the step's rest could show; pin-memory, a fix of the loader, does not."""
    report, values = _slow_input(tmp_path)
    assert round(values["data_wait_pct"], 1) == 96.1 and values["cuda_used"]
    said = {}
    for outcome in (o for o in report.fix_outcomes if o.fix in ("amp", "tf32", "pin-memory")):
        planned = next(p for p in report.plan if p.fix == outcome.fix)
        decided = decide(planned, outcome.trials, values, [report.baseline])
        said[outcome.fix] = (decided.status, decided.reason.removeprefix(outcome.reason))
    ceiling = "; the loop waited on its input for 96% of each step, so a fix of the rest could gain at most"
    assert said == {
        "amp": ("no_gain", f"{ceiling} 1.04x while the input stays as slow"),
        "tf32": ("no_gain", f"{ceiling} 1.04x while the input stays as slow"),
        "pin-memory": ("no_gain", ""),
    }
