"""A script that dies of out-of-memory gets a diagnosis: the allocator's state at the failing point
(read from the snapshot and statistics recorded at a real out-of-memory on an H100), the lines that
allocated the largest live blocks, and the fixes it proposes tried in fresh runs. The GPU's
boundary is faked in child processes (tests/fakes/cuda) and answers with that H100's records."""

from __future__ import annotations

import json
import os
import pickle
import resource
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import ROOT, SCRIPTS, gpu_run, load_report, run_cli

from trainadvisor import rulebook
from trainadvisor.analyze.run.summary import named_measurements, summarize
from trainadvisor.measure.runner import RunSpec, measure
from trainadvisor.memory import oom
from trainadvisor.report.mdtext import cell

FAKES = ROOT / "tests" / "fakes"
H100 = {"name": "NVIDIA H100 80GB HBM3", "major": 9, "total_memory": 85017493504, "memory_fraction": 0.04}
# torch.cuda.set_per_process_memory_fraction(0.04) on the H100: the allocator's limit
LIMIT_BYTES = int(0.04 * 85017493504)
LIVE_BYTES = 3290632704  # allocated_bytes.all.current at the error
LARGEST = [
    {"site": "residual_stack.py:16", "bytes": 2417491968, "blocks": 47, "holds": "",
     "stack": ["residual_stack.py:16", "residual_stack.py:27", "train_oom.py:20"]},
    {"site": "train_oom.py:18", "bytes": 805999104, "blocks": 146, "holds": "", "stack": ["train_oom.py:18"]},
    {"site": "train_oom.py:19", "bytes": 33587200, "blocks": 2, "holds": "", "stack": ["train_oom.py:19"]},
]  # fmt: skip
SITES_TEXT = (
    "residual_stack.py:16 (2.25 GiB in 47 blocks, from residual_stack.py:27 < train_oom.py:20); "
    "train_oom.py:18 (768.66 MiB in 146 blocks); train_oom.py:19 (32.03 MiB in 2 blocks)"
)
RULES = rulebook.rules_for([])


def _artifacts() -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The H100's error text (without its type), statistics and snapshot at the error."""
    folder = gpu_run("artifacts")
    message = (folder / "oom_message.txt").read_text().strip().removeprefix("torch.OutOfMemoryError: ")
    stats = json.loads((folder / "memory_stats_at_oom.json").read_text())
    snapshot = pickle.loads((folder / "memory_snapshot_oom.pickle").read_bytes())
    return message, stats, snapshot


def test_the_h100_out_of_memory_is_read_at_its_failing_point() -> None:
    message, stats, snapshot = _artifacts()
    assert oom.kind_of("OutOfMemoryError", message) == "cuda"
    # the message's figures, as rounded as it writes them ("3.17 GiB allowed")
    assert oom.message_figures(message) == {
        "request_bytes": 128 * 2**20,
        "device_total_bytes": round(79.18 * 2**30),
        "device_free_bytes": round(75.38 * 2**30),
        "process_used_bytes": round(3.79 * 2**30),
        "allowed_bytes": round(3.17 * 2**30),
        "allocated_bytes": round(3.06 * 2**30),
        "reserved_unallocated_bytes": round(1.81 * 2**20),
    }
    facts = oom.summarise_cuda(message, stats, snapshot, device=0)
    # exact where the statistics and the allocator's record of the refused request have it
    assert facts["request_bytes"] == 134217728 and facts["request_site"] == "residual_stack.py:16"
    assert (facts["live_bytes"], facts["reserved_bytes"]) == (LIVE_BYTES, 3292528640)
    assert facts["snapshot_live_bytes"] == LIVE_BYTES  # the snapshot's live blocks add up to it
    assert (facts["limit_bytes"], facts["limit_source"]) == (
        round(3.17 * 2**30),
        "allowed, as the error states",
    )
    # 71% of what was live came from one line of the model's forward, called from the loop's
    assert facts["largest_sites"] == LARGEST
    assert facts["unattributed_bytes"] == 33554432  # one block whose stack holds no Python frame
    table = oom.oom_measurements(facts)
    assert table["oom_largest_sites"] == SITES_TEXT
    assert table["oom_summary"] == (
        "it asked for 128.00 MiB more with 3.06 GiB already allocated, of the 3.17 GiB it may use "
        "(allowed, as the error states)"
    )
    [finding] = rulebook.evaluate(RULES, table)
    assert (finding.rule, finding.severity) == ("out-of-memory", "high")
    assert finding.fixes == ["activation-checkpointing", "grad-accumulation", "amp", "optimizer-foreach"]


