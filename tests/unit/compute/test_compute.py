"""FLOPs counted on a real step, MFU against the datasheet peak or the CPU's measured one, and
the compile fix's decisions, code change and switch (compile.py's run-time compile runs in a
child process with inductor's cache, `test_compile_fix_end_to_end`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from support.compute import H100, _raw, _trial
from support.window import FakeClock, FakeProfiler

from trainadvisor.analyze.run.summary import summarize
from trainadvisor.compute.flops import StepFlops
from trainadvisor.compute.mfu import utilization, with_baseline_flops
from trainadvisor.compute.peaks import matmul_dtype
from trainadvisor.fixes.compile import Compile, compile_change
from trainadvisor.records import Overrides, Trial
from trainadvisor.training.window import Window
from trainadvisor.training.window_plan import WindowPlan


def _step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).pow(2).mean().backward()


def test_one_step_of_a_linear_layer_counts_its_forward_and_weight_gradient() -> None:
    """Linear(8, 4) on 16 samples: 2*16*8*4 = 1024 FLOPs forward, 1024 for the weight's
    gradient (the input needs none): 2048, all of them in fp32."""
    model, x = torch.nn.Linear(8, 4), torch.randn(16, 8)
    flops = StepFlops()
    flops.start()
    _step(model, x)
    flops.stop()
    assert flops.facts() == {
        "flops_status": "counted",
        "flops_per_step": 2048.0,
        "flops_by_dtype": {"torch.float32": 2048.0},
    }


def test_under_autocast_the_matmuls_count_in_their_low_precision() -> None:
    model, x = torch.nn.Linear(8, 4), torch.randn(16, 8)
    flops = StepFlops()
    flops.start()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.float().pow(2).mean().backward()
    flops.stop()
    assert flops.facts()["flops_by_dtype"] == {"torch.bfloat16": 2048.0}


@pytest.mark.parametrize(("reentrant", "counted", "hfu"), [(False, 11264.0, "56.3"), (True, 12288.0, "61.4")])
def test_a_step_that_recomputes_checkpointed_activations_counts_hardware_flops(
    reentrant: bool, counted: float, hfu: str
) -> None:
    """Linear(8, 8), ReLU, Linear(8, 4) on 16 samples: 9216 FLOPs a step; checkpointed, backward
    recomputes the first layer (2048 more: non-reentrant checkpoints stop once what backward
    needs is back) or the whole forward (3072: reentrant). Those are hardware FLOPs: at 50 steps/s
    against 1 MFLOP/s the figure is HFU, said so in its cell and the headline's words; the
    checkpoint's own parts are torch's again once the step is counted."""
    import torch.utils.checkpoint as checkpoint

    from trainadvisor.report.utilization import mfu_cell, mfu_words

    originals = (checkpoint._recomputation_hook, checkpoint.CheckpointFunction.__dict__["backward"])
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x = torch.randn(16, 8, requires_grad=True)
    flops = StepFlops()
    flops.start()
    checkpoint.checkpoint(model, x, use_reentrant=reentrant).pow(2).mean().backward()
    flops.stop()
    facts = flops.facts()
    assert facts["flops_recomputed"] == 1 and facts["flops_per_step"] == counted
    assert (checkpoint._recomputation_hook, checkpoint.CheckpointFunction.__dict__["backward"]) == originals
    cpu = {"flops_per_s": 1e6, "dtype": "fp32", "how": "measured"}
    use = utilization({**facts, "cpu_peak": cpu}, None, 50.0)
    assert use is not None and use.hardware_flops and use.label == "HFU"
    run = dataclasses.replace(summarize(_raw({}, 20.0)), utilization=use)
    assert mfu_words(run) == f", HFU {hfu}%"
    assert mfu_cell(run).endswith("(fp32, measured, HFU: its FLOPs count the recomputed activations)")
    plain = utilization({"flops_status": "counted", "flops_per_step": 9216.0, "cpu_peak": cpu}, None, 50.0)
    assert plain is not None and plain.label == "MFU" and not plain.hardware_flops


def test_a_step_without_matmuls_is_not_counted_rather_than_zero() -> None:
    flops = StepFlops()
    flops.start()
    torch.randn(4).relu().sum()
    flops.stop()
    assert flops.facts() == {
        "flops_status": "not counted: the step dispatched no matmul, convolution or attention"
    }


def test_the_window_counts_the_profilers_warmup_step_and_no_timed_one() -> None:
    clock = FakeClock()
    window = Window(WindowPlan(warmup=0, steps=2, profile_steps=1), clock.clock(), profiler=FakeProfiler)
    model, x = torch.nn.Linear(8, 4), torch.randn(16, 8)
    for _ in range(5):
        _step(model, x)
        clock.advance(10.0)
        window.boundary()
    assert window.phase == "done"
    assert window.facts.runtime["flops_per_step"] == 2048.0
    assert [r.profiled for r in window.records] == [False, False, True, True]


def _runtime(**facts: object) -> dict[str, object]:
    return {"flops_status": "counted", "flops_per_step": 1e12, "flops_by_dtype": {}, **facts}


def test_mfu_on_an_h100_uses_the_dense_bf16_peak() -> None:
    """1 TFLOP a step at 100 steps/s: 100 TFLOP/s of the H100 SXM's 989.4 dense bf16."""
    runtime = _runtime(cuda_used=True, flops_by_dtype={"torch.bfloat16": 9e11, "torch.float32": 1e11})
    use = utilization(runtime, H100, 100.0)
    assert use is not None
    assert (use.status, use.peak_dtype, use.peak_how) == ("measured", "bf16", "datasheet")
    assert use.achieved_tflops == pytest.approx(100.0)
    assert use.mfu_pct == pytest.approx(100 * 100 / 989.4)


