"""The `fsdp-settings` fix: when it applies, its candidate, its choice under a memory budget, the
switch that makes every `fully_shard` keep its parameters after forward (a real FSDP2 unit in a
one-process gloo group), and the code change at each `fully_shard` call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import EXAMPLES
from torch import nn

from trainadvisor.fixes.fsdp_settings import FsdpSettings
from trainadvisor.records import Overrides, RawRun, Trial
from trainadvisor.training import parallel
from trainadvisor.training.hooks import Patches

VALUES = {
    "fsdp_version": "FSDP2", "fsdp_units": 5, "fsdp_resharding_units": 4, "fsdp_world_size": 2,
    "steps_per_s": 40.0, "step_peak_bytes": 1000,
}  # fmt: skip


def _trial(steps_per_s: float, peak: int) -> Trial:
    raw = RawRun.__new__(RawRun)
    raw.runtime = {"memory": {"peak_bytes": peak}}
    setting = FsdpSettings().next_candidate(VALUES, [])
    assert setting is not None
    return Trial(setting.label, setting.overrides, "measured", steps_per_s, None, raw=raw)


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({"fsdp_units": 0}, "the script builds no FSDP units (fully_shard)"),
        ({"fsdp_version": "FSDP1"}, "FSDP1 (FullyShardedDataParallel): this fix sets FSDP2's fully_shard"),
        ({"fsdp_world_size": 1}, "FSDP over one rank communicates nothing"),
        (
            {"fsdp_resharding_units": 0, "fsdp_units": 2},
            "every FSDP unit keeps its parameters gathered after forward already, and too few to prefetch",
        ),
    ],
)
def test_where_the_fix_cannot_apply_it_says_why(changed: dict[str, Any], why: str) -> None:
    assert FsdpSettings().not_applicable({**VALUES, **changed}) == why


def test_one_candidate_kept_where_faster_and_within_the_budget() -> None:
    fix = FsdpSettings()
    assert fix.not_applicable(VALUES) is None
    first = fix.next_candidate(VALUES, [])
    assert first is not None and first.overrides.runtime == {"fsdp": {"reshard_after_forward": False}}
    faster = _trial(50.0, 1500)
    prefetch = fix.next_candidate(VALUES, [faster])  # then prefetching, on top of the better
    assert prefetch is not None and prefetch.label == "reshard_after_forward=False, prefetch the next unit"
    assert prefetch.overrides.runtime == {"fsdp_prefetch": 1, "fsdp": {"reshard_after_forward": False}}
    prefetched = Trial(prefetch.label, prefetch.overrides, "measured", 45.0, None, raw=faster.raw)
    assert fix.next_candidate(VALUES, [faster, prefetched]) is None
    assert fix.choose([faster], VALUES) is faster
    assert fix.choose([faster, prefetched], VALUES) is faster  # the first that fits: the faster
    alone = fix.next_candidate(VALUES, [_trial(39.0, 1500)])  # the first lost: prefetching alone
    assert alone is not None and alone.overrides.runtime == {"fsdp_prefetch": 1}
    assert "set_modules_to_forward_prefetch" in fix.loop_change(alone.overrides)
    assert fix.describe(faster, VALUES) == "reshard_after_forward=False (peak 1 kB -> 1.5 kB)"
    assert fix.choose([_trial(41.0, 1500)], VALUES) is None  # under 5% faster
    budget = {**VALUES, "memory_budget_bytes": 1200}
    assert fix.choose([faster], budget) is None
    assert fix.search_note([faster], budget) == (
        "keeping the parameters gathered needs peak 1 kB -> 1.5 kB, over the budget of 1.2 kB: "
        "over the memory budget"
    )


def test_the_switch_makes_every_fully_shard_keep_its_parameters(one_process_group: None) -> None:
    from torch.distributed.fsdp import fully_shard

    patches = Patches()
    FsdpSettings().install(patches, Overrides(runtime={"fsdp": {"reshard_after_forward": False}}))
    try:
        import torch.distributed.fsdp as fsdp

        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        fsdp.fully_shard(model[0], reshard_after_forward=True)  # the script asks; the trial overrides
        fsdp.fully_shard(model)
        patched = parallel.fsdp_facts(model.modules())
    finally:
        patches.undo()
    assert patched["fsdp_units"] == 2 and patched["fsdp_resharding_units"] == 0
    import torch.distributed.fsdp as fsdp

    assert fsdp.fully_shard is fully_shard  # put back
    again = nn.Sequential(nn.Linear(4, 4))
    fully_shard(again[0], reshard_after_forward=True)
    assert parallel.fsdp_facts(again.modules())["fsdp_resharding_units"] == 1


def test_the_code_change_sets_it_at_each_fully_shard_call() -> None:
    source = (EXAMPLES / "fsdp_train.py").read_text()
    changed = FsdpSettings().code_change(
        source, EXAMPLES / "fsdp_train.py", Overrides(runtime={"fsdp": {"reshard_after_forward": False}})
    )
    assert changed is not None
    assert "fully_shard(block, reshard_after_forward=False)" in changed
    assert "fully_shard(model, reshard_after_forward=False)" in changed
    assert "reshard_after_forward=not args.no_reshard" not in changed


def test_gathered_parameters_count_while_their_unit_is_unsharded(one_process_group: None) -> None:
    """FSDP2 units of 4x4+4 and 4x2+2 float parameters: nothing gathered before the forward;
    after it, with reshard_after_forward=False, both units hold their parameters gathered."""
    from torch.distributed.fsdp import fully_shard

    from trainadvisor.memory import sharded

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    fully_shard(model[0], reshard_after_forward=False)
    fully_shard(model, reshard_after_forward=False)
    gathered = sharded.gathered_bytes()
    assert gathered is not None and gathered() == (0, 0)
    weight = next(model.parameters())  # sharded: a DTensor, its local shard what the rank holds
    assert type(weight).__name__ == "DTensor" and type(sharded.local(weight)) is torch.Tensor
    model(torch.ones(3, 4))
    assert gathered() == ((4 * 4 + 4 + 4 * 2 + 2) * 4, 4)


def test_prefetching_links_each_unit_to_its_neighbours(one_process_group: None) -> None:
    """Three blocks and the root: block i prefetches block i+1 for its forward and block i-1
    for its backward; the root, which holds them, prefetches nothing."""
    from torch.distributed.fsdp import fully_shard

    patches = Patches()
    FsdpSettings().install(patches, Overrides(runtime={"fsdp_prefetch": 1}))
    try:
        import torch.distributed.fsdp as fsdp

        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
        for block in model:
            fsdp.fully_shard(block)
        fsdp.fully_shard(model)
    finally:
        patches.undo()
    states = [m._get_fsdp_state() for m in (*model, model)]
    forward = [[states.index(s) for s in st._states_to_forward_prefetch] for st in states]
    backward = [[states.index(s) for s in st._states_to_backward_prefetch] for st in states]
    assert (forward, backward) == ([[1], [2], [], []], [[], [0], [1], []])
    model(torch.ones(2, 4)).sum().backward()  # trains with them
    assert fully_shard is fsdp.fully_shard


def test_prefetching_never_fails_the_scripts_own_call(one_process_group: None) -> None:
    """fully_shard of a list of modules (one group of them) returns the list: nothing to link,
    and the call is the script's as it was."""
    patches = Patches()
    FsdpSettings().install(patches, Overrides(runtime={"fsdp_prefetch": 1}))
    try:
        import torch.distributed.fsdp as fsdp

        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        made = fsdp.fully_shard([model[0], model[1]])
        fsdp.fully_shard(model)
    finally:
        patches.undo()
    assert made == [model[0], model[1]]
    model(torch.ones(2, 4)).sum().backward()


