"""What e2e/test_compute.py and unit/compute/test_compute.py share."""

from __future__ import annotations

from trainadvisor.records import Overrides, RawRun, Trial, WindowShape

H100 = "NVIDIA H100 80GB HBM3"


def _raw(runtime: dict[str, object], step_ms: float) -> RawRun:
    from trainadvisor.records import DeviceInfo, StepRecord

    steps = [StepRecord(index=i, start_ms=i * step_ms, step_ms=step_ms, data_wait_ms=0.0) for i in range(10)]
    device = DeviceInfo("2.13", "3.12", 16, True, gpu_name=H100)
    return RawRun("r", "window_complete", None, None, 0, 10, 0, 10, steps, [], device, runtime=dict(runtime))


def _trial(steps_per_s: float, compile_s: float | None) -> Trial:
    raw = _raw({"compile": {"compile_s": compile_s}} if compile_s else {}, 1e3 / steps_per_s)
    raw.shape = WindowShape(40, 12.0, "settled")
    return Trial(
        "torch.compile(model)", Overrides(runtime={"compile": "default"}), "measured", steps_per_s, None, raw
    )
