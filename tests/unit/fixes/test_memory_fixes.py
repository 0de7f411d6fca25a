"""The memory fixes: activation checkpointing on the repeated blocks found in a real model, run for
real on the CPU (the loss of every step the same, the peak lower), the choice among candidates
against a memory budget, and the code change in the user's own script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from support.memory_fixes import EXAMPLE, train_counting_the_last

from trainadvisor import fixes
from trainadvisor.fixes.activation_checkpointing import checkpoint_change
from trainadvisor.memory.blocks import checkpoint_blocks, repeated_blocks
from trainadvisor.records import Overrides, RawRun, Trial


def _example_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("deep_blocks", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_repeated_blocks_are_the_module_list_holding_most_parameters() -> None:
    """Net(32, 3): three Blocks of 2·32 + 32·128 + 128 + 128·32 + 32 = 8,416 parameters each
    (LayerNorm, up, down) in `blocks`, and a head of 33: the Sequential of Linear and ReLU in
    no block (its modules have no modules of their own) is not a candidate."""
    net = _example_module().Net(32, 3)
    net.extra = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    found = repeated_blocks(net)
    assert found is not None
    assert (found["blocks_path"], found["blocks"], found["blocks_type"]) == ("blocks", 3, "Block")
    assert round(found["blocks_params_pct"], 3) == round(100 * 3 * 8416 / (3 * 8416 + 33 + 12), 3)
    assert repeated_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())) is None


def _peak_and_losses(checkpointed: bool) -> tuple[int, list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    net = _example_module().Net(64, 6)
    undo = checkpoint_blocks(net, "blocks") if checkpointed else None
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = torch.randn(256, 64), torch.randn(256, 1)
    facts, losses = train_counting_the_last(net, optimizer, x, y)
    peak = facts["peak_bytes"]
    if undo is not None:
        undo()
        assert "forward" not in net.blocks[0].__dict__
    return peak, losses, [p.detach().clone() for p in net.parameters()]


def test_checkpointing_the_blocks_lowers_the_peak_and_trains_the_same() -> None:
    """Six blocks of width 64 on a batch of 256: kept for backward, each block's LayerNorm
    output, hidden layer and GELU (256·(64 + 2·256)·4 bytes, with the block's input) dominate
    the peak; checkpointed, only each block's input is kept and one block's rest at a time.
    Dropout-free and recomputed exactly: the same losses and parameters, bit for bit."""
    plain_peak, plain_losses, plain_params = _peak_and_losses(False)
    checkpointed_peak, checkpointed_losses, checkpointed_params = _peak_and_losses(True)
    assert checkpointed_losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(plain_params, checkpointed_params))
    assert checkpointed_peak < 0.7 * plain_peak


def _trial(label: str, peak_bytes: int, steps_per_s: float) -> Trial:
    raw = RawRun(label, "window_complete", 0, None, 5, 20, 0, 25, [], [], None)
    raw.runtime = {"memory": {"status": "measured", "peak_bytes": peak_bytes}}
    return Trial(
        label, Overrides(runtime={"activation_checkpointing": "blocks"}), "measured", steps_per_s, None, raw
    )


BASE = {
    "blocks_path": "blocks", "blocks": 8, "blocks_type": "Block", "step_peak_bytes": 42_000_000,
    "steps_per_s": 20.0, "dataloader_call_site": "deep_blocks.py:64", "batch_size": 512,
}  # fmt: skip


def test_over_the_budget_the_fastest_candidate_that_fits_is_chosen_and_its_cost_said() -> None:
    fix = fixes.REGISTRY["activation-checkpointing"]
    assert fix.not_applicable(BASE) is None
    assert fix.not_applicable({**BASE, "blocks_path": ""}) is None  # the model itself is the list
    assert "no repeated blocks" in (fix.not_applicable({"step_peak_bytes": 1}) or "")
    setting = fix.next_candidate(BASE, [])
    assert setting is not None and setting.overrides.runtime == {"activation_checkpointing": "blocks"}
    assert setting.label == "checkpoint each of the 8 Block blocks of model.blocks"
    budget = {**BASE, "memory_budget_bytes": 30_000_000}
    slow_fits, fast_over = _trial("a", 21_000_000, 13.0), _trial("b", 31_000_000, 19.0)
    assert fix.choose([fast_over, slow_fits], budget) is slow_fits  # fits: its cost is worth it
    assert fix.choose([fast_over], budget) is None
    assert fix.describe(slow_fits, budget) == (
        "checkpoint each of the 8 Block blocks of model.blocks: peak 42 MB -> 21 MB, fits the budget "
        "of 30 MB; 1.54x slower per step"
    )
    # within the budget (none given): a tenth lower at 65% of the speed or better
    assert fix.choose([slow_fits], BASE) is slow_fits
    assert fix.choose([_trial("c", 21_000_000, 12.0)], BASE) is None  # 60% of the speed
    accumulation = fixes.REGISTRY["grad-accumulation"]
    assert accumulation.not_applicable(budget) is None  # on a CPU too: the step's peak is measured
    assert fixes.goal("activation-checkpointing") == "memory"


SCRIPT = """\
import torch

def main():
    model = Net(128, 8).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
"""


def test_the_code_change_wraps_the_same_blocks_after_the_model_is_built() -> None:
    changed = checkpoint_change(SCRIPT, "blocks")
    assert changed == (
        "import torch\n"
        "import functools\n"
        "from torch.utils.checkpoint import checkpoint\n\n"
        "def main():\n"
        "    model = Net(128, 8).to(device)\n"
        "    for block in model.blocks:  # activation checkpointing: each block's activations "
        "recomputed in backward\n"
        "        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)\n"
        "    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    )
    assert checkpoint_change("x = 1\n", "blocks") is None
    fix = fixes.REGISTRY["activation-checkpointing"]
    overrides = Overrides(runtime={"activation_checkpointing": "blocks"})
    assert fix.code_change(SCRIPT, Path("train.py"), overrides) == changed


def test_for_hugging_face_the_setting_is_gradient_checkpointing() -> None:
    from trainadvisor.frameworks import vocab

    t = vocab.Translation(call=None)  # type: ignore[arg-type]
    runtime: dict[str, Any] = {"activation_checkpointing": "model.layers"}
    vocab._transformers(t, runtime, {})
    assert t.settings == {"gradient_checkpointing": True} and runtime == {}
    assert vocab.WHERE["transformers"]["activation-checkpointing"] == (
        "`gradient_checkpointing=True` in TrainingArguments"
    )
