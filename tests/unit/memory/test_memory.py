"""One step's peak memory and what fills it, measured on real steps on the CPU; the GPU's
allocator statistics through stand-ins of torch.cuda's two calls; the budget and its option."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
import torch

from trainadvisor.memory.peak import memory_measurements, step_memory
from trainadvisor.memory.step import StepMemory, breakdown
from trainadvisor.options.kinds import SIZE
from trainadvisor.report.memory import memory_cell


def _trained(optimizer_class: type[torch.optim.Optimizer], **kwargs: float) -> tuple[object, object]:
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 4), torch.randn(16, 8)
    optimizer = optimizer_class(model.parameters(), **kwargs)

    def step() -> None:
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    step()  # the optimizer's state exists from its first step
    return optimizer, step


@pytest.mark.parametrize(
    ("optimizer_class", "kwargs", "state_bytes"),
    [
        (torch.optim.SGD, {"lr": 0.1}, 0),
        # exp_avg and exp_avg_sq like the parameters (144 bytes each), and two fp32 step counters
        (torch.optim.Adam, {}, 144 + 144 + 2 * 4),
    ],
)
def test_the_parts_of_a_linear_layers_step_are_exact(
    optimizer_class: type[torch.optim.Optimizer], kwargs: dict[str, float], state_bytes: int
) -> None:
    """Linear(8, 4): 32 + 4 fp32 parameters, 144 bytes, and as much gradient; the activations
    autograd keeps: the 16x8 input for the weight's gradient (512 bytes) and the 16x4 output
    `pow` needs (256). The peak is measured; the rest of it is `other`, never negative."""
    optimizer, step = _trained(optimizer_class, **kwargs)
    memory = StepMemory()
    memory.start(optimizer, None)  # type: ignore[arg-type]
    step()  # type: ignore[operator]
    memory.stop()
    facts = memory.facts()
    parts = facts["breakdown"]
    assert facts["status"] == "measured"
    assert (parts["parameters"], parts["gradients"], parts["optimizer_state"]) == (144, 144, state_bytes)
    assert parts["activations"] == 512 + 256
    assert parts["other"] >= 0 and sum(parts.values()) == facts["peak_bytes"]


def test_on_a_gpu_the_peak_is_the_allocators_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda's statistics, stood in for: the peak is reset before the step and read after
    it, on the device the loop trains on."""
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(
        torch.cuda, "max_memory_allocated", lambda device: calls.append(("peak", device)) or 4096
    )
    optimizer, step = _trained(torch.optim.SGD, lr=0.1)
    memory = StepMemory()
    memory.start(optimizer, 1)  # type: ignore[arg-type]
    step()  # type: ignore[operator]
    memory.stop()
    facts = memory.facts()
    assert calls == [("reset", 1), ("peak", 1)]
    assert facts["peak_bytes"] == 4096 and facts["peak_source"] == "the CUDA allocator's peak over the step"
    assert facts["breakdown"]["other"] == 4096 - 144 - 144 - 768


def test_parts_that_were_not_alive_at_once_leave_no_negative_other() -> None:
    facts = breakdown(1000, {"parameters": 400, "gradients": 400, "optimizer_state": 0}, 300, "test")
    assert facts["breakdown"]["other"] == 0
    assert facts["note"] == (
        "the parts add up to 100 bytes more than the peak: not all of them were alive at the same moment"
    )


def test_without_an_optimizer_nothing_is_measured_and_the_step_goes_on() -> None:
    memory = StepMemory()
    memory.start(None, None)
    memory.stop()
    assert memory.facts() == {"status": "not measured: no optimizer stepped before the counted step"}


def test_the_budget_is_the_allocators_limit_on_a_gpu_and_the_share_is_measured() -> None:
    runtime = {
        "memory": {"status": "measured", "peak_bytes": 30_000, "breakdown": {"activations": 15_000}},
        "cuda_memory": {"limit_bytes": 40_000, "limit_source": "set_per_process_memory_fraction(0.5)"},
    }
    memory = step_memory(runtime)
    assert (
        memory is not None and memory.fits and memory.budget_source == "set_per_process_memory_fraction(0.5)"
    )
    table = memory_measurements(memory)
    assert (table["budget_used_pct"], table["activations_pct"], table["memory_budget_bytes"]) == (
        75.0,
        50.0,
        40_000,
    )


def test_the_report_says_whether_the_step_fits() -> None:
    from trainadvisor.records import Run, Stats

    runtime = {
        "memory": {"status": "measured", "peak_bytes": 30_000_000, "breakdown": {"activations": 15_000_000}}
    }
    memory = step_memory(runtime)
    assert memory is not None
    memory.budget_bytes, memory.budget_source = 24_000_000, "--memory-budget"
    run = Run("r", 1, Stats(1, 1, 1, 1, 1), 1.0, None, {}, {}, [], None, memory=memory)  # type: ignore[arg-type]
    assert memory_cell(run) == "30 MB: activations 50%; DOES NOT FIT the budget of 24 MB (--memory-budget)"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("24GB", 24 * 10**9),
        ("500MiB", 500 * 2**20),
        ("8e9", 8 * 10**9),
        ("1.5 GiB", 3 * 2**29),
        ("4096", 4096),
    ],
)
def test_memory_budget_sizes(text: str, size: int) -> None:
    assert SIZE.convert(text, None, None) == size


def test_a_memory_budget_that_is_no_size_is_refused() -> None:
    with pytest.raises(click.BadParameter, match="'lots' is not an amount of memory: write it as 24GB"):
        SIZE.convert("lots", None, None)