def test_fp32_matmuls_with_tf32_on_use_the_tf32_peak_and_fall_back_to_fp32_on_a_v100() -> None:
    runtime = _runtime(cuda_used=True, tf32_enabled=True, flops_by_dtype={"torch.float32": 1e12})
    a100 = utilization(runtime, "NVIDIA A100-SXM4-80GB", 10.0)
    v100 = utilization(runtime, "Tesla V100-SXM2-32GB", 10.0)
    assert a100 is not None and (a100.peak_dtype, a100.peak_tflops) == ("tf32", 156.0)
    assert v100 is not None and (v100.peak_dtype, v100.peak_tflops) == ("fp32", 15.7)


def test_a_convolutions_flops_are_counted_apart_from_the_matmuls() -> None:
    """Conv2d(3, 4, 3) on 2x3x8x8 (a 6x6 output): 2*2*4*36*27 = 15,552 FLOPs forward and as many
    for the weight's gradient (the input needs none), under their own key; the head's matmuls
    (Linear(144, 2): 2*2*144*2 = 1,152 forward, for its weight's gradient and for its input's,
    which the convolution needs) under plain float32."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(144, 2))
    flops = StepFlops()
    flops.start()
    _step(model, torch.randn(2, 3, 8, 8))
    flops.stop()
    assert flops.facts()["flops_by_dtype"] == {"conv:torch.float32": 31104.0, "torch.float32": 3456.0}


def test_fp32_convolutions_run_in_tf32_under_cudnns_own_flag() -> None:
    """cuDNN runs float32 convolutions in TF32 by default, whatever the matmuls' flag: a conv net's
    MFU against the fp32 peak read up to 7.4x too high on an H100 (494.7 against 66.9 TFLOP/s)."""
    by_dtype = {"conv:torch.float32": 9e11, "torch.float32": 1e11}
    conv_tf32 = utilization(
        _runtime(cuda_used=True, cudnn_tf32_enabled=True, flops_by_dtype=by_dtype), H100, 100.0
    )
    assert conv_tf32 is not None and (conv_tf32.peak_dtype, conv_tf32.peak_tflops) == ("tf32", 494.7)
    assert conv_tf32.mfu_pct == pytest.approx(100 * 100 / 494.7)
    plain = utilization(
        _runtime(cuda_used=True, cudnn_tf32_enabled=False, flops_by_dtype=by_dtype), H100, 100.0
    )
    assert plain is not None and plain.peak_dtype == "fp32"
    assert matmul_dtype(by_dtype, tf32_enabled=False, conv_tf32=True) == "tf32"
    assert matmul_dtype(by_dtype, tf32_enabled=True, conv_tf32=False) == "fp32"  # most FLOPs: the convs'


def test_an_unknown_gpu_gets_flops_and_no_guessed_peak() -> None:
    use = utilization(_runtime(cuda_used=True), "NVIDIA GeForce GTX 1080", 10.0)
    assert use is not None
    assert (use.achieved_tflops, use.mfu_pct, use.peak_tflops) == (10.0, None, None)
    assert use.status == "no MFU: no datasheet peak for NVIDIA GeForce GTX 1080 in fp32 (never guessed)"


def test_a_cpu_run_is_measured_against_its_own_benchmark() -> None:
    peak = {"flops_per_s": 2e11, "dtype": "fp32", "device": "CPU", "source": "measured", "how": "measured"}
    use = utilization(_runtime(cuda_used=False, flops_per_step=1e9, cpu_peak=peak), None, 50.0)
    assert use is not None and (use.mfu_pct, use.peak_how) == (25.0, "measured")


def test_a_run_saved_before_flops_were_counted_has_no_utilization() -> None:
    assert utilization({"cuda_used": True}, H100, 10.0) is None


def test_a_compiled_after_run_borrows_the_baselines_flops_and_says_so() -> None:
    baseline = summarize(_raw(_runtime(cuda_used=True, flops_by_dtype={"torch.bfloat16": 1e12}), 20.0))
    compiled = {"flops_status": "not counted: the step runs code torch.compile compiled", "cuda_used": True}
    after = with_baseline_flops(summarize(_raw(compiled, 10.0)), baseline)
    assert after.utilization is not None and after.utilization.flops_from_baseline
    assert after.utilization.mfu_pct == pytest.approx(100 * 100 / 989.4)  # 1 TFLOP at 100 steps/s


@pytest.mark.parametrize(
    ("known", "status", "said"),
    [
        (
            {"run_seen_steps": 900},
            "recommended",
            "the run's length is not known (a run took at least 900 steps)",
        ),
        ({"run_seen_steps": 6000}, "", "a run of the script took 6000 steps and went on"),
        ({"run_total_steps": 4000}, "no_gain", "and the run has 4000 steps"),
        ({"run_total_steps": 10000}, "", "the run has 10000 steps"),
    ],
)
def test_compiling_pays_only_on_runs_longer_than_its_break_even(
    known: dict[str, int], status: str, said: str
) -> None:
    """100 -> 125 steps/s saves 2 ms a step; 10 s of compiling pays after 5000 steps."""
    verdict = Compile().verdict(_trial(125.0, 10.0), {"steps_per_s": 100.0, **known})
    assert verdict is not None
    assert verdict[0] == status and said in verdict[1]
    assert verdict[2] == {"compile_s": 10.0, "break_even_steps": 5000}
    assert "compiling took 10.0 s and saves 2.00 ms a step: it pays after 5000 steps" in verdict[1]


def test_the_compile_workers_start_up_counts_in_the_break_even_beside_the_compile() -> None:
    """100 -> 125 steps/s saves 2 ms a step. Besides 10 s of compiling, 100 warm-up steps were left
    out for 3 s while torch's compile workers started: at 125 steps/s they take 0.8 s, so the
    start-up cost 2.2 s more, and compiling pays after (10 + 2.2) / 0.002 = 6100 steps, not 5000."""
    trial = _trial(125.0, 10.0)
    assert trial.raw is not None
    trial.raw.runtime["compile"].update(pool_start_wait_s=3.0, pool_start_steps=100)
    verdict = Compile().verdict(trial, {"steps_per_s": 100.0, "run_total_steps": 6000})
    assert verdict is not None and verdict[0] == "no_gain"
    assert verdict[2] == {"compile_s": 10.0, "break_even_steps": 6100}
    assert verdict[1] == (
        "compiling took 10.0 s (and the compile workers' start-up slowed its first steps by 2.2 s) and "
        "saves 2.00 ms a step: it pays after 6100 steps, and the run has 6000 steps"
    )
    trial.raw.runtime["compile"]["pool_starting_when_timed"] = True
    assert "were still starting when its steps were timed, after 3.0 s" in (
        Compile().search_note([trial], {}) or ""
    )


def test_without_dynamos_record_the_compile_time_is_the_warmup_beyond_its_settled_steps() -> None:
    """40 warm-up steps took 12 s; at 125 steps/s they would have taken 0.32 s."""
    from trainadvisor.fixes.compile import compile_seconds

    assert compile_seconds(_trial(125.0, None)) == pytest.approx(12.0 - 40 / 125.0)


def test_a_compile_that_did_not_pay_still_carries_the_compile_time_it_measured() -> None:
    """On an H200, compiling took 9.6 s and then ran at 75 steps/s against 168 eager: no gain, and
    the outcome keeps the 9.6 s (no break-even: it never paid)."""
    from trainadvisor.profile.trials import decide
    from trainadvisor.records import PlannedFix

    planned = PlannedFix("compile", "host-bound", True, "")
    outcome = decide(planned, [_trial(75.0, 9.6)], {"steps_per_s": 168.0, "optimizer": "AdamW"}, [])
    assert (outcome.status, outcome.compile_s, outcome.break_even_steps) == ("no_gain", 9.6, None)
    assert outcome.search == (
        "torch.compile(model): compiling took 9.6 s, then 75.0 steps/s against 168.0 eager"
    )
    waited = _trial(75.0, 9.6)
    assert waited.raw is not None
    waited.raw.runtime["compile"]["pool_start_wait_s"] = 12.04
    assert Compile().search_note([waited], {"steps_per_s": 168.0}) == (
        "torch.compile(model): compiling took 9.6 s (and 12.0 s of steps beside torch's starting compile "
        "workers, left out of the measurement), then 75.0 steps/s against 168.0 eager"
    )
    refused = Trial("torch.compile(model)", Overrides(runtime={"compile": "default"}), "failed", None, "boom")
    assert decide(planned, [refused], {"steps_per_s": 168.0}, []).compile_s is None


def test_compile_is_not_tried_on_a_loop_that_waits_on_data_or_already_compiles() -> None:
    fix = Compile()
    base = {"optimizer": "SGD", "data_wait_pct": 1.0}
    assert fix.not_applicable(base) is None
    assert "waits on its input" in (fix.not_applicable({**base, "data_wait_pct": 45.0}) or "")
    assert "already compiles" in (fix.not_applicable({**base, "compiled_graphs": 2}) or "")


SCRIPT = """import torch


