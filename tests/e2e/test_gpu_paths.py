"""The CUDA-only paths, run on a CPU: the boundary is faked (torch.cuda in a child process through
tests/fakes/cuda, NVML through tests/fakes/nvml), trainadvisor's own logic is not. Each test
fails on the code before issue 11's fixes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import EXAMPLES, FAKES, SCRIPTS, SETTLE_CAP, SHORT, kept_or_loaded, load_report, run_cli

from trainadvisor.analyze.run.disturbance import gpu_intruders, gpu_note
from trainadvisor.analyze.run.summary import summarize
from trainadvisor.measure.runner import RunSpec, measure
from trainadvisor.records import Overrides, RawRun, StepRecord

A100 = {"name": "NVIDIA A100-SXM4-80GB", "major": 8, "uuid": "2f5e8c3a-0d1b-4b7e-9a55-0c1d2e3f4a5b"}


NVML_A100 = {
    "devices": [
        {"uuid": "GPU-2f5e8c3a-0d1b-4b7e-9a55-0c1d2e3f4a5b", "util": 71, "used": 3e9, "total": 8e10,
         "power_mw": 250000, "sm_clock": 1410},
    ]
}  # fmt: skip


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Child processes believe in an A100 (FAKE_CUDA); this process's NVML is the stand-in.
    Returns the log of the child's synchronize / reset / event calls."""
    log = tmp_path / "cuda.log"
    monkeypatch.setenv("FAKE_CUDA", json.dumps({**A100, "alloc_retries_before": 3, "log": str(log)}))
    monkeypatch.setenv("FAKE_NVML", json.dumps(NVML_A100))
    paths = [str(FAKES / "cuda"), str(FAKES / "nvml"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    return log


def _log(path: Path) -> list[str]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_gpu_run_measures_its_window_edges_memory_and_device(tmp_path: Path, fake_gpu: Path) -> None:
    """The non-blocking copy patch installs (it crashed on `Tensor.__dict__['to']`); the window
    starts and ends with a synchronize, steps are timed by CUDA events too, the peaks are reset at
    the window's start and the allocator retries counted from there; the profiler asks for CUDA
    activity after one warmup step; NVML samples the GPU the child named, by UUID."""
    spec = RunSpec(
        "gpu", EXAMPLES / "small_batch.py", ["--epochs", "1", "--device", "cpu"], tmp_path / "out",
        warmup=3, steps=8, show_output=False, overrides=Overrides(non_blocking_h2d=True),
    )  # fmt: skip
    raw = measure(spec)
    assert raw.status == "window_complete", raw.error
    assert raw.runtime["cuda_used"] is True and raw.device is not None and raw.device.gpu_name == A100["name"]
    memory = raw.runtime["cuda_memory"]
    assert (memory["device"], memory["alloc_retries"], memory["ooms"]) == (
        0,
        0,
        0,
    )  # 3 retries before the window
    timed = [s for s in raw.steps if not s.profiled]
    assert len(timed) == 8 and all(s.gpu_ms is not None and s.gpu_ms > 0 for s in timed)
    assert all(s.gpu_ms is None for s in raw.steps if s.profiled)
    events = _log(fake_gpu)
    first_sync = events.index("synchronize")
    assert events[first_sync + 1] == "reset_peak_memory_stats"  # the peaks start with the window
    assert events.count("event_record") == 9  # the window's start and each timed step's end
    assert events.count("synchronize") >= 3  # start, before the last timed step's clock, reading events
    assert "profiler_cuda_requested" in events
    assert len([s for s in raw.steps if s.profiled]) == 1 + 8  # the profiler's warmup step + 8 traced
    assert raw.nvml_status == "sampled GPU 0" and raw.gpu_samples
    assert {s.device for s in raw.gpu_samples} == {"GPU 0"} and raw.gpu_samples[0].util_pct == 71.0
    # MFU against the datasheet peak of the card by its CUDA name, in the dtype the matmuls ran
    # in (fp32, TF32 as the script left it); the step's memory from the allocator's statistics
    use = summarize(raw).utilization
    tf32 = raw.runtime["tf32_enabled"]
    assert use is not None and use.peak_how == "datasheet" and use.peak_dtype == ("tf32" if tf32 else "fp32")
    assert use.peak_tflops == (156.0 if tf32 else 19.5) and use.mfu_pct is not None
    assert raw.runtime["memory"]["peak_source"] == "the CUDA allocator's peak over the step"


def test_fp16_with_a_scheduler_and_clipping_runs_under_profile_trials(tmp_path: Path) -> None:
    norms = tmp_path / "norms.txt"
    spec = RunSpec(
        "fp16", SCRIPTS / "scheduled_clipped.py", ["--norms", str(norms)], tmp_path,
        warmup=2, steps=5, show_output=False, overrides=Overrides(runtime={"amp": "fp16"}),
    )  # fmt: skip
    raw = measure(spec)
    assert raw.status == "window_complete", raw.error
    assert raw.runtime["lr_scheduler"] is True
    seen = [float(line) for line in norms.read_text().split()]
    # fp16 overflows at the first scales (inf: those updates are skipped, the scale lowered);
    # the rest are the true norms (4-7 here), not 65536 times them
    finite = [n for n in seen if math.isfinite(n)]
    assert len(seen) >= 13 and len(finite) >= 8 and max(finite) < 100


def _in_child(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_tf32_is_read_and_switched_in_the_api_the_script_uses() -> None:
    """After `fp32_precision = "tf32"` (torch >= 2.9) reading the legacy flags raises; facts are
    read from the new API and the switch writes it, and both come back as they were."""
    new = _in_child(
        "import torch\n"
        "from trainadvisor.fixes import flags\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "torch.backends.cudnn.conv.fp32_precision = 'ieee'\n"
        "restore = flags.switch_flags(tf32=True, cudnn_benchmark=True)\n"
        "on = (flags.tf32_api(), flags.tf32_enabled(), flags.float32_matmul_precision(),\n"
        "      torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.benchmark)\n"
        "restore()\n"
        "print(on, torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.benchmark,\n"
        "      flags.tf32_api())\n"
    )
    assert new == "('new', True, 'high', 'tf32', True) ieee False new"
    legacy = _in_child(
        "import torch\n"
        "from trainadvisor.fixes import flags\n"
        "restore = flags.switch_flags(tf32=True)\n"
        "on = (flags.tf32_api(), torch.backends.cuda.matmul.allow_tf32, flags.float32_matmul_precision())\n"
        "restore()\n"
        "print(on, torch.backends.cuda.matmul.allow_tf32)\n"
    )
    assert legacy == "('legacy', True, 'high') False"


def test_a_script_on_the_new_tf32_api_is_profiled_unharmed(tmp_path: Path) -> None:
    # a window of exactly its steps, which the script's 40 hold with its traced ones: one run,
    # not a second fitted into them (its tiny steps never settled within 400)
    result = run_cli(
        "profile", "--warmup", "2", "--steps", "5", "--min-time", "0", "--max-warmup", "0", "--no-fix",
        "--out", tmp_path / "r", SCRIPTS / "scheduled_clipped.py", "--tf32-new-api", "--steps", "40",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runtime = load_report(tmp_path / "r")["baseline"]["raw"]["runtime"]
    assert (runtime["tf32_api"], runtime["float32_matmul_precision"]) == ("new", "high")


@pytest.mark.long_run
def test_profile_on_a_gpu_measures_loss_noise_and_keeps_the_workers_fix(
    tmp_path: Path, fake_gpu: Path
) -> None:
    """The whole command where a GPU is believed: the baseline's seeded steps run twice to set
    the loss tolerance above the GPU's noise (none here: the arithmetic runs on the CPU), the
    workers fix's trials pin memory and copy without blocking (the patch that crashed every CUDA
    run), NVML samples the GPU the script named, and the report shows both clocks. The workers fix
    alone (--fix): the larger batches the fake A100's free memory proposes, each a fresh run, are
    tested in tests/e2e/test_memory_fixes.py."""
    result = run_cli(
        "profile", "--fix", "dataloader-workers", "--warmup", "3", "--steps", "10", *SHORT, *SETTLE_CAP,
        "--max-workers", "4", "--out", tmp_path / "r", EXAMPLES / "slow_input_mnist.py",
        "--samples", "200000", "--latency-ms", "2", "--device", "cpu",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "running the baseline's seeded steps again to measure the GPU's loss noise" in result.stderr
    report = load_report(tmp_path / "r")
    assert report["loss_noise_rel"] == 0.0
    noise = "Two identical runs of the baseline's seeded steps differed in loss by up to 0%"
    assert any(note.startswith(noise)
               for note in report["details"])  # fmt: skip
    [workers] = [o for o in report["fix_outcomes"] if o["fix"] == "dataloader-workers"]
    # kept (4.10x alone, 4.45x beside one busy core, 4.08x beside three: at 2 ms a sample the
    # baseline waits on sleeps that a busy core does not slow; at 0.5 ms, beside a busy core and the
    # suite's other tests, 4 workers read 29.1 steps/s, the windows left nothing for a confirmation
    # run to judge and no loss noise was measured); or, where the report names other processes' CPU
    # in its windows or the machine's speed changing between its runs (a quiet CI run's other tests
    # beside it once left it open), inconclusive with no change given: issue 36's answer, not this
    # test's matter
    held, shown = kept_or_loaded(report, "dataloader-workers")
    assert held, shown
    assert all(t["overrides"]["non_blocking_h2d"] for t in workers["trials"])
    assert report["baseline"]["raw"]["nvml_status"] == "sampled GPU 0"
    assert report["baseline"]["gpu_step_time_ms"]["median"] > 0
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "| GPU time per step, median (CUDA events) |" in markdown


def test_advise_on_a_gpu_records_what_profile_records(tmp_path: Path, fake_gpu: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "from trainadvisor import advise\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "@advise(warmup=2, steps=4, out=sys.argv[1], min_time=0, max_warmup=None)\n"
        "def step(x):\n"
        "    loss = model(x).pow(2).mean()\n"
        "    optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
        "    return loss\n"
        "for _ in range(12):\n"
        "    step(torch.ones(2, 4))\n"
    )
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "r")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = load_report(tmp_path / "r")
    raw = report["baseline"]["raw"]
    assert raw["runtime"]["cuda_memory"]["alloc_retries"] == 0 and raw["nvml_status"] == "sampled GPU 0"
    assert len([s for s in raw["steps"] if s["gpu_ms"] is not None]) == 4
    assert "profiler_cuda_requested" in _log(fake_gpu)


def test_nvml_names_other_processes_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes on the run's GPU that are neither the run's nor trainadvisor's, among those this
    machine shows (a host pid from outside a container matches nothing and is not counted)."""
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    from trainadvisor.measure.nvml import NvmlSampler

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ours, absent = 424242, 2**22 + 17  # the run's rank; a pid no process here has
        processes = [[ours, 1 << 30], [other.pid, 2 << 30], [absent, 1 << 20], [os.getpid(), 0]]
        device = {"uuid": "GPU-aaaa", "util": 90, "used": 3, "total": 8, "power_mw": 1, "sm_clock": 1}
        monkeypatch.setenv("FAKE_NVML", json.dumps({"devices": [{**device, "processes": processes}]}))
        sampler = NvmlSampler()
        sampler.add("GPU 0", {"uuid": "aaaa", "index": 0})
        [(_, sample)] = sampler.tick(ours={ours})
        assert sample.other_pids == [other.pid]
        sampler.close()
    finally:
        other.kill()
        other.wait()
    raw = RawRun(
        "baseline", "window_complete", 0, None, 1, 1, 0, 2, [StepRecord(1, 0.0, 10.0, 0.0)], [], None
    )
    late = replace(sample, t_ms=11.0, other_pids=[99])  # after the window: not counted
    raw.gpu_samples = [replace(sample, t_ms=5.0), replace(sample, t_ms=9.0, other_pids=[77, other.pid]), late]
    assert gpu_intruders(raw) == {"GPU 0": sorted([77, other.pid])}
    assert gpu_note({"the baseline window": {"GPU 0": [77]}, "a trial": {}}) == (
        "Other processes ran on the GPU during the baseline window (GPU 0: pid 77): kernels of theirs "
        "share the GPU with the script's, so those timings may be disturbed; measure again with the GPU "
        "to itself."
    )
