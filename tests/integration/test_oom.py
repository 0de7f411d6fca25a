"""A script that dies of out-of-memory gets a diagnosis: the allocator's state at the failing point
(read from the snapshot and statistics recorded at a real out-of-memory on an H100), the lines that
allocated the largest live blocks, and the fixes it proposes tried in fresh runs. The GPU's
boundary is faked in child processes (tests/fakes/cuda) and answers with that H100's records."""

from __future__ import annotations

import pickle

import pytest
from conftest import gpu_run
from support.oom import LARGEST, LIMIT_BYTES, LIVE_BYTES, RULES, SITES_TEXT, _artifacts

from trainadvisor import rulebook
from trainadvisor.memory import oom


def test_the_h100_out_of_memory_is_read_at_its_failing_point() -> None:
    message, stats, snapshot = _artifacts()
    assert oom.kind_of("OutOfMemoryError", message) == "cuda"
    # the message's figures, as rounded as it writes them ("3.17 GiB allowed")
    assert oom.message_figures(message) == {
        "request_bytes": 128 * 2**20,
        "device_total_bytes": round(79.18 * 2**30),
        "device_free_bytes": round(75.38 * 2**30),
        "process_used_bytes": round(3.79 * 2**30),
        "allowed_bytes": round(3.17 * 2**30),
        "allocated_bytes": round(3.06 * 2**30),
        "reserved_unallocated_bytes": round(1.81 * 2**20),
    }
    facts = oom.summarise_cuda(message, stats, snapshot, device=0)
    # exact where the statistics and the allocator's record of the refused request have it
    assert facts["request_bytes"] == 134217728 and facts["request_site"] == "residual_stack.py:16"
    assert (facts["live_bytes"], facts["reserved_bytes"]) == (LIVE_BYTES, 3292528640)
    assert facts["snapshot_live_bytes"] == LIVE_BYTES  # the snapshot's live blocks add up to it
    assert (facts["limit_bytes"], facts["limit_source"]) == (
        round(3.17 * 2**30),
        "allowed, as the error states",
    )
    # 71% of what was live came from one line of the model's forward, called from the loop's
    assert facts["largest_sites"] == LARGEST
    assert facts["unattributed_bytes"] == 33554432  # one block whose stack holds no Python frame
    table = oom.oom_measurements(facts)
    assert table["oom_largest_sites"] == SITES_TEXT
    assert table["oom_summary"] == (
        "it asked for 128.00 MiB more with 3.06 GiB already allocated, of the 3.17 GiB it may use "
        "(allowed, as the error states)"
    )
    [finding] = rulebook.evaluate(RULES, table)
    assert (finding.rule, finding.severity) == ("out-of-memory", "high")
    assert finding.fixes == ["activation-checkpointing", "grad-accumulation", "amp", "optimizer-foreach"]


def test_the_optimizer_s_storages_say_what_a_site_holds() -> None:
    """Blocks at the addresses of the optimizer's tensors are parameters (here: those the model
    put on the GPU at train_oom.py:18); the rest of what was live is activations and temporaries."""
    message, stats, snapshot = _artifacts()
    blocks = oom.live_blocks(snapshot, 0)
    owned = {b.address: ("parameters", b.size_bytes) for b in blocks if b.stack[:1] == ("train_oom.py:18",)}
    facts = oom.summarise_cuda(
        message, stats, snapshot, 0, owned, (LIMIT_BYTES, "per-process memory fraction 0.04")
    )
    assert facts["breakdown"] == {"parameters": 805999104, "other": LIVE_BYTES - 805999104}
    assert [s["holds"] for s in facts["largest_sites"]] == ["other", "parameters", "other"]
    table = oom.oom_measurements(facts)
    assert table["oom_parameters_pct"] == pytest.approx(100 * 805999104 / LIVE_BYTES)
    assert "train_oom.py:18 (768.66 MiB in 146 blocks, parameters)" in table["oom_largest_sites"]
    assert table["oom_limit_bytes"] == LIMIT_BYTES


def test_a_healthy_snapshot_has_no_failed_request() -> None:
    snapshot = pickle.loads(gpu_run("artifacts/memory_snapshot_ok.pickle").read_bytes())
    facts = oom.summarise_cuda("", {}, snapshot, 0)
    assert facts["request_bytes"] is None and "request_site" not in facts
    assert facts["snapshot_live_bytes"] == 1696974848 and facts["unattributed_bytes"] == 436556288
    assert facts["largest_sites"][0] == {
        "site": "train_oom.py:8", "bytes": 806020096, "blocks": 149, "holds": "", "stack": ["train_oom.py:8"],
    }  # fmt: skip


def test_errors_of_older_torch_and_of_host_memory() -> None:
    old = (
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB "
        "already allocated; 3.44 MiB free; 14.74 GiB reserved in total by PyTorch)"
    )
    assert oom.kind_of("RuntimeError", old) == "cuda"
    assert oom.message_figures(old) == {
        "request_bytes": 20 * 2**20,
        "device_total_bytes": round(15.78 * 2**30),
        "device_free_bytes": round(3.44 * 2**20),
        "allocated_bytes": round(14.56 * 2**30),
        "reserved_bytes": round(14.74 * 2**30),
    }
    cpu = (
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 4611686018427387904 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert oom.kind_of("RuntimeError", cpu) == "host"
    assert oom.message_figures(cpu) == {"request_bytes": 2**62}
    assert oom.kind_of("MemoryError", "") == "host"
    assert oom.kind_of("RuntimeError", "boom at step 5") is None
    assert oom.kind_of("ValueError", "CUDA error: out of bounds") is None
    # the driver's and the libraries' (real messages of torch 2.x): out of memory all the same
    assert (
        oom.kind_of("RuntimeError", "CUDA error: out of memory\nCUDA kernel errors might be asynchronously")
        == "cuda"
    )
    assert oom.kind_of("AcceleratorError", "CUDA error: out of memory") == "cuda"
    assert (
        oom.kind_of(
            "RuntimeError", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
        )
        == "cuda"
    )
    assert oom.kind_of("RuntimeError", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED") == "cuda"
    assert oom.kind_of("RuntimeError", "CUDA error: an illegal memory access was encountered") is None


def test_user_frames_are_outside_packages_and_the_standard_library() -> None:
    torch_dir = "/opt/venv/lib/python3.12/site-packages/torch/"
    assert oom.is_user_file("train_oom.py") and oom.is_user_file("/home/me/project/model.py")
    assert not oom.is_user_file(torch_dir + "nn/modules/module.py")
    assert not oom.is_user_file("/usr/lib/python3.12/runpy.py")
    assert not oom.is_user_file("??") and not oom.is_user_file("CUDACachingAllocator.cpp")
    assert not oom.is_user_file("<frozen runpy>")
    assert not oom.is_user_file(
        "/src/trainadvisor/trainadvisor/measure/child.py", ("/src/trainadvisor/trainadvisor/",)
    )