def main():
    model = Net().to("cuda")  # the model
    data = load()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x in data:
        step(x)


if __name__ == "__main__":
    main()
"""


def test_the_code_change_compiles_the_model_in_place_after_the_line_that_builds_it() -> None:
    changed = compile_change(SCRIPT, "default")
    assert changed == SCRIPT.replace(
        '    model = Net().to("cuda")  # the model\n',
        '    model = Net().to("cuda")  # the model\n'
        "    model.forward = torch.compile(model.forward)  # in place: same state_dict keys\n",
    )
    cuda_graphs = compile_change(SCRIPT, "reduce-overhead") or ""
    assert (
        '    model.forward = torch.compile(model.forward, mode="reduce-overhead")  # in place' in cuda_graphs
    )


def test_a_lightning_script_compiles_the_module_before_fit() -> None:
    source = "import lightning as L\nmodel = Lit()\ntrainer = L.Trainer()\ntrainer.fit(model, dm)\n"
    assert compile_change(source, "default") == (
        "import torch\nimport lightning as L\nmodel = Lit()\ntrainer = L.Trainer()\n"
        "model = torch.compile(model)\ntrainer.fit(model, dm)\n"
    )


def test_no_place_for_the_change_gives_none() -> None:
    assert compile_change("import torch\nrun(build())\n", "default") is None


def test_hugging_face_gets_torch_compile_in_training_arguments() -> None:
    from trainadvisor.frameworks.vocab import Translation, _transformers
    from trainadvisor.records import FrameworkCall

    t = Translation(FrameworkCall("transformers", "TrainingArguments", "train.py:9"))
    _transformers(t, {"compile": "reduce-overhead"}, {})
    assert t.settings == {"torch_compile": True, "torch_compile_mode": "reduce-overhead"}


def test_on_a_gpu_cuda_graphs_are_tried_after_a_compile_that_paid() -> None:
    """reduce-overhead (CUDA graphs) is the second candidate on a GPU, tried only when plain
    compiling was faster; a CPU has no CUDA graphs to try."""
    fix, gpu = Compile(), {"cuda_used": True, "steps_per_s": 100.0}
    first = fix.next_candidate(gpu, [])
    assert first is not None and first.overrides.runtime == {"compile": "default"}
    faster = _trial(130.0, 5.0)
    second = fix.next_candidate(gpu, [faster])
    assert second is not None and second.label == 'torch.compile(model, mode="reduce-overhead")'
    assert fix.next_candidate(gpu, [_trial(101.0, 5.0)]) is None  # compiling did not help
    assert fix.next_candidate({"cuda_used": False, "steps_per_s": 100.0}, [faster]) is None
    assert fix.choose([faster, _trial(150.0, 6.0)], gpu).steps_per_s == 150.0  # type: ignore[union-attr]


def test_a_formula_that_raises_never_breaks_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting is torch's formulas run inside the user's step: one that cannot read its
    operator's arguments counts nothing there, and the step goes on."""
    import torch.utils.flop_counter as flop_counter

    def broken(*args: object, **kwargs: object) -> int:
        raise ValueError("unexpected arguments")

    monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.addmm, broken)
    model, x = torch.nn.Linear(8, 4), torch.randn(16, 8)
    flops = StepFlops()
    flops.start()
    _step(model, x)  # the forward's addmm: its formula raises
    flops.stop()
    assert model.weight.grad is not None
    assert flops.facts()["flops_per_step"] == 1024.0  # the weight gradient's mm only


