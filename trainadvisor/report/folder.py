"""The report folder: refused where it cannot be one (a file, or a folder of the user's that is
not a report: nothing of theirs is overwritten), and held by one writer at a time.

Every command that writes a report folder (`profile`, `analyze`, `report`, `@advise`) holds it
with `hold_out_dir` for as long as it writes: the folder's `.lock` is locked (flock), and a
second writer is refused, naming the first one's process.

Nothing of the user's outside the folder is written, truncated or deleted, and no link inside
it is followed to write or delete: the lock is opened without following a link, and a `.lock`
or `.work` that is a link is refused, naming it; report files are written under a temporary
name of the writer's own, created exclusively, then renamed over the old ones
(`_serial.write_atomically`); a tree that is replaced is renamed away and removed, so a link in
it, or in its place, is removed itself, never what it points to.

An earlier report stays whole until the new one replaces it. A run never writes into the
folder's traces/ or logs/: it writes them into a staging folder of its own
(`ReportFolder.stage`, `.work/stage-<pid>-<token>`). Each time it saves a report, the report
is rendered, then `ReportFolder.publish` puts the staged traces/ and logs/ in the place of the
folder's (hard links to the staged files, then one rename each way), then the report files
are written (`render.write_report`). A run that ends, fails or cannot render before its first
report leaves the earlier one as it was. The staging folder goes when the writer lets go of
the folder; one left by a writer that was killed goes when the next one takes the folder.
(`report` re-renders in place and `analyze` writes no traces: neither publishes, and neither
removes the traces beside the report it replaces.)"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import signal
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainadvisor.errors import UsageError

PUBLISHED = ("traces", "logs")  # what a run stages, and publishes beside its report files
STAGES = "stage-*"  # the staging folders in .work


def check_out_dir(out_dir: Path, option: str = "--out") -> None:
    """Refuse a report folder that cannot be one: under a file, a file itself, or a folder of the
    user's that is not an earlier report (nothing of theirs is overwritten). `option` names
    where the folder came from, for the message ("": the folder was named as itself)."""
    for folder in (out_dir, *out_dir.parents):
        if folder.exists() and not folder.is_dir():
            where = "exists and is not a folder" if folder == out_dir else f"is inside {folder}, a file"
            raise UsageError(f"{_named(out_dir, option)}: {where}; choose another {option or '--out'}")
    ours = (".work", ".lock")  # what an earlier run left before its first report
    if (
        out_dir.is_dir()
        and any(p.name not in ours for p in out_dir.iterdir())
        and not (out_dir / "report.json").exists()
    ):
        raise UsageError(
            f"{_named(out_dir, option)}: the folder has files and is not a trainadvisor report; "
            "choose an empty or new folder so nothing of yours is overwritten"
        )


@dataclass
class ReportFolder:
    """A report folder, held by one writer (`hold_out_dir`)."""

    path: Path
    _stage: Path | None = None

    @property
    def stage(self) -> Path:
        """The writer's own staging folder (made on first use): its runs write their traces/
        and logs/ here, and `publish` puts them in the folder."""
        if self._stage is None:
            work = self.path / ".work"
            work.mkdir(exist_ok=True)
            self._stage = work / f"stage-{os.getpid()}-{secrets.token_hex(4)}"
            self._stage.mkdir()
        return self._stage

    def publish(self) -> None:
        """The staged traces/ and logs/ in the place of the folder's (those of the report
        before go; a tree not staged goes too): called just before the report files that name
        them are written. The staged files stay, for the runs still to come, and are linked
        (not copied) into place."""
        stage = self.stage
        for name in PUBLISHED:
            fresh, replaced = stage / ".published" / name, stage / ".replaced" / name
            _remove(fresh)
            _remove(replaced)
            if (stage / name).is_dir():
                shutil.copytree(stage / name, fresh, symlinks=True, copy_function=_link)
            replaced.parent.mkdir(exist_ok=True)
            _swap(self.path / name, fresh, replaced)
            _remove(replaced)


@contextlib.contextmanager
def hold_out_dir(out_dir: Path, option: str = "--out") -> Iterator[ReportFolder]:
    """One writer at a time writes a report folder: the folder is checked (`check_out_dir`),
    made if need be and locked for the block; a second writer is refused, naming the first
    one's process. On leaving, the writer's staging folder goes, and the folder too if this
    writer made it and left it empty. `option` names where the folder came from, for messages."""
    lock_path = out_dir / ".lock"
    _refuse_link(lock_path, out_dir, option)
    holder = _holder_now(lock_path)
    if holder is not None:  # before the check: a run's half-written folder is busy, not foreign
        raise _busy(out_dir, option, holder)
    check_out_dir(out_dir, option)
    _refuse_link(out_dir / ".work", out_dir, option)
    made = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    handle = _lock(lock_path, out_dir, option)
    folder = ReportFolder(out_dir)
    try:
        for stale in (out_dir / ".work").glob(STAGES):  # a killed writer's
            _remove(stale, quietly=True)
        yield folder
    finally:
        _let_go(folder, handle, lock_path, made)


def _named(out_dir: Path, option: str) -> str:
    return f"{option} {out_dir}" if option else str(out_dir)


def _busy(out_dir: Path, option: str, holder: str) -> UsageError:
    return UsageError(
        f"{_named(out_dir, option)}: another trainadvisor run is writing this report (process "
        f"{holder}); wait for it to end or choose another {option or '--out'}"
    )


def _not_ours(path: Path, what: str, out_dir: Path, option: str) -> UsageError:
    return UsageError(
        f"{_named(out_dir, option)}: {path} is {what}; trainadvisor writes nothing through a link in a "
        f"report folder: remove the link or choose another {option or '--out'}"
    )


def _refuse_link(path: Path, out_dir: Path, option: str) -> None:
    if path.is_symlink():
        raise _not_ours(path, "a symbolic link", out_dir, option)


def _holder_now(lock_path: Path) -> str | None:
    """The process holding the lock (its number, or "unknown"), or None when no one does."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _pid_in(fd)
    finally:
        os.close(fd)
    return None


