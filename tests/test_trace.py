"""The Kineto trace reader, on real GPU traces recorded by others (tests/data/hta/SOURCE.md)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from conftest import DATA

from trainadvisor.analysis.trace import summarize_trace
from trainadvisor.errors import UsageError


def test_pageable_and_pinned_copies_per_step_on_a_cuda_trace() -> None:
    summary = summarize_trace(DATA / "hta" / "sampled_rank-0.json.gz")
    assert [s.number for s in summary.steps] == [551, 552]
    first, second = summary.steps
    assert (first.h2d_pageable, first.h2d_pinned, first.h2d_unknown) == (8, 4, 0)
    assert (first.h2d_copy_us, first.h2d_bytes) == (395.0, 2367536)
    assert (second.h2d_pageable, second.h2d_pinned) == (8, 4)
    assert (second.h2d_copy_us, second.h2d_bytes) == (482.0, 2498576)


def test_rocm_trace_steps_and_copies() -> None:
    summary = summarize_trace(DATA / "hta" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    # Each step also appears as a gpu_user_annotation on the GPU timeline; it is not counted.
    assert [(s.number, s.dur_us) for s in summary.steps] == [(1, 9288.291), (2, 49.073)]
    assert summary.steps[0].h2d_unknown == 2  # ROCm: "Memcpy HtoD (Host -> Device)"
    assert round(summary.steps[0].h2d_copy_us, 3) == 38.161


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"traceEvents": [', "not valid JSON"),
        (b'{"hello": 1}', "not a profiler trace"),
        (gzip.compress(b'{"traceEvents": []}')[:-8], "cannot read the trace"),
    ],
)
def test_bad_traces_get_a_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=message):
        summarize_trace(path)


def test_missing_trace(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such trace file"):
        summarize_trace(tmp_path / "nope.json")
