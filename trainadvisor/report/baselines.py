"""Named baselines: reports kept under a name (`baseline:main`) in a store, so that a CI job
compares a pull request's report with the one its main branch saved, not with a path into some
earlier job's artifacts. The store is a folder, or an object-store URL (s3://bucket/prefix, and
whatever else fsspec reads) reached through the storage layer `analyze` uses, with its deadlines.

Each baseline is `NAME/report.json`, written whole: in a folder through a temporary file renamed
into place (`_serial.write_atomically`), in an object store by one PUT; two saves of one name at
once leave one of them, never a mixture or half of one."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from trainadvisor import _serial
from trainadvisor.analyze.read.sources import filesystem, is_url, store_call
from trainadvisor.errors import UsageError
from trainadvisor.report.render import MAX_REPORT_BYTES

STORE_ENV = "TRAINADVISOR_BASELINES"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
PREFIX = "baseline:"


def default_store() -> str:
    """$TRAINADVISOR_BASELINES, else trainadvisor/baselines under $XDG_DATA_HOME
    (~/.local/share)."""
    given = os.environ.get(STORE_ENV)
    if given:
        return given
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(data) / "trainadvisor" / "baselines")


def checked_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise UsageError(
            f"{name[:60]!r} is not a baseline name: letters, digits, '.', '_' and '-', starting with a "
            "letter or digit, at most 100 (main, release-2.1)"
        )
    return name


@dataclass(order=True)
class Saved:
    name: str
    size_bytes: int


def _no_larger_than_a_report(path: str, size_bytes: int) -> None:
    if size_bytes > MAX_REPORT_BYTES:
        raise UsageError(f"{path}: larger than {MAX_REPORT_BYTES // 2**20} MiB: not a report")


class BaselineStore:
    def __init__(self, location: str) -> None:
        self.location = location.rstrip("/") or location
        self.remote = is_url(location)

    def _path(self, name: str) -> str:
        return f"{self.location}/{checked_name(name)}/report.json"

    def save(self, name: str, text: str) -> str:
        path = self._path(name)
        if self.remote:
            fs, inner = filesystem(path)
            with store_call(path):
                fs.pipe(inner, text.encode())
            return path
        _serial.write_atomically(Path(path), text)
        return path

    def load(self, name: str) -> str:
        """The saved report.json's text; a usage error naming the known baselines where there is
        none by that name."""
        path = self._path(name)
        data = self._read(path)
        if data is None:
            known = ", ".join(s.name for s in self.names()) or "none yet"
            raise UsageError(
                f"no baseline {name!r} in {self.location} (saved: {known}); save one with "
                f"`trainadvisor baseline save {name} REPORT`"
            )
        return data.decode("utf-8", errors="replace")

    def _read(self, path: str) -> bytes | None:
        if self.remote:
            fs, inner = filesystem(path)
            with store_call(path):
                if not fs.exists(inner):
                    return None
                _no_larger_than_a_report(path, int(fs.size(inner) or 0))
                return bytes(fs.cat_file(inner))
        local = Path(path)
        if not local.is_file():
            return None
        _no_larger_than_a_report(path, local.stat().st_size)
        return local.read_bytes()

    def names(self) -> list[Saved]:
        if self.remote:
            fs, inner = filesystem(self.location)
            with store_call(self.location):
                found = fs.glob(f"{inner}/*/report.json", detail=True) if fs.exists(inner) else {}
            return sorted(
                Saved(p.rstrip("/").split("/")[-2], int(info.get("size") or 0)) for p, info in found.items()
            )
        root = Path(self.location)
        if not root.is_dir():
            return []
        return sorted(
            Saved(p.parent.name, p.stat().st_size)
            for p in root.glob("*/report.json")
            if NAME.fullmatch(p.parent.name) and p.is_file()
        )

    def delete(self, name: str) -> None:
        path = self._path(name)
        if self.remote:
            fs, inner = filesystem(path)
            with store_call(path):
                if not fs.exists(inner):
                    raise UsageError(f"no baseline {name!r} in {self.location}")
                fs.rm(inner)
            return
        local = Path(path)
        if not local.is_file():
            raise UsageError(f"no baseline {name!r} in {self.location}")
        local.unlink()
        try:
            local.parent.rmdir()
        except OSError:
            pass  # something else of the user's is in it: left
