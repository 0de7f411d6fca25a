"""The priority of a run started ahead (`measure.priority`): whether this user may raise a lowered
priority back (CAP_SYS_NICE in /proc/self/status's CapEff, or RLIMIT_NICE). `restore` on a real
process: `tests/e2e/test_priority.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainadvisor.measure import priority

STATUS = "Name:\tpython\nCapInh:\t0000000000000000\nCapPrm:\t{caps}\nCapEff:\t{caps}\n"


@pytest.mark.parametrize(
    ("nice", "soft_limit", "caps", "restorable"),
    [
        (0, 0, "000001ffffffffff", True),  # root's full set (CAP_SYS_NICE is bit 23)
        (0, 0, "0000000000800000", True),  # CAP_SYS_NICE alone
        (0, 0, "00000000a80425fb", False),  # a container's default set, without it
        (0, 0, "0000000000000000", False),  # a user's
        (0, 20, "0000000000000000", True),  # RLIMIT_NICE 20: back to nice 0 is allowed
        (0, 19, "0000000000000000", False),  # ... 19: only to nice 1
        (1, 19, "0000000000000000", True),
        (19, 0, "0000000000000000", True),  # already at the lowest: nothing to raise back
        (0, priority.resource.RLIM_INFINITY, "0000000000000000", True),
    ],
)
def test_a_lowered_priority_may_be_raised_back_with_cap_sys_nice_or_rlimit_nice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nice: int, soft_limit: int, caps: str, restorable: bool
) -> None:
    status = tmp_path / "status"
    status.write_text(STATUS.format(caps=caps))
    monkeypatch.setattr(priority, "STATUS", status)
    monkeypatch.setattr(priority.resource, "getrlimit", lambda which: (soft_limit, soft_limit))
    assert priority.restorable(nice) is restorable


def test_without_proc_only_root_is_taken_to_be_capable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(priority, "STATUS", tmp_path / "absent")
    monkeypatch.setattr(priority.resource, "getrlimit", lambda which: (0, 0))
    for euid, capable in [(0, True), (1000, False)]:
        monkeypatch.setattr(priority.os, "geteuid", lambda euid=euid: euid)
        assert priority.restorable(0) is capable
