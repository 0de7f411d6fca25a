"""Trials that race and warm-ups capped from the baseline's settling (issue 36), driven by a fake
clock and exact step times: which window stops where, and why."""

from __future__ import annotations

from support.race import _windows_at

from trainadvisor.records import Overrides


def test_measuring_chosen_fixes_together_and_without_each_holds_the_budget() -> None:
    """Two fixes chosen in windows, each window taking 2 s as measured so far: with 5 s of
    --budget left, the round (together, and without each: 6 s) is not started and the note says
    why; with 6.5 s left, a round whose windows take 3 s each stops before the third, and each
    fix keeps the gain of its own windows, with the same note."""
    import time
    from pathlib import Path
    from types import SimpleNamespace

    from trainadvisor.profile.runs import ProfileOptions
    from trainadvisor.profile.tuning import Tuning
    from trainadvisor.records import FixOutcome

    def outcome(fix: str) -> FixOutcome:
        return FixOutcome(
            fix, "r", "unconfirmed", "measured 1.5x", Overrides(), [], mode="in_process", gain=1.5
        )

    def tuning(left_s: float, calls: list[str], window_s: float) -> Tuning:
        options = ProfileOptions(Path("train.py"), [], Path("out"), budget_s=100.0)
        chosen = [outcome("amp"), outcome("tf32")]
        found = Tuning(options, [], {}, _windows_at(100.0), lambda line: None, time.monotonic(), chosen)
        found.started -= 100.0 - left_s
        found.walls["window"] = [2.0]

        def measure(fix: object, label: str, setting: object) -> SimpleNamespace:
            calls.append(label)
            found.started -= window_s  # the window's time passes
            return SimpleNamespace(run=_windows_at(150.0), status="measured")

        found._attribute(measure)  # type: ignore[arg-type]
        return found

    over = (
        "The combination of amp, tf32 was not measured with and without each: its windows would have "
        "run past the --budget; each keeps the gain of its own windows."
    )
    calls: list[str] = []
    assert tuning(5.0, calls, 2.0).notes == [over] and calls == []
    spent = tuning(6.5, calls, 3.0)
    assert len(calls) == 2 and spent.notes == [over]
    assert [o.status for o in spent.outcomes] == ["unconfirmed", "unconfirmed"]
