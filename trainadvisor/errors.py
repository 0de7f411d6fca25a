"""Exceptions of trainadvisor. Each carries the exit code the CLI ends with and a message
that tells the user what to do next.

May import: nothing of the package."""

from __future__ import annotations


class TrainAdvisorError(Exception):
    """Base of every error trainadvisor raises on purpose."""

    exit_code = 1


class UsageError(TrainAdvisorError):
    """The user asked for something that cannot be done as asked (missing script, bad folder)."""

    exit_code = 2


class NoStepsError(TrainAdvisorError):
    """The script ran but no training step was seen, so there is nothing to measure."""

    exit_code = 2


class RuleError(TrainAdvisorError):
    """A rule file is malformed; the message names the file and the field."""

    exit_code = 2


class ScriptFailedError(TrainAdvisorError):
    """The user's script raised or exited non-zero. What was measured is still reported."""

    exit_code = 3


class MissingDependencyError(TrainAdvisorError, ImportError):
    """An integration was used without the library it plugs into; the message says what to
    install."""

    exit_code = 2


class Terminated(BaseException):  # noqa: N818 - a signal, like KeyboardInterrupt
    """SIGTERM (what Slurm and Kubernetes send) reached trainadvisor: unwind as Ctrl-C does, so
    every child process is stopped and the report of what was measured is kept."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum
