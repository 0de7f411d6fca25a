"""The `optimizer-foreach` fix: its switch run for real on the CPU (where torch steps per list
only when told to: `foreach=True`), the step's peak measured exactly, the same update; when it
cannot be tried; its planning on a GPU run's values; its code change in the user's script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainadvisor import fixes, rulebook
from trainadvisor.fixes.optimizer_foreach import CPU_DEFAULT
from trainadvisor.frameworks import vocab
from trainadvisor.frameworks.change import fix_change
from trainadvisor.records import Finding, Overrides, RawRun, Trial
from trainadvisor.resources import rules_dir
from trainadvisor.training.gpu import optimizer_facts
from trainadvisor.training.hooks import Patches

FIX = fixes.REGISTRY["optimizer-foreach"]
OFF = Overrides(runtime={"optimizer_foreach_off": True})


def _step_peak(switched: bool) -> tuple[int, list[torch.Tensor], Any]:
    """The peak of the third step (Adam's moments exist by then) of four 256x256 Linear layers
    on one sample, Adam built with foreach=True, with the fix's switch installed or not."""
    patches = Patches()
    if switched:
        FIX.install(patches, OFF)
    try:
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, foreach=True)
    finally:
        patches.undo()
    x, y = torch.randn(1, 256), torch.randn(1, 256)
    from support.memory_fixes import train_counting_the_last

    facts, _ = train_counting_the_last(net, optimizer, x, y)
    return facts["peak_bytes"], [p.detach().clone() for p in net.parameters()], optimizer


def test_one_tensor_at_a_time_the_step_peak_is_lower_and_the_update_the_same() -> None:
    """Parameters P = 4 x (256·256 + 256) x 4 = 1,052,672 bytes, as much gradient, 2P + 32 of
    moments and step counters, and 1 KiB of the step's own: 4,211,744 bytes after backward. Per
    list, the step adds the denominators of all eight tensors at once (P: 5,264,416); one tensor
    at a time, at most two temporaries of one 256x256 weight (2 x 262,144 bytes: 4,737,056).
    The same arithmetic per element: the parameters come out bit for bit the same."""
    per_list_peak, per_list_params, per_list = _step_peak(False)
    per_tensor_peak, per_tensor_params, per_tensor = _step_peak(True)
    assert (per_list_peak, per_tensor_peak) == (5_264_416, 4_737_056)
    assert all(torch.equal(a, b) for a, b in zip(per_list_params, per_tensor_params))
    assert per_list.param_groups[0]["foreach"] is True
    assert per_tensor.param_groups[0]["foreach"] is False and per_tensor.defaults["foreach"] is False


def test_the_switch_leaves_fused_optimizers_and_classes_without_foreach_alone() -> None:
    patches = Patches()
    FIX.install(patches, OFF)
    try:
        w = torch.nn.Parameter(torch.zeros(2))
        fused = torch.optim.AdamW([w], fused=True)
        lbfgs = torch.optim.LBFGS([w])
        sgd = torch.optim.SGD([w], lr=0.1)
        sgd.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})  # from its defaults
    finally:
        patches.undo()
    assert (fused.defaults["fused"], fused.param_groups[0]["foreach"]) == (True, None)
    assert "foreach" not in lbfgs.defaults and "foreach" not in lbfgs.param_groups[0]
    assert [g["foreach"] for g in sgd.param_groups] == [False, False]
    after = torch.optim.SGD([w], lr=0.1)  # the switch is undone
    assert after.param_groups[0]["foreach"] is None
    FIX.install(patches, Overrides())  # not asked for: nothing patched
    assert not patches._undo
    assert optimizer_facts(fused)["optimizer_has_foreach"] is True
    assert optimizer_facts(lbfgs)["optimizer_has_foreach"] is False


GPU = {
    "cuda_used": True, "optimizer": "AdamW", "optimizer_fused": False, "optimizer_has_foreach": True,
    "optimizer_foreach": None, "peak_reserved_bytes": 30_000_000, "memory_budget_bytes": 28_000_000,
    "steps_per_s": 10.0,
}  # fmt: skip


