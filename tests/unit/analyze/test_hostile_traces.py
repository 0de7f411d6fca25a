"""Hostile and odd inputs to `analyze` (issue 28): archives and gzip files that expand without
bound, zero-length step markers, the non-standard numbers and strings Kineto writes, and files
that are no regular file. Each case: the exit code and the exact message, or the exact result."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from trainadvisor.analyze.read import archives, stream
from trainadvisor.errors import UsageError


def test_a_zip_of_100000_empty_members_writes_none_of_them(tmp_path: Path) -> None:
    """A 10 MB zip of 100,000 empty `*.json` members wrote them all before the first check; an
    empty member is no trace and is passed over, and past MAX_TRACE_MEMBERS trace files the
    archive is refused at the first one too many, before it is written."""
    archive = tmp_path / "empty.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for i in range(100_000):
            z.writestr(f"r{i}.json", b"")
    into = tmp_path / "unpacked"
    with pytest.raises(UsageError, match="no trace files"):
        archives.unpack(archive, into)
    assert not into.exists() or not any(into.iterdir())
    many = tmp_path / "many.zip"
    with zipfile.ZipFile(many, "w") as z:
        for i in range(6):
            z.writestr(f"r{i}.json", b"[]")
    limited = tmp_path / "limited"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(archives, "MAX_TRACE_MEMBERS", 4)
        with pytest.raises(UsageError, match=f"{many}: more than 4 trace files in one archive"):
            archives.unpack(many, limited)
    assert len(list(limited.iterdir())) == 4


def test_the_fallback_keeps_strings_as_written_and_replaces_lone_surrogates() -> None:
    events = stream._decode(
        b'[{"ph": "X", "name": "inf, NaN, -inf \\"nan\\"", "ts": 1, "dur": inf},'
        b' {"ph": "X", "name": "a\\ud83d\\ude00b\\ud800c\\\\ud800", "ts": Infinity},'
        b' {"ph": "X", "name": "\\udc00\\udc01", "ts": -1e999, "dur": NaN}]'
    )
    assert [(e.name, e.ts, e.dur) for e in events] == [('inf, NaN, -inf "nan"', 1.0, 0.0)]
    name = b"a\\ud83d\\ude00b\\ud800c\\\\ud800\\udc00\\udc01"  # a pair, a lone high, no escape, two lone lows
    events = stream._decode(b'[{"name": "' + name + b'", "ts": 2, "dur": -inf}]')
    assert [(e.name, e.ts, e.dur) for e in events] == [("a\U0001f600b\ufffdc\\ud800\ufffd\ufffd", 2.0, 0.0)]
