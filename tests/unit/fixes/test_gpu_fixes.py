"""The fixes the GPU rules propose: when each may be tried, how each searches and chooses, and
that each in-process switch really changes the run (on CPU where torch can: bf16 autocast and
fused optimizers run on the CPU; TF32 and cuDNN flags are no-ops there)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from trainadvisor import fixes
from trainadvisor.fixes.batch_size import BatchSize
from trainadvisor.profile.trials import in_batches, samples_ratio
from trainadvisor.records import LoaderInfo, Overrides, RawRun, RunLength, Trial

GPU = {
    "cuda_used": True, "dataloader_call_site": "train.py:12", "batch_size": 32, "pin_memory": False,
    "tf32_supported": True, "tf32_enabled": False, "bf16_supported": True, "optimizer": "Adam",
    "optimizer_fused": False, "optimizer_fusable": True, "cudnn_benchmark": False, "samples_per_s": 1000.0,
}  # fmt: skip


@pytest.mark.parametrize(
    "fix_id", ["pin-memory", "batch-size", "amp", "tf32", "fused-optimizer", "cudnn-benchmark"]
)
def test_gpu_fixes_are_not_proposed_without_a_gpu(fix_id: str) -> None:
    fix = fixes.REGISTRY[fix_id]
    assert (
        fix.not_applicable({**GPU, "cuda_used": False})
        == "the run used no GPU, and this fix only changes GPU work"
    )
    assert fix.not_applicable(GPU) is None


@pytest.mark.parametrize(
    ("fix_id", "change", "reason"),
    [
        (
            "tf32",
            {"tf32_supported": False},
            "TF32 needs an NVIDIA GPU of compute capability 8.0 (Ampere) or newer",
        ),
        ("tf32", {"tf32_enabled": True}, "TF32 is already on for matmuls"),
        (
            "amp",
            {"bf16_supported": False, "optimizers": 2},
            "this GPU has no bf16, and fp16 needs one GradScaler",
        ),
        ("amp", {"amp_override": "bf16"}, "autocast is already applied to this run"),
        ("fused-optimizer", {"optimizer_fused": True}, "Adam is already fused"),
        (
            "fused-optimizer",
            {"optimizer": "LBFGS", "optimizer_fusable": False},
            "LBFGS has no fused implementation",
        ),
        ("cudnn-benchmark", {"cudnn_benchmark": True}, "torch.backends.cudnn.benchmark is already on"),
        ("pin-memory", {"pin_memory": True}, "the DataLoader already pins memory"),
        ("batch-size", {"batch_size": None}, "the DataLoader batches through a batch_sampler"),
    ],
)
def test_why_a_fix_cannot_be_tried(fix_id: str, change: dict[str, Any], reason: str) -> None:
    assert (fixes.REGISTRY[fix_id].not_applicable({**GPU, **change}) or "").startswith(reason)


def _trial(size: int, samples_per_s: float | None, status: str = "measured", peak_pct: float = 50.0) -> Trial:
    overrides = Overrides({"train.py:12": {"batch_size": size}})
    raw = RawRun("t", "window_complete", 0, None, 5, 20, 0, 25, [], [], None)
    raw.runtime = {"cuda_memory": {"peak_reserved_bytes": int(peak_pct * 1e7), "total_bytes": int(1e9)}}
    raw.loaders = [
        LoaderInfo(
            0, "train.py:12", "D", False, 32, 0, False, False, None, "fork", None, 10, {"batch_size": size}
        )
    ]
    return Trial(f"batch_size={size}", overrides, status, 10.0, None, raw, samples_per_s)


def test_batch_size_search_doubles_while_it_pays_and_stops_at_oom_or_memory() -> None:
    fix = BatchSize()
    assert fix.next_candidate(GPU, []).label == "batch_size=64"  # type: ignore[union-attr]
    gained = [_trial(64, 1500.0)]
    assert fix.next_candidate(GPU, gained).label == "batch_size=128"  # type: ignore[union-attr]
    flat = [_trial(64, 1500.0), _trial(128, 1600.0)]  # +7% < 10%: stop
    assert fix.next_candidate(GPU, flat) is None
    oom = [_trial(64, 1500.0), _trial(128, None, status="failed")]
    assert fix.next_candidate(GPU, oom) is None
    full = [_trial(64, 1500.0, peak_pct=95.0)]  # the next doubling would not fit
    assert fix.next_candidate(GPU, full) is None
    capped = [_trial(s, 1000.0 * 1.5**i) for i, s in enumerate((64, 128, 256, 512), start=1)]
    assert fix.next_candidate(GPU, capped) is None  # 16x the original batch is the limit
    assert fix.choose(flat, {"samples_per_s": 1000.0}) is flat[1]
    assert fix.choose([_trial(64, 1040.0)], {"samples_per_s": 1000.0}) is None  # < 5% more samples/s
    assert fix.describe(flat[1], GPU) == (
        "batch_size=128 (from 32): scale the learning rate by 4 (linear rule, SGD) or 2 "
        "(square-root rule, Adam) and warm it up"
    )


def test_against_a_budget_a_batch_whose_peak_was_not_measured_is_not_taken_to_fit() -> None:
    fix = BatchSize()
    budget = {**GPU, "memory_budget_bytes": 10**9, "samples_per_s": 1000.0}
    fits = _trial(64, 1500.0, peak_pct=50.0)  # reserved 500 MB of the 1 GB budget
    assert fix.choose([fits], budget) is fits
    assert fix.next_candidate(budget, [fits]).label == "batch_size=128"  # type: ignore[union-attr]
    unmeasured = _trial(64, 1500.0)
    assert unmeasured.raw is not None
    unmeasured.raw.runtime = {}  # its run ended before the step that measures memory
    assert fix.choose([unmeasured], budget) is None
    assert fix.next_candidate(budget, [unmeasured]) is None
    assert (
        fix.search_note([unmeasured], budget)
        == "batch_size=64's peak was not measured (its run ended before the step that measures it)"
    )


@pytest.mark.parametrize(
    ("budget", "peak", "expected"),
    [
        (None, None, 1),  # a CPU without --memory-budget: it stops at the first doubling that does not pay
        (149 * 10**9, 92 * 10**6, 4),  # an H200's free memory, slow_input_mnist's peak: up to 16x
        (None, 75 * 10**6, 1),
        (200 * 10**6, 20 * 10**6, 4),  # 10x the peak: three doublings fit, and the fourth is run
        (60 * 10**6, 20 * 10**6, 2),  # 3x: one fits, the second is run to find it does not
        (30 * 10**6, 20 * 10**6, 1),  # the first, which does not fit
        (10**9, None, 4),  # no peak measured: every doubling to 16x
    ],
)
def test_a_memory_aware_search_is_expected_to_try_each_doubling_that_could_fit(
    budget: int | None, peak: int | None, expected: int
) -> None:
    """The progress line's estimate counts the candidates the search will run: on an H200 it ran
    four (batch 128 to 1024) where one was counted: the line said 41 s left, and they alone took 115 s
    (tests/data/own/h200-2026-11-30/slow_input)."""
    values: dict[str, Any] = {**GPU, "batch_size": 64}
    if budget is not None:
        values["memory_budget_bytes"] = budget
    if peak is not None:
        values["peak_reserved_bytes"] = peak
    assert BatchSize().expected_trials(values) == expected


def test_a_run_in_larger_batches_is_fitted_into_the_fewer_steps_the_script_then_takes() -> None:
    known = RunLength(512, "a run of the script ended after 512 steps", 512)
    assert in_batches(known, 4.0) == RunLength(
        128, "a run of the script ended after 512 steps, in batches 4 times as large", 128
    )
    assert in_batches(known, 3.0).total_steps == 170  # rounded down: a window fitted into it fits
    assert in_batches(known, 0.5).total_steps == 1024
    assert in_batches(RunLength(None, "not known", 30), 2.0) == RunLength(
        None, "not known, in batches 2 times as large", 15
    )
    assert in_batches(None, 2.0) is None
    baseline = _trial(32, 100.0).raw  # batches of 32 (the loader's own)
    assert baseline is not None
    assert samples_ratio(baseline, Overrides({"train.py:12": {"batch_size": 128}})) == 4.0
    accumulated = Overrides({"train.py:12": {"batch_size": 16}}, runtime={"grad_accumulation": 2})
    assert samples_ratio(baseline, accumulated) is None  # two micro-batches of 16: one step of 32
    assert samples_ratio(baseline, Overrides({"train.py:12": {"num_workers": 4}})) is None


def test_pin_memory_pins_the_loader_that_fed_the_steps_and_copies_without_blocking() -> None:
    setting = fixes.REGISTRY["pin-memory"].next_candidate(GPU, [])
    assert setting.overrides == Overrides({"train.py:12": {"pin_memory": True}}, non_blocking_h2d=True)
    assert fixes.REGISTRY["pin-memory"].next_candidate(GPU, [setting]) is None  # one candidate


def test_switch_fixes_try_once_and_keep_only_a_gain() -> None:
    amp = fixes.REGISTRY["amp"]
    setting = amp.next_candidate(GPU, [])
    assert setting is not None and setting.overrides.runtime == {"amp": "bf16"}
    fp16 = amp.next_candidate({**GPU, "bf16_supported": False, "optimizers": 1}, [])
    assert fp16 is not None and fp16.overrides.runtime == {"amp": "fp16"}  # with a GradScaler
    trial = Trial(setting.label, setting.overrides, "measured", 12.0, None)
    assert amp.next_candidate(GPU, [trial]) is None
    assert amp.choose([trial], {"steps_per_s": 10.0}) is trial
    assert amp.choose([trial], {"steps_per_s": 11.5}) is None  # 4% is not a reliable gain
    assert fixes.merge_overrides(
        [setting.overrides, fixes.REGISTRY["tf32"].next_candidate(GPU, []).overrides]  # type: ignore[union-attr]
    ).runtime == {"amp": "bf16", "tf32": True}


def _accumulation_trial(k: int, peak_bytes: int, steps_per_s: float) -> Trial:
    setting = fixes.REGISTRY["grad-accumulation"].next_candidate(MEMORY, [])
    assert setting is not None
    overrides = replace(setting.overrides, runtime={"grad_accumulation": k})
    raw = RawRun("t", "window_complete", 0, None, 5, 20, 0, 25, [], [], None)
    raw.runtime = {"cuda_memory": {"peak_reserved_bytes": peak_bytes, "total_bytes": 40 * 10**9}}
    return Trial(f"k={k}", overrides, "measured", steps_per_s, None, raw)


MEMORY = {
    **GPU,
    "batch_size": 64,
    "optimizers": 1,
    "lr_scheduler": False,
    "peak_reserved_bytes": 38 * 10**9,
    "steps_per_s": 10.0,
}


def test_grad_accumulation_applies_only_where_the_loop_allows_it() -> None:
    fix = fixes.REGISTRY["grad-accumulation"]
    assert fix.not_applicable(MEMORY) is None
    assert fix.not_applicable({**MEMORY, "lr_scheduler": True}).startswith("an LR scheduler")  # type: ignore[union-attr]
    assert fix.not_applicable({**MEMORY, "optimizers": 2}).startswith("the script steps several")  # type: ignore[union-attr]
    assert fix.not_applicable({**MEMORY, "batch_size": 63}).startswith("batch_size=63 is odd")  # type: ignore[union-attr]
    first = fix.next_candidate(MEMORY, [])
    assert first is not None and first.overrides.loaders == {"train.py:12": {"batch_size": 32}}
    assert first.overrides.runtime == {"grad_accumulation": 2}


def test_grad_accumulation_keeps_the_fewest_micro_batches_that_relieve_memory() -> None:
    fix = fixes.REGISTRY["grad-accumulation"]
    too_little = _accumulation_trial(2, 36 * 10**9, 9.5)  # -5%: not enough
    assert fix.next_candidate(MEMORY, [too_little]).overrides.runtime == {"grad_accumulation": 4}  # type: ignore[union-attr]
    relieved = _accumulation_trial(4, 25 * 10**9, 8.5)
    assert fix.next_candidate(MEMORY, [too_little, relieved]) is None
    assert fix.choose([too_little, relieved], MEMORY) is relieved
    assert fix.choose([_accumulation_trial(2, 20 * 10**9, 7.0)], MEMORY) is None  # 70% of the speed
    assert fix.describe(relieved, MEMORY) == "k=4: peak 38 GB -> 25 GB; 1.18x slower per step"
    assert fixes.goal("grad-accumulation") == "memory" and fixes.goal("amp") == "throughput"
