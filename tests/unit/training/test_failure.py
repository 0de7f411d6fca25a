"""What the child records of a script that died (`training.failure`): the line of the user's code
an error passed through last (on real exceptions raised from files written in tmp_path and run
in this process), the facts of an out-of-memory built from a faked error message (the host's
figures and the optimizer's tensors, or the message's figures where the allocator cannot be
read), and what `died` adds to the run for a recorder as the child builds it."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from trainadvisor.measure.config import ChildConfig
from trainadvisor.records import Overrides
from trainadvisor.training import failure, gpu, hooks

# The user's script: its step calls a helper of another folder, which fails in the standard
# library (json) below it.
TRAIN = """\
def step(parse):
    x = 1
    return parse("{" * x)


def oom(kind, message):
    raise kind(message)
"""
HELPER = """\
import json


def parse(text):
    return json.loads(text)
"""

# torch 2.x's wording, with round figures: 128 MiB asked for, 80 GiB in all, 2 GiB free, 4 GiB in
# use by the process, 3 GiB allowed, 2.5 GiB allocated, 1.5 MiB reserved but unallocated.
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has a total capacity of 80.00 GiB of which "
    "2.00 GiB is free. Including non-PyTorch memory, this process has 4.00 GiB memory in use. 3.00 GiB "
    "allowed; Of the allocated memory 2.50 GiB is allocated by PyTorch, and 1.50 MiB is reserved by "
    "PyTorch but unallocated."
)
CUDA_FIGURES = {
    "request_bytes": 128 * 2**20,
    "device_total_bytes": 80 * 2**30,
    "device_free_bytes": 2 * 2**30,
    "process_used_bytes": 4 * 2**30,
    "allowed_bytes": 3 * 2**30,
    "allocated_bytes": int(2.5 * 2**30),
    "reserved_unallocated_bytes": int(1.5 * 2**20),
}
HOST_OOM = (
    "DefaultCPUAllocator: can't allocate memory: you tried to allocate 100000000000000 bytes. "
    "Error code 12 (Cannot allocate memory)"
)


def _run(path: Path, source: str) -> dict[str, Any]:
    """`source` written at `path` and run as a module of this process (its code names the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    namespace: dict[str, Any] = {"__name__": path.stem}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace


def _raised(call: Any, *args: Any) -> BaseException:
    try:
        call(*args)
    except BaseException as exc:  # the error, its traceback through the files' frames
        return exc
    raise AssertionError("nothing was raised")


def _optimizer() -> torch.optim.SGD:
    """SGD with momentum on a 4 -> 3 linear layer, stepped once: weight 48 bytes and bias 12 bytes
    each of parameters, gradients and momentum buffers, on the CPU."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return optimizer


class _Process:
    """psutil's process, holding 7 MiB."""

    def memory_info(self) -> Any:
        return types.SimpleNamespace(rss=7 * 2**20)


@pytest.fixture
def fixed_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process holds 7 MiB of a 16 GiB limit."""
    monkeypatch.setattr(psutil, "Process", _Process)
    monkeypatch.setattr(failure, "_host_limit", lambda: (16 * 2**30, "the address-space limit (ulimit -v)"))


def test_the_site_is_the_innermost_frame_of_the_users_code_the_error_passed_through(tmp_path: Path) -> None:
    train = _run(tmp_path / "user" / "train.py", TRAIN)
    helper = _run(tmp_path / "lib" / "helper.py", HELPER)
    exc = _raised(train["step"], helper["parse"])
    assert isinstance(exc, ValueError)  # raised inside json, below both files
    not_user = failure._not_user()
    assert failure.failed_site(exc, not_user) == "helper.py:5"  # json's frames are the stdlib's
    helpers_folder = str(tmp_path / "lib") + "/"
    assert failure.failed_site(exc, (*not_user, helpers_folder)) == "train.py:3"


def test_an_error_that_passed_through_no_users_frame_has_no_site(tmp_path: Path) -> None:
    train = _run(tmp_path / "user" / "train.py", TRAIN)
    helper = _run(tmp_path / "lib" / "helper.py", HELPER)
    exc = _raised(train["step"], helper["parse"])
    # the files', this test's (where it was caught) and the standard library's: none the user's
    everything = (str(tmp_path) + "/", str(Path(__file__).parent) + "/", *failure._not_user())
    assert failure.failed_site(exc, everything) == ""
    assert failure.failed_site(ValueError("never raised"), ()) == ""


def test_not_user_holds_torch_trainadvisor_and_the_standard_library() -> None:
    import json

    import trainadvisor

    folders = failure._not_user()
    assert all(folder.endswith("/") for folder in folders)
    for module in (torch, trainadvisor, json):
        assert any(str(Path(module.__file__).resolve()).startswith(f) for f in folders), module


def test_an_error_other_than_out_of_memory_has_no_facts() -> None:
    assert failure.oom_facts(ValueError("shapes (2,3) and (4,5) do not match"), None, None) is None
    assert failure.oom_facts(RuntimeError("CUDA error: device-side assert triggered"), None, None) is None


@pytest.mark.usefixtures("fixed_host")
def test_a_host_out_of_memory_records_the_request_what_the_process_held_and_the_optimizers_tensors(
    tmp_path: Path,
) -> None:
    train = _run(tmp_path / "train.py", TRAIN)
    exc = _raised(train["oom"], RuntimeError, HOST_OOM)
    assert failure.oom_facts(exc, _optimizer(), None) == {
        "kind": "host",
        "message_figures": {"request_bytes": 10**14},
        "request_bytes": 10**14,
        "live_bytes": 7 * 2**20,
        "limit_bytes": 16 * 2**30,
        "limit_source": "the address-space limit (ulimit -v)",
        "breakdown": {"parameters": 60, "gradients": 60, "optimizer_state": 60},
        "failed_site": "train.py:7",
    }


@pytest.mark.usefixtures("fixed_host")
def test_pythons_memory_error_without_an_optimizer_has_no_breakdown() -> None:
    assert failure.oom_facts(MemoryError(), None, None) == {
        "kind": "host",
        "message_figures": {},
        "request_bytes": None,
        "live_bytes": 7 * 2**20,
        "limit_bytes": 16 * 2**30,
        "limit_source": "the address-space limit (ulimit -v)",
        "failed_site": "",
    }


def test_a_cuda_out_of_memory_whose_allocator_cannot_be_read_keeps_the_messages_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def gone(device: int) -> dict[str, Any]:
        raise RuntimeError("CUDA driver gone")

    monkeypatch.setattr(gpu, "cuda_in_use", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_stats", gone)
    train = _run(tmp_path / "train.py", TRAIN)
    exc = _raised(train["oom"], torch.OutOfMemoryError, CUDA_OOM)
    assert failure.oom_facts(exc, None, 0) == {
        "kind": "cuda",
        "message_figures": CUDA_FIGURES,
        "request_bytes": 128 * 2**20,
        "note": "the allocator's state could not be read: RuntimeError: CUDA driver gone",
        "failed_site": "train.py:7",
    }


def test_the_host_limit_is_the_address_space_limit_where_one_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (3 * 2**30, resource.RLIM_INFINITY))
    assert failure._host_limit() == (3 * 2**30, "the address-space limit (ulimit -v)")
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert failure._host_limit() == (psutil.virtual_memory().total, "the machine's memory")


def test_owned_lists_each_storage_the_optimizer_holds_on_that_kind_of_device_once() -> None:
    optimizer = _optimizer()
    owned = failure._owned(optimizer, "cpu")
    each = [(what, size) for what in ("parameters", "gradients", "optimizer_state") for size in (48, 12)]
    assert sorted(owned.values()) == sorted(each)
    weight = optimizer.param_groups[0]["params"][0]
    assert owned[weight.untyped_storage().data_ptr()] == ("parameters", 48)
    assert failure._owned(optimizer, "cuda") == {} and failure._owned(None, "cpu") == {}


def _recorder(tmp_path: Path, warmup: int, runtime: dict[str, Any] | None = None) -> hooks.Recorder:
    config = ChildConfig("t", str(tmp_path / "r.json"), None, warmup, 2, 0, False, None)
    config.overrides = Overrides(runtime=runtime or {})
    return hooks.Recorder(config)


def test_died_of_another_error_records_nothing(tmp_path: Path) -> None:
    assert failure.died(ValueError("a bug"), _recorder(tmp_path, warmup=5)) == {}


@pytest.mark.usefixtures("fixed_host")
def test_died_before_the_window_records_the_oom_and_torchs_facts_with_the_first_optimizer_built(
    tmp_path: Path,
) -> None:
    recorder = _recorder(tmp_path, warmup=5, runtime={"amp": "bf16"})
    optimizer = _optimizer()
    recorder.optimizer_built(optimizer)  # built, never stepped under the recorder
    found = failure.died(MemoryError(), recorder)
    assert found["oom"]["breakdown"] == {"parameters": 60, "gradients": 60, "optimizer_state": 60}
    assert set(found) == {
        "oom", "cuda_used", "anomaly_detection", "float32_matmul_precision", "tf32_api",
        "data_parallel_modules", "amp_override", "intra_op_threads", "optimizer", "lr_scheduler",
        "optimizer_fused", "optimizer_foreach", "optimizer_has_foreach", "optimizer_fusable",
    }  # fmt: skip
    assert (found["cuda_used"], found["amp_override"], found["data_parallel_modules"]) == (False, "bf16", 0)
    assert (found["optimizer"], found["lr_scheduler"], found["optimizer_fused"]) == ("SGD", False, False)
    assert "cuda_memory" not in found  # no GPU used: no peaks to read


@pytest.mark.usefixtures("fixed_host")
def test_died_inside_the_window_records_only_the_oom_with_the_counted_optimizer(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path, warmup=1)
    optimizer = _optimizer()
    recorder.optimizer_step(optimizer)  # the warm-up step: the window opens and reads torch's facts
    assert recorder.window.phase == "timed" and recorder.window.facts.runtime
    found = failure.died(RuntimeError(HOST_OOM), recorder)
    assert list(found) == ["oom"]
    assert found["oom"]["breakdown"] == {"parameters": 60, "gradients": 60, "optimizer_state": 60}
    assert found["oom"]["request_bytes"] == 10**14


@pytest.mark.usefixtures("fixed_host")
def test_died_says_on_stderr_when_reading_the_facts_fails_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any) -> dict[str, Any]:
        raise RuntimeError("no facts")

    monkeypatch.setattr(gpu, "torch_facts", broken)
    assert failure.died(MemoryError(), _recorder(tmp_path, warmup=5)) == {}
    assert capsys.readouterr().err == (
        "[trainadvisor] could not read the memory at the failure: RuntimeError('no facts')\n"
    )