def test_the_reproduce_command_keeps_the_budget(tmp_path: Path) -> None:
    from trainadvisor.profile.runs import ProfileOptions, reproduce_command

    options = ProfileOptions(
        script=tmp_path / "train.py", args=[], out_dir=tmp_path, memory_budget_bytes=24 * 10**9
    )
    command = reproduce_command(options)
    assert command[command.index("--memory-budget") + 1] == "24000000000"


def test_the_peak_is_placed_at_the_lines_whose_tensors_hold_it() -> None:
    """Adam on Linear(8, 4), the old gradients freed by zero_grad: the peak (1,728 bytes) is in
    backward, where the line calling it holds the new gradients and autograd's buffers (1,028
    bytes in 5 tensors), beside the optimizer's state, the forward's output (256) kept for
    `pow`, the parameters and the loss. The step over time is the bytes after each operator;
    its most is the peak."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 4), torch.randn(16, 8)
    optimizer = torch.optim.Adam(model.parameters())

    def step() -> None:
        optimizer.zero_grad()
        y = model(x)
        loss = y.pow(2).mean()
        loss.backward()
        optimizer.step()

    step()
    memory = StepMemory()
    memory.start(optimizer, None)
    step()
    memory.stop()
    facts = memory.facts()
    line = step.__code__.co_firstlineno
    assert facts["peak_bytes"] == 1728 and max(facts["timeline_bytes"]) == 1728
    assert facts["timeline_bytes"][0] == 144 + 144 + 296  # before the first operator
    assert facts["peak_sites"] == [
        {"site": f"test_memory.py:{line + 4}", "bytes": 1028, "tensors": 5},
        {"site": "optimizer state", "bytes": 296, "tensors": 6},
        {"site": f"test_memory.py:{line + 2}", "bytes": 256, "tensors": 1},
        {"site": "parameters", "bytes": 144, "tensors": 2},
        {"site": f"test_memory.py:{line + 3}", "bytes": 4, "tensors": 1},
    ]


def _two_layers(autocast: bool) -> tuple[object, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 64))
    x = torch.randn(16, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        out.float().pow(2).mean().backward()
        optimizer.step()

    step()
    return optimizer, step


@pytest.mark.parametrize("autocast", [False, True])
def test_weights_are_not_counted_as_activations(autocast: bool) -> None:
    """The second Linear saves its input and `weight.t()`, a view of the parameter's storage;
    under autocast it saves the weight's bf16 copy. Neither is an activation (checkpointing was
    proposed for memory it cannot free): the activations are the inputs alone, 16x8 for the
    first layer's weight gradient, 16x64 for the second's, 16x64 for `pow`'s (fp32: 512 B, 4 KiB
    and 4 KiB; the layers' inputs in bf16 under autocast: 256 B and 2 KiB)."""
    optimizer, step = _two_layers(autocast)
    memory = StepMemory()
    memory.start(optimizer, None)  # type: ignore[arg-type]
    step()  # type: ignore[operator]
    memory.stop()
    parts = memory.facts()["breakdown"]
    weight_bytes = 64 * 64 * (2 if autocast else 4)
    assert parts["activations"] < weight_bytes, parts
    assert parts["activations"] == (256 + 2048 if autocast else 512 + 4096) + 4096, parts


def test_a_data_set_held_before_the_step_is_not_the_steps_memory() -> None:
    """pytorch/examples vae: each batch a slice of a 47 MB tensor held before the step, which the
    step's peak then held ("held at the peak"). A view allocates nothing: the 3.2 MB data set is
    in no part of the step's memory, the peak stays far below it."""
    torch.manual_seed(0)
    data = torch.randn(100_000, 8)  # 3.2 MB, made before the step
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        optimizer.zero_grad()
        model(data[:16]).pow(2).mean().backward()
        optimizer.step()

    step()
    memory = StepMemory()
    memory.start(optimizer, None)
    step()
    memory.stop()
    facts = memory.facts()
    assert facts["peak_bytes"] < 100_000, facts["peak_bytes"]


def test_the_windows_peak_keeps_the_timed_steps_past_the_memory_steps_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window resets the allocator's peaks when timing begins, and the memory step resets
    them again: the window's peak was the memory step's alone. The timed steps' peak is kept
    before that reset. (torch.cuda's statistics calls stood in for: no GPU here.)"""
    from trainadvisor.training.gpu import GpuWindow

    state = {"allocated": 0, "reserved": 0}

    def reset(device: int) -> None:
        state["allocated"] = state["reserved"] = 0

    for name, value in {
        "synchronize": lambda device=None: None,
        "reset_peak_memory_stats": reset,
        "memory_stats": lambda device: {"reserved_bytes.all.current": 4096},
        "max_memory_allocated": lambda device: state["allocated"],
        "max_memory_reserved": lambda device: state["reserved"],
        "get_device_properties": lambda device: type("P", (), {"total_memory": 10**9})(),
        "mem_get_info": lambda device: (10**9 - 4096, 10**9),
        "get_per_process_memory_fraction": lambda device: 1.0,
        "Event": lambda enable_timing: type("E", (), {"record": lambda self, stream: None})(),
        "current_stream": lambda device: None,
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)
    window = GpuWindow()
    window.start(0)
    state.update(allocated=3000, reserved=4096)  # the timed steps
    window.keep_peaks()
    reset(0)  # the memory step's own reset
    state.update(allocated=1000, reserved=2048)
    memory = window.memory()
    assert (memory["peak_allocated_bytes"], memory["peak_reserved_bytes"]) == (3000, 4096)
