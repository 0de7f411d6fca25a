"""Where the shipped rule files and report templates are: inside the installed package
(the wheel maps the repository's top-level `rules/` and `templates/` there), or the repository's
own folders when running from a source checkout.

May import: nothing of the package."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"trainadvisor's {name}/ folder is missing from {_PACKAGE}: reinstall the package"
    )


def rules_dir() -> Path:
    return _shipped("rules")


def templates_dir() -> Path:
    return _shipped("templates")