def test_the_optimizer_s_storages_say_what_a_site_holds() -> None:
    """Blocks at the addresses of the optimizer's tensors are parameters (here: those the model
    put on the GPU at train_oom.py:18); the rest of what was live is activations and temporaries."""
    message, stats, snapshot = _artifacts()
    blocks = oom.live_blocks(snapshot, 0)
    owned = {b.address: ("parameters", b.size_bytes) for b in blocks if b.stack[:1] == ("train_oom.py:18",)}
    facts = oom.summarise_cuda(
        message, stats, snapshot, 0, owned, (LIMIT_BYTES, "per-process memory fraction 0.04")
    )
    assert facts["breakdown"] == {"parameters": 805999104, "other": LIVE_BYTES - 805999104}
    assert [s["holds"] for s in facts["largest_sites"]] == ["other", "parameters", "other"]
    table = oom.oom_measurements(facts)
    assert table["oom_parameters_pct"] == pytest.approx(100 * 805999104 / LIVE_BYTES)
    assert "train_oom.py:18 (768.66 MiB in 146 blocks, parameters)" in table["oom_largest_sites"]
    assert table["oom_limit_bytes"] == LIMIT_BYTES


def test_a_healthy_snapshot_has_no_failed_request() -> None:
    snapshot = pickle.loads(gpu_run("artifacts/memory_snapshot_ok.pickle").read_bytes())
    facts = oom.summarise_cuda("", {}, snapshot, 0)
    assert facts["request_bytes"] is None and "request_site" not in facts
    assert facts["snapshot_live_bytes"] == 1696974848 and facts["unattributed_bytes"] == 436556288
    assert facts["largest_sites"][0] == {
        "site": "train_oom.py:8", "bytes": 806020096, "blocks": 149, "holds": "", "stack": ["train_oom.py:8"],
    }  # fmt: skip


def test_errors_of_older_torch_and_of_host_memory() -> None:
    old = (
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB "
        "already allocated; 3.44 MiB free; 14.74 GiB reserved in total by PyTorch)"
    )
    assert oom.kind_of("RuntimeError", old) == "cuda"
    assert oom.message_figures(old) == {
        "request_bytes": 20 * 2**20,
        "device_total_bytes": round(15.78 * 2**30),
        "device_free_bytes": round(3.44 * 2**20),
        "allocated_bytes": round(14.56 * 2**30),
        "reserved_bytes": round(14.74 * 2**30),
    }
    cpu = (
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 4611686018427387904 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert oom.kind_of("RuntimeError", cpu) == "host"
    assert oom.message_figures(cpu) == {"request_bytes": 2**62}
    assert oom.kind_of("MemoryError", "") == "host"
    assert oom.kind_of("RuntimeError", "boom at step 5") is None
    assert oom.kind_of("ValueError", "CUDA error: out of bounds") is None
    # the driver's and the libraries' (real messages of torch 2.x): out of memory all the same
    assert (
        oom.kind_of("RuntimeError", "CUDA error: out of memory\nCUDA kernel errors might be asynchronously")
        == "cuda"
    )
    assert oom.kind_of("AcceleratorError", "CUDA error: out of memory") == "cuda"
    assert (
        oom.kind_of(
            "RuntimeError", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
        )
        == "cuda"
    )
    assert oom.kind_of("RuntimeError", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED") == "cuda"
    assert oom.kind_of("RuntimeError", "CUDA error: an illegal memory access was encountered") is None


def test_user_frames_are_outside_packages_and_the_standard_library() -> None:
    torch_dir = "/opt/venv/lib/python3.12/site-packages/torch/"
    assert oom.is_user_file("train_oom.py") and oom.is_user_file("/home/me/project/model.py")
    assert not oom.is_user_file(torch_dir + "nn/modules/module.py")
    assert not oom.is_user_file("/usr/lib/python3.12/runpy.py")
    assert not oom.is_user_file("??") and not oom.is_user_file("CUDACachingAllocator.cpp")
    assert not oom.is_user_file("<frozen runpy>")
    assert not oom.is_user_file(
        "/src/trainadvisor/trainadvisor/measure/child.py", ("/src/trainadvisor/trainadvisor/",)
    )


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
