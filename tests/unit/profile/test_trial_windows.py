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
