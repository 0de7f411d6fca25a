"""The `ddp-settings` fix and the DDP facts it reads: DDP's own record of itself, read from a
real DistributedDataParallel (one gloo process in this one), the candidates, the switch that
builds DDP with them, and the code change at the line that builds it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from trainadvisor.fixes.ddp_settings import DdpSettings
from trainadvisor.records import Overrides, Trial
from trainadvisor.training import parallel
from trainadvisor.training.hooks import Patches

VALUES = {
    "ddp_modules": 1, "ddp_world_size": 2, "ddp_find_unused_parameters": True,
    "ddp_unused_parameter_bytes": 0, "ddp_bucket_cap_mb": 0.05, "ddp_gradient_as_bucket_view": False,
    "steps_per_s": 40.0,
}  # fmt: skip
DDP = nn.parallel.DistributedDataParallel


class _WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(8, 8), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _step(model: nn.Module) -> None:
    model(torch.randn(2, 8)).sum().backward()


def test_ddps_record_of_itself_becomes_the_windows_facts(one_process_group: None) -> None:
    patches, wrappers = Patches(), parallel.Wrappers()
    parallel.watch(patches, wrappers)
    try:
        model = DDP(_WithUnused(), find_unused_parameters=True, bucket_cap_mb=2)
        _step(model)
        _step(model)  # DDP records what went unused at the step after
        facts = wrappers.ddp_facts()
    finally:
        patches.undo()
    assert facts.pop("ddp_call_site").startswith(f"{__file__}:")
    assert facts == {
        "ddp_modules": 1, "ddp_find_unused_parameters": True, "ddp_unused_parameter_bytes": (4 * 4 + 4) * 4,
        "ddp_bucket_cap_mb": 2.0, "ddp_gradient_as_bucket_view": False, "ddp_static_graph": False,
        "ddp_no_sync_used": False, "ddp_world_size": 1,
    }  # fmt: skip
    assert parallel.Wrappers().ddp_facts() == {}  # no DDP built: no facts


def test_the_switch_builds_ddp_with_the_candidates_settings(one_process_group: None) -> None:
    patches = Patches()
    settings = {"find_unused_parameters": False, "gradient_as_bucket_view": True, "bucket_cap_mb": 25.0}
    DdpSettings().install(patches, Overrides(runtime={"ddp": settings}))
    try:
        model = DDP(nn.Linear(8, 8), find_unused_parameters=True, bucket_cap_mb=1)
    finally:
        patches.undo()
    logged = model._get_ddp_logging_data()
    assert (logged["find_unused_parameters"], logged["gradient_as_bucket_view"]) == (0, 1)
    assert logged["bucket_cap_bytes"] == 25 * 2**20
    again = DDP(nn.Linear(8, 8), find_unused_parameters=True)  # put back: DDP builds as asked again
    assert again._get_ddp_logging_data()["find_unused_parameters"] == 1


def _trial(label: str, steps_per_s: float) -> Trial:
    return Trial(label, Overrides(), "measured", steps_per_s, None)


def test_the_candidates_free_settings_first_then_larger_buckets_only_where_they_gained() -> None:
    fix = DdpSettings()
    assert fix.not_applicable(VALUES) is None
    first = fix.next_candidate(VALUES, [])
    assert first is not None and first.label == (
        "find_unused_parameters=False, gradient_as_bucket_view=True, bucket_cap_mb=25"
    )
    larger = fix.next_candidate(VALUES, [_trial(first.label, 60.0)])
    assert larger is not None and larger.overrides.runtime["ddp"]["bucket_cap_mb"] == 100.0
    assert fix.next_candidate(VALUES, [_trial(first.label, 41.0)]) is None  # under 5%: no second trial
    trials = [_trial("a", 60.0), _trial("b", 66.0)]
    assert fix.choose(trials, VALUES) is trials[1]
    assert fix.choose([_trial("a", 41.0)], VALUES) is None


def test_a_static_graph_is_tried_last_on_top_of_the_best_setting_so_far() -> None:
    """Batches of one shape and no parameter unused: after the free settings and larger
    buckets, static_graph=True on top of the faster of them (alone where neither gained)."""
    fix, values = DdpSettings(), {**VALUES, "input_shapes_fixed": True}
    assert fix.expected_trials(values) == 4  # at most: three bucket sizes, then the static graph
    first = fix.next_candidate(values, [])
    assert first is not None
    tried = Trial(first.label, first.overrides, "measured", 60.0, None)
    larger = fix.next_candidate(values, [tried])
    assert larger is not None
    slower = Trial(larger.label, larger.overrides, "measured", 50.0, None)
    static = fix.next_candidate(values, [tried, slower])
    assert static is not None and static.overrides.runtime["ddp"] == {
        **first.overrides.runtime["ddp"], "static_graph": True,
    }  # fmt: skip
    done = Trial(static.label, static.overrides, "measured", 61.0, None)
    assert fix.next_candidate(values, [tried, slower, done]) is None
    lost = Trial(first.label, first.overrides, "measured", 39.0, None)
    alone = fix.next_candidate(values, [lost])
    assert alone is not None and alone.label == "static_graph=True"
    good = {
        **values,
        "ddp_find_unused_parameters": False,
        "ddp_bucket_cap_mb": 25.0,
        "ddp_gradient_as_bucket_view": True,
    }
    assert fix.not_applicable(good) is None and fix.expected_trials(good) == 1
    assert (
        fix.not_applicable({**good, "ddp_static_graph": True})
        == "DDP is built with the settings this fix would set"
    )
    assert fix.not_applicable({**good, "input_shapes_fixed": False}) is not None  # shapes vary: not static


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({"ddp_modules": 0}, "the script builds no DistributedDataParallel"),
        ({"ddp_world_size": 1}, "DDP over one process communicates nothing"),
        (
            {
                "ddp_find_unused_parameters": False,
                "ddp_bucket_cap_mb": 25.0,
                "ddp_gradient_as_bucket_view": True,
            },
            "DDP is built with the settings this fix would set",
        ),
    ],
)
def test_where_the_fix_cannot_apply_it_says_why(changed: dict[str, Any], why: str) -> None:
    assert DdpSettings().not_applicable({**VALUES, **changed}) == why


def test_parameters_that_really_go_unused_keep_the_search_on() -> None:
    values = {**VALUES, "ddp_unused_parameter_bytes": 4096}
    first = DdpSettings().next_candidate(values, [])
    assert first is not None and "find_unused_parameters" not in first.overrides.runtime["ddp"]
    assert "find_unused_parameters stays on: 4096 bytes" in (DdpSettings().search_note([], values) or "")


def test_the_code_change_sets_the_settings_at_the_line_that_builds_ddp() -> None:
    source = (
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(net, device_ids=None, find_unused_parameters=True, bucket_cap_mb=1)\n"
    )
    settings = {"find_unused_parameters": False, "gradient_as_bucket_view": True, "bucket_cap_mb": 25.0}
    changed = DdpSettings().code_change(source, None, Overrides(runtime={"ddp": settings}))  # type: ignore[arg-type]
    assert changed is not None and changed.splitlines()[2] == (
        "model = DDP(net, device_ids=None, find_unused_parameters=False, bucket_cap_mb=25.0, "
        "gradient_as_bucket_view=True)"
    )


def test_the_report_says_the_jobs_data_parallelism_in_one_line() -> None:
    from support.runs import raw

    from trainadvisor.analyze.run.summary import summarize
    from trainadvisor.report.parallel import parallelism

    run = summarize(raw([10.0] * 6))
    assert parallelism(run) is None  # no DDP built
    run.raw.runtime.update({k: v for k, v in VALUES.items() if k.startswith("ddp_")})
    run.raw.runtime["ddp_call_site"] = "/home/me/train.py:79"
    assert parallelism(run) == (
        "DDP over 2 processes: buckets of 0.05 MiB, a search for unused parameters each step (none "
        "went unused), gradient_as_bucket_view off; built at train.py:79"
    )
    del run.raw.runtime["ddp_bucket_cap_mb"]  # DDP's record gave none: no size is guessed
    assert parallelism(run) == (
        "DDP over 2 processes: a search for unused parameters each step (none went unused), "
        "gradient_as_bucket_view off; built at train.py:79"
    )


def test_an_fsdp_job_is_said_by_its_version_units_and_ranks() -> None:
    from support.runs import raw

    from trainadvisor.analyze.run.summary import summarize
    from trainadvisor.report.parallel import parallelism

    run = summarize(raw([10.0] * 6))
    run.raw.runtime.update(fsdp_version="FSDP2", fsdp_units=9, fsdp_resharding_units=8, fsdp_world_size=4)
    assert parallelism(run) == "FSDP2 over 4 ranks: 9 units, 8 reshard after forward"
    run.raw.runtime.update(fsdp_version="FSDP1", fsdp_units=3)
    assert parallelism(run) == "FSDP1 over 4 ranks: 3 units"


def test_gradient_accumulation_without_no_sync_gets_it_in_the_first_candidate() -> None:
    """Four backward() calls per optimizer step and no no_sync() of the script's: the first
    candidate skips the all-reduce on three of every four micro-steps (no static graph then:
    DDP's reducer refuses one with no_sync)."""
    fix = DdpSettings()
    values = {
        **VALUES, "backwards_per_step": 4, "backwards_even": True, "ddp_no_sync_used": False,
        "input_shapes_fixed": True,
    }  # fmt: skip
    first = fix.next_candidate(values, [])
    assert first is not None and first.overrides.runtime["ddp_no_sync"] == 4
    assert first.label.endswith(", no_sync() on 3 of every 4 micro-steps")
    assert fix.expected_trials(values) == 3
    assert (
        "ddp_no_sync"
        not in (fix.next_candidate({**values, "backwards_even": False}, []) or first).overrides.runtime
    )
    tried = Trial(first.label, first.overrides, "measured", 60.0, None)
    larger = fix.next_candidate(values, [tried])
    assert larger is not None and larger.overrides.runtime["ddp_no_sync"] == 4
    assert "with model.no_sync():" in fix.loop_change(first.overrides)
    assert fix.loop_change(Overrides(runtime={"ddp": {"bucket_cap_mb": 25.0}})) == ""
    own = {**values, "ddp_no_sync_used": True}  # the script's own no_sync(): nothing to add
    again = fix.next_candidate(own, [])
    assert again is not None and "ddp_no_sync" not in again.overrides.runtime
    good = {
        **own,
        "ddp_find_unused_parameters": False,
        "ddp_bucket_cap_mb": 25.0,
        "ddp_gradient_as_bucket_view": True,
    }
    assert fix.not_applicable(good) == "DDP is built with the settings this fix would set"
    only = fix.next_candidate({**good, "ddp_no_sync_used": False}, [])
    assert only is not None and only.label == "no_sync() on 3 of every 4 micro-steps"
    assert only.overrides.runtime == {"ddp_no_sync": 4}


def test_the_switch_skips_the_all_reduce_on_every_micro_step_but_the_last(one_process_group: None) -> None:
    patches = Patches()
    DdpSettings().install(patches, Overrides(runtime={"ddp_no_sync": 3}))
    try:
        model = DDP(nn.Linear(8, 8))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        synced = []
        for _ in range(2):  # two optimizer steps of three micro-steps
            for _ in range(3):
                model(torch.randn(2, 8)).sum().backward()
                synced.append(model.require_backward_grad_sync)
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():
            model(torch.randn(2, 8))  # an evaluation's forward counts for nothing
        for _ in range(4):  # a 4th micro-step before the optimizer's step syncs too
            model(torch.randn(2, 8)).sum().backward()
            synced.append(model.require_backward_grad_sync)
    finally:
        patches.undo()
    assert synced == [False, False, True, False, False, True, False, False, True, True]
    assert DDP.forward is not None and "no_sync_forward" not in DDP.forward.__qualname__  # put back


def test_the_scripts_own_no_sync_is_recorded(one_process_group: None) -> None:
    patches, wrappers = Patches(), parallel.Wrappers()
    parallel.watch(patches, wrappers)
    try:
        model = DDP(nn.Linear(8, 8))
        _step(model)
        assert wrappers.ddp_facts()["ddp_no_sync_used"] is False
        with model.no_sync():
            _step(model)
        facts = wrappers.ddp_facts()
    finally:
        patches.undo()
    assert facts["ddp_no_sync_used"] is True


def test_buckets_grow_while_each_size_gains_up_to_three_sizes() -> None:
    fix = DdpSettings()
    first = fix.next_candidate(VALUES, [])
    assert first is not None
    sizes = [Trial(first.label, first.overrides, "measured", 60.0, None)]
    larger = fix.next_candidate(VALUES, sizes)
    assert larger is not None and larger.overrides.runtime["ddp"]["bucket_cap_mb"] == 100.0
    sizes.append(Trial(larger.label, larger.overrides, "measured", 70.0, None))  # +17%: go on
    largest = fix.next_candidate(VALUES, sizes)
    assert largest is not None and largest.overrides.runtime["ddp"]["bucket_cap_mb"] == 400.0
    sizes.append(Trial(largest.label, largest.overrides, "measured", 90.0, None))
    assert fix.next_candidate(VALUES, sizes) is None  # three sizes (and no static graph asked)
    assert fix.choose(sizes, VALUES) is sizes[2]
    flat = [sizes[0], Trial(larger.label, larger.overrides, "measured", 61.0, None)]
    assert fix.next_candidate(VALUES, flat) is None  # 100 MiB gained under 5% on 25: no 400


@pytest.mark.parametrize(
    ("parameters_bytes", "sizes_mb", "expected"),
    [
        (273_448, [25.0], 1),  # the DDP example's 0.26 MiB: 25 MiB holds it, no 100
        (60 * 2**20, [25.0, 100.0], 2),  # 60 MiB: 100 holds it, no 400
        (25 * 2**20, [25.0], 1),  # exactly one bucket of 25 MiB
        (900 * 2**20, [25.0, 100.0, 400.0], 3),  # larger than every size: three, as before
        (None, [25.0, 100.0, 400.0], 3),  # no memory measured: three, as before
    ],
)
def test_no_larger_bucket_is_tried_once_one_bucket_holds_every_gradient(
    parameters_bytes: int | None, sizes_mb: list[float], expected: int
) -> None:
    """Each size gains 17% on the one before, and the model's parameters (the gradients DDP
    buckets) fit in one bucket of the last size tried: a larger size would change nothing."""
    fix = DdpSettings()
    values = {**VALUES, "parameters_bytes": parameters_bytes}
    assert fix.expected_trials(values) == expected
    tried: list[Trial] = []
    while (candidate := fix.next_candidate(values, tried)) is not None:
        tried.append(Trial(candidate.label, candidate.overrides, "measured", 60.0 * 1.17 ** len(tried), None))
    assert [t.overrides.runtime["ddp"]["bucket_cap_mb"] for t in tried] == sizes_mb
    note = fix.search_note(tried, values)
    if len(sizes_mb) < 3:
        held = f"{parameters_bytes / 2**20:.3g}" if parameters_bytes else ""
        assert note == (
            f"no larger bucket tried: the model's {held} MiB of gradients fit in one of "
            f"{sizes_mb[-1]:g} MiB, so a larger size changes nothing"
        )
    else:
        assert note is None
