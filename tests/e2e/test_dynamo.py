"""torch.compile's own records read back (`compute.dynamo`): real scripts compiled in fresh
processes (dynamo's state is per process) with the eager backend (graph breaks and guards are
dynamo's, whatever the backend), then the graph-breaks and recompilation rules on what they
recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from conftest import ROOT, SCRIPTS

from trainadvisor import rulebook
from trainadvisor.analyze.run.measures import runtime_measurements
from trainadvisor.compute import dynamo
from trainadvisor.resources import rules_dir

# What the profile child does around the user's script: run it, then read the records back.
RUNNER = """
import json, runpy, sys
from trainadvisor.compute.dynamo import compile_facts
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
print(json.dumps({"facts": compile_facts(), "dynamo_imported": "torch._dynamo" in sys.modules}))
"""


RUNS = {
    "break": ["compiled_graph_break.py", "--steps", "4"],
    "lengths": ["compiled_lengths.py", "--steps", "4"],  # lengths 8, 9, 10, 11
    "limit": ["compiled_lengths.py", "--steps", "12"],  # lengths 8 to 19: past the limit of 8
    "clean": ["compiled_lengths.py", "--steps", "4", "--grow", "0"],
    "plain": ["hand_sgd.py"],  # never compiles
}


RULES = {rule.id: rule for rule in rulebook.load_rules([rules_dir()])}


# `runs` compiles five scripts once per process that asks for it: one group, so that under pytest -n
# one worker runs them all, not each worker its own copy
pytestmark = pytest.mark.xdist_group("dynamo_runs")


def _line(script: str, text: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every script at once, each in its own process, run from the scripts' folder (sites are
    named relative to the working directory, as a user would name them)."""
    cache = tmp_path_factory.mktemp("inductor")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    started = {
        name: subprocess.Popen(
            [sys.executable, "-c", RUNNER, *argv],
            cwd=SCRIPTS,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name, argv in RUNS.items()
    }
    results = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
        results[name] = json.loads(out.strip().splitlines()[-1])
    return results


def test_a_graph_break_is_placed_on_the_users_line(runs: dict[str, dict[str, Any]]) -> None:
    facts = runs["break"]["facts"]
    line = _line("compiled_graph_break.py", "# BREAK")
    assert facts["graph_break_sites"] == [
        {
            "reason": "a Python branch (if/while) on a tensor's value",
            "site": f"compiled_graph_break.py:{line}",
            "function": "forward",
            "count": 1,
        }
    ]
    assert facts["graph_breaks"] == 1
    assert facts["compiled_graphs"] == 2  # forward before the branch, and after it
    assert facts["recompilations"] == 0 and facts["recompile_reasons"] == []
    assert 0 < facts["compile_s"] < facts["run_s"]


def test_a_changing_length_recompiles_on_its_size_guard(runs: dict[str, dict[str, Any]]) -> None:
    facts = runs["lengths"]["facts"]
    assert facts["recompilations"] == 3  # lengths 9, 10 and 11 each failed the size guard
    assert facts["compiled_graphs"] == 4
    [reason] = facts["recompile_reasons"]
    assert reason == {
        "reason": "tensor 'tokens' size mismatch at index 1. expected 10, actual 11",
        "site": f"compiled_lengths.py:{_line('compiled_lengths.py', 'def forward')}",
        "function": "forward",
        "count": 3,
    }
    assert facts["graph_breaks"] == 0 and facts["recompile_limit_hits"] == 0


def test_the_recompile_limit_reached_is_counted(runs: dict[str, dict[str, Any]]) -> None:
    facts = runs["limit"]["facts"]
    assert facts["recompile_limit"] == 8
    assert facts["recompile_limit_hits"] == 1
    # 7 recompilations compiled, and the attempt that found the limit (an id of its own since
    # torch 2.5); lengths 17 to 19 then ran uncompiled, without a guard checked
    assert facts["recompilations"] == 8
    assert facts["compiled_graphs"] == 8
    assert [r["count"] for r in facts["recompile_reasons"]] == [8]


def test_a_script_that_compiles_once_records_no_break_nor_recompilation(
    runs: dict[str, dict[str, Any]],
) -> None:
    facts = runs["clean"]["facts"]
    assert facts["compiled_graphs"] == 1
    assert facts["graph_breaks"] == 0 and facts["graph_break_sites"] == []
    assert facts["recompilations"] == 0 and facts["recompile_reasons"] == []


def test_a_script_that_never_compiles_has_no_facts_and_no_dynamo(runs: dict[str, dict[str, Any]]) -> None:
    assert runs["plain"] == {"facts": {}, "dynamo_imported": False}


def test_graph_breaks_rule_names_the_line(runs: dict[str, dict[str, Any]]) -> None:
    values = dynamo.compile_measurements(runs["break"]["facts"])
    finding = rulebook.evaluate_rule(RULES["graph-breaks"], values)
    line = _line("compiled_graph_break.py", "# BREAK")
    assert finding is not None and finding.severity == "medium"
    assert finding.message == (
        "torch.compile split your compiled code at graph breaks (1 in all); the most frequent at "
        f"compiled_graph_break.py:{line} (in forward): a Python branch (if/while) on a tensor's value."
    )
    assert rulebook.evaluate_rule(RULES["recompilation"], values) is None


def test_recompilation_rule_names_the_guard(runs: dict[str, dict[str, Any]]) -> None:
    values = dynamo.compile_measurements(runs["lengths"]["facts"])
    finding = rulebook.evaluate_rule(RULES["recompilation"], values)
    line = _line("compiled_lengths.py", "def forward")
    assert finding is not None and finding.severity == "medium"
    assert finding.message == (
        f"torch.compile recompiled 3 times, most often compiled_lengths.py:{line} (in forward) "
        "because this guard failed: tensor 'tokens' size mismatch at index 1. expected 10, actual 11."
    )
    assert rulebook.evaluate_rule(RULES["graph-breaks"], values) is None
    # four: half the default limit, a size still changing that will reach it
    four = rulebook.evaluate_rule(RULES["recompilation"], {**values, "recompilations": 4})
    assert four is not None and four.severity == "high"


def test_the_recompile_limit_reached_is_high(runs: dict[str, dict[str, Any]]) -> None:
    finding = rulebook.evaluate_rule(
        RULES["recompilation"], dynamo.compile_measurements(runs["limit"]["facts"])
    )
    assert finding is not None and finding.severity == "high"


@pytest.mark.parametrize("run", ["clean", "plain"])
def test_rules_stay_quiet_on_clean_and_uncompiled_scripts(runs: dict[str, dict[str, Any]], run: str) -> None:
    values = runtime_measurements({"compile": runs[run]["facts"], "cuda_used": False})
    assert rulebook.evaluate_rule(RULES["graph-breaks"], values) is None
    assert rulebook.evaluate_rule(RULES["recompilation"], values) is None


def test_runtime_measurements_read_the_saved_compile_facts(runs: dict[str, dict[str, Any]]) -> None:
    facts = {**runs["lengths"]["facts"], "run_s": 10.0, "compile_s": 0.5}
    values = runtime_measurements({"compile": facts, "cuda_used": False})
    assert values["recompilations"] == 3 and values["graph_breaks"] == 0
    assert values["compile_pct"] == pytest.approx(5.0)
    assert values["recompile_site"].startswith("compiled_lengths.py:")
    assert "compile" not in values and "graph_break_site" not in values
    assert runtime_measurements({"cuda_used": False}) == {"cuda_used": False}