def _lock(lock_path: Path, out_dir: Path, option: str) -> int:
    """The lock file, opened without following a link and locked; its descriptor."""
    for _ in range(5):
        try:
            fd = os.open(
                lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _not_ours(lock_path, "a symbolic link", out_dir, option) from None
            raise
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or opened.st_nlink != 1:
                raise _not_ours(
                    lock_path, "not a file of its own (a hard link or a special file)", out_dir, option
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _busy(out_dir, option, _pid_in(fd)) from None
            if _same_file(lock_path, opened):
                with contextlib.suppress(OSError):  # a full disk: the lock holds without the number
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, str(os.getpid()).encode(), 0)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the last holder removed the file after this one opened it: open the new one
    raise _busy(out_dir, option, "unknown")


def _same_file(path: Path, opened: os.stat_result) -> bool:
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


def _pid_in(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    except OSError:
        return "unknown"


def _let_go(folder: ReportFolder, fd: int, lock_path: Path, made: bool) -> None:
    """The staging folder removed, then the lock file, while still locked (a writer that
    opened it meanwhile finds it gone and opens the next one), then the lock released."""
    try:
        if folder._stage is not None:
            _remove(folder._stage, quietly=True)
        with contextlib.suppress(OSError):  # only where nothing else is in it
            (folder.path / ".work").rmdir()
        if _same_file(lock_path, os.fstat(fd)):
            lock_path.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):
                folder.path.rmdir()
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _link(source: str, target: str) -> str:
    """A staged file in the folder: a hard link (no copy, however large), or a copy where the
    file system has none."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)
    return target


def _swap(target: Path, fresh: Path, replaced: Path) -> None:
    """`fresh` in the place of `target` (which is moved to `replaced`; a link is moved itself).
    Ctrl-C and SIGTERM wait until both renames are done: between them neither tree is there."""
    with _signals_deferred():
        moved = target.is_symlink() or target.exists()
        if moved:
            os.rename(target, replaced)
        if fresh.exists():
            try:
                os.rename(fresh, target)
            except OSError:
                if moved:
                    os.rename(replaced, target)
                raise


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # a signal is handled in the main thread: it cannot interrupt this one
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _remove(path: Path, quietly: bool = False) -> None:
    """`path` gone: a link or a file unlinked (never what a link points to), a folder with what
    is in it (shutil.rmtree unlinks the links inside without following them)."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path)
    except OSError:
        if not quietly:
            raise
