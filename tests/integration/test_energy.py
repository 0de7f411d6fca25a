"""Energy per sample: NVML's energy counter read at each sample, or its power readings integrated
where a GPU has no counter, over the timed steps only; "not measured" with the reason otherwise.
The GPU side is the fake pynvml (tests/fakes/nvml) with scripted readings, placed in time by the
runner's own `attach_samples`; one CPU profile run says what a machine without a GPU reports."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from typing import Any

import pytest
from support.energy import _device

from trainadvisor.analyze.run.energy import run_energy
from trainadvisor.analyze.run.summary import summarize
from trainadvisor.measure.runner import attach_samples
from trainadvisor.measure.sampling import Sampler
from trainadvisor.records import GpuSample, ProfileReport, RawRun, StepRecord
from trainadvisor.records.energy import Energy
from trainadvisor.report.render import energy_cell, render_html, render_markdown
from trainadvisor.resources import templates_dir

T0 = 1_800_000_000.0  # the window's start, unix s: steps of 1/8 s from it are exact in floats


def _sampled(nvml: pytest.MonkeyPatch, devices: list[dict[str, Any]], at_s: list[float]) -> Sampler:
    """A sampler that read the fake's devices (the n-th named "rank n (GPU n)") once at each of
    `at_s`, seconds from the window's start."""
    from trainadvisor.measure.nvml import NvmlSampler

    nvml.setenv("FAKE_NVML", json.dumps({"devices": devices}))
    reader = NvmlSampler()
    for i, device in enumerate(devices):
        reader.add(
            f"rank {i} (GPU {i})" if len(devices) > 1 else "GPU 0", {"uuid": device["uuid"], "index": i}
        )
    sampler = Sampler(os.getpid())
    sampler.gpu = [(T0 + t, sample) for t in at_s for _, sample in reader.tick()]
    sampler.nvml_status = reader.status(len(sampler.gpu))
    reader.close()
    return sampler


def _raw(steps: int = 10, step_ms: float = 300.0, samples: int = 64, rank: int | None = None) -> RawRun:
    """A run whose timed steps start at T0, one step every `step_ms`, `samples` per batch."""
    records = [StepRecord(i + 3, i * step_ms, step_ms, 0.0, samples=samples) for i in range(steps)]
    return RawRun(
        "baseline", "window_complete", 0, None, 3, steps, 0, steps + 3, records, [], None,
        window_start_unix_s=T0, runtime={"cuda_used": True}, rank=rank,
    )  # fmt: skip


def _measured(sampler: Sampler, raw: RawRun | None = None) -> Energy:
    raw = raw or _raw()
    attach_samples(raw, sampler)
    return run_energy(raw)


def test_the_energy_counter_gives_the_joules_of_the_timed_steps() -> None:
    """The H100's counter read 1,863,082 mJ over 3.01 s of bf16 matmuls (619 W): read at the
    timed steps' edges, that is their energy, per step and per sample of a batch of 64."""
    readings = [(0.0, 41_022_517_333), (3010.0, 41_022_517_333 + 1_863_082)]
    sample = GpuSample(0.0, 99.0, None, None, 699.0, None, device="GPU 0")
    raw = _raw(steps=7, step_ms=430.0)
    raw.gpu_samples = [replace(sample, t_ms=t, energy_mj=mj) for t, mj in readings]
    energy = run_energy(raw)
    assert energy == Energy(
        "energy counter", "", 1863.082, 1863.082 / 7, 1863.082 / 7 / 64, ["GPU 0"], 3.01, [0.0, 3010.0]
    )
    assert round(energy.energy_j / energy.timed_s) == 619  # type: ignore[operator]
    # 3 s of timed steps: NVML's counter moves every ~100 ms, a 3% share of them
    assert energy_cell(energy) == "4.16 J/sample, 266 J/step (energy counter; over 3 s, good to about 3%)"