def test_why_it_cannot_be_tried() -> None:
    assert FIX.not_applicable(GPU) is None
    assert (
        FIX.not_applicable({**GPU, "cuda_used": False})
        == CPU_DEFAULT
        == (
            "on a CPU torch's optimizers already step one tensor at a time (foreach is their default "
            "for CUDA tensors only)"
        )
    )
    assert FIX.not_applicable({**GPU, "cuda_used": False, "optimizer_foreach": True}) is None  # forced on
    assert FIX.not_applicable({"cuda_used": True}) == "no torch.optim optimizer stepped in the window"
    assert FIX.not_applicable({**GPU, "optimizer_fused": True}) == (
        "AdamW is built with fused=True: its one-kernel step makes no per-list temporaries"
    )
    assert FIX.not_applicable({**GPU, "optimizer": "LBFGS", "optimizer_has_foreach": False}) == (
        "LBFGS has no foreach implementation in torch"
    )
    assert (
        FIX.not_applicable({**GPU, "optimizer_foreach": False}) == "AdamW is already built with foreach=False"
    )


def _trial(peak_reserved_bytes: int, steps_per_s: float) -> Trial:
    raw = RawRun("t", "window_complete", 0, None, 5, 20, 0, 25, [], [], None)
    raw.runtime = {"cuda_memory": {"peak_reserved_bytes": peak_reserved_bytes}}
    return Trial("AdamW(..., foreach=False)", OFF, "measured", steps_per_s, None, raw)


def test_planned_from_the_memory_rules_on_a_gpu_and_chosen_when_the_run_fits() -> None:
    rules = {r.id: r for r in rulebook.load_rules([rules_dir()])}
    for rule_id in ("over-memory-budget", "memory-pressure", "out-of-memory"):
        assert rules[rule_id].fixes[-1] == "optimizer-foreach"
    finding = Finding(
        "over-memory-budget", "t", "high", "", [], rules["over-memory-budget"].fixes, "", "", "", ""
    )
    planned = {p.fix: p for p in fixes.plan([finding], GPU)}
    assert (planned["optimizer-foreach"].applicable, planned["optimizer-foreach"].reason) == (True, "")
    fused = {p.fix: p for p in fixes.plan([finding], {**GPU, "optimizer_fused": True})}
    assert not fused["optimizer-foreach"].applicable
    setting = FIX.next_candidate(GPU, [])
    assert setting is not None and (setting.label, setting.overrides) == ("AdamW(..., foreach=False)", OFF)
    fits = _trial(27_000_000, 9.0)
    assert FIX.next_candidate(GPU, [fits]) is None  # one candidate
    assert FIX.choose([fits], GPU) is fits and FIX.choose([_trial(29_000_000, 9.5)], GPU) is None
    assert FIX.describe(fits, GPU) == (
        "AdamW(..., foreach=False): peak 30 MB -> 27 MB, fits the budget of 28 MB; 1.11x slower per step"
    )
    assert fixes.goal("optimizer-foreach") == "memory" and FIX.loss_tolerance_rel == 1e-4


SCRIPT = """\
import torch

model = Net().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
head = torch.optim.SGD(
    model.head.parameters(),
    lr=0.1,
)
"""


def test_the_code_change_adds_foreach_false_to_the_optimizers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    diff = fix_change(script, "optimizer-foreach", OFF, None).diff
    lines = diff.splitlines()
    changed = [s for s in lines if s.startswith(("+", "-")) and not s.startswith(("+++", "---"))]
    assert changed == [
        "-optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)",
        "+optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)",
        "+    foreach=False,",
    ]
    explicit = "opt = torch.optim.Adam(params, foreach=True)\n"
    assert FIX.code_change(explicit, script, OFF) == "opt = torch.optim.Adam(params, foreach=False)\n"
    assert FIX.code_change("opt = torch.optim.Adam(params, fused=True)\n", script, OFF) is None
    assert FIX.code_change(SCRIPT, script, Overrides()) is None


def test_for_hugging_face_the_optimizer_is_the_users_to_build() -> None:
    t = vocab.Translation(call=None)  # type: ignore[arg-type]
    runtime: dict[str, Any] = {"optimizer_foreach_off": True}
    vocab._transformers(t, runtime, {})
    assert t.notes == [
        "an optimizer built with `foreach=False` given as `Trainer(optimizers=(optimizer, None))`"
    ]
    assert vocab.where_set("optimizer-foreach", "lightning") == (
        "`foreach=False` on the optimizer configure_optimizers returns"
    )