def _two_units(patches: Patches) -> tuple[nn.Module, dict[str, Any]]:
    """A model of two FSDP2 units made through fully_shard as the script sees it while
    `patches` are installed, and FSDP's facts read back; the patches undone after."""
    import torch.distributed.fsdp as fsdp

    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        fsdp.fully_shard(model[0])
        fsdp.fully_shard(model)
        return model, parallel.fsdp_facts(model.modules())  # its own units, not another test's
    finally:
        patches.undo()


GPU_VALUES = {**VALUES, "cuda_used": True, "bf16_supported": True}


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        (
            {"fsdp_version": "FSDP1"},
            "the script builds no FSDP2 units (fully_shard): the amp fix is the one to measure",
        ),
        ({"cuda_used": False}, "the run used no GPU, and this fix only changes GPU work"),
        ({"bf16_supported": False}, "this GPU computes in no bfloat16"),
        ({"fsdp_param_dtype": "float16"}, "FSDP already gathers its parameters in float16"),
    ],
)
def test_fsdp_mixed_precision_applies_on_a_bf16_gpu_only(changed: dict[str, Any], why: str) -> None:
    from trainadvisor.fixes.fsdp_mixed_precision import FsdpMixedPrecision

    assert FsdpMixedPrecision().not_applicable(GPU_VALUES) is None
    assert FsdpMixedPrecision().not_applicable({**GPU_VALUES, **changed}) == why


def test_fsdp_mixed_precision_gathers_in_bfloat16_and_is_written_at_each_call(
    one_process_group: None,
) -> None:
    """The switch (a CPU run stands in for the GPU's: the policy is the same code) gives every
    unit the policy, the script's own run reads it back, and the code change writes it."""
    from trainadvisor.fixes.fsdp_mixed_precision import FsdpMixedPrecision

    fix = FsdpMixedPrecision()
    setting = fix.setting(GPU_VALUES)
    patches = Patches()
    fix.install(patches, setting.overrides)
    model, facts = _two_units(patches)
    assert facts["fsdp_param_dtype"] == "bfloat16"
    assert model(torch.ones(3, 4)).dtype == torch.bfloat16
    changed = fix.code_change(
        (EXAMPLES / "fsdp_train.py").read_text(), EXAMPLES / "fsdp_train.py", setting.overrides
    )
    assert changed is not None
    assert "from torch.distributed.fsdp import MixedPrecisionPolicy\n" in changed
    policy = "mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"
    assert f"fully_shard(model, {policy})" in changed


