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
    """What the window's warm-up now leaves out (compute.compilepool): in both compile runs the
    trial's only child, torch's compile sidecar, used a core from the compile to past the timed
    steps, and the loop's batches (gathered on the host, spread over every core) waited about 15x
    as long as the eager baseline's."""
    for name, busy_s in (("compile_fix", 12.2), ("compile_fix_pool", 11.8)):
        report, _ = _run(name, tmp_path)
        outcome = next(o for o in report["fix_outcomes"] if o["fix"] == "compile")
        raw = outcome["trials"][0]["raw"]
        busy = [s["t_ms"] for s in raw["host_samples"] if s["workers_cpu_pct"] > 50 and s["workers"] >= 1]
        assert round((max(busy) - min(busy)) / 1e3, 1) == busy_s
        assert min(busy) < 0 < raw["shape"]["timed_s"] * 1e3 < max(busy)  # across the timed steps
        waits = statistics.median(s["data_wait_ms"] for s in raw["steps"])
        eager = statistics.median(s["data_wait_ms"] for s in report["baseline"]["raw"]["steps"])
        assert waits > 10 * eager, (waits, eager)
