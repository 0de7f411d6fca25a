"""The CUDA-only paths, run on a CPU: the boundary is faked (torch.cuda in a child process through
tests/fakes/cuda, NVML through tests/fakes/nvml), trainadvisor's own logic is not. Each test
fails on the code before issue 11's fixes."""

from __future__ import annotations

import json
import sys
from collections import UserDict, namedtuple
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import FAKES

from trainadvisor.fixes import flags, switches
from trainadvisor.measure.runner import _named_devices
from trainadvisor.records import LoaderInfo, Overrides
from trainadvisor.training import gpu, hooks, loaders


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
