"""Review findings on the GPU paths, confirmed against real APIs and an H100 run, each tested on a
CPU: the rank's GPU in a trace's deviceProperties, .item() calls that waited for nothing, the fp16
GradScaler on torch < 2.3, TF32 put back exactly, bf16 read off the training device, pinned
memory checked when the iterator is made, and memory against what the allocator may use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FAKES, ROOT

from trainadvisor.measure.runner import RunSpec, measure

# Runs in a child (torch's flags are process-wide and cannot be reset): for each starting state, in
# a forked process of its own, the flags as read before the switch, during it, after the restore,
# and after a later assignment at the global or backend level (what "none" vs a value decides).
_TF32_CHILD = r"""
import json, os, sys
import torch
from trainadvisor.fixes import flags

B = torch.backends
READS = {
    "global": lambda: B.fp32_precision, "cuda": lambda: B.cudnn.fp32_precision,
    "matmul": lambda: B.cuda.matmul.fp32_precision, "conv": lambda: B.cudnn.conv.fp32_precision,
    "rnn": lambda: B.cudnn.rnn.fp32_precision, "mkldnn_matmul": lambda: B.mkldnn.matmul.fp32_precision,
    "matmul.allow_tf32": lambda: B.cuda.matmul.allow_tf32, "cudnn.allow_tf32": lambda: B.cudnn.allow_tf32,
    "float32_matmul_precision": torch.get_float32_matmul_precision, "benchmark": lambda: B.cudnn.benchmark,
}
LATER = ("torch.backends.fp32_precision = 'tf32'", "torch.backends.cudnn.fp32_precision = 'ieee'")

def snapshot():
    values = {}
    for name, read in READS.items():
        try:
            values[name] = read()
        except RuntimeError:  # a mix of legacy and new flags: torch refuses the legacy read
            values[name] = "raises"
    return values

def forked(work):
    read, write = os.pipe()
    if os.fork() == 0:
        try:
            out = work()
        except Exception as exc:  # the switch failed on this state: said, not a crashed child
            out = {"error": repr(exc)}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        return json.loads(f.read())

def later():
    return [forked(lambda stmt=stmt: (exec(stmt), snapshot())[1]) for stmt in LATER]

def case(setup):
    exec(setup)
    before, before_later = snapshot(), later()
    restore = flags.switch_flags(tf32=True, cudnn_benchmark=True)
    during = snapshot()
    restore()
    return {"before": before, "during": during, "after": snapshot(), "later": [before_later, later()]}

print(json.dumps([forked(lambda setup=setup: case(setup)) for setup in json.loads(sys.argv[1])]))
"""


_STARTS = [
    "",  # nothing set: matmul inherits ("none"), conv TF32, legacy flags readable
    "torch.backends.cuda.matmul.fp32_precision = 'ieee'",
    "torch.backends.cuda.matmul.fp32_precision = 'tf32'",
    "torch.backends.cudnn.conv.fp32_precision = 'ieee'",
    "torch.backends.cudnn.conv.fp32_precision = 'none'",
    "torch.backends.fp32_precision = 'ieee'",
    "torch.backends.fp32_precision = 'ieee'; torch.backends.cuda.matmul.fp32_precision = 'none'",
    "torch.backends.fp32_precision = 'tf32'",
    "torch.backends.cudnn.fp32_precision = 'ieee'",
    "torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False",
    "torch.backends.cudnn.allow_tf32 = False",
    "torch.set_float32_matmul_precision('medium')",
    "torch.set_float32_matmul_precision('high')",
    "torch.backends.cudnn.benchmark = True",
]


# torch does not say whether an op holds "none" or its backend's value set again: written back as
# "none", an op the script set to that same value follows a later global assignment.
_SAME_AS_BACKEND = (
    "torch.backends.fp32_precision = 'ieee'; torch.backends.cuda.matmul.fp32_precision = 'ieee'"
)


@cache
def _tf32_cases() -> dict[str, dict[str, Any]]:
    starts = [*_STARTS, _SAME_AS_BACKEND]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    result = subprocess.run(
        [sys.executable, "-c", _TF32_CHILD, json.dumps(starts)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return dict(zip(starts, json.loads(result.stdout)))


@pytest.mark.skipif(not hasattr(torch.backends, "fp32_precision"), reason="torch < 2.9 has no fp32_precision")
@pytest.mark.parametrize("start", _STARTS)
def test_tf32_and_autotuning_come_back_exactly_on_the_new_api(start: str) -> None:
    """Every flag reads as before the switch (the restore wrote matmul 'ieee' where the script
    had 'none'), TF32 and autotuning were on during it, no legacy read raises that did not, and
    a later global or backend assignment lands as it would have."""
    case = _tf32_cases()[start]
    assert "error" not in case, case.get("error")
    assert case["after"] == case["before"]
    during = case["during"]
    assert (during["matmul"], during["conv"], during["benchmark"]) == ("tf32", "tf32", True)
    for read in ("matmul.allow_tf32", "cudnn.allow_tf32", "float32_matmul_precision"):
        assert during[read] != "raises" or case["before"][read] == "raises", read
    assert case["later"][1] == case["later"][0]


def test_an_op_set_to_its_backends_value_reads_back_the_same() -> None:
    case = _tf32_cases()[_SAME_AS_BACKEND]
    assert "error" not in case, case.get("error")
    assert case["after"] == case["before"] and case["during"]["matmul"] == "tf32"


def test_a_gpu_run_records_the_allocators_limit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The child under the fake CUDA (its mem_get_info and memory fraction) on an 80 GiB card
    capped at half."""
    spec = json.dumps({"name": "NVIDIA A100-SXM4-80GB", "major": 8, "memory_fraction": 0.5})
    monkeypatch.setenv("FAKE_CUDA", spec)
    paths = [str(FAKES / "cuda"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    run = RunSpec(
        "gpu", ROOT / "examples" / "small_batch.py", ["--epochs", "1", "--device", "cpu"], tmp_path / "out",
        warmup=2, steps=3, show_output=False,
    )  # fmt: skip
    raw = measure(run)
    assert raw.status == "window_complete", raw.error
    memory = raw.runtime["cuda_memory"]
    assert (memory["limit_bytes"], memory["limit_source"]) == (40 * 2**30, "per-process memory fraction 0.5")
