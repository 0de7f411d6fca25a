"""The command line's one error boundary, shared by every command: how a message reaches the
terminal, how errors become exit codes, and how a saved report is read."""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import click

from trainadvisor.errors import Terminated, TrainAdvisorError, UsageError
from trainadvisor.records import Report
from trainadvisor.report.mdtext import terminal


def echo(message: str, err: bool = True) -> None:
    """Every line trainadvisor writes to the terminal (JSON aside): what it quotes of others
    (file names, object keys, a script's exception) shown, never acted on (`mdtext.terminal`)."""
    click.echo(terminal(message), err=err)


def run(work: Callable[[], int]) -> NoReturn:
    """The one error boundary of every command: trainadvisor's own errors as one line with
    their exit code; a file that cannot be read or written (no space left, a folder that is a
    file) as a usage problem; Ctrl-C as 130; a defect of ours as one line and exit 1, its
    traceback with TRAINADVISOR_DEBUG=1."""
    # SIGINT too: a shell starting a background job, or a scheduler, may have set it to be
    # ignored, and a `kill -INT` to this process alone must still stop the run.
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, terminate),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
    }
    try:
        code = work()
    except TrainAdvisorError as exc:
        echo(f"trainadvisor: error: {exc}")
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, Terminated) as exc:
        click.echo("trainadvisor: interrupted; the script and its workers were stopped", err=True)
        sys.exit(128 + getattr(exc, "signum", signal.SIGINT))
    except OSError as exc:
        echo(_os_error(exc))
        sys.exit(UsageError.exit_code if _about_files(exc) else TrainAdvisorError.exit_code)
    except Exception as exc:  # a defect of ours: one line for the user, the details on request
        if os.environ.get("TRAINADVISOR_DEBUG"):
            raise
        echo(
            f"trainadvisor: internal error: {type(exc).__name__}: {exc}. Please report it; "
            "set TRAINADVISOR_DEBUG=1 to see the traceback."
        )
        sys.exit(1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    sys.exit(code)


# errno values of a file that cannot be written or read: the user frees space, fixes the
# permissions or chooses another folder
_FILE_ERRNOS = frozenset({
    errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR,
    errno.ENOENT, errno.EEXIST, errno.ENAMETOOLONG, errno.ENOTEMPTY, errno.EXDEV, errno.EFBIG,
})  # fmt: skip
_FILE_ERRORS = (PermissionError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError)


def _about_files(exc: OSError) -> bool:
    """Whether `exc` is about a file (a full disk, a permission, a folder that is a file) rather
    than a connection (a tracker's server, an object store) that failed or timed out."""
    return isinstance(exc, _FILE_ERRORS) or exc.errno in _FILE_ERRNOS or exc.filename is not None


def _os_error(exc: OSError) -> str:
    if _about_files(exc):
        where = f" {exc.filename}" if exc.filename else ""
        return (
            f"trainadvisor: error: {exc.strerror or exc} while writing or reading{where}; free space, "
            "fix the permissions or choose another --out"
        )
    return (
        f"trainadvisor: error: {type(exc).__name__}: {exc.strerror or exc or 'no detail given'}; a "
        "connection failed or timed out (a tracker's server, an object store): check that it can be "
        "reached from here and run the command again"
    )


def terminate(signum: int, _frame: object) -> None:
    raise Terminated(signum)


def load(path: Path) -> Report:
    """A saved report: its folder or its report.json (`report.saved`, read when a command needs
    it: the renderer's imports are not every command's)."""
    from trainadvisor.report.saved import saved_report

    return saved_report(path)
