"""Every shipped rule against its case file (tests/rule_cases/<rule>.toml): real traces on which
it must fire at a given severity or stay quiet (`shared`: recorded by others, read from
../shared/traces; `trace`: our own, in tests/data), plus measurement tables for facts no trace
holds (runtime flags, allocator statistics). A case file needs at least one firing and one quiet
case."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import tomllib
from conftest import DATA, ROOT, shared_trace

from trainadvisor import rulebook
from trainadvisor.analyze.command import to_run
from trainadvisor.analyze.run.summary import named_measurements
from trainadvisor.analyze.trace.analysis import analyze_trace
from trainadvisor.resources import rules_dir

CASES = ROOT / "tests" / "rule_cases"
RULES = {rule.id: rule for rule in rulebook.load_rules([rules_dir()])}


def _cases() -> list[Any]:
    params = []
    for path in sorted(CASES.glob("*.toml")):
        for i, case in enumerate(tomllib.loads(path.read_text())["case"]):
            params.append(pytest.param(path.stem, case, id=f"{path.stem}-{i + 1}-{case['expect']}"))
    return params


@cache
def _trace_values(path: Path) -> dict[str, Any]:
    analysis = analyze_trace(path)
    return named_measurements(to_run(analysis))


def test_every_rule_has_firing_and_quiet_cases() -> None:
    assert sorted(p.stem for p in CASES.glob("*.toml")) == sorted(RULES)
    for path in CASES.glob("*.toml"):
        cases = tomllib.loads(path.read_text())["case"]
        assert any(c["expect"] != "quiet" for c in cases), path.name
        assert any(c["expect"] == "quiet" for c in cases), path.name


@pytest.mark.parametrize(("rule_id", "case"), _cases())
def test_rule_case(rule_id: str, case: dict[str, Any]) -> None:
    values: dict[str, Any] = {}
    if "trace" in case:
        values.update(_trace_values(DATA / case["trace"]))
    if "shared" in case:
        values.update(_trace_values(shared_trace(case["shared"])))
    values.update(case.get("measurements", {}))
    values.update(case.get("facts", {}))
    finding = rulebook.evaluate_rule(RULES[rule_id], values)
    assert (finding.severity if finding else "quiet") == case["expect"], case["why"]
    if "message" in case:
        assert finding is not None and finding.message == case["message"]
