"""The measurement loop at GPU speed (issue 24), reproduced on the CPU: steps well under a
millisecond, runs of a few hundred steps, steps that start slow and settle, and the GPU-only
lines behind them through the fakes."""

from __future__ import annotations

import threading
from typing import Any

import torch
from support.gpu_speed import _chosen, _run

from trainadvisor.analyze.run.length import run_length
from trainadvisor.analyze.run.summary import summarize
from trainadvisor.measure import sampling
from trainadvisor.profile import attribution
from trainadvisor.profile.trials import decide
from trainadvisor.records import (
    FrameworkCall,
    LoaderInfo,
    Overrides,
    PlannedFix,
    ProfileReport,
    RawRun,
    StepRecord,
    Trial,
)
from trainadvisor.report.render import headline


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


def test_fixes_that_each_add_their_share_are_all_kept_with_what_each_adds() -> None:
    pace = {"a + b together": 300.0, "b (without a)": 200.0, "a (without b)": 150.0}
    a = _chosen("a", 1.5, Overrides(runtime={"a": 1}))
    b = _chosen("b", 2.0, Overrides(runtime={"b": 1}))
    decided, _ = attribution.attribute([a, b], lambda _label, setting: _run(pace[setting.label]))
    assert [(o.status, round(o.added_gain or 0, 3)) for o in decided] == [
        ("unconfirmed", 1.5),
        ("unconfirmed", 2.0),
    ]


def test_when_the_script_ends_during_the_combination_each_keeps_its_own_trial() -> None:
    a = _chosen("a", 1.5, Overrides(runtime={"a": 1}))
    b = _chosen("b", 2.0, Overrides(runtime={"b": 1}))
    decided, notes = attribution.attribute([a, b], lambda _label, _setting: None)
    assert decided == [a, b]
    assert notes == [
        "The combination of a, b could not be measured with and without each (the script ended): "
        "each keeps the gain of its own trial."
    ]


def test_a_window_counts_what_the_switches_did_in_it() -> None:
    """The proof that a trial ran with its switch on: module outputs that came back from
    autocast in bf16 (on this CPU, autocast's CPU device), counted from the timed steps on."""
    from trainadvisor.fixes import switches
    from trainadvisor.training.hooks import Patches
    from trainadvisor.training.window import Window
    from trainadvisor.training.window_plan import WindowPlan

    model = torch.nn.Linear(4, 2)
    window = Window(WindowPlan(warmup=1, steps=3), profiler=lambda *_: None)
    model(torch.ones(1, 4))  # before the switch: nothing counted
    patches = Patches()
    switches.install_autocast(patches, torch.bfloat16)  # type: ignore[arg-type]
    try:
        for _ in range(4):
            output = model(torch.ones(1, 4))
            window.boundary()
    finally:
        patches.undo()
    assert output.dtype == torch.float32  # handed back in fp32
    window.read_back()
    assert window.facts.runtime["switched"] == {"autocast_outputs": 3, "non_blocking_copies": 0}


def _loader(length: int | None) -> LoaderInfo:
    return LoaderInfo(
        0, "train.py:10", "Data", False, 32, 0, False, False, None, "fork", None, 5, length=length
    )


def _raw_of(
    status: str, steps_seen: int, frameworks: list[FrameworkCall], length: int | None = 100
) -> RawRun:
    return RawRun(
        "baseline",
        status,
        None,
        None,
        5,
        20,
        0,
        steps_seen,
        [],
        [_loader(length)],
        None,
        frameworks=frameworks,
    )  # type: ignore[arg-type]


def test_the_scripts_length_from_a_frameworks_settings_or_from_a_run_that_ended() -> None:
    hf = FrameworkCall("transformers", "TrainingArguments", "train.py:40")
    hf.settings = {"max_steps": -1, "num_train_epochs": 3.0, "gradient_accumulation_steps": 4}
    found = run_length(_raw_of("window_complete", 40, [hf]))
    assert (found.total_steps, found.seen_steps) == (75, 40)  # 3 epochs x ceil(100 / 4) updates
    hf.settings["max_steps"] = 600
    assert run_length(_raw_of("window_complete", 40, [hf])).total_steps == 600
    lightning = FrameworkCall("lightning", "Trainer", "train.py:50")
    lightning.settings = {"max_steps": -1, "max_epochs": 2, "accumulate_grad_batches": 1}
    assert run_length(_raw_of("window_complete", 40, [lightning])).source == (
        "Trainer(max_epochs=2) x 100 steps per epoch"
    )
    lightning.settings["max_steps"] = 150  # whichever comes first
    assert run_length(_raw_of("window_complete", 40, [lightning])).total_steps == 150
    plain = run_length(_raw_of("window_complete", 40, []))
    assert (plain.total_steps, plain.source) == (
        None,
        "not known: a run of the script took at least 40 steps",
    )
    ended = run_length(_raw_of("script_ended", 313, []), plain)
    assert (ended.total_steps, ended.source) == (313, "a run of the script ended after 313 steps")
    assert run_length(_raw_of("window_complete", 24, []), ended).total_steps == 313  # known stays known


