"""What these tests share: integration/test_claims.py, integration/test_measurements.py,
unit/fixes/test_ddp_settings.py."""

from __future__ import annotations

from trainadvisor.records import (
    DeviceInfo,
    LoaderInfo,
    Overrides,
    RawRun,
    StepRecord,
    Trial,
)


def raw(
    step_ms: list[float],
    data_ms: list[float] | None = None,
    workers: int = 0,
    losses: list[float | None] | None = None,
    label: str = "baseline",
) -> RawRun:
    data_ms = data_ms or [0.0] * len(step_ms)
    steps = [
        StepRecord(index=2 + i, start_ms=sum(step_ms[:i]), step_ms=ms, data_wait_ms=d, samples=32)
        for i, (ms, d) in enumerate(zip(step_ms, data_ms))
    ]
    loader = LoaderInfo(
        index=0,
        created_at="train.py:12",
        dataset_class="D",
        iterable_dataset=False,
        batch_size=32,
        num_workers=workers,
        pin_memory=False,
        persistent_workers=False,
        prefetch_factor=None,
        start_method="fork",
        collate_fn=None,
        batches_in_window=len(step_ms),
    )
    return RawRun(
        label=label,
        status="window_complete",
        exit_code=0,
        error=None,
        warmup_steps=2,
        window_steps=len(step_ms),
        profile_steps=0,
        steps_seen=2 + len(step_ms),
        steps=steps,
        loaders=[loader],
        device=DeviceInfo("2.13.0", "3.11.7", 2, False),
        losses=losses if losses is not None else [1.0, 0.9] + [0.5] * len(step_ms),
    )


def trial(
    workers: int, steps_per_s: float | None, prefetch: int | None = None, status: str = "measured"
) -> Trial:
    loader = {"num_workers": workers, "persistent_workers": True}
    if prefetch:
        loader["prefetch_factor"] = prefetch
    return Trial(f"w{workers}", Overrides({"0": loader}), status, steps_per_s, None)
