"""The energy a run's GPUs drew over its timed steps, from the NVML readings trainadvisor's
process took while the run went on (`measure.nvml`, every 0.1 s). Pure.

Each GPU is measured the better way it allows:
- its energy counter (NVML's total energy, in millijoules since the driver loaded; Volta and
  later): the counter's value at the timed steps' end minus its value at their start;
- without one, its power readings integrated over the timed steps (trapezoid rule).
Either way a value at an edge of the timed steps is interpolated linearly between the readings
either side of it, and the readings inside are used as they are. The readings that bracket the
timed steps, taken as they are, would weigh the steps just outside at full weight (the warm-up's
compilation, the traced steps under the profiler, an idle GPU after the script ended); at GPU
speed a window is often shorter than the interval between readings, and then this is the
bracket's average power over the timed steps' time. Beyond the first or last reading a value is
carried by at most one interval between readings (a trial window's readings start after it
does): the counter at the rate of the nearest interval, the power at the nearest reading."""

from __future__ import annotations

from bisect import bisect_left

from trainadvisor.records import GpuSample, RawRun, timed_steps
from trainadvisor.records.energy import Energy

Reading = tuple[float, float]  # (ms from the window's start, counter mJ or power W)


def run_energy(raw: RawRun) -> Energy:
    """The GPUs' energy over the run's timed steps; under torchrun every rank's GPU, per global
    step and per sample of all ranks. Not measured, and why, where a GPU the run trained on has
    neither readings of its counter nor of its power around the timed steps."""
    steps = timed_steps(raw)
    span_ms = sum(s.step_ms for s in steps)
    if not steps or span_ms <= 0:
        return Energy("not measured", "no step was timed")
    timed_s = span_ms / 1e3
    by_device: dict[str, list[GpuSample]] = {}
    for sample in raw.gpu_samples:
        by_device.setdefault(sample.device or "the GPU", []).append(sample)
    if not by_device:
        return Energy("not measured", _not_sampled(raw.nvml_status), timed_s=timed_s)
    trained = sum(1 for run in raw.ranks or [raw] if run.runtime.get("cuda_used"))
    if len(by_device) < trained:
        why = f"NVML sampled {len(by_device)} of the {trained} GPUs the ranks trained on ({raw.nvml_status})"
        return Energy("not measured", why, timed_s=timed_s)
    total_j, methods, edges_ms = 0.0, set[str](), list[float]()
    for device, samples in sorted(by_device.items()):
        measured = _device_energy(samples, span_ms)
        if isinstance(measured, str):
            return Energy("not measured", f"{device}: {measured}", timed_s=timed_s)
        joules, method, used = measured
        total_j += joules
        methods.add(method)
        edges_ms += used
    per_step_j = total_j / len(steps)
    per_step_samples = _samples_per_step(raw)
    return Energy(
        # a GPU without a counter makes the sum a sampled figure
        "energy counter" if methods == {"energy counter"} else "sampled power",
        energy_j=total_j,
        j_per_step=per_step_j,
        j_per_sample=per_step_j / per_step_samples if per_step_samples else None,
        devices=sorted(by_device),
        timed_s=timed_s,
        readings_ms=[min(edges_ms), max(edges_ms)],
    )


def _not_sampled(nvml_status: str) -> str:
    """Why no GPU reading is there, from the sampler's own words."""
    if nvml_status.startswith("sampled"):
        return "NVML read no sample of the GPU while the run's window lasted"
    if nvml_status == "not sampled":  # a run saved before the sampler said why
        return "no GPU was sampled"
    return nvml_status.removeprefix("not sampled: ")


def _samples_per_step(raw: RawRun) -> float | None:
    """Samples per global step: under torchrun each rank's batch, added up."""
    total = 0.0
    for run in raw.ranks or [raw]:
        counts = [s.samples for s in timed_steps(run)]
        if not counts or any(n is None for n in counts):
            return None
        total += sum(n for n in counts if n is not None) / len(counts)
    return total


def _device_energy(samples: list[GpuSample], span_ms: float) -> tuple[float, str, list[float]] | str:
    """(joules, method, the first and last readings' times) of one GPU, or why not."""
    counter = [(s.t_ms, float(s.energy_mj)) for s in samples if s.energy_mj is not None]
    used = _around(counter, span_ms)
    if used and all(b[1] >= a[1] for a, b in zip(used, used[1:])):  # not reset (a driver reload)
        joules = (_at(used, span_ms, hold=False) - _at(used, 0.0, hold=False)) / 1e3
        return joules, "energy counter", [used[0][0], used[-1][0]]
    power = [(s.t_ms, s.power_w) for s in samples if s.power_w is not None]
    used = _around(power, span_ms)
    if used:
        return _power_j(used, span_ms), "sampled power", [used[0][0], used[-1][0]]
    if not counter and not power:
        return "NVML read neither its energy counter nor its power draw"
    return f"too few NVML readings around the timed steps ({span_ms / 1e3:.3g} s)"


def _power_j(readings: list[Reading], span_ms: float) -> float:
    """Power integrated over the timed steps: linear between readings (the trapezoid rule)."""
    times = [0.0, *(t for t, _ in readings if 0.0 < t < span_ms), span_ms]
    watts = [_at(readings, t, hold=True) for t in times]
    return sum((b - a) / 1e3 * (pa + pb) / 2 for a, b, pa, pb in zip(times, times[1:], watts, watts[1:]))


def _around(readings: list[Reading], span_ms: float) -> list[Reading]:
    """The readings inside the timed steps and the nearest one either side; [] where they do
    not reach within one interval between readings of either edge."""
    ordered = sorted(dict(readings).items())  # one reading per time
    before = [r for r in ordered if r[0] < 0.0][-1:]
    after = [r for r in ordered if r[0] > span_ms][:1]
    used = [*before, *(r for r in ordered if 0.0 <= r[0] <= span_ms), *after]
    if len(used) < 2:
        return []
    if used[0][0] > used[1][0] - used[0][0] or span_ms - used[-1][0] > used[-1][0] - used[-2][0]:
        return []
    return used


def _at(readings: list[Reading], t_ms: float, hold: bool) -> float:
    """The value at `t_ms`, linear between the readings around it; beyond them, the nearest
    reading (`hold`) or the nearest interval's line."""
    times = [t for t, _ in readings]
    if hold and t_ms <= times[0]:
        return readings[0][1]
    if hold and t_ms >= times[-1]:
        return readings[-1][1]
    i = min(max(bisect_left(times, t_ms), 1), len(readings) - 1)
    (t0, v0), (t1, v1) = readings[i - 1], readings[i]
    return v0 + (v1 - v0) * (t_ms - t0) / (t1 - t0)
