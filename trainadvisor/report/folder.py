"""The report folder: refused where it cannot be one (a file, or a folder of the user's that is
not a report: nothing of theirs is overwritten), and locked while one run writes it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from trainadvisor.errors import UsageError


def check_out_dir(out_dir: Path, option: str = "--out") -> None:
    """Refuse a report folder that cannot be one: under a file, a file itself, or a folder of the
    user's that is not an earlier report (nothing of theirs is overwritten). `option` names
    where the folder came from, for the message."""
    for folder in (out_dir, *out_dir.parents):
        if folder.exists() and not folder.is_dir():
            where = "exists and is not a folder" if folder == out_dir else f"is inside {folder}, a file"
            raise UsageError(f"{option} {out_dir}: {where}; choose another {option}")
    ours = (".work", ".lock")  # what an earlier run left before its first report
    if (
        out_dir.is_dir()
        and any(p.name not in ours for p in out_dir.iterdir())
        and not (out_dir / "report.json").exists()
    ):
        raise UsageError(
            f"{option} {out_dir}: the folder has files and is not a trainadvisor report; "
            "choose an empty or new folder so nothing of yours is overwritten"
        )


@contextlib.contextmanager
def hold_out_dir(out_dir: Path, option: str = "--out") -> Iterator[None]:
    """One run at a time writes a report folder: the folder is checked (`check_out_dir`) and
    locked for the block; a second run into it is refused, naming the first one's process."""
    lock_path = out_dir / ".lock"
    busy = UsageError(
        f"{option} {out_dir}: another trainadvisor run is writing this report (process "
        f"{_holder(lock_path)}); wait for it to end or choose another {option}"
    )
    if lock_path.exists() and _held(lock_path):
        raise busy
    check_out_dir(out_dir, option)
    out_dir.mkdir(parents=True, exist_ok=True)
    handle = open(lock_path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise busy from None
    try:
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
        lock_path.unlink(missing_ok=True)


def _held(lock_path: Path) -> bool:
    with open(lock_path, "a+") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
    return False


def _holder(lock_path: Path) -> str:
    try:
        return lock_path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"
