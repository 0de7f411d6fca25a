"""The CUDA-only paths, run on a CPU: the boundary is faked (torch.cuda in a child process through
tests/fakes/cuda, NVML through tests/fakes/nvml), trainadvisor's own logic is not. Each test
fails on the code before issue 11's fixes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import UserDict, namedtuple
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import EXAMPLES, ROOT, SCRIPTS, SETTLE_CAP, SHORT, load_report, run_cli

from trainadvisor.analyze.run.disturbance import gpu_intruders, gpu_note
from trainadvisor.analyze.run.summary import summarize
from trainadvisor.fixes import flags, switches
from trainadvisor.measure.runner import RunSpec, _named_devices, measure
from trainadvisor.records import LoaderInfo, Overrides, RawRun, StepRecord
from trainadvisor.training import gpu, hooks, loaders

FAKES = ROOT / "tests" / "fakes"
A100 = {"name": "NVIDIA A100-SXM4-80GB", "major": 8, "uuid": "2f5e8c3a-0d1b-4b7e-9a55-0c1d2e3f4a5b"}
NVML_A100 = {
    "devices": [
        {"uuid": "GPU-2f5e8c3a-0d1b-4b7e-9a55-0c1d2e3f4a5b", "util": 71, "used": 3e9, "total": 8e10,
         "power_mw": 250000, "sm_clock": 1410},
    ]
}  # fmt: skip


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Child processes believe in an A100 (FAKE_CUDA); this process's NVML is the stand-in.
    Returns the log of the child's synchronize / reset / event calls."""
    log = tmp_path / "cuda.log"
    monkeypatch.setenv("FAKE_CUDA", json.dumps({**A100, "alloc_retries_before": 3, "log": str(log)}))
    monkeypatch.setenv("FAKE_NVML", json.dumps(NVML_A100))
    paths = [str(FAKES / "cuda"), str(FAKES / "nvml"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    return log


def _log(path: Path) -> list[str]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_gpu_run_measures_its_window_edges_memory_and_device(tmp_path: Path, fake_gpu: Path) -> None:
    """The non-blocking copy patch installs (it crashed on `Tensor.__dict__['to']`); the window
    starts and ends with a synchronize, steps are timed by CUDA events too, the peaks are reset at
    the window's start and the allocator retries counted from there; the profiler asks for CUDA
    activity after one warmup step; NVML samples the GPU the child named, by UUID."""
    spec = RunSpec(
        "gpu", EXAMPLES / "small_batch.py", ["--epochs", "1", "--device", "cpu"], tmp_path / "out",
        warmup=3, steps=8, show_output=False, overrides=Overrides(non_blocking_h2d=True),
    )  # fmt: skip
    raw = measure(spec)
    assert raw.status == "window_complete", raw.error
    assert raw.runtime["cuda_used"] is True and raw.device is not None and raw.device.gpu_name == A100["name"]
    memory = raw.runtime["cuda_memory"]
    assert (memory["device"], memory["alloc_retries"], memory["ooms"]) == (
        0,
        0,
        0,
    )  # 3 retries before the window
    timed = [s for s in raw.steps if not s.profiled]
    assert len(timed) == 8 and all(s.gpu_ms is not None and s.gpu_ms > 0 for s in timed)
    assert all(s.gpu_ms is None for s in raw.steps if s.profiled)
    events = _log(fake_gpu)
    first_sync = events.index("synchronize")
    assert events[first_sync + 1] == "reset_peak_memory_stats"  # the peaks start with the window
    assert events.count("event_record") == 9  # the window's start and each timed step's end
    assert events.count("synchronize") >= 3  # start, before the last timed step's clock, reading events
    assert "profiler_cuda_requested" in events
    assert len([s for s in raw.steps if s.profiled]) == 1 + 8  # the profiler's warmup step + 8 traced
    assert raw.nvml_status == "sampled GPU 0" and raw.gpu_samples
    assert {s.device for s in raw.gpu_samples} == {"GPU 0"} and raw.gpu_samples[0].util_pct == 71.0
    # MFU against the datasheet peak of the card by its CUDA name, in the dtype the matmuls ran
    # in (fp32, TF32 as the script left it); the step's memory from the allocator's statistics
    use = summarize(raw).utilization
    tf32 = raw.runtime["tf32_enabled"]
    assert use is not None and use.peak_how == "datasheet" and use.peak_dtype == ("tf32" if tf32 else "fp32")
    assert use.peak_tflops == (156.0 if tf32 else 19.5) and use.mfu_pct is not None
    assert raw.runtime["memory"]["peak_source"] == "the CUDA allocator's peak over the step"


def test_nvml_finds_devices_by_uuid_and_says_what_it_could_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    from trainadvisor.measure.nvml import NvmlSampler

    devices = [
        {"uuid": "GPU-aaaa", "util": 10, "used": 1, "total": 2, "power_mw": 1, "sm_clock": 1},
        {"uuid": "MIG-bbbb", "util": 0, "used": 5e9, "total": 1e10, "power_mw": 0, "sm_clock": 0,
         "unsupported": ["power", "SM clock"]},
    ]  # fmt: skip
    monkeypatch.setenv("FAKE_NVML", json.dumps({"devices": devices}))
    sampler = NvmlSampler()
    sampler.add("rank 0 (GPU 0)", {"uuid": "aaaa", "index": 0})  # torch's UUID has no "GPU-"
    sampler.add("rank 1 (GPU 0)", {"uuid": "bbbb", "index": 0})  # a MIG instance
    sampler.add("rank 2 (GPU 1)", {"uuid": "cccc", "index": 1})
    sampler.add("rank 3 (GPU 0)", {"uuid": "dddd", "index": 0, "rocm": True})
    ticks = sampler.tick()
    assert [(t.device, t.util_pct, t.memory_used_bytes) for _, t in ticks] == [
        ("rank 0 (GPU 0)", 10.0, 1),
        ("rank 1 (GPU 0)", None, 5000000000),  # MIG: no utilisation, memory still sampled
    ]
    assert sampler.status(len(ticks)) == (
        "sampled rank 0 (GPU 0), rank 1 (GPU 0) (no utilisation, power, SM clock: not supported); "
        "rank 2 (GPU 1) not sampled: NVML knows no GPU with UUID cccc; "
        "rank 3 (GPU 0) not sampled: an AMD GPU (NVML samples NVIDIA GPUs only)"
    )
    sampler.close()


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (
            "NVMLError_LibraryNotFound",
            "not sampled: no NVIDIA driver library (libnvidia-ml.so) on this machine",
        ),
        ("NVMLError_DriverNotLoaded", "not sampled: the NVIDIA driver is installed but not loaded"),
        (
            "NVMLError_LibRmVersionMismatch",
            "not sampled: the NVIDIA driver and its library differ in version (reboot after a driver update)",
        ),
        ("NVMLError_NoPermission", "not sampled: no permission to query the NVIDIA driver"),
    ],
)
def test_nvml_start_errors_are_told_apart(monkeypatch: pytest.MonkeyPatch, error: str, status: str) -> None:
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setenv("FAKE_NVML", json.dumps({"init_error": error}))
    from trainadvisor.measure.nvml import NvmlSampler

    sampler = NvmlSampler()
    sampler.add("GPU 0", {"uuid": "aaaa"})
    assert (sampler.tick(), sampler.status(0)) == ([], status)


def test_every_torchrun_rank_names_its_own_gpu(tmp_path: Path) -> None:
    device_file = tmp_path / "baseline.rank{rank}.device.json"
    for rank in (0, 1):
        (tmp_path / f"baseline.rank{rank}.device.json").write_text(
            json.dumps({"index": rank, "uuid": f"u{rank}"})
        )
    (tmp_path / "baseline.rank2.device.json").write_text('{"index": ')  # still being written
    named = _named_devices(device_file)()
    assert named == {
        "rank 0 (GPU 0)": {"index": 0, "uuid": "u0"},
        "rank 1 (GPU 1)": {"index": 1, "uuid": "u1"},
    }
    single = tmp_path / "plain.device.json"
    single.write_text(json.dumps({"index": 3, "uuid": "u3"}))
    assert _named_devices(single)() == {"GPU 3": {"index": 3, "uuid": "u3"}}


class _Recorder:
    """What the switches need of `hooks.Recorder`: patches it undoes."""

    def __init__(self) -> None:
        self.loss_transform: Any = None
        self.undo: list[Any] = []
        self.steps = 0

    def patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, replacement)
        self.undo.append(lambda: setattr(owner, name, original))

    def on_uninstall(self, undo: Any) -> None:
        self.undo.append(undo)

    def optimizer_step(self, *_: Any) -> None:
        self.steps += 1

    def uninstall(self) -> None:
        while self.undo:
            self.undo.pop()()


def _clipped_norms(scaler: Any) -> tuple[list[float], list[torch.Tensor]]:
    """Train 3 steps with clipping; the norms clipping saw and the weights after."""
    recorder = _Recorder()
    if scaler is not None:
        switches.install_step_control(recorder, scaler, 1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        norms = []
        for _ in range(3):
            loss = ((model(torch.ones(4, 8)) - 3.0) ** 2).mean()
            optimizer.zero_grad()
            (recorder.loss_transform(loss) if recorder.loss_transform else loss).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
            optimizer.step()
            scheduler.step()
        return norms, [p.detach().clone() for p in model.parameters()]
    finally:
        recorder.uninstall()


def test_an_injected_grad_scaler_keeps_lr_schedulers_and_unscales_before_clipping() -> None:
    """With an LR scheduler the injected step crashed (`step_fn.__func__`); clipping saw scaled
    gradients (norm x 65536) and shrank every update by the scale."""
    plain_norms, plain_weights = _clipped_norms(None)
    scaled_norms, scaled_weights = _clipped_norms(torch.amp.GradScaler("cpu", init_scale=2.0**16))
    assert scaled_norms == pytest.approx(plain_norms, rel=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-5) for a, b in zip(scaled_weights, plain_weights))
    assert torch.nn.utils.clip_grad_norm_ is torch.nn.utils.clip_grad.clip_grad_norm_  # undone


def test_fp16_with_a_scheduler_and_clipping_runs_under_profile_trials(tmp_path: Path) -> None:
    norms = tmp_path / "norms.txt"
    spec = RunSpec(
        "fp16", SCRIPTS / "scheduled_clipped.py", ["--norms", str(norms)], tmp_path,
        warmup=2, steps=5, show_output=False, overrides=Overrides(runtime={"amp": "fp16"}),
    )  # fmt: skip
    raw = measure(spec)
    assert raw.status == "window_complete", raw.error
    assert raw.runtime["lr_scheduler"] is True
    seen = [float(line) for line in norms.read_text().split()]
    # fp16 overflows at the first scales (inf: those updates are skipped, the scale lowered);
    # the rest are the true norms (4-7 here), not 65536 times them
    finite = [n for n in seen if math.isfinite(n)]
    assert len(seen) >= 13 and len(finite) >= 8 and max(finite) < 100


def test_autocast_hands_back_fp32_outputs_so_a_functional_loss_runs_in_fp32() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> Any:
            out = self.linear(x)
            self.inner_dtype = out.dtype  # inside the model: autocast's bf16
            return {"logits": out, "pair": Pair(out, out.argmax(1)), "list": [out]}

    Pair = namedtuple("Pair", "scores labels")
    recorder = _Recorder()
    switches.install_autocast(recorder, torch.bfloat16)
    try:
        net = Net()
        outputs = net(torch.ones(3, 4))
        assert net.inner_dtype == torch.bfloat16
        assert outputs["logits"].dtype == torch.float32 and outputs["logits"].requires_grad
        assert isinstance(outputs["pair"], Pair) and outputs["pair"].scores.dtype == torch.float32
        assert outputs["pair"].labels.dtype == torch.int64 and outputs["list"][0].dtype == torch.float32
        loss = torch.nn.functional.cross_entropy(outputs["logits"], torch.tensor([0, 1, 0]))
        assert loss.dtype == torch.float32
    finally:
        recorder.uninstall()


def test_batches_in_any_mapping_or_sequence_are_counted() -> None:
    """Hugging Face's BatchEncoding is a UserDict, not a dict."""
    Batch = namedtuple("Batch", "inputs labels")
    batch = UserDict({"input_ids": torch.zeros(8, 5), "extra": [torch.ones(8), (torch.ones(8),)]})
    assert len(list(hooks.batch_tensors(batch))) == 3
    assert len(list(hooks.batch_tensors(Batch(torch.ones(4), torch.ones(4))))) == 2
    assert list(hooks.batch_tensors("text")) == []


