"""Trial windows in the baseline's own process (issue 13): the mode chosen, the windows in
order, the pairs that catch drift, and each case that falls back to restarting the script."""

from __future__ import annotations


def test_which_fixes_switch_while_the_loop_runs() -> None:
    """The rest restart the script, each with its reason."""
    from trainadvisor.fixes import REGISTRY

    in_place = {fix: REGISTRY[fix].in_process_problem({"bf16_supported": True}) for fix in REGISTRY}
    assert [fix for fix, problem in in_place.items() if problem is None] == [
        "dataloader-workers", "pin-memory", "amp", "tf32", "cudnn-benchmark",
    ]  # fmt: skip
    assert in_place["fused-optimizer"].startswith("the optimizer's state is created for the implementation")
    assert REGISTRY["amp"].in_process_problem({"bf16_supported": False}) == (
        "fp16 needs a GradScaler around backward and the optimizer step, added when they are built"
    )


class _Recorded:
    """A live run that records each window's size, and has ended (measures nothing)."""

    def __init__(self) -> None:
        self.sizes: list[object] = []
        self.ended = "the script ended"

    def window(
        self, label: str, overrides: object, warmup: int, steps: int, size: object, timeout_s: float
    ) -> None:
        self.sizes.append(size)


def test_a_windows_warm_up_ends_within_what_is_left_of_the_budget() -> None:
    """Each window settles at most its cap (10 s here, or a pair's 3 s), and no longer than what is
    left of --budget less its timed steps (--min-time, 1 s) and its overhead (0.5 s), one block
    (1 s) at least; without a budget, its cap alone."""
    from pathlib import Path

    from support.race import _windows_at

    from trainadvisor.fixes import REGISTRY
    from trainadvisor.fixes.common import Setting
    from trainadvisor.profile.runs import ProfileOptions
    from trainadvisor.profile.trials import budget_cap_s, run_cap_s, windows
    from trainadvisor.records import Overrides

    options = ProfileOptions(Path("train.py"), [], Path("out"), min_time_s=1.0)
    assert (budget_cap_s(None, 1.0), budget_cap_s(10.0, 1.0), budget_cap_s(1.2, 1.0)) == (None, 8.5, 1.0)
    # a fresh run's: the settling its estimate counts (8 s of 12) and what the budget leaves beyond it
    runs = [
        run_cap_s(20.0, None, 12.0, 4.0),
        run_cap_s(20.0, 15.0, 12.0, 4.0),
        run_cap_s(None, 12.5, 12.0, 12.0),
    ]
    assert runs + [run_cap_s(5.0, 15.0, 12.0, 4.0)] == [20.0, 11.0, 1.0, 5.0]
    caps = []
    for left_s, pair_s in [(None, None), (40.0, None), (10.0, None), (10.0, 3.0), (0.5, None)]:
        live = _Recorded()
        left = lambda known=left_s: known  # noqa: E731
        in_windows = windows(live, options, _windows_at(10.0), lambda: None, 10.0, left)  # type: ignore[arg-type]
        measured = in_windows(REGISTRY["dataloader-workers"], "w", Setting("w", Overrides(), settle_s=pair_s))
        assert measured.status == "failed"
        caps.append(live.sizes[0].settle.blocks_max_s)  # type: ignore[attr-defined]
    assert caps == [10.0, 10.0, 8.5, 3.0, 1.0]
