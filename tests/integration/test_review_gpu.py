"""Review findings on the GPU paths, confirmed against real APIs and an H100 run, each tested on a
CPU: the rank's GPU in a trace's deviceProperties, .item() calls that waited for nothing, the fp16
GradScaler on torch < 2.3, TF32 put back exactly, bf16 read off the training device, pinned
memory checked when the iterator is made, and memory against what the allocator may use."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import DATA, gpu_run, shared_trace
from torch.utils.data import DataLoader

from trainadvisor import rulebook
from trainadvisor.analyze.read.reading import read_table
from trainadvisor.analyze.run.measures import runtime_measurements, trace_measurements
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.fixes import flags, switches
from trainadvisor.fixes.amp import Amp
from trainadvisor.records import Overrides
from trainadvisor.resources import rules_dir
from trainadvisor.training import gpu, hooks, loaders

H100_TOTAL_BYTES = 85017493504  # totalGlobalMem of the H100 80GB HBM3 in the H100 run's traces


def _event(name: str, cat: str, ts: float, dur: float, **args: object) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def _two_gpu_trace(path: Path, device: int | None) -> Path:
    """One step whose kernel and copy ran on `device` (None: events that name no device), in a
    process that could see an A100 (id 0) and an H100 (id 1)."""
    on = {} if device is None else {"device": device}
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 1000),
        _event("aten::mm", "cpu_op", 100, 50),
        _event("cudaLaunchKernel", "cuda_runtime", 110, 10, correlation=1),
        _event("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", 130, 300, correlation=1, **on),
        _event("cudaMemcpyAsync", "cuda_runtime", 500, 10, correlation=2),
        _event("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 520, 5, correlation=2, bytes=64, **on),
    ]
    props = [
        {"id": 0, "name": "NVIDIA A100-SXM4-40GB", "totalGlobalMem": 42505273344, "computeMajor": 8},
        {"id": 1, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": H100_TOTAL_BYTES, "computeMajor": 9},
    ]
    path.write_text(json.dumps({"deviceProperties": props, "traceEvents": events}))
    return path


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (1, ("NVIDIA H100 80GB HBM3", H100_TOTAL_BYTES, 9)),
        (0, ("NVIDIA A100-SXM4-40GB", 42505273344, 8)),
        (None, ("NVIDIA A100-SXM4-40GB", 42505273344, 8)),  # nothing tells: the first entry
        (5, ("NVIDIA A100-SXM4-40GB", 42505273344, 8)),  # a device not listed: the first entry
    ],
)
def test_the_ranks_gpu_is_the_one_its_kernels_ran_on(
    tmp_path: Path, device: int | None, expected: tuple[str, int, int]
) -> None:
    analysis = analyze_trace(_two_gpu_trace(tmp_path / "t.json", device))
    assert (analysis.gpu_name, analysis.gpu_memory_bytes, analysis.compute_capability) == expected


def test_real_traces_name_the_gpu_their_rank_used() -> None:
    """8 visible A100s, rank 3's kernels on device 3; 4 V100s whose device 0 (the one used) has
    less memory than devices 1-3 (34,087,305,216 bytes); rank 1 of 2 V100s."""
    control = shared_trace("hta/trace_diff/control/control.json.gz")
    assert read_table(control)[0].device_events == {3: 9450}
    analysis = analyze_trace(control)
    assert (analysis.rank, analysis.gpu_name, analysis.gpu_memory_bytes) == (
        3,
        "NVIDIA A100-PG509-200",
        42505273344,
    )
    resnet = analyze_trace(
        shared_trace("tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    )
    assert (resnet.gpu_name, resnet.gpu_memory_bytes) == ("Tesla V100-DGXS-32GB", 34084028416)
    test = analyze_trace(shared_trace("hta/trace_diff/test/test.json.gz"))
    assert (test.rank, test.gpu_name, test.gpu_memory_bytes) == (1, "Tesla V100-SXM2-16GB", 16945512448)


def test_only_items_that_waited_count_in_the_h100_fp32_trace() -> None:
    """185 .item() calls in 10 steps (18.5 per step were reported), 182 of them on host tensors
    (Adam's step count): 3 copied a value from the GPU and synced its stream."""
    analysis = analyze_trace(gpu_run("fp32/traces/baseline/trainadvisor.pt.trace.json.gz"))
    assert analysis.syncs == {
        "host_item": 182,
        "item": 3,
        "stream_sync": 3,
        "copy_sync": 20,
        "device_sync": 1,
    }
    values = trace_measurements(analysis)
    assert (len(analysis.steps), values["items_per_step"], values["syncs_per_step"]) == (10, 0.3, 0.3)


def test_no_item_is_a_wait_without_a_gpu() -> None:
    """Our host_tensors example on a CPU: 3 .item() per step, none a wait (3.0 and 3.0 before)."""
    analysis = analyze_trace(DATA / "own" / "host_tensors_cpu.pt.trace.json.gz")
    assert analysis.syncs == {"host_item": 9}
    values = trace_measurements(analysis)
    assert (values["syncs_per_step"], values["items_per_step"], values["sync_ms_per_step"]) == (0.0, 0.0, 0.0)


def test_an_item_waits_by_a_copy_to_the_host_or_a_sync_on_its_own_thread(tmp_path: Path) -> None:
    """A synchronous copy to the host (no stream sync after it) is a wait; an .item() on a
    DataLoader thread while the main thread syncs is not; an empty .item() is a host tensor's."""
    item = "aten::_local_scalar_dense"
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 1000),
        _event(item, "cpu_op", 100, 60),  # of a GPU tensor: the copy is its wait
        _event("cudaMemcpy", "cuda_runtime", 105, 50, correlation=1),
        _event("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 140, 4, correlation=1, bytes=4),
        _event(item, "cpu_op", 300, 2),  # of a host tensor
        {**_event(item, "cpu_op", 400, 40), "tid": 2},  # on another thread than the sync below
        _event("cudaStreamSynchronize", "cuda_runtime", 410, 20),
        _event("cudaLaunchKernel", "cuda_runtime", 500, 5, correlation=2),
        _event("elementwise_kernel", "kernel", 510, 30, correlation=2, device=0),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    [step] = analyze_trace(path).steps
    assert step.syncs == {"item": 1, "host_item": 2, "stream_sync": 1}


def _as_torch_before_2_3(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.amp has no GradScaler and no grad_scaler module; torch.cuda.amp has both."""
    import torch.cuda.amp.grad_scaler  # noqa: F401 - imported while torch.amp.grad_scaler is there

    monkeypatch.delattr(torch.amp, "GradScaler")
    monkeypatch.setitem(sys.modules, "torch.amp.grad_scaler", None)  # an import of it fails


def test_the_fp16_fix_builds_torch_cuda_amp_grad_scaler_before_torch_2_3(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scaler_class = torch.cuda.amp.GradScaler
    _as_torch_before_2_3(monkeypatch)
    installed: list[Any] = []
    monkeypatch.setattr(switches, "install_autocast", lambda recorder, dtype: None)
    monkeypatch.setattr(
        switches, "install_step_control", lambda recorder, scaler, k: installed.append(scaler)
    )
    with pytest.warns(Warning):  # deprecated on new torch; and there is no CUDA here
        Amp().install(object(), Overrides(runtime={"amp": "fp16"}))
    assert [type(scaler) for scaler in installed] == [scaler_class]


def test_the_injected_step_reads_the_scalers_stage_before_torch_2_3(monkeypatch: pytest.MonkeyPatch) -> None:
    scaler = torch.amp.GradScaler("cpu")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    _as_torch_before_2_3(monkeypatch)
    assert switches._unscaled(scaler, optimizer) is False
    scaler.unscale_(optimizer)
    assert switches._unscaled(scaler, optimizer) is True


class _LegacyMatmul:
    """torch < 2.9's torch.backends.cuda.matmul: allow_tf32 is float32_matmul_precision != "highest",
    and setting it writes "high" or "highest"."""

    def __init__(self, precision: str) -> None:
        self.precision = precision

    @property
    def allow_tf32(self) -> bool:
        return self.precision != "highest"

    @allow_tf32.setter
    def allow_tf32(self, on: bool) -> None:
        self.precision = "high" if on else "highest"


@pytest.mark.parametrize("precision", ["highest", "high", "medium"])
@pytest.mark.parametrize("cudnn_tf32", [False, True])
@pytest.mark.parametrize("benchmark", [False, True])
def test_tf32_and_autotuning_come_back_exactly_on_the_legacy_api(
    monkeypatch: pytest.MonkeyPatch, precision: str, cudnn_tf32: bool, benchmark: bool
) -> None:
    """Each flag comes back as it was; a script's "medium" matmul precision came back "high"
    (the switch wrote allow_tf32 = True over it, and the restore True again)."""
    matmul = _LegacyMatmul(precision)
    cudnn = SimpleNamespace(allow_tf32=cudnn_tf32, benchmark=benchmark)
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends, "cudnn", cudnn)
    restore = flags.switch_flags(tf32=True, cudnn_benchmark=True)
    assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark) == (True, True, True)
    restore()
    assert (matmul.precision, cudnn.allow_tf32, cudnn.benchmark) == (precision, cudnn_tf32, benchmark)


def _two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Volta as device 0 (current) and a Hopper as device 1; torch.cuda.is_bf16_supported()
    would answer for the current device, so asking it is an error here."""
    majors = {0: 7, 1: 9}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: SimpleNamespace(major=majors[device], total_memory=1),
    )

    def current_only(**_: Any) -> bool:
        raise AssertionError("is_bf16_supported() answers for the current device")

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", current_only)
    for name in ("synchronize", "reset_peak_memory_stats", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {})
    monkeypatch.setattr(
        torch.cuda, "Event", lambda enable_timing=False: SimpleNamespace(record=lambda s: None)
    )


def test_bf16_is_read_off_the_training_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _two_gpus(monkeypatch)
    assert (gpu.native_bf16(0), gpu.native_bf16(1)) == (False, True)
    assert gpu.torch_facts(None, None, 1)["bf16_supported"] is True
    assert gpu.torch_facts(None, None)["bf16_supported"] is False  # no device known: the current one


def test_the_childs_window_reads_bf16_on_the_losses_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A rank training on cuda:1 without set_device (device 0 current)."""
    _two_gpus(monkeypatch)
    recorder = hooks.Recorder(hooks.ChildConfig("t", str(tmp_path / "r.json"), None, 1, 2, 0, False, None))
    recorder.window.device = 1  # as its first loss on cuda:1 set it
    recorder.boundary()  # the warm-up step ends: the timed steps begin
    assert recorder.window.phase == "timed" and recorder.window.facts.runtime["bf16_supported"] is True


def _build(dataset: list[int]) -> DataLoader:
    return DataLoader(dataset, batch_size=2)  # the call site the override names


_SITE = f"{__file__}:{_build.__code__.co_firstlineno + 1}"


class _Refused(Exception):
    pass


@pytest.mark.parametrize(
    ("built_on", "iterated_on", "refused"),
    [(0, 1, False), (1, 0, True)],
    ids=["set_device-after-building", "device-changed-after-building"],
)
def test_pinning_is_checked_when_the_iterator_is_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, built_on: int, iterated_on: int, refused: bool
) -> None:
    """Local rank 1 of 2: a loader built while device 0 was current and iterated after
    set_device(1) was refused; one built on device 1 and iterated on device 0 went through."""
    current = {"device": built_on}
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["device"])
    overrides = Overrides(loaders={_SITE: {"pin_memory": True}})
    # 5 warm-up steps: the window stays closed (opening it would ask the GPU for its facts)
    config = hooks.ChildConfig("t", str(tmp_path / "r.json"), None, 5, 5, 0, False, None, overrides)
    recorder = hooks.Recorder(config)
    reasons: list[str] = []

    def refuse(reason: str) -> None:
        reasons.append(reason)
        raise _Refused(reason)

    loaders.install(recorder, refuse)
    try:
        loader = _build([1, 2, 3, 4])
        assert loader.pin_memory is True and reasons == []
        current["device"] = iterated_on
        if refused:
            with pytest.raises(_Refused):
                iter(loader)
        else:
            assert [batch.tolist() for batch in loader] == [[1, 2], [3, 4]]
    finally:
        recorder.uninstall()
    expected = (
        "local rank 1 has not called torch.cuda.set_device(1) before iterating its DataLoader: with "
        "pin_memory=True its pinning thread would run on GPU 0 and every rank would open a CUDA "
        "context there; call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) first, then pin memory"
    )
    assert reasons == ([expected] if refused else [])
    assert recorder.loaders[0].override_refused == (expected if refused else None)


def _allocator(
    monkeypatch: pytest.MonkeyPatch, total: int, fraction: float, reserved_now: int, free: int, peak: int
) -> gpu.GpuWindow:
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=total)
    )
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: fraction)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(
        torch.cuda, "memory_stats", lambda device=None: {"reserved_bytes.all.current": reserved_now}
    )
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: peak)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3290632704)
    window = gpu.GpuWindow()
    window.device = 0
    return window


def test_memory_is_measured_against_a_per_process_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    """The H100 run's OOM under set_per_process_memory_fraction(0.04) (artifacts/): 3.07 GiB
    reserved of "3.17 GiB allowed", 75.38 GiB free. Against the card it read as 3.9% used."""
    window = _allocator(monkeypatch, H100_TOTAL_BYTES, 0.04, 3292528640, 80938658693, 3292528640)
    memory = window.memory()
    assert (memory["limit_bytes"], memory["limit_source"]) == (3400699740, "per-process memory fraction 0.04")
    values = runtime_measurements({"cuda_memory": memory})
    assert values["gpu_memory_bytes"] == H100_TOTAL_BYTES and values["memory_limit_bytes"] == 3400699740
    assert values["memory_limit_source"] == "per-process memory fraction 0.04"
    assert values["peak_reserved_pct"] == 100.0 * 3292528640 / 3400699740  # 96.8%
    assert values["memory_headroom_pct"] == 100.0 - values["peak_reserved_pct"]
    rule = next(r for r in rulebook.load_rules([rules_dir()]) if r.id == "memory-pressure")
    finding = rulebook.evaluate_rule(rule, values)
    assert finding is not None and finding.severity == "high"
    assert finding.message == (
        "Peak reserved GPU memory reached 97% of what this process may use, as limited by the "
        "per-process memory fraction 0.04; 0% of it was reserved by the allocator but not holding tensors."
    )
    evidence = {e.measurement: e.value for e in finding.evidence}
    assert evidence["memory_limit_bytes"] == 3400699740
    assert evidence["memory_limit_source"] == "per-process memory fraction 0.04"


@pytest.mark.parametrize(
    ("reserved_now", "free", "expected"),
    [
        # a co-tenant holds 12.3 GB: 10 GB reserved here + 62.7 GB free is all there is
        (
            10_000_000_000,
            62_717_493_504,
            (72_717_493_504, "free device memory (other processes and CUDA contexts hold 12.3 GB)"),
        ),
        (10_000_000_000, 75_017_493_504, (H100_TOTAL_BYTES, "device total")),  # nothing held elsewhere
    ],
)
def test_memory_is_measured_against_what_other_processes_leave_free(
    monkeypatch: pytest.MonkeyPatch, reserved_now: int, free: int, expected: tuple[int, str]
) -> None:
    window = _allocator(monkeypatch, H100_TOTAL_BYTES, 1.0, reserved_now, free, 60_000_000_000)
    memory = window.memory()
    assert (memory["limit_bytes"], memory["limit_source"]) == expected
    values = runtime_measurements({"cuda_memory": memory})
    assert values["peak_reserved_pct"] == 100.0 * 60_000_000_000 / expected[0]


def test_a_trace_tells_only_the_device_total() -> None:
    """Rank 1 of 2 V100s: 12.8 of its 34.1 GB reserved at the peak."""
    values = trace_measurements(
        analyze_trace(shared_trace("hta/df_index_resolver/df_index_resolver.json.gz"))
    )
    assert (values["memory_limit_bytes"], values["memory_limit_source"]) == (34089730048, "device total")
    assert values["peak_reserved_bytes"] == 12782141440
    assert values["peak_reserved_pct"] == 100.0 * 12782141440 / 34089730048  # 37.5%
