"""torch.compile's own records read back (`compute.dynamo`): real scripts compiled in fresh
processes (dynamo's state is per process) with the eager backend (graph breaks and guards are
dynamo's, whatever the backend), then the graph-breaks and recompilation rules on what they
recorded."""

from __future__ import annotations

import sys
import traceback
import types
from pathlib import Path
from typing import Any

import pytest

from trainadvisor.compute import dynamo

# `runs` compiles five scripts once per process that asks for it: one group, so that under pytest -n
# one worker runs them all, not each worker its own copy
pytestmark = pytest.mark.xdist_group("dynamo_runs")


def test_one_guard_failure_per_recompilation() -> None:
    # torch 2.5+: each recompilation checks every cache entry, newest first, ids falling
    ids = ["3/0: a", "3/1: b", "3/0: c", "3/2: d", "3/1: e", "3/0: f"]
    assert dynamo.one_per_recompile(ids) == ["3/0: a", "3/1: b", "3/2: d"]
    # torch 2.1: one failure recorded per recompilation, without ids
    assert dynamo.one_per_recompile(["x", "y"]) == ["x", "y"]


def test_recompile_reasons_group_a_guard_whose_values_change() -> None:
    def forward() -> None: ...

    resumed = forward.__code__.replace(co_name="torch_dynamo_resume_in_forward_at_7")
    failures = {
        forward.__code__: ["0/0: L['n'] == 3", "0/1: L['n'] == 4", "0/0: L['n'] == 3"],
        resumed: ["1/0: ___check_obj_id(L['self'].training, 140)  # if self.training:  # m.py:7 in f"],
    }
    reasons = dynamo.recompile_reasons(failures)
    here = f"{dynamo._path(__file__)}:{forward.__code__.co_firstlineno}"
    assert reasons == [
        {"reason": "L['n'] == 4", "site": here, "function": "forward", "count": 2},
        {
            "reason": "___check_obj_id(L['self'].training, 140)",
            "site": here,
            "function": "forward",
            "count": 1,
        },
    ]


def test_a_break_inside_torch_is_placed_at_the_users_call() -> None:
    torch_file = str(Path(dynamo.__file__).parents[1] / "compute" / "flops.py")  # a library frame
    stack = traceback.StackSummary.from_list(
        [("/nonexistent/train.py", 12, "forward", None), (torch_file, 40, "f", None)]
    )
    reasons = [
        types.SimpleNamespace(
            reason="Unsupported Tensor.item()\n  Explanation: no item.\n  Hint: h", user_stack=stack
        ),
        types.SimpleNamespace(reason="generic_jump TensorVariable()", user_stack=stack[:1]),
        types.SimpleNamespace(reason="not a break", user_stack=stack, graph_break=False),
    ]
    assert dynamo.break_sites(reasons) == [
        {"reason": "no item.", "site": "/nonexistent/train.py:12", "function": "forward", "count": 1},
        {"reason": "a Python branch (if/while) on a tensor's value", "site": "/nonexistent/train.py:12",
         "function": "forward", "count": 1},
    ]  # fmt: skip


def test_records_missing_or_reshaped_give_fewer_facts_never_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def items(self) -> Any:
            raise RuntimeError("changed in a later torch")

    utils = types.ModuleType("torch._dynamo.utils")
    utils.counters = {"frames": {"total": 2}, "graph_break": {"call_function print": 2}}  # type: ignore[attr-defined]
    utils.guard_failures = Broken()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", utils)
    monkeypatch.setitem(sys.modules, "torch._dynamo.convert_frame", None)
    monkeypatch.setitem(sys.modules, "torch._dynamo.config", None)
    facts = dynamo.compile_facts()
    assert facts["graph_breaks"] == 2
    assert facts["graph_break_sites"] == [
        {"reason": "call_function print", "site": None, "function": None, "count": 2}
    ]
    assert facts["recompilations"] == 0 and facts["recompile_reasons"] == []
    assert "compile_s" not in facts and "recompile_limit" not in facts
    assert dynamo.compile_measurements(facts)["graph_break_site"] == "an unrecorded line"
    utils.counters = {}  # type: ignore[attr-defined]  # imported, never compiled
    assert dynamo.compile_facts() == {}
