"""The fixes the GPU rules propose: when each may be tried, how each searches and chooses, and
that each in-process switch really changes the run (on CPU where torch can: bf16 autocast and
fused optimizers run on the CPU; TF32 and cuDNN flags are no-ops there)."""

from __future__ import annotations

import gzip
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, ROOT, load_report, run_cli

from trainadvisor import fixes
from trainadvisor.analyze.run.summary import attach_trace
from trainadvisor.measure.runner import RunSpec, measure
from trainadvisor.profile.judge import loss_check
from trainadvisor.records import Overrides, RawRun


def _run(out: Path, label: str, runtime: dict[str, Any]) -> RawRun:
    spec = RunSpec(
        label=label, script=EXAMPLES / "small_batch.py", args=["--epochs", "1"], out_dir=out,
        warmup=2, steps=10, show_output=False, overrides=Overrides(runtime=runtime),
    )  # fmt: skip
    return measure(spec)


def test_runtime_switches_change_the_run_they_are_applied_to(tmp_path: Path) -> None:
    plain = _run(tmp_path, "plain", {})
    amp = _run(tmp_path, "amp", {"amp": "bf16"})
    fused = _run(tmp_path, "fused", {"fused_optimizer": True})
    assert plain.status == amp.status == fused.status == "window_complete"
    # Fused Adam on the CPU computes the same update: the losses agree to the strict tolerance.
    assert (plain.runtime["optimizer_fused"], fused.runtime["optimizer_fused"]) == (False, True)
    assert loss_check(plain, fused).equivalent is True
    traced = {
        label: gzip.open(tmp_path / str(run.trace_file)).read()
        for label, run in (("plain", plain), ("fused", fused))
    }
    assert b'"aten::_fused_adam_"' in traced["fused"] and b'"aten::_fused_adam_"' not in traced["plain"]
    # bf16 autocast changes the arithmetic: not bit-identical, within amp's 5% tolerance.
    check = loss_check(plain, amp, fixes.REGISTRY["amp"].loss_tolerance_rel)
    assert amp.runtime["amp_override"] == "bf16"
    assert check.max_rel_diff is not None and 1e-6 < check.max_rel_diff < 0.05
    assert check.equivalent is True and loss_check(plain, amp).equivalent is False
    assert all(not math.isnan(loss) for loss in amp.losses if loss is not None)


def test_a_site_finding_gets_its_lines_from_a_separate_run_traced_with_stacks(tmp_path: Path) -> None:
    """host-sync needs a GPU and waits for it (a CPU's .item() waits for nothing: no sync is
    counted); a user rule of the same id that holds on any step makes it fire on this CPU, where
    the trace still names the .item() calls' sites, so the sites run is exercised."""
    rules = tmp_path / "rules"
    rules.mkdir()
    shipped_rule = (ROOT / "rules" / "host-sync.toml").read_text()
    any_step = shipped_rule.replace("cuda_used and syncs_per_step >= 1", "sync_pct >= 0")
    (rules / "host-sync.toml").write_text(any_step)
    out = tmp_path / "report"
    result = run_cli(
        "profile", "--no-fix", "--rules", rules, "--warmup", "3", "--steps", "6", "--out", out,
        EXAMPLES / "host_tensors.py", "--epochs", "100", cwd=tmp_path,  # steps to outlast its windows
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "tracing 3 steps with Python stacks" in result.stderr
    report = load_report(out)
    [finding] = [f for f in report["findings"] if f["rule"] == "host-sync"]
    sites = next(e["value"] for e in finding["evidence"] if e["measurement"] == "sync_sites")
    assert "host_tensors.py:61 (.item() in main)" in sites.split("; ")
    assert (out / "traces" / "sites" / "trainadvisor.pt.trace.json.gz").is_file()
    # The measured baseline was traced without stacks.
    assert b"python_function" not in gzip.open(out / report["baseline"]["raw"]["trace_file"]).read()


def test_profile_on_cpu_reports_anomaly_detection_and_no_gpu_findings(tmp_path: Path) -> None:
    out = tmp_path / "report"
    # --no-fix: what is tested is the diagnosis (no fix turns anomaly detection off; the trials of
    # those that a CPU run may propose beside it, compile or workers, are tested on their own)
    result = run_cli(
        "profile", "--no-fix", "--warmup", "3", "--steps", "10", "--out", out,
        EXAMPLES / "small_batch.py", "--detect-anomaly", "--epochs", "20", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = load_report(out)
    # no GPU finding; compute-bound (the CPU's own MFU) may or may not fire beside it
    assert [f["rule"] for f in report["findings"]][0] == "anomaly-detection-on"
    assert {f["rule"] for f in report["findings"]} <= {"anomaly-detection-on", "compute-bound"}
    assert report["baseline"]["raw"]["runtime"]["anomaly_detection"] is True
    assert report["baseline"]["raw"]["runtime"]["optimizer"] == "Adam"
    assert "[high] anomaly-detection-on" in result.stdout


def test_sync_sites_name_the_line_of_the_users_call(tmp_path: Path) -> None:
    """On the CPU an .item() waits for nothing, but the trace still names where it is called:
    the same machinery names a GPU run's sync and host-made tensor sites."""
    spec = RunSpec(
        label="sites", script=EXAMPLES / "host_tensors.py", args=["--epochs", "1"], out_dir=tmp_path,
        warmup=2, steps=3, show_output=False, with_stack=True,
    )  # fmt: skip
    raw = measure(spec)
    assert b"python_function" in gzip.open(tmp_path / str(raw.trace_file)).read()
    values = attach_trace(raw, tmp_path, EXAMPLES / "host_tensors.py")
    # Also listed: .item() calls inside the DataLoader's code, attributed to the loop in main.
    assert "host_tensors.py:61 (.item() in main)" in values["sync_sites"].split("; ")
    assert values["cpu_tensor_copies_per_step"] == 0.0  # nothing is copied to a device on a CPU


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("host_tensors.py", ["--epochs", "1", "--samples", "1024"]),
        ("host_tensors.py", ["--epochs", "1", "--samples", "1024", "--on-device"]),
        ("small_batch.py", ["--epochs", "1", "--samples", "512"]),
        ("fp32_matmul.py", ["--epochs", "1", "--samples", "2048"]),
        ("memory_limit.py", ["--steps", "2", "--width", "256", "--size-gb", "0.05"]),
    ],
)
def test_examples_run_on_cpu(script: str, args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "loss" in result.stdout


def test_gradient_accumulation_and_fp16_loss_scaling_run_for_real(tmp_path: Path) -> None:
    """On the CPU, where torch has fp16 autocast and a GradScaler: the switches that replace the
    loop's optimizer step keep one trainadvisor step per update and leave training alike."""
    args = ["--epochs", "1", "--batch-size", "32"]
    plain = measure(RunSpec("plain", EXAMPLES / "small_batch.py", args, tmp_path, 2, 10, show_output=False))
    accumulated = measure(
        RunSpec(
            "accum", EXAMPLES / "small_batch.py", args, tmp_path, 2, 10, show_output=False,
            overrides=Overrides(
                {plain.loaders[0].created_at: {"batch_size": 16}}, runtime={"grad_accumulation": 2}
            ),
        )
    )  # fmt: skip
    fp16 = measure(
        RunSpec("fp16", EXAMPLES / "small_batch.py", args, tmp_path, 2, 10, show_output=False,
                overrides=Overrides(runtime={"amp": "fp16"}))
    )  # fmt: skip
    assert plain.status == accumulated.status == fp16.status == "window_complete"
    assert accumulated.loaders[0].overrides_applied == {"batch_size": 16}
    # 10 timed steps are 10 updates, each over two micro-batches of 16: 320 samples, as plain.
    timed = [s for s in accumulated.steps if not s.profiled]
    assert len(timed) == 10 and sum(s.samples or 0 for s in timed) == 320
    assert accumulated.runtime["optimizers"] == 1 and accumulated.runtime["lr_scheduler"] is False
    accumulated_check = loss_check(plain, accumulated, fixes.REGISTRY["grad-accumulation"].loss_tolerance_rel)
    assert accumulated_check.same_batches is False and accumulated_check.equivalent is True
    fp16_check = loss_check(plain, fp16, fixes.REGISTRY["amp"].loss_tolerance_rel)
    assert fp16_check.equivalent is True and fp16_check.max_rel_diff and fp16_check.max_rel_diff > 0
