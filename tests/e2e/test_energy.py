"""Energy per sample: NVML's energy counter read at each sample, or its power readings integrated
where a GPU has no counter, over the timed steps only; "not measured" with the reason otherwise.
The GPU side is the fake pynvml (tests/fakes/nvml) with scripted readings, placed in time by the
runner's own `attach_samples`; one CPU profile run says what a machine without a GPU reports."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, FAKES, epochs_outlasting, load_report
from support.energy import _device

from trainadvisor.analyze.run.summary import summarize
from trainadvisor.measure.config import WindowSize
from trainadvisor.measure.runner import RunSpec, measure
from trainadvisor.measure.settle import Settling


def test_a_fake_gpu_run_reads_the_counter_in_trainadvisors_process(
    nvml: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """End to end: the child believes in a GPU (FAKE_CUDA), the parent's sampler reads the fake
    counter, which grows at 250 W with the wall clock: the run's energy is 250 W over its timed
    steps, to within the time between a tick's stamp and its reading: microseconds on a quiet
    machine, 1.4 ms once beside a busy core (247.67 J for 0.992 s, 0.14% short); 2% (20 ms of
    a 1 s window) allows for that and still fails a window one 0.1 s tick too long or short."""
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "major": 8, "uuid": "2f5e8c3a-0d1b-4b7e-9a55-0c1d2e3f4a5b"}
    nvml.setenv("FAKE_CUDA", json.dumps(a100))
    nvml.setenv("FAKE_NVML", json.dumps({"devices": [_device(f"GPU-{a100['uuid']}", energy_mj="power")]}))
    paths = [str(FAKES / "cuda"), str(FAKES / "nvml"), os.environ.get("PYTHONPATH", "")]
    nvml.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    # a second of warm-up steps and of timed ones: the sampler (0.1 s ticks, started once the
    # child names its GPU) has readings around the timed steps even on a loaded machine
    size = WindowSize(min_time_s=1.0, settle=Settling(block_s=0.5, max_s=2.0))
    epochs = str(epochs_outlasting(size, 512))  # its 512 steps an epoch, at any speed
    spec = RunSpec(
        "gpu", EXAMPLES / "small_batch.py", ["--epochs", epochs, "--device", "cpu"],
        tmp_path / "out", warmup=3, steps=8, show_output=False, profile=False, size=size,
    )  # fmt: skip
    raw = measure(spec)
    assert raw.status == "window_complete", raw.error
    energy = summarize(raw).energy
    assert energy is not None and energy.method == "energy counter", energy
    assert energy.timed_s > 0.25 and energy.energy_j == pytest.approx(250.0 * energy.timed_s, rel=0.02)


@pytest.mark.xdist_group("slow_input_report")  # one run of it, on one worker
def test_a_cpu_profile_run_reports_energy_as_not_measured(
    slow_input_report: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = slow_input_report
    report = load_report(out)
    for run in ("baseline", "after"):
        assert report[run]["energy"]["method"] == "not measured"
        assert report[run]["energy"]["reason"] == "the run used no NVIDIA GPU"
        assert report[run]["energy"]["energy_j"] is None
    assert (
        "| GPU energy, timed steps | not measured: the run used no NVIDIA GPU | "
        "not measured: the run used no NVIDIA GPU | "
    ) in (out / "report.md").read_text().splitlines()
    assert "<td>GPU energy, timed steps</td>" in (out / "report.html").read_text()