def test_attention_on_a_cpu_is_counted_as_torch_counts_flash_attention() -> None:
    """torch's registry has the GPU's fused attention, not the CPU's: counted with the same
    formulas. b=2, h=4, s=16, d=8: forward two matmuls, 2*2*b*h*s*s*d = 65,536; backward
    five (the scores recomputed), 163,840."""
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    flops = StepFlops()
    flops.start()
    torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
    flops.stop()
    assert flops.facts()["flops_per_step"] == 65536.0 + 163840.0
    assert flops.facts()["flops_by_dtype"] == {"torch.float32": 229376.0}


@pytest.fixture
def measured_peaks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[torch.dtype]:
    """The dtypes the CPU's peak is measured in, each measurement a stand-in (1, 2, 3 ...
    GFLOP/s in turn); the machine's best peaks kept in tmp_path; this process has measured none."""
    from trainadvisor.compute import flops as flops_module
    from trainadvisor.compute import peaks
    from trainadvisor.compute.peaks import Peak

    monkeypatch.setenv(peaks.CPU_PEAKS_ENV, str(tmp_path / "cpu-peaks.json"))
    monkeypatch.setattr(flops_module, "_MEASURED_NOW", {})
    measured: list[torch.dtype] = []

    def fake_measure(dtype: torch.dtype) -> Peak:
        measured.append(dtype)
        return Peak(1e9 * len(measured), "fp32", "CPU (test)", "measured by the test", "measured")

    monkeypatch.setattr(peaks, "measure_cpu_peak", fake_measure)
    return measured


