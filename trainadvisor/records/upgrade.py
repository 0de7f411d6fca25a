"""A saved report.json of any version this one reads, as the current version's plain data:
reports written by earlier versions still render (`trainadvisor report`) and compare
(`trainadvisor compare`). Each version's step up is one function; CHANGELOG.md tells what
changed for users.

May import: nothing of the package (records' constants come in through the package)."""

from __future__ import annotations

from typing import Any

# Fields of version 1's single report that belonged to one command only.
PROFILE_ONLY = (
    "after",
    "plan",
    "fix_outcomes",
    "applied_fixes",
    "speedup",
    "comparison",
    "loss_noise_rel",
    "trial_windows",
)
ANALYZE_ONLY = ("traces", "ranks")


class UnreadableVersion(ValueError):
    """A report.json whose schema_version this version cannot read (a newer writer's, or not a
    report at all)."""

    def __init__(self, version: object, newest: int) -> None:
        super().__init__(
            f"schema_version {str(version)[:40]!r} is not one this version reads (1 to {newest}); "
            "a newer trainadvisor wrote it, or it is not a report"
        )


def upgraded(plain: dict[str, Any], newest: int) -> dict[str, Any]:
    """`plain` (a parsed report.json) in version `newest`'s shape; UnreadableVersion where its
    version is not one from 1 to `newest`."""
    version = plain.get("schema_version")
    if type(version) is not int or not 1 <= version <= newest:
        raise UnreadableVersion(version, newest)
    if version == 1:
        plain = from_v1(plain)
    return plain


def kind_of_v1(plain: dict[str, Any]) -> str:
    """Version 1 did not say which command wrote it: `analyze` reports hold traces, and their
    command is `trainadvisor analyze ...`; every other (profile, @advise) is a profile."""
    command = plain.get("command")
    named = isinstance(command, list) and len(command) > 1 and command[1] == "analyze"
    return "analyze" if named or plain.get("traces") else "profile"


def from_v1(plain: dict[str, Any]) -> dict[str, Any]:
    """Version 1 -> 2: one header and one of two results. What 1 did not record (the writer's
    version, the run's id) stays None; nothing measured is dropped, only the other command's
    empty fields."""
    kind = kind_of_v1(plain)
    other = PROFILE_ONLY if kind == "analyze" else ANALYZE_ONLY
    upgraded = {key: value for key, value in plain.items() if key not in other}
    missing = dict.fromkeys(("producer_version", "run_id", "content_digest", "workload"))
    upgraded.update(schema_version=2, kind=kind, producer="trainadvisor", **missing)
    return upgraded
