"""A script that dies of out-of-memory gets a diagnosis: the allocator's state at the failing point
(read from the snapshot and statistics recorded at a real out-of-memory on an H100), the lines that
allocated the largest live blocks, and the fixes it proposes tried in fresh runs. The GPU's
boundary is faked in child processes (tests/fakes/cuda) and answers with that H100's records."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import FAKES, SCRIPTS, gpu_run, load_report, run_cli
from support.oom import LARGEST, LIMIT_BYTES, LIVE_BYTES, RULES, SITES_TEXT, _artifacts

from trainadvisor import rulebook
from trainadvisor.analyze.run.summary import named_measurements, summarize
from trainadvisor.measure.runner import RunSpec, measure
from trainadvisor.report.mdtext import cell

H100 = {"name": "NVIDIA H100 80GB HBM3", "major": 9, "total_memory": 85017493504, "memory_fraction": 0.04}


def _spec(tmp_path: Path, script: str, warmup: int = 2) -> RunSpec:
    return RunSpec(
        "baseline", SCRIPTS / script, [], tmp_path / "out", warmup=warmup, steps=10, show_output=False
    )


def test_a_host_out_of_memory_is_recorded_by_the_child(tmp_path: Path) -> None:
    """torch's CPU allocator refuses a tensor larger than any address space: the child records
    the request, the line, and the optimizer's tensors exactly (Adam on a 256x256 Linear)."""
    raw = measure(_spec(tmp_path, "host_oom.py"))
    assert (raw.status, raw.exit_code) == ("script_failed", 1)
    assert raw.error is not None and "DefaultCPUAllocator: can't allocate memory" in raw.error
    facts = raw.runtime["oom"]
    assert (facts["kind"], facts["request_bytes"], facts["failed_site"]) == ("host", 2**62, "host_oom.py:15")
    params = 256 * 256 * 4 + 256 * 4
    # Adam's two moments per parameter, and a 4-byte step count for each of the two tensors
    assert facts["breakdown"] == {
        "parameters": params,
        "gradients": params,
        "optimizer_state": 2 * params + 8,
    }
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    limit = psutil.virtual_memory().total if soft == resource.RLIM_INFINITY else soft
    assert facts["limit_bytes"] == limit and facts["live_bytes"] > 0
    [finding] = rulebook.evaluate(RULES, named_measurements(summarize(raw)))
    assert finding.rule == "out-of-memory"
    assert finding.message.startswith(
        "The script died of out-of-memory in host memory: it asked for 4194304.00 TiB more with "
    )
    evidence = {e.measurement: e.value for e in finding.evidence}
    assert evidence["oom_request_bytes"] == 2**62 and evidence["oom_failed_site"] == "host_oom.py:15"
    assert evidence["oom_largest_sites"] is None  # the host keeps no allocation history


@pytest.fixture
def fake_h100(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Child processes believe in an H100 capped at 0.04 of its memory, whose allocator answers
    with the statistics and snapshot recorded at the out-of-memory; the scripts raise its error."""
    folder = gpu_run("artifacts")
    message, _, _ = _artifacts()
    log = tmp_path / "cuda.log"
    fake = {
        **H100, "log": str(log),
        "snapshot": str(folder / "memory_snapshot_oom.pickle"),
        "memory_stats": str(folder / "memory_stats_at_oom.json"),
    }  # fmt: skip
    monkeypatch.setenv("FAKE_CUDA", json.dumps(fake))
    monkeypatch.setenv("OOM_MESSAGE", message)
    paths = [str(FAKES / "cuda"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    return log


def _history_calls(log: Path) -> list[Any]:
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return [e["enabled"] for e in events if e["event"] == "record_memory_history"]


def test_a_cuda_out_of_memory_before_the_window_is_recorded_by_the_child(
    tmp_path: Path, fake_h100: Path
) -> None:
    """It dies in the warm-up: the allocator's history was on (never stopped: no step was timed),
    the snapshot names the lines, and torch's facts the window would have read are read at the
    failure (what planning the fixes needs: bf16, the peak reserved)."""
    raw = measure(_spec(tmp_path, "cuda_oom.py", warmup=5))
    assert (raw.status, raw.exit_code) == ("script_failed", 1)
    assert _history_calls(fake_h100) == ["all"]
    facts = raw.runtime["oom"]
    assert (facts["kind"], facts["device"], facts["failed_site"]) == ("cuda", 0, "cuda_oom.py:25")
    assert (facts["request_bytes"], facts["live_bytes"]) == (134217728, LIVE_BYTES)
    assert (facts["limit_bytes"], facts["limit_source"]) == (LIMIT_BYTES, "per-process memory fraction 0.04")
    assert facts["largest_sites"] == LARGEST and "breakdown" not in facts  # its parameters are on the CPU
    assert raw.runtime["bf16_supported"] is True and raw.runtime["optimizer"] == "SGD"
    memory = raw.runtime["cuda_memory"]
    assert memory["since"] == "the process started (it died before its window)"
    assert (memory["ooms"], memory["limit_bytes"]) == (1, LIMIT_BYTES)


def test_profile_diagnoses_an_out_of_memory_and_recommends_the_fix_that_lets_it_run(
    tmp_path: Path, fake_h100: Path
) -> None:
    """The baseline dies after its window opened (the history stopped there); the report shows
    the diagnosis, and `amp` (under which the script fits) is tried in a fresh run that gets
    through its window: recommended, with that run's figures."""
    out = tmp_path / "report"
    result = run_cli(
        "profile", "--trials", "restart", "--warmup", "2", "--steps", "10", "--max-warmup", "0",
        "--min-time", "0", "--out", out, SCRIPTS / "cuda_oom.py", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB" in result.stderr
    assert "It died of out-of-memory: the diagnosis, and the fixes tried, are in" in result.stderr
    assert result.stdout.startswith("trainadvisor: The script died of out-of-memory (high)")
    report = load_report(out)
    # the baseline's, then amp's and optimizer-foreach's trials: recorded through the warm-up,
    # stopped as timing began
    assert _history_calls(fake_h100) == ["all", None] * 3
    finding = report["findings"][0]
    assert finding["rule"] == "out-of-memory"
    assert finding["message"] == (
        "The script died of out-of-memory in GPU memory: it asked for 128.00 MiB more with 3.06 GiB "
        "already allocated, of the 3.17 GiB it may use (per-process memory fraction 0.04)."
    )
    evidence = {e["measurement"]: e["value"] for e in finding["evidence"]}
    assert evidence["oom_request_bytes"] == 134217728 and evidence["oom_live_bytes"] == LIVE_BYTES
    assert evidence["oom_failed_site"] == "cuda_oom.py:25" and evidence["oom_largest_sites"] == SITES_TEXT
    assert "memory-pressure" not in {f["rule"] for f in report["findings"]}  # superseded
    outcomes = {o["fix"]: o for o in report["fix_outcomes"]}
    amp = outcomes["amp"]
    assert (amp["status"], amp["mode"]) == ("recommended", "restart")
    assert amp["reason"].startswith(
        "without it the script died of out-of-memory; with it the run got through its window: "
    )
    assert amp["trials"][0]["status"] == "measured" and amp["settings"]["runtime"] == {"amp": "bf16"}
    assert outcomes["grad-accumulation"]["status"] == "not_applicable"  # no DataLoader to divide
    assert any(
        n.startswith("The script died of out-of-memory, so there is no speed") for n in report["notes"]
    )
    markdown = (out / "report.md").read_text()
    assert cell(f"Failed at: cuda_oom.py:25 Largest live allocations: {SITES_TEXT}") in markdown
