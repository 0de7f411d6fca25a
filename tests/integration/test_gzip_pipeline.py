"""A large gzipped trace is inflated in this process and parsed on worker processes as it
streams (issue 27, `analyze.read.pipeline`): the same columns, keys and analysis as the one-process
read, bit for bit; damaged and hostile files get the one-process read's messages; small ones
keep the one-process read. The thresholds are lowered through parameters (and the block size
through the module) so that real traces of a few MB take the pipelined path in many pieces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA, shared_trace
from support.gzip_pipeline import same_table

from trainadvisor._serial import to_plain
from trainadvisor.analyze.read import pipeline, reading, stream
from trainadvisor.analyze.read.columns import Table
from trainadvisor.analyze.read.reading import read_table
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.errors import UsageError


def piped(path: Path, piece_bytes: int = pipeline.PIECE_BYTES) -> tuple[Table, dict[str, Any]]:
    read = pipeline.read_piped(path, 2, reading._context(), piece_bytes)
    assert read is not None
    return read


def test_a_gzipped_trace_read_on_workers_gives_the_analysis_of_one_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTA's df_index_resolver trace (3.0 MB gzipped, 54 MB of JSON, 216,092 events, 5 steps):
    this process reads its first 8 MB, two workers the rest in 4 MB pieces; tables and analyses
    are equal exactly."""
    trace = shared_trace("hta/df_index_resolver/df_index_resolver.json.gz")
    assert reading._piped(trace, 0) and not reading._piped(trace, None)  # 3 MB: one process by default
    parts, parts_meta = read_table(trace, 2, piped_min_gzip_bytes=0)
    whole, whole_meta = read_table(trace, 1)
    assert parts_meta == whole_meta and whole_meta["_events"] == 216092
    assert whole_meta["distributedInfo"]["rank"] == 1
    same_table(parts, whole)
    monkeypatch.setattr(reading, "PIPED_MIN_GZIP_BYTES", 0)
    on_workers, alone = to_plain(analyze_trace(trace, workers=2)), to_plain(analyze_trace(trace, workers=1))
    assert on_workers == alone
    assert (alone["events"], alone["kernels"], alone["rank"]) == (216092, 19370, 1)
    assert [step["dur_us"] for step in alone["steps"]] == [345770.0, 365256.0, 346097.0, 344269.0, 336328.0]
    assert round(alone["breakdown_pct"]["communication"], 3) == 20.564


def test_cuts_in_many_pieces_are_never_made_inside_a_string(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names that hold the boundary text itself (`}, {"ph": "X"`), cut into pieces of 16 kB (so
    that a boundary inside a string ends many of them): the same table as one process's."""
    decoy = 'x}, {"ph": "X", "ts": 1}, {"ph": "X"'
    events = []
    for i in range(2000):
        events.append({"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{i}", "ts": 100.0 * i, "dur": 90})
        events.append({"ph": "X", "cat": "cpu_op", "name": decoy * 3, "ts": 100.0 * i + 10, "dur": 5})
    trace = tmp_path / "decoy.json.gz"
    trace.write_bytes(gzip.compress(json.dumps({"traceEvents": events, "traceName": "decoy"}).encode()))
    monkeypatch.setattr(stream, "BLOCK_BYTES", 16384)
    parts, parts_meta = piped(trace, 16384)
    whole, whole_meta = read_table(trace, 1)
    assert parts_meta == whole_meta == {"traceName": "decoy", "_events": 4000}
    same_table(parts, whole)


def test_a_trace_of_kineto_spellings_reads_alike_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our own record_shapes trace (ops' shapes and dtypes, FLOPs, copies, memory events),
    with C's `inf` in some durations, in pieces of 8 kB."""
    text = gzip.decompress((DATA / "traces" / "record_shapes_bf16.json.gz").read_bytes())
    text = text.replace(b'"dur": 0.', b'"dur": inf, "was": 0.')  # the spans under a microsecond
    assert text.count(b'"dur": inf') == 185
    trace = tmp_path / "inf.json.gz"
    trace.write_bytes(gzip.compress(text))
    monkeypatch.setattr(stream, "BLOCK_BYTES", 8192)
    parts, parts_meta = piped(trace, 8192)
    whole, whole_meta = read_table(trace, 1)
    assert parts_meta == whole_meta and whole_meta["_events"] == 819
    same_table(parts, whole)


def _refusal(read: Any) -> str:
    with pytest.raises(UsageError) as refused:
        read()
    return str(refused.value)


def test_a_cut_off_or_hostile_gzip_trace_gets_the_message_of_one_process(tmp_path: Path) -> None:
    whole = gzip.compress(gzip.decompress((DATA / "traces" / "record_shapes_bf16.json.gz").read_bytes()))
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    message = _refusal(lambda: read_table(cut, 1))
    assert message == (
        f"{cut}: cannot read the trace (Compressed file ended before the end-of-stream marker was "
        "reached); is the file complete?"
    )
    assert _refusal(lambda: read_table(cut, 2, piped_min_gzip_bytes=0)) == message
    # One event whose name never ends: refused at 32 MB, wherever it is read.
    endless = tmp_path / "endless.json.gz"
    with gzip.open(endless, "wb", compresslevel=1) as f:
        f.write(b'{"traceEvents": [{"ph": "X", "name": "' + b"a" * (40 << 20))
    message = _refusal(lambda: read_table(endless, 1))
    assert message.startswith(f"{endless}: an event larger than 32 MB at byte 17;")
    assert _refusal(lambda: read_table(endless, 2, piped_min_gzip_bytes=0)) == message
