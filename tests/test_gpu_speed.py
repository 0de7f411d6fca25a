"""The measurement loop at GPU speed (issue 24), reproduced on the CPU: steps well under a
millisecond, runs of a few hundred steps, steps that start slow and settle, and the GPU-only
lines behind them through the fakes."""

from __future__ import annotations

import threading
from typing import Any

from trainadvisor.measure import sampling


def test_a_gpu_run_shorter_than_the_sampling_interval_is_not_reported_as_using_no_gpu() -> None:
    """On the H100 a short run said "the run used no NVIDIA GPU": it named its GPU after the
    sampler's last tick."""

    def named_after_the_last_tick() -> dict[str, Any]:  # the sampler's own thread never sees it
        if threading.current_thread() is threading.main_thread():
            return {"GPU 0": {"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H100 80GB HBM3"}}
        return {}

    sampler = sampling.Sampler(1, devices=named_after_the_last_tick)
    sampler.start()
    sampler.stop()
    assert sampler.nvml_status == (
        "not sampled: the run ended before NVML's first sample of its GPU (one every 0.1 s)"
    )
    quiet = sampling.Sampler(1, devices=lambda: {})
    quiet.start()
    quiet.stop()
    assert quiet.nvml_status == "not sampled: the run used no NVIDIA GPU"