def test_a_recorded_batch_in_a_user_dict_counts_its_samples_and_fingerprint(tmp_path: Path) -> None:
    config = hooks.ChildConfig("t", str(tmp_path / "r.json"), None, 0, 5, 0, False, None)
    recorder = hooks.Recorder(config)  # no warmup: the window measures from the first step
    recorder.data_wait(0.001, UserDict({"input_ids": torch.arange(12).reshape(6, 2)}))
    window = recorder.window
    assert window.samples == 6 and window.batches and window.batches[0].startswith("(6, 2):int64")


def test_the_patched_tensor_methods_are_inherited_ones_and_come_back() -> None:
    """`Tensor.to`/`.cuda` live on torch._C.TensorBase; patching them read `Tensor.__dict__`."""
    recorder = hooks.Recorder(hooks.ChildConfig("t", "r.json", None, 0, 1, 0, False, None))
    switches.install_non_blocking_copies(recorder)
    assert "to" in torch.Tensor.__dict__ and "cuda" in torch.Tensor.__dict__
    recorder.uninstall()
    assert "to" not in torch.Tensor.__dict__ and "cuda" not in torch.Tensor.__dict__
    assert torch.Tensor.to is torch._C.TensorBase.to


def test_only_a_dataloader_batch_is_copied_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    # Spies on the boundary (the CPU build has no working .cuda()), installed before the patch.
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: seen.append(("to", k)) or self)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: seen.append(("cuda", k)) or self)
    recorder = hooks.Recorder(hooks.ChildConfig("t", "r.json", None, 0, 1, 0, False, None))
    switches.install_non_blocking_copies(recorder)
    batch, own = torch.ones(2), torch.ones(2)
    batch._trainadvisor_batch = True  # type: ignore[attr-defined]
    batch.to("cuda"), batch.cuda(), own.to("cuda"), batch.to("cuda", non_blocking=False)
    recorder.uninstall()
    assert seen == [
        ("to", {"non_blocking": True}),
        ("cuda", {"non_blocking": True}),
        ("to", {}),
        ("to", {"non_blocking": False}),
    ]  # fmt: skip


def test_data_wait_marks_pinned_batches_for_non_blocking_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    config = hooks.ChildConfig("t", "r.json", None, 0, 1, 0, False, None, Overrides(non_blocking_h2d=True))
    recorder = hooks.Recorder(config)
    pinned, pageable = torch.ones(2), torch.ones(2)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: self is pinned)  # no GPU: nothing pins
    recorder.data_wait(0.0, (pinned, pageable))
    assert getattr(pinned, "_trainadvisor_batch", False) and not hasattr(pageable, "_trainadvisor_batch")


def _cuda_boundary(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, Any]], **props: Any) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", device)))
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device))
    )
    monkeypatch.setattr(
        torch.cuda, "memory_stats", lambda device=None: {"num_alloc_retries": 5, "num_ooms": 1}
    )
    monkeypatch.setattr(
        torch.cuda, "max_memory_allocated", lambda device=None: calls.append(("peak", device)) or 7
    )
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 9)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=100, **props)
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (95, 100))  # nothing reserved now
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 1.0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: calls.append(("stream", device)))
    monkeypatch.setattr(
        torch.cuda, "Event", lambda enable_timing=False: SimpleNamespace(record=lambda stream: None)
    )


def test_a_rank_on_its_own_gpu_without_set_device_reads_that_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that trains on cuda:1 with device 0 current: memory and syncs are device 1's."""
    calls: list[tuple[str, Any]] = []
    _cuda_boundary(monkeypatch, calls)
    loss = SimpleNamespace(device=torch.device("cuda", 1))
    device = gpu.training_device(loss)  # type: ignore[arg-type]
    window = gpu.GpuWindow()
    window.start(device)
    assert device == 1 and calls == [("sync", 1), ("reset", 1), ("stream", 1)]
    memory = window.memory()
    assert memory == {
        "device": 1, "peak_allocated_bytes": 7, "peak_reserved_bytes": 9, "total_bytes": 100,
        "limit_bytes": 95,  # nothing reserved at the end, 95 of 100 bytes free
        "limit_source": "free device memory (other processes and CUDA contexts hold 0.0 GB)",
        "alloc_retries": 0, "ooms": 0,  # counted from the window's start, not the process's
    }  # fmt: skip
    assert ("peak", 1) in calls and gpu.training_device(None) == 0