def test_the_counter_is_read_at_each_sample_and_interpolated_at_the_edges(nvml: pytest.MonkeyPatch) -> None:
    """Readings 1/8 s before and after the timed steps place their edges (500 W before the first
    reading inside, 600 W after the last); the idle reading before and the busy one after them
    are not counted: 0.875 s x 500 W + 1 s x 700 W + 1.125 s x 600 W."""
    counter = [9_930_000, 10_000_000, 10_500_000, 11_200_000, 12_100_000, 13_600_000]
    at_s = [-1.125, -0.125, 0.875, 1.875, 3.375, 4.375]  # 70 W idle, then 500, 700, 600, 1500 W
    energy = _measured(_sampled(nvml, [_device("GPU-a", energy_mj=counter)], at_s))
    assert (energy.method, energy.energy_j, energy.j_per_step) == ("energy counter", 1812.5, 181.25)
    assert energy.j_per_sample == 181.25 / 64 and energy.readings_ms == [-125.0, 3375.0]


def test_without_a_counter_the_power_readings_are_integrated(nvml: pytest.MonkeyPatch) -> None:
    """A GPU older than Volta has no counter (NotSupported): its power, linear between readings
    (400 W at the start, interpolated; 700 W; 400 W at the end), over the 3 s of timed steps:
    0.5 s x 550 W + 1 s x 700 W + 1.5 s x 550 W."""
    power_mw = [100_000, 700_000, 700_000, 300_000]
    energy = _measured(_sampled(nvml, [_device("GPU-a", power_mw=power_mw)], [-0.5, 0.5, 1.5, 3.5]))
    assert energy == Energy("sampled power", "", 1800.0, 180.0, 2.8125, ["GPU 0"], 3.0, [-500.0, 3500.0])
    assert energy_cell(energy) == "2.81 J/sample, 180 J/step (sampled power)"


def test_a_window_shorter_than_the_sampling_interval_takes_the_readings_around_it(
    nvml: pytest.MonkeyPatch,
) -> None:
    """At GPU speed a window of 4 steps can last 62.5 ms, between two readings 0.125 s apart: its
    energy is their interval's average power (620 W) over its time. Readings that miss an edge
    by more than the interval between them place nothing."""
    counter = [1_000_000, 1_077_500]
    sampler = _sampled(nvml, [_device("GPU-a", energy_mj=counter)], [-0.03125, 0.09375])
    energy = _measured(sampler, _raw(steps=4, step_ms=15.625))
    assert (energy.energy_j, energy.readings_ms) == (0.0625 * 620, [-31.25, 93.75])
    late = _measured(_sampled(nvml, [_device("GPU-a", energy_mj=counter)], [0.25, 0.375]))
    why = "GPU 0: too few NVML readings around the timed steps (3 s)"
    assert late == Energy("not measured", why, timed_s=3.0)


def test_a_reset_counter_falls_back_to_the_power_readings(nvml: pytest.MonkeyPatch) -> None:
    """The counter starts again from 0 when the driver reloads: its difference is no energy."""
    sampler = _sampled(nvml, [_device("GPU-a", energy_mj=[5_000_000, 200])], [0.0, 3.0])
    assert _measured(sampler).method == "sampled power"
    assert _measured(sampler).energy_j == 750.0  # 250 W over 3 s


def test_every_gpu_of_a_torchrun_run_is_counted_per_sample_of_all_ranks(nvml: pytest.MonkeyPatch) -> None:
    """Two ranks of 64 samples a step: 1,800 J + 2,400 J over 10 steps of 128 samples; a GPU
    without a counter makes the sum a sampled figure; a rank's GPU NVML did not sample makes
    it not measured (a sum of fewer GPUs would pass for the run's)."""
    devices = [
        _device("GPU-a", energy_mj=[1_000_000, 2_800_000]),
        _device("GPU-b", energy_mj=[7_000_000, 9_400_000]),
    ]
    raw = _raw()
    raw.ranks = [_raw(rank=0), _raw(rank=1)]
    energy = _measured(_sampled(nvml, devices, [0.0, 3.0]), raw)
    assert (energy.method, energy.energy_j, energy.j_per_step) == ("energy counter", 4200.0, 420.0)
    assert energy.j_per_sample == 420.0 / 128 and energy.devices == ["rank 0 (GPU 0)", "rank 1 (GPU 1)"]
    assert (
        energy_cell(energy)
        == "3.28 J/sample, 420 J/step (energy counter, 2 GPUs; over 3 s, good to about 3%)"
    )

    devices[1] = _device("GPU-b", power_mw=[800_000, 800_000])  # no counter: 800 W x 3 s
    assert _measured(_sampled(nvml, devices, [0.0, 3.0]), raw).method == "sampled power"
    assert _measured(_sampled(nvml, devices, [0.0, 3.0]), raw).energy_j == 1800.0 + 2400.0

    raw.ranks.append(_raw(rank=2))
    energy = _measured(_sampled(nvml, devices, [0.0, 3.0]), raw)
    assert (energy.method, energy.energy_j) == ("not measured", None)
    assert energy.reason.startswith("NVML sampled 2 of the 3 GPUs the ranks trained on (sampled rank 0")


