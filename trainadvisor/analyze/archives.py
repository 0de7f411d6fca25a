"""Traces shipped as one archive (`ranks.tar.gz`): the trace files inside are unpacked into a
folder of ours under names of ours (a member's path never decides where it is written: no
`../`, no links, no devices), after checking that they fit in the free space there."""

from __future__ import annotations

import re
import shutil
import tarfile
from pathlib import Path

from trainadvisor.errors import UsageError

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
TRACE_SUFFIXES = (".json", ".json.gz")
_UNSAFE = re.compile(r"[^\w.-]+")


def is_archive(path: Path) -> bool:
    return path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES)


def unpack(archive: Path, into: Path) -> list[tuple[Path, str]]:
    """(unpacked file, `archive:member` to show) for each trace file in the archive."""
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(TRACE_SUFFIXES)]
            if not members:
                raise UsageError(f"{archive}: no trace files (*.json, *.json.gz) in this archive")
            into.mkdir(parents=True, exist_ok=True)
            needed, free = sum(m.size for m in members), shutil.disk_usage(into).free
            if needed > 0.8 * free:
                raise UsageError(
                    f"{archive}: its traces take {needed / 1e9:.1f} GB unpacked, more than the free space "
                    f"where trainadvisor would unpack them ({free / 1e9:.1f} GB in {into}); unpack them "
                    "elsewhere and pass the folder"
                )
            found = []
            for i, member in enumerate(sorted(members, key=lambda m: m.name)):
                target = into / f"{i:04d}_{_UNSAFE.sub('_', Path(member.name).name)}"
                source = tar.extractfile(member)
                if source is None:
                    continue
                with source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                found.append((target, f"{archive.name}:{member.name}"))
            return found
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UsageError(f"{archive}: cannot read the archive ({exc}); is the file complete?") from None