def test_pinned_memory_is_refused_for_a_rank_that_did_not_set_its_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _cuda_boundary(monkeypatch, [])
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = LoaderInfo(0, "t.py:1", "D", False, 8, 0, False, False, None, "fork", None)
    args: dict[str, Any] = {"dataset": [1, 2], "batch_size": 8}
    loaders.apply(args, {"pin_memory": True}, info)
    assert "pin_memory" not in args and info.override_refused is not None
    assert info.override_refused.startswith("local rank 1 has not called torch.cuda.set_device(1)")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # set_device(local_rank) was called
    info.override_refused = None
    loaders.apply(args, {"pin_memory": True}, info)
    assert args["pin_memory"] is True and info.override_refused is None
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert loaders.pinning_device_problem() is None


def test_bf16_and_tf32_on_older_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch < 2.3 takes no `including_emulation` (bf16 is read off the compute capability, so
    that check is never made); torch < 2.9 has no `fp32_precision` API."""
    _cuda_boundary(monkeypatch, [], major=8)

    def old_check(**kwargs: Any) -> bool:
        if kwargs:
            raise TypeError("is_bf16_supported() got an unexpected keyword argument 'including_emulation'")
        return True

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", old_check)
    monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(allow_tf32=True))
    assert gpu.native_bf16(0) is True
    assert (flags.tf32_api(), flags.tf32_enabled()) == ("legacy", True)


def test_pinned_memory_is_left_out_where_no_gpu_is_there() -> None:
    info = LoaderInfo(0, "t.py:1", "D", False, 8, 0, False, False, None, "fork", None)
    args: dict[str, Any] = {"dataset": [1, 2], "batch_size": 8}
    loaders.apply(args, {"pin_memory": True, "num_workers": 2}, info)
    assert args == {"dataset": [1, 2], "batch_size": 8, "num_workers": 2}
    assert info.overrides_applied == {"num_workers": 2} and info.pin_memory is False


@pytest.mark.parametrize(
    ("arch", "native"),
    [("gfx906:sramecc+:xnack-", False), ("gfx90a:sramecc+:xnack-", True), ("gfx942", True)],
)
def test_bf16_on_rocm_follows_the_architecture(
    monkeypatch: pytest.MonkeyPatch, arch: str, native: bool
) -> None:
    """torch.cuda.is_bf16_supported() is True on every HIP device (MI50 included)."""
    _cuda_boundary(monkeypatch, [], gcnArchName=arch)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert gpu.native_bf16(0) is native


def _in_child(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_tf32_is_read_and_switched_in_the_api_the_script_uses() -> None:
    """After `fp32_precision = "tf32"` (torch >= 2.9) reading the legacy flags raises; facts are
    read from the new API and the switch writes it, and both come back as they were."""
    new = _in_child(
        "import torch\n"
        "from trainadvisor.fixes import flags\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "torch.backends.cudnn.conv.fp32_precision = 'ieee'\n"
        "restore = flags.switch_flags(tf32=True, cudnn_benchmark=True)\n"
        "on = (flags.tf32_api(), flags.tf32_enabled(), flags.float32_matmul_precision(),\n"
        "      torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.benchmark)\n"
        "restore()\n"
        "print(on, torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.benchmark,\n"
        "      flags.tf32_api())\n"
    )
    assert new == "('new', True, 'high', 'tf32', True) ieee False new"
    legacy = _in_child(
        "import torch\n"
        "from trainadvisor.fixes import flags\n"
        "restore = flags.switch_flags(tf32=True)\n"
        "on = (flags.tf32_api(), torch.backends.cuda.matmul.allow_tf32, flags.float32_matmul_precision())\n"
        "restore()\n"
        "print(on, torch.backends.cuda.matmul.allow_tf32)\n"
    )
    assert legacy == "('legacy', True, 'high') False"


def test_a_script_on_the_new_tf32_api_is_profiled_unharmed(tmp_path: Path) -> None:
    result = run_cli(
        "profile", "--warmup", "2", "--steps", "5", "--no-fix", "--out", tmp_path / "r",
        SCRIPTS / "scheduled_clipped.py", "--tf32-new-api", "--steps", "20", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runtime = load_report(tmp_path / "r")["baseline"]["raw"]["runtime"]
    assert (runtime["tf32_api"], runtime["float32_matmul_precision"]) == ("new", "high")


@pytest.mark.long_run
def test_profile_on_a_gpu_measures_loss_noise_and_keeps_the_workers_fix(
    tmp_path: Path, fake_gpu: Path
) -> None:
    """The whole command where a GPU is believed: the baseline's seeded steps run twice to set
    the loss tolerance above the GPU's noise (none here: the arithmetic runs on the CPU), the
    workers fix's trials pin memory and copy without blocking (the patch that crashed every CUDA
    run), NVML samples the GPU the script named, and the report shows both clocks. The workers fix
    alone (--fix): the larger batches the fake A100's free memory proposes, each a fresh run, are
    tested in tests/test_memory_fixes.py."""
    result = run_cli(
        "profile", "--fix", "dataloader-workers", "--warmup", "3", "--steps", "10", *SHORT, *SETTLE_CAP,
        "--max-workers", "4", "--out", tmp_path / "r", EXAMPLES / "slow_input_mnist.py",
        "--samples", "200000", "--latency-ms", "0.5", "--device", "cpu",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "running the baseline's seeded steps again to measure the GPU's loss noise" in result.stderr
    report = load_report(tmp_path / "r")
    assert report["loss_noise_rel"] == 0.0
    noise = "Two identical runs of the baseline's seeded steps differed in loss by up to 0%"
    assert any(note.startswith(noise)
               for note in report["details"])  # fmt: skip
    [workers] = [o for o in report["fix_outcomes"] if o["fix"] == "dataloader-workers"]
    assert workers["status"] == "kept", workers
    assert all(t["overrides"]["non_blocking_h2d"] for t in workers["trials"])
    assert report["baseline"]["raw"]["nvml_status"] == "sampled GPU 0"
    assert report["baseline"]["gpu_step_time_ms"]["median"] > 0
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "| GPU time per step, median (CUDA events) |" in markdown


def test_advise_on_a_gpu_records_what_profile_records(tmp_path: Path, fake_gpu: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "from trainadvisor import advise\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "@advise(warmup=2, steps=4, out=sys.argv[1], min_time=0, max_warmup=None)\n"
        "def step(x):\n"
        "    loss = model(x).pow(2).mean()\n"
        "    optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
        "    return loss\n"
        "for _ in range(12):\n"
        "    step(torch.ones(2, 4))\n"
    )
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "r")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = load_report(tmp_path / "r")
    raw = report["baseline"]["raw"]
    assert raw["runtime"]["cuda_memory"]["alloc_retries"] == 0 and raw["nvml_status"] == "sampled GPU 0"
    assert len([s for s in raw["steps"] if s["gpu_ms"] is not None]) == 4
    assert "profiler_cuda_requested" in _log(fake_gpu)


def test_nvml_names_other_processes_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes on the run's GPU that are neither the run's nor trainadvisor's, among those this
    machine shows (a host pid from outside a container matches nothing and is not counted)."""
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    from trainadvisor.measure.nvml import NvmlSampler

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ours, absent = 424242, 2**22 + 17  # the run's rank; a pid no process here has
        processes = [[ours, 1 << 30], [other.pid, 2 << 30], [absent, 1 << 20], [os.getpid(), 0]]
        device = {"uuid": "GPU-aaaa", "util": 90, "used": 3, "total": 8, "power_mw": 1, "sm_clock": 1}
        monkeypatch.setenv("FAKE_NVML", json.dumps({"devices": [{**device, "processes": processes}]}))
        sampler = NvmlSampler()
        sampler.add("GPU 0", {"uuid": "aaaa", "index": 0})
        [(_, sample)] = sampler.tick(ours={ours})
        assert sample.other_pids == [other.pid]
        sampler.close()
    finally:
        other.kill()
        other.wait()
    raw = RawRun(
        "baseline", "window_complete", 0, None, 1, 1, 0, 2, [StepRecord(1, 0.0, 10.0, 0.0)], [], None
    )
    late = replace(sample, t_ms=11.0, other_pids=[99])  # after the window: not counted
    raw.gpu_samples = [replace(sample, t_ms=5.0), replace(sample, t_ms=9.0, other_pids=[77, other.pid]), late]
    assert gpu_intruders(raw) == {"GPU 0": sorted([77, other.pid])}
    assert gpu_note({"the baseline window": {"GPU 0": [77]}, "a trial": {}}) == (
        "Other processes ran on the GPU during the baseline window (GPU 0: pid 77): kernels of theirs "
        "share the GPU with the script's, so those timings may be disturbed; measure again with the GPU "
        "to itself."
    )
