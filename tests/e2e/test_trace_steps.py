"""Steps found in traces as users record them (issue 14, items 1, 5, 6): our own CPU traces of
each way of profiling (tests/data/traces, made by scripts/record_traces.py) and real GPU traces
recorded by others (../shared/traces). Exact figures of the stored files."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli, shared_trace
from support.trace_steps import OWN

from trainadvisor.analyze.trace.analysis import analyze_trace


def test_a_gpu_only_trace_gets_a_device_breakdown(tmp_path: Path) -> None:
    """TraceLens' MI210 GPU-only trace: kernels and HIP runtime calls, no CPU ops."""
    path = shared_trace("more/tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz")
    a = analyze_trace(path)
    assert not a.host_events and a.step_method.startswith("no host events (a GPU-only trace)")
    assert round(a.steps[0].dur_us, 3) == 6024.766
    assert {k: round(v, 2) for k, v in a.breakdown_pct.items() if v} == {
        "kernel": 88.69,
        "runtime": 2.41,
        "idle": 8.9,
    }
    assert a.loop == "training" and a.loop_evidence == "backward kernels"
    result = run_cli("analyze", "--out", tmp_path / "r", path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "holds no host (CPU) events" in " ".join(result.stdout.split())


def test_analyze_says_how_steps_were_found_and_that_a_loop_is_not_training(tmp_path: Path) -> None:
    result = run_cli(
        "analyze",
        "--out",
        tmp_path / "r",
        OWN / "inference.json.gz",
        OWN / "no_schedule_workers0.json.gz",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert (
        "note: Steps of inference.json.gz: DataLoader __next__ calls: 6 iterations, the first "
        "(warm-up) set apart." in text
    )
    assert "inference.json.gz is not a training loop (no backward pass and no optimizer step)" in text
    assert (
        "[high] data-stall: no_schedule_workers0.json.gz: The loop waited for its next batch for 93%" in text
    )
