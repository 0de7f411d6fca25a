"""Hostile and odd inputs to `analyze` (issue 28): archives and gzip files that expand without
bound, zero-length step markers, the non-standard numbers and strings Kineto writes, and files
that are no regular file. Each case: the exit code and the exact message, or the exact result."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, shared_trace

from trainadvisor.analyze.read import archives
from trainadvisor.errors import UsageError

BOMB_ADVICE = (
    "64 MB, more than 100 times its size on disk (traces compress 10 to 30 times): a compression bomb or a "
    "damaged archive, not unpacked further; if it is genuine, unpack it yourself and pass the folder"
)


def _analyze(tmp_path: Path, *paths: Path | str) -> tuple[int, str, dict[str, Any] | None]:
    """Exit code, stderr and the JSON report (None on failure) of `analyze --json PATHS`."""
    done = run_cli("analyze", "--json", "--out", tmp_path / "r", *paths, cwd=tmp_path, timeout_s=120)
    return done.returncode, done.stderr, json.loads(done.stdout) if done.returncode == 0 else None


class _Spaces(io.RawIOBase):
    """`size_bytes` spaces, read a block at a time (not held in memory)."""

    def __init__(self, size_bytes: int) -> None:
        self.left_bytes = size_bytes

    def read(self, size: int = -1) -> bytes:
        size = self.left_bytes if size < 0 else min(size, self.left_bytes)
        self.left_bytes -= size
        return b" " * size


def _tar_gz(path: Path, members: dict[str, int]) -> None:
    """A .tar.gz whose members (name: size) are spaces: a thousand times smaller on disk."""
    with tarfile.open(path, "w:gz") as tar:
        for name, size_bytes in members.items():
            info = tarfile.TarInfo(name)
            info.size = size_bytes
            tar.addfile(info, _Spaces(size_bytes))


def test_a_tar_gz_bomb_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    archive = tmp_path / "ranks.tar.gz"
    _tar_gz(archive, {"rank0.json": 80 << 20})
    assert archive.stat().st_size < 200 << 10
    code, err, _ = _analyze(tmp_path, archive)
    assert code == 2
    assert err.splitlines() == [
        f"trainadvisor: error: {archive}: unpacking rank0.json would take the archive past {BOMB_ADVICE}"
    ]
    into = tmp_path / "unpacked"
    with pytest.raises(UsageError):
        archives.unpack(archive, into)
    assert not into.exists() or not any(into.iterdir())


def test_members_are_refused_at_the_one_that_takes_the_archive_past_its_bound(tmp_path: Path) -> None:
    """Each member alone is within the bound; together they are not: the fourth is refused
    before a byte of it is written, and no more than the bound was written before it."""
    archive = tmp_path / "ranks.tgz"
    _tar_gz(archive, {f"rank{i}.json": 20 << 20 for i in range(5)})
    code, err, _ = _analyze(tmp_path, archive)
    assert code == 2
    assert err.splitlines() == [
        f"trainadvisor: error: {archive}: unpacking rank3.json would take the archive past {BOMB_ADVICE}"
    ]
    into = tmp_path / "unpacked"
    with pytest.raises(UsageError):
        archives.unpack(archive, into)
    assert sorted(p.name for p in into.iterdir()) == ["0000_rank0.json", "0001_rank1.json", "0002_rank2.json"]


def test_an_archive_that_expands_past_its_bound_in_other_members_is_not_read_to_its_end(
    tmp_path: Path,
) -> None:
    """What is not a trace is not written, but still decompressed to be skipped: bounded too."""
    archive = tmp_path / "job.tar.gz"
    _tar_gz(archive, {"checkpoint.pt": 70 << 20, "rank0.json": 10})
    code, err, _ = _analyze(tmp_path, archive)
    assert code == 2
    assert err.splitlines() == [f"trainadvisor: error: {archive}: expands past {BOMB_ADVICE}"]


def test_a_zip_bomb_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    archive = tmp_path / "ranks.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("rank0.json", b"[]")
        with z.open("logs/rank1.json", "w") as member:
            shutil.copyfileobj(_Spaces(80 << 20), member)
    code, err, _ = _analyze(tmp_path, archive)
    assert code == 2
    assert err.splitlines() == [
        f"trainadvisor: error: {archive}: unpacking logs/rank1.json would take the archive past {BOMB_ADVICE}"
    ]
    into = tmp_path / "unpacked"
    with pytest.raises(UsageError):
        archives.unpack(archive, into)
    assert [p.name for p in into.iterdir()] == ["0000_rank0.json"]


def test_a_zip_of_rank_traces_is_analysed(tmp_path: Path) -> None:
    archive = tmp_path / "ranks.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for rank in (1, 0):
            z.write(shared_trace(f"hta/trace_filter/sampled_rank-{rank}.json.gz"), f"job/rank-{rank}.json.gz")
        z.writestr("job/notes.txt", "not a trace")
    code, err, report = _analyze(tmp_path, archive)
    assert code == 0, err
    assert report is not None
    shown = ["ranks.zip:job/rank-0.json.gz", "ranks.zip:job/rank-1.json.gz"]
    assert [t["path"] for t in report["traces"]] == shown
    assert [row["rank"] for row in report["ranks"]["rows"]] == [0, 1]


def test_a_gzip_trace_that_expands_past_its_bound_is_refused(tmp_path: Path) -> None:
    """Valid, small events (no one of them too large), repeated: 80 MB from 0.2 MB on disk."""
    trace = tmp_path / "rank0.json.gz"
    event = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1, "pid": 1, "tid": 1}, '
    with gzip.open(trace, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents": [')
        for _ in range(80):
            f.write(event * ((1 << 20) // len(event)))
        f.write(event.rstrip(b", ") + b"]}")
    assert trace.stat().st_size < 400 << 10
    code, err, _ = _analyze(tmp_path, trace)
    assert code == 2
    assert err.splitlines() == [
        f"trainadvisor: error: {trace}: decompresses past 64 MB, more than 100 times its size on disk "
        "(traces compress 10 to 30 times): a compression bomb or a damaged file, not read further; if it "
        "is genuine, decompress it (gunzip) and pass the .json"
    ]


def _event(name: str, ts: float, dur: float, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def _stepped_trace(path: Path, step_durations_us: list[float]) -> Path:
    events = []
    for i, dur in enumerate(step_durations_us):
        events.append(_event(f"ProfilerStep#{i}", 1000 * i, dur, "user_annotation"))
        events.append(_event("aten::mm", 1000 * i + 10, 500))
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_zero_length_step_markers_are_skipped_and_the_report_says_so(tmp_path: Path) -> None:
    trace = _stepped_trace(tmp_path / "steps.json", [900, 0, 900, 0])
    code, err, report = _analyze(tmp_path, trace)
    assert code == 0, err
    assert report is not None
    (analysis,) = report["traces"]
    assert [(s["number"], s["dur_us"]) for s in analysis["steps"]] == [(0, 900.0), (2, 900.0)]
    assert analysis["step_method"] == (
        "2 ProfilerStep#N markers (2 zero-length markers skipped: ProfilerStep#1, ProfilerStep#3)"
    )


def test_a_trace_whose_step_markers_all_have_zero_length_is_one_window(tmp_path: Path) -> None:
    trace = _stepped_trace(tmp_path / "steps.json", [0, 0, 0])
    code, err, report = _analyze(tmp_path, trace)
    assert code == 0, err
    assert report is not None
    (analysis,) = report["traces"]
    assert [(s["number"], s["dur_us"]) for s in analysis["steps"]] == [(0, 2510.0)]
    assert analysis["step_method"] == (
        "nothing marks an iteration: the trace is one window (3 zero-length markers skipped: "
        "ProfilerStep#0, ProfilerStep#1, ProfilerStep#2)"
    )


def test_a_trace_of_one_zero_length_step_marker_has_nothing_to_analyse(tmp_path: Path) -> None:
    trace = tmp_path / "one.json"
    trace.write_text(json.dumps({"traceEvents": [_event("ProfilerStep#0", 5, 0, "user_annotation")]}))
    code, err, _ = _analyze(tmp_path, trace)
    assert code == 2
    assert err.splitlines() == [
        f"trainadvisor: error: {trace}: the trace has no host or device events to analyse (an empty trace?)"
    ]


def test_nan_infinity_bare_inf_and_lone_surrogates_are_read(tmp_path: Path) -> None:
    """Kineto writes C++'s `inf` and `nan` for an undefined number (pytorch/kineto#105), and
    names as it finds them (half of a surrogate pair, escaped). An event without a finite start
    is dropped; one without a finite duration has none."""
    lines = [
        '"cat": "user_annotation", "name": "ProfilerStep#0", "ts": 0, "dur": 900',
        '"cat": "cpu_op", "name": "inf", "ts": 10, "dur": inf',
        '"cat": "cpu_op", "name": "aten::mm \\ud800", "ts": 20, "dur": 500, "args": {"warps per SM": -inf, '
        '"blocks per SM": Infinity, "occupancy %": NaN, "x": -Infinity}',
        '"cat": "cpu_op", "name": "lost", "ts": nan, "dur": 1',
        '"cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1000, "dur": 900',
        '"cat": "cpu_op", "name": "aten::mm \\udc00\\\\ud800", "ts": 1010, "dur": 500, '
        '"args": {"ratio": -nan}',
    ]
    trace = tmp_path / "kineto.json"
    events = ",\n".join('{"ph": "X", "pid": 1, "tid": 1, ' + line + "}" for line in lines)
    trace.write_text('{"schemaVersion": 1, "traceEvents": [\n' + events + '\n], "x": inf}')
    code, err, report = _analyze(tmp_path, trace)
    assert code == 0, err
    assert report is not None
    (analysis,) = report["traces"]
    assert analysis["events"] == 5
    assert [(s["number"], s["dur_us"], s["ms"]["other_host"]) for s in analysis["steps"]] == [
        (0, 900.0, 0.5),
        (1, 900.0, 0.5),
    ]


NOT_A_FILE = (
    "not a trace file; trainadvisor reads only regular files (a pipe or a device may never end): "
    "write the trace to a file and pass that"
)


def test_a_named_pipe_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    code, err, _ = _analyze(tmp_path, fifo)  # opening it would wait forever for a writer
    assert code == 2
    assert err.splitlines() == [f"trainadvisor: error: {fifo}: a named pipe (FIFO), {NOT_A_FILE}"]


def test_a_folder_with_a_named_pipe_among_its_traces_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ranks"
    folder.mkdir()
    _stepped_trace(folder / "rank0.json", [900, 900])
    os.mkfifo(folder / "rank1.json")
    code, err, _ = _analyze(tmp_path, folder)
    assert code == 2
    fifo = folder / "rank1.json"
    assert err.splitlines() == [f"trainadvisor: error: {fifo}: a named pipe (FIFO), {NOT_A_FILE}"]


def test_a_named_pipe_named_by_a_file_url_is_refused_too(tmp_path: Path) -> None:
    """`file://` is read through fsspec's local filesystem: it opened the pipe and waited for a
    writer forever; a pipe in a folder named by a file:// URL, too."""
    pytest.importorskip("fsspec")
    folder = tmp_path / "ranks"
    folder.mkdir()
    fifo = folder / "rank0.json"
    os.mkfifo(fifo)
    for url in (f"file://{fifo}", f"file://{folder}/"):
        code, err, _ = _analyze(tmp_path, url)
        assert code == 2
        assert err.splitlines() == [f"trainadvisor: error: {fifo}: a named pipe (FIFO), {NOT_A_FILE}"]


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero on this system")
def test_a_device_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    code, err, _ = _analyze(tmp_path, Path("/dev/zero"))
    assert code == 2
    assert err.splitlines() == [f"trainadvisor: error: /dev/zero: a device, {NOT_A_FILE}"]


@pytest.mark.parametrize(
    "events",
    [
        # one device event of zero length (a one-kernel trace)
        [{"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 1000,
          "dur": 0, "args": {"device": 0, "stream": 7}}],
        # kineto issue 105's shape: zero-length events, one with a bare inf in its arguments
        [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000, "dur": 0},
         {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1000, "dur": 0,
          "args": {"device": 0, "stream": 7, "blocks per SM": "INF"}}],
    ],
)  # fmt: skip
def test_a_trace_whose_events_all_last_zero_us_is_reported(tmp_path: Path, events: list[Any]) -> None:
    """Every event 0 us long: the report's timeline divided by its tallest step (0), a
    ZeroDivisionError, exit 1 and no report; now the report is written, without a timeline."""
    trace = tmp_path / "zero.json"
    trace.write_text(json.dumps({"traceEvents": events}).replace('"INF"', "inf"))
    code, stderr, report = _analyze(tmp_path, trace)
    assert code == 0, stderr
    assert report is not None and (tmp_path / "r" / "report.html").is_file()