def test_a_gpu_without_counter_or_power_is_not_measured_and_says_why(nvml: pytest.MonkeyPatch) -> None:
    device = _device("GPU-a", energy_mj=[1, 2], unsupported=["energy", "power"])
    energy = _measured(_sampled(nvml, [device], [0.0, 1.5, 3.0]))
    why = "GPU 0: NVML read neither its energy counter nor its power draw"
    assert energy == Energy("not measured", why, timed_s=3.0)
    assert energy_cell(energy) == f"not measured: {why}"


@pytest.mark.parametrize(
    ("init_error", "reason"),
    [
        ("NVMLError_LibraryNotFound", "no NVIDIA driver library (libnvidia-ml.so) on this machine"),
        ("NVMLError_DriverNotLoaded", "the NVIDIA driver is installed but not loaded"),
        (None, "nvidia-ml-py is not installed"),
    ],
)
def test_without_nvml_it_is_not_measured_and_says_why(
    nvml: pytest.MonkeyPatch, init_error: str | None, reason: str
) -> None:
    from trainadvisor.measure.nvml import NvmlSampler

    if init_error is None:
        nvml.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    nvml.setenv("FAKE_NVML", json.dumps({"init_error": init_error, "devices": [_device("GPU-a")]}))
    sampler = Sampler(os.getpid())
    sampler.nvml_status = NvmlSampler().status(0)
    assert _measured(sampler) == Energy("not measured", reason, timed_s=3.0)


def test_a_run_on_the_cpu_is_not_measured() -> None:
    sampler = Sampler(os.getpid())  # never named a GPU: its status says so
    raw = _raw()
    raw.runtime = {"cuda_used": False}
    assert _measured(sampler, raw) == Energy("not measured", "the run used no NVIDIA GPU", timed_s=3.0)
    assert run_energy(_raw(steps=0)) == Energy("not measured", "no step was timed")


def test_the_report_shows_energy_before_and_after(nvml: pytest.MonkeyPatch) -> None:
    """A row beside the GPU figures in report.md and report.html, the total in the cell's title."""
    before = _raw()
    attach_samples(before, _sampled(nvml, [_device("GPU-a", energy_mj=[0, 1_800_000])], [0.0, 3.0]))
    after = replace(_raw(step_ms=150.0), label="after")
    attach_samples(after, _sampled(nvml, [_device("GPU-a", energy_mj=[0, 1_350_000])], [0.0, 1.5]))
    report = ProfileReport(
        1, ["trainadvisor", "profile", "train.py"], "train.py", None, summarize(before), []
    )
    report.after = summarize(after)
    markdown = render_markdown(report, templates_dir())
    cells = [
        "2.81 J/sample, 180 J/step (energy counter; over 3 s, good to about 3%)",
        "2.11 J/sample, 135 J/step (energy counter; over 1.5 s, good to about 7%)",
    ]
    assert f"| GPU energy, timed steps | {cells[0]} | {cells[1]} | " in markdown.splitlines()
    html = render_html(report, templates_dir())
    assert f'<td class="num" title="1,800 J over 3 s of timed steps (GPU 0)">{cells[0]}</td>' in html