def test_a_process_measures_its_cpu_peak_once_for_each_dtype_and_thread_count(
    measured_peaks: list[torch.dtype],
) -> None:
    """Every window of a process (in-process trials, `@advise`) records the CPU peak: the half
    second of matmuls runs for the first only, and a new dtype or thread count measures again."""
    from trainadvisor.compute import flops as flops_module

    first = flops_module.measure_cpu_peak_facts({"torch.float32": 10.0})
    again = flops_module.measure_cpu_peak_facts({"torch.float32": 20.0})
    assert measured_peaks == [torch.float32]
    assert first["measured_now_flops_per_s"] == again["measured_now_flops_per_s"] == 1e9
    flops_module.measure_cpu_peak_facts({"torch.bfloat16": 10.0})
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        more = flops_module.measure_cpu_peak_facts({"torch.float32": 10.0})
    finally:
        torch.set_num_threads(threads)
    assert measured_peaks == [torch.float32, torch.bfloat16, torch.float32]
    assert more["measured_now_flops_per_s"] == 3e9


def test_the_runs_of_one_profile_share_the_cpu_peak_the_first_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, measured_peaks: list[torch.dtype]
) -> None:
    """A profile's later runs (trials, the confirmation run: each a new process) read the peak
    its first run wrote beside them, whatever other dtypes were kept there since; a damaged
    file, or other torch threads, is measured anew."""
    from trainadvisor.compute import flops as flops_module

    shared = tmp_path / "stage" / "cpu-peak.json"
    shared.parent.mkdir()
    try:
        flops_module.share_cpu_peak(str(shared))
        for _process in range(2):  # the baseline's process, then a trial's
            monkeypatch.setattr(flops_module, "_MEASURED_NOW", {})
            facts = flops_module.measure_cpu_peak_facts({"torch.float32": 10.0})
            assert facts["measured_now_flops_per_s"] == 1e9
        monkeypatch.setattr(flops_module, "_MEASURED_NOW", {})
        flops_module.measure_cpu_peak_facts({"torch.bfloat16": 10.0})  # a trial under autocast
        monkeypatch.setattr(flops_module, "_MEASURED_NOW", {})
        assert flops_module.measure_cpu_peak_facts({"torch.float32": 10.0})["measured_now_flops_per_s"] == 1e9
        assert measured_peaks == [torch.float32, torch.bfloat16] and shared.is_file()
        shared.write_text("{not json")
        monkeypatch.setattr(flops_module, "_MEASURED_NOW", {})
        assert flops_module.measure_cpu_peak_facts({"torch.float32": 10.0})["measured_now_flops_per_s"] == 3e9
        monkeypatch.setattr(flops_module, "_MEASURED_NOW", {})
        threads = torch.get_num_threads()
        torch.set_num_threads(threads + 1)
        try:
            flops_module.measure_cpu_peak_facts({"torch.float32": 10.0})
        finally:
            torch.set_num_threads(threads)
        assert measured_peaks == [torch.float32, torch.bfloat16, torch.float32, torch.float32]
        # the damaged file's entries are gone; what was measured since is kept side by side
        assert set(json.loads(shared.read_text())) == {
            f"torch.float32 | {threads} threads", f"torch.float32 | {threads + 1} threads",
        }  # fmt: skip
    finally:
        flops_module.share_cpu_peak(None)