def _paced(
    step_ms: list[float], samples: int = 16, label: str = "w", loaders: list[LoaderInfo] | None = None
) -> RawRun:
    records = [StepRecord(i, sum(step_ms[:i]), ms, 0.0, samples=samples) for i, ms in enumerate(step_ms)]
    return RawRun(label, "window_complete", None, None, 5, len(records), 0, 30, records, loaders or [], None)


def _trial(raw: RawRun, overrides: Overrides) -> Trial:
    run = summarize(raw)
    return Trial(raw.label, overrides, "measured", run.steps_per_s, None, raw, run.samples_per_s)


SITE = {"train.py:10": {"num_workers": 2, "persistent_workers": True}}


def test_a_gain_within_the_spread_of_the_windows_is_no_gain() -> None:
    """A bursty baseline (windows of 50 and 150 steps/s) against a steady trial at 110: 1.47x on
    the mean, but the trial's slow windows do not beat the baseline's fast ones."""
    baseline = summarize(_paced(([20.0] * 5 + [20.0 / 3] * 5) * 3))
    trial = _trial(_paced([1000.0 / 110] * 30, label="num_workers=2"), Overrides(SITE))
    values = {
        "steps_per_s": baseline.steps_per_s,
        "num_workers": 0,
        "cpu_count": 2,
        "dataloader_call_site": "train.py:10",
    }
    outcome = decide(PlannedFix("dataloader-workers", "data-stall", True, ""), [trial], values, [baseline])
    assert outcome.status == "no_gain"
    assert outcome.reason == (
        "num_workers=2 measured 1.47x steps/s (range 0.73-2.20x): within the spread of the windows, "
        "not a reliable gain"
    )
    steady = _trial(_paced([1000.0 / 200] * 30), Overrides(SITE))
    kept = decide(PlannedFix("dataloader-workers", "data-stall", True, ""), [steady], values, [baseline])
    assert (kept.status, round(kept.gain or 0, 2), round(kept.gain_low or 0, 2)) == (
        "unconfirmed",
        2.67,
        1.33,
    )


def test_a_larger_batch_is_an_opportunity_measured_in_samples_per_second_never_applied() -> None:
    baseline = summarize(_paced([2.0] * 30, samples=16))
    grown = LoaderInfo(0, "train.py:10", "Data", False, 16, 0, False, False, None, "fork", None, 30)
    grown.overrides_applied = {"batch_size": 256}
    raw = _paced([7.0] * 30, samples=256, loaders=[grown])
    trial = _trial(raw, Overrides({"train.py:10": {"batch_size": 256}}))
    values = {
        "samples_per_s": baseline.samples_per_s,
        "batch_size": 16,
        "dataloader_call_site": "train.py:10",
    }
    outcome = decide(PlannedFix("batch-size", "gpu-underutilized", True, ""), [trial], values, [baseline])
    assert (outcome.status, outcome.unit, round(outcome.gain or 0, 2)) == ("opportunity", "samples/s", 4.57)
    assert (
        outcome.reason
        == "measured 4.57x samples/s (range 4.57-4.57x) in its own run; not applied: it changes what is "
        "learned"
    )
    assert outcome.chosen.startswith(
        "batch_size=256 (from 16): scale the learning rate by 16 (linear rule, SGD)"
    )
    report = ProfileReport(1, [], "train.py", None, baseline, [], fix_outcomes=[outcome])
    assert headline(report) == (
        "No bottleneck found by the rules in the profiled window; opportunity: 4.57x samples/s with "
        "batch_size=256 (from 16), which changes training (batch-size)"
    )


def test_a_fix_measured_on_a_loop_that_waits_on_its_input_says_how_little_it_could_gain() -> None:
    """On an H200 the slow-input example waited on its input for 96% of each step (tests/data/own/
    h200-2026-11-30/slow_input): amp measured no gain, as it must (making the other 4% instant
    gains 1.04x); the reason says so. A fix of the loader, a loop that waits less than half of
    each step, or one on a CPU (where the input and the step share the cores) gets no such words."""
    amp = _trial(_paced([78.7] * 30, label="torch.autocast(dtype=torch.bfloat16)"), Overrides())
    values = {"steps_per_s": 12.48, "data_wait_pct": 96.1, "cuda_used": True}
    outcome = decide(PlannedFix("amp", "no-mixed-precision", True, ""), [amp], values, [])
    assert outcome.status == "no_gain"
    assert outcome.reason == (
        "no candidate was at least 5% faster than the baseline; the loop waited on its input for 96% of "
        "each step, so a fix of the rest could gain at most 1.04x while the input stays as slow"
    )
    quieter = decide(
        PlannedFix("amp", "no-mixed-precision", True, ""), [amp], {**values, "data_wait_pct": 40.0}, []
    )
    assert quieter.reason == "no candidate was at least 5% faster than the baseline"
    pinned = _trial(_paced([80.6] * 30, label="pin_memory=True"), Overrides())
    loader = decide(PlannedFix("pin-memory", "pageable-h2d-copy", True, ""), [pinned], values, [])
    assert loader.reason == "no candidate was at least 5% faster than the baseline"
    on_a_cpu = {**values, "cuda_used": False}  # the input and the step share the cores: no bound
    cpu = decide(PlannedFix("amp", "no-mixed-precision", True, ""), [amp], on_a_cpu, [])
    assert cpu.reason == "no candidate was at least 5% faster than the baseline"
