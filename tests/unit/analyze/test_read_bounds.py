"""The bounds on reading an input (`analyze.read.bounds`): a named pipe, a device or a socket is
refused before it is opened, a folder or a missing path is simply not a regular file, a compressed
file may expand to at most 100 times its size (64 MB at least), and a capped stream refuses the
byte past its limit, having read only one byte past it."""

from __future__ import annotations

import gzip
import io
import os
import socket
from pathlib import Path

import pytest

from trainadvisor.analyze.read.bounds import (
    EXPANSION_FLOOR_BYTES,
    EXPANSION_RATIO,
    Capped,
    expansion_limit_bytes,
    refuse_special,
    regular_file,
    too_expanded,
)
from trainadvisor.errors import UsageError

_TAIL = (
    "not a trace file; trainadvisor reads only regular files (a pipe or a device may never end): write "
    "the trace to a file and pass that"
)


def test_a_named_pipe_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)  # opening it would wait for a writer for ever: refused from its stat alone
    with pytest.raises(UsageError) as caught:
        refuse_special(fifo)
    assert str(caught.value) == f"{fifo}: a named pipe (FIFO), {_TAIL}"
    assert caught.value.exit_code == 2
    with pytest.raises(UsageError, match="a named pipe"):
        regular_file(fifo)


def test_a_link_to_a_named_pipe_is_refused_under_the_links_name(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "trace.json"
    link.symlink_to(fifo)
    with pytest.raises(UsageError) as caught:
        regular_file(link)
    assert str(caught.value) == f"{link}: a named pipe (FIFO), {_TAIL}"


def test_a_character_device_is_refused_as_a_device() -> None:
    with pytest.raises(UsageError) as caught:
        refuse_special(Path("/dev/null"))
    assert str(caught.value) == f"/dev/null: a device, {_TAIL}"


def test_a_socket_is_refused_as_a_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative name: a socket's path must be short
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind("s")
        with pytest.raises(UsageError) as caught:
            refuse_special(Path("s"))
        assert str(caught.value) == f"s: a socket, {_TAIL}"
    finally:
        server.close()


def test_a_folder_and_a_missing_path_are_not_refused_but_are_not_regular_files(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    missing = tmp_path / "nothing.json"
    refuse_special(folder)  # no error: a folder is listed, not read
    refuse_special(missing)  # no error: said where it is opened
    assert regular_file(folder) is False
    assert regular_file(missing) is False


def test_a_regular_file_and_a_link_to_one_are_regular_files(tmp_path: Path) -> None:
    trace = tmp_path / "rank0.json"
    trace.write_text('{"traceEvents": []}')
    link = tmp_path / "latest.json"
    link.symlink_to(trace)
    assert regular_file(trace) is True
    assert regular_file(link) is True


def test_a_small_compressed_file_may_expand_to_the_floor_and_a_large_one_to_a_hundred_times_it() -> None:
    assert EXPANSION_RATIO == 100
    assert EXPANSION_FLOOR_BYTES == 67_108_864  # 64 MiB
    assert expansion_limit_bytes(0) == 67_108_864
    assert expansion_limit_bytes(1000) == 67_108_864  # 100 kB expanded: under the floor
    # 64 MiB / 100 = 671088.64: 671088 bytes expand to 67108800 (the floor wins), 671089 to 67108900
    assert expansion_limit_bytes(671_088) == 67_108_864
    assert expansion_limit_bytes(671_089) == 67_108_900
    assert expansion_limit_bytes(1 << 20) == 104_857_600  # 1 MiB: 100 MiB


def test_the_refusal_of_a_bomb_says_its_limit_in_whole_megabytes() -> None:
    error = too_expanded(Path("runs/rank0.json.gz"), "decompressed", 100 << 20, "not read further")
    assert isinstance(error, UsageError)
    assert str(error) == (
        "runs/rank0.json.gz: decompressed past 100 MB, more than 100 times its size on disk (traces "
        "compress 10 to 30 times): not read further"
    )
    # a limit of 64.5 MiB is said in whole megabytes, rounded down
    half_more = too_expanded("s3://bucket/t.zip", "a member", (64 << 20) + (1 << 19), "refused")
    assert str(half_more).startswith("s3://bucket/t.zip: a member past 64 MB, more than 100 times")


def test_a_capped_reader_yields_exactly_its_limit() -> None:
    refusal = UsageError("too much")
    capped = Capped(io.BytesIO(b"0123456789"), 10, refusal)
    assert capped.read() == b"0123456789"
    assert capped.read() == b""


def test_a_capped_reader_refuses_the_byte_past_its_limit() -> None:
    refusal = UsageError("too much")
    capped = Capped(io.BytesIO(b"0123456789A"), 10, refusal)
    with pytest.raises(UsageError) as caught:
        capped.read()
    assert caught.value is refusal


def test_a_capped_reader_read_in_blocks_asks_for_one_byte_past_its_limit_at_most() -> None:
    stream = io.BytesIO(b"0123456789ABCDEF")
    capped = Capped(stream, 10, UsageError("too much"))
    assert capped.read(4) == b"0123"
    assert capped.read(4) == b"4567"
    with pytest.raises(UsageError, match="too much"):
        capped.read(4)  # 3 bytes asked, not 4: 11 read in all
    assert stream.tell() == 11


def test_a_gzip_bomb_is_refused_once_its_limit_is_decompressed_and_both_streams_are_closed() -> None:
    source = io.BytesIO(gzip.compress(b"\0" * 1000))
    stream = gzip.GzipFile(fileobj=source)
    yielded = []
    with pytest.raises(UsageError, match="bomb"):
        with Capped(stream, 999, UsageError("bomb"), source) as capped:
            while block := capped.read(100):
                yielded.append(block)
    # nine blocks of 100 pass; the tenth would take it to 1000 bytes, one past the 999 allowed
    assert [len(block) for block in yielded] == [100] * 9
    assert stream.closed and source.closed


def test_closing_a_capped_reader_without_a_source_closes_its_stream() -> None:
    stream = io.BytesIO(b"abc")
    Capped(stream, 10, UsageError("too much")).close()
    assert stream.closed
