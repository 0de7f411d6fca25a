"""Paths as a published report shows them: relative to the repository root (git's top level,
found by its `.git`; outside a repository, the working directory), so that a report attached to
a pull request names `examples/train.py:56`, not `/home/ci/work/repo/examples/train.py:56`. The
absolute paths stay in the run's own log. Pure but for looking up the root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

from trainadvisor import _serial
from trainadvisor.records import Report

R = TypeVar("R", bound=Report)


def repository_root(start: Path) -> Path:
    """The nearest folder at or above `start` holding `.git` (a folder, or a worktree's file);
    `start` itself where there is none."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


def relative_text(text: str, root: Path) -> str:
    """`text` with every path under `root` written relative to it ("examples/train.py:56")."""
    prefix = str(root).rstrip(os.sep) + os.sep
    return text.replace(prefix, "") if len(prefix) > 1 else text


def relativized(plain: Any, root: Path) -> Any:
    """Plain data (a report's) with `relative_text` applied to every string in it."""
    if isinstance(plain, str):
        return relative_text(plain, root)
    if isinstance(plain, list):
        return [relativized(item, root) for item in plain]
    if isinstance(plain, dict):
        return {key: relativized(value, root) for key, value in plain.items()}
    return plain


def published(report: R, root: Path | None = None) -> R:
    """The report as it is published: every path under the repository root (`root`, else the
    one around the working directory) relative to it."""
    plain = relativized(_serial.to_plain(report), root or repository_root(Path.cwd()))
    return _serial.from_plain(type(report), plain)  # type: ignore[no-any-return]
