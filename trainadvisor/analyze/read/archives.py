"""Traces shipped as one archive (`ranks.tar.gz`, `ranks.zip`): the trace files inside are
unpacked into a folder of ours under names of ours (a member's path never decides where it is
written: no `../`, no links, no devices). What an archive expands to is bounded while it is read
(`bounds`): a member is refused before a byte of it is written when its size would take the
archive past its bound or fill the disk, and the bytes decompressed, those of skipped members
too, are counted as they come."""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

from trainadvisor.analyze.read.bounds import Capped, Readable, expansion_limit_bytes, too_expanded
from trainadvisor.analyze.read.sources import ARCHIVE_SUFFIXES, TRACE_SUFFIXES
from trainadvisor.errors import UsageError

_UNSAFE = re.compile(r"[^\w.-]+")
# The most trace files one archive may hold: a job of thousands of ranks writes one trace each
# (more are read from a folder or a store's prefix); 100,000 members of a few bytes each are a
# bomb of another kind, refused at the one past this before it is written. An empty member is
# no trace: it is passed over, never written.
MAX_TRACE_MEMBERS = 16_384
_REFUSED = (
    "a compression bomb or a damaged archive, not unpacked further; if it is genuine, unpack it "
    "yourself and pass the folder"
)
# A tar compressed as a whole, by its first bytes (a `.tar` may be compressed: tar reads it so).
_DECOMPRESSED: dict[bytes, Callable[[IO[bytes]], Readable]] = {
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    b"BZh": bz2.BZ2File,
    b"\xfd7zXZ\x00": lzma.LZMAFile,
}


def is_archive(path: Path) -> bool:
    return path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES)


def unpack(archive: Path, into: Path) -> list[tuple[Path, str]]:
    """(unpacked file, `archive:member` to show) for each trace file in the archive, in the
    order of the members' names."""
    unpacker = _Unpacker(archive, into)
    try:
        if archive.name.endswith(".zip"):
            _unpack_zip(archive, unpacker)
        else:
            _unpack_tar(archive, unpacker)
    # RuntimeError: an encrypted zip member; NotImplementedError: a compression zipfile lacks.
    except (
        tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, zlib.error, lzma.LZMAError, RuntimeError,
        NotImplementedError,
    ) as exc:  # fmt: skip
        raise UsageError(f"{archive}: cannot read the archive ({exc}); is the file complete?") from None
    if not unpacker.found:
        raise UsageError(f"{archive}: no trace files (*.json, *.json.gz) in this archive")
    return sorted(unpacker.found, key=lambda found: found[1])


def _unpack_tar(archive: Path, unpacker: _Unpacker) -> None:
    """Member by member as the archive is read (a stream: nothing is listed first, which
    would decompress it all)."""
    with open(archive, "rb") as raw:
        head = raw.read(6)
        raw.seek(0)
        opener = next((o for magic, o in _DECOMPRESSED.items() if head.startswith(magic)), None)
        refusal = too_expanded(archive, "expands", unpacker.limit_bytes, _REFUSED)
        stream = Capped(opener(raw) if opener else raw, unpacker.limit_bytes, refusal)
        with stream, tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                source = tar.extractfile(member) if member.isfile() else None
                if source is not None and member.size and member.name.endswith(TRACE_SUFFIXES):
                    unpacker.write(member.name, source, member.size)
                tar.members.clear()  # tar keeps every header read; a million empty members are a bomb too


def _unpack_zip(archive: Path, unpacker: _Unpacker) -> None:
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            link = stat.S_ISLNK(info.external_attr >> 16)
            trace = info.file_size and info.filename.endswith(TRACE_SUFFIXES)
            if trace and not info.is_dir() and not link:
                unpacker.write(info.filename, z.open(info), info.file_size)


class _Unpacker:
    """Writes an archive's trace members into `into`, within the archive's bound and 80% of
    the free space there."""

    def __init__(self, archive: Path, into: Path) -> None:
        self.archive, self.into = archive, into
        self.limit_bytes = expansion_limit_bytes(archive.stat().st_size)
        self.written_bytes = 0
        self.found: list[tuple[Path, str]] = []
        self._free_bytes: int | None = None

    def write(self, name: str, source: IO[bytes] | tarfile.ExFileObject, size_bytes: int) -> None:
        """Member `name` (of `size_bytes`, as its header says) from `source`; refused before
        a byte is written where it does not fit, and stopped where it holds more than that."""
        self._admit(name, size_bytes)
        target = self.into / f"{len(self.found):04d}_{_UNSAFE.sub('_', Path(name).name)}"
        copied_bytes = 0
        with source, open(target, "wb") as out:
            while block := source.read(1 << 20):
                copied_bytes += len(block)
                if copied_bytes > size_bytes:
                    raise UsageError(
                        f"{self.archive}: {name} holds more than the {size_bytes} bytes its header "
                        "gives; the archive is damaged, not unpacked further"
                    )
                out.write(block)
        self.written_bytes += copied_bytes
        self.found.append((target, f"{self.archive.name}:{name}"))

    def _admit(self, name: str, size_bytes: int) -> None:
        if len(self.found) >= MAX_TRACE_MEMBERS:
            raise UsageError(
                f"{self.archive}: more than {MAX_TRACE_MEMBERS:,} trace files in one archive, not "
                "unpacked further; unpack it yourself and pass the folder, or store the traces under "
                "a prefix (s3://...) and pass that"
            )
        needed_bytes = self.written_bytes + size_bytes
        if needed_bytes > self.limit_bytes:
            raise too_expanded(
                self.archive, f"unpacking {name} would take the archive", self.limit_bytes, _REFUSED
            )
        self.into.mkdir(parents=True, exist_ok=True)
        if self._free_bytes is None:
            self._free_bytes = shutil.disk_usage(self.into).free
        if needed_bytes > 0.8 * self._free_bytes:
            raise UsageError(
                f"{self.archive}: its traces take {needed_bytes / 1e9:.1f} GB or more unpacked, more than "
                f"the free space where trainadvisor would unpack them ({self._free_bytes / 1e9:.1f} GB in "
                f"{self.into}); unpack them elsewhere and pass the folder"
            )