@pytest.mark.parametrize(
    ("file", "function", "label"),
    [
        ("_runtime_utils.py", "_reduce_grad", "FSDP's buffers (all-gather, reduce-scatter)"),
        ("_runtime_utils.py", "_get_reduce_scatter_tensors", "FSDP's buffers (all-gather, reduce-scatter)"),
        ("_runtime_utils.py", "_pre_forward", "train.py:3"),  # FSDP1's hooks around the model's code
        (
            "_fully_shard/_fsdp_collectives.py",
            "foreach_all_gather",
            "FSDP's buffers (all-gather, reduce-scatter)",
        ),
    ],
)
def test_fsdp_code_that_makes_buffers_labels_them(file: str, function: str, label: str) -> None:
    """A tensor made in FSDP's buffer-making code (FSDP1's reduce-scatter functions too) is
    FSDP's; one made under FSDP1's forward hooks is the model's code that called it. The
    frames are real, compiled under torch's own file names."""
    from trainadvisor.memory.storages import user_site

    fsdp = Path(torch.__file__).parent / "distributed" / "fsdp" / file
    inner: dict[str, Any] = {"user_site": user_site}
    exec(compile(f"def {function}():\n    return user_site(1)\n", str(fsdp), "exec"), inner)
    outer: dict[str, Any] = {"inner": inner[function]}
    exec(compile("def step():\n\n    return inner()\n", "/home/me/train.py", "exec"), outer)
    assert outer["step"]() == label


@pytest.mark.parametrize("mixed_first", [False, True])
def test_both_fsdp_fixes_in_one_run_keep_both_settings(one_process_group: None, mixed_first: bool) -> None:
    """A confirmation run with fsdp-settings and fsdp-mixed-precision installed together (in
    either order): every unit keeps its parameters gathered and gathers them in bfloat16; undone,
    fully_shard is torch's again."""
    import torch.distributed.fsdp as fsdp

    from trainadvisor.fixes.fsdp_mixed_precision import FsdpMixedPrecision

    original = fsdp.fully_shard
    mixed = FsdpMixedPrecision()
    installs = [
        lambda p: FsdpSettings().install(p, Overrides(runtime={"fsdp": {"reshard_after_forward": False}})),
        lambda p: mixed.install(p, mixed.setting(GPU_VALUES).overrides),
    ]
    patches = Patches()
    for install in installs[::-1] if mixed_first else installs:
        install(patches)
    _, facts = _two_units(patches)
    assert (facts["fsdp_resharding_units"], facts["fsdp_param_dtype"]) == (0, "bfloat16")
    assert fsdp.fully_shard is original


def test_the_scripts_own_policy_without_param_dtype_is_left_alone(one_process_group: None) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from trainadvisor.fixes.fsdp_mixed_precision import FsdpMixedPrecision

    default = fully_shard(nn.Sequential(nn.Linear(4, 4)))
    assert "fsdp_mp_policy_set" not in parallel.fsdp_facts(default.modules())  # torch's default policy
    own = fully_shard(
        nn.Sequential(nn.Linear(4, 4)), mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32)
    )
    facts = parallel.fsdp_facts(own.modules())
    assert facts["fsdp_mp_policy_set"] is True and "fsdp_param_dtype" not in facts
    why = FsdpMixedPrecision().not_applicable({**GPU_VALUES, **facts})
    assert why is not None and why.startswith(
        "the script gives fully_shard a MixedPrecisionPolicy of its own"
    )


COMPOSABLE = """import torch
from torch.distributed._composable.fsdp import fully_shard

fully_shard(model)
"""
IMPORTED = """import torch
from torch.distributed.fsdp import (
    MixedPrecisionPolicy,
    fully_shard,
)

fully_shard(model)
"""


def test_the_policys_import_follows_the_scripts_fully_shard() -> None:
    """torch 2.4-2.5 export FSDP2 from _composable.fsdp: the policy is imported from where the
    script imports fully_shard; a script that imports it already gets no second import."""
    from trainadvisor.fixes.fsdp_mixed_precision import FsdpMixedPrecision

    fix = FsdpMixedPrecision()
    overrides = fix.setting(GPU_VALUES).overrides
    composable = fix.code_change(COMPOSABLE, Path("train.py"), overrides)
    assert composable is not None
    assert "from torch.distributed._composable.fsdp import MixedPrecisionPolicy\n" in composable
    imported = fix.code_change(IMPORTED, Path("train.py"), overrides)
    assert imported is not None and imported.count("MixedPrecisionPolicy") == 2  # the import and the call
    assert "fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16" in imported
