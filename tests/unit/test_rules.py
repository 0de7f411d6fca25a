"""The rule engine and the shipped rule files."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from trainadvisor import fixes, rulebook
from trainadvisor.errors import RuleError
from trainadvisor.resources import rules_dir

RULE = """
id = "{id}"
title = "t"
threshold_source = "s"
message = "{message}"
[[when]]
severity = "medium"
condition = "{condition}"
[recommendation]
text = "r"
anti_pattern = "bad()"
best_practice = "good()"
"""


def write_rule(
    folder: Path, rule_id: str = "x", condition: str = "steps > 1", message: str = "steps={steps}"
) -> Path:
    path = folder / f"{rule_id}.toml"
    path.write_text(RULE.format(id=rule_id, condition=condition, message=message))
    return path


SHIPPED = [
    "allocator-churn", "anomaly-detection-on", "comm-bound", "compute-bound", "cpu-oversubscribed",
    "cpu-tensor-creation",
    "cudnn-benchmark", "data-parallel", "data-stall", "ddp-no-sync", "ddp-settings", "gpu-underutilized",
    "graph-breaks",
    "host-bound",
    "host-sync", "launch-bound", "memory-headroom", "memory-pressure", "no-mixed-precision", "out-of-memory",
    "over-memory-budget",
    "pageable-h2d-copy",
    "recompilation", "straggler",
]  # fmt: skip


def shipped(rule_id: str) -> rulebook.Rule:
    return next(r for r in rulebook.load_rules([rules_dir()]) if r.id == rule_id)


def test_every_shipped_rule_loads_with_its_code_examples() -> None:
    rules = rulebook.load_rules([rules_dir()])
    assert [r.id for r in rules] == SHIPPED
    for rule in rules:
        assert rule.anti_pattern.strip() and rule.best_practice.strip()
        assert rule.threshold_source.strip() and rule.recommendation.strip()
        for fix in rule.fixes:  # every fix a rule proposes is one trainadvisor can apply
            assert fix in fixes.REGISTRY, (rule.id, fix)


@pytest.mark.parametrize(
    ("data_wait_pct", "severity"),
    [(4.99, None), (5.0, "medium"), (19.99, "medium"), (20.0, "high"), (84.0, "high")],
)
def test_data_stall_thresholds(data_wait_pct: float, severity: str | None) -> None:
    rule = shipped("data-stall")
    values = {
        "data_wait_pct": data_wait_pct,
        "data_wait_ms_per_step": 10.0,
        "step_time_ms_mean": 50.0,
        "num_workers": 0,
    }
    finding = rulebook.evaluate_rule(rule, values)
    assert (finding.severity if finding else None) == severity
    if finding:
        assert finding.message == (
            f"The loop waited for its next batch for {data_wait_pct:.0f}% of each step "
            "(10.0 ms per step on average)."
        )


def test_a_rule_is_not_evaluated_without_its_measurements(tmp_path: Path) -> None:
    rule = shipped("data-stall")
    assert rulebook.evaluate_rule(rule, {"data_wait_pct": 90.0}) is None  # message needs more
    # A level whose measurements are missing does not hold; the next level is tried.
    two = rulebook.load_rule(write_rule(tmp_path, condition="batch_size > 1", message="steps={steps}"))
    two.levels.insert(0, rulebook.Level("high", "ranks > 1", ast.parse("ranks > 1", mode="eval"), {"ranks"}))
    assert rulebook.evaluate_rule(two, {"steps": 1, "batch_size": 2}).severity == "medium"  # type: ignore[union-attr]


def test_conditions_are_expressions_over_measurements_only(tmp_path: Path) -> None:
    for condition in ("__import__('os').system('true')", "a.__class__ > 1", "[a][0] > 1", "a if a else 1"):
        path = write_rule(tmp_path, condition=condition)
        with pytest.raises(RuleError, match="is not allowed in a condition"):
            rulebook.load_rule(path)


def test_messages_cannot_reach_attributes(tmp_path: Path) -> None:
    path = write_rule(tmp_path, message="{a.__class__}")
    with pytest.raises(RuleError, match=r"message field '\{a.__class__\}' may only name measurements"):
        rulebook.load_rule(path)


def test_arithmetic_and_boolean_conditions(tmp_path: Path) -> None:
    rule = rulebook.load_rule(
        write_rule(tmp_path, condition="steps * 2 >= batch_size and not cuda_used or -steps > 0")
    )
    assert rulebook.evaluate_rule(rule, {"steps": 3, "batch_size": 6, "cuda_used": False}) is not None
    assert rulebook.evaluate_rule(rule, {"steps": 3, "batch_size": 7, "cuda_used": False}) is None
    assert rulebook.evaluate_rule(rule, {"steps": -1, "batch_size": 7, "cuda_used": True}) is not None


def test_malformed_rule_files_name_the_problem(tmp_path: Path) -> None:
    (tmp_path / "broken.toml").write_text("id = ")
    with pytest.raises(RuleError, match="broken.toml: not a readable TOML rule file"):
        rulebook.load_rule(tmp_path / "broken.toml")
    path = write_rule(tmp_path, rule_id="other")
    path.rename(tmp_path / "renamed.toml")
    with pytest.raises(RuleError, match=r"must be named after the rule id \(other.toml\)"):
        rulebook.load_rule(tmp_path / "renamed.toml")
    (tmp_path / "nolevel.toml").write_text('id = "nolevel"\ntitle = "t"\nmessage = "m"\n')
    with pytest.raises(RuleError, match="at least one"):
        rulebook.load_rule(tmp_path / "nolevel.toml")


def test_hostile_rule_files_are_refused_before_they_are_read_whole_or_evaluated(tmp_path: Path) -> None:
    """A --rules folder is input like any other: a condition of 20,000 terms, one nested 600
    deep, a TOML array nested 100,000 deep, a 100 MB string, a message field 1.5 GB wide or with
    a field inside its format, and a FIFO named like a rule are each refused with the reason,
    none of them read whole, parsed to the end or formatted."""
    cases = {
        "a condition of 39,997 characters": write_rule(tmp_path, "terms", condition=" + ".join("a" * 10_000)),
        "a condition of 1,206 terms": write_rule(tmp_path, "deep", condition="-" * 600 + "a > 1"),
        r"message field '\{a:1500000000\}'": write_rule(tmp_path, "wide", message="{a:1500000000}"),
        r"message field '\{a:\{b\}\}'": write_rule(tmp_path, "nested", message="{a:{b}}"),
    }
    array = tmp_path / "array.toml"
    array.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    cases[r"array.toml: not a readable TOML rule file \(nested too deep\)"] = array
    big = tmp_path / "big.toml"
    big.write_text(f'id = "big"\ntitle = "{"A" * 10**8}"\n')
    cases["big.toml: a rule file of more than 256 KiB"] = big
    (tmp_path / "pipes").mkdir()
    fifo = tmp_path / "pipes" / "fifo.toml"
    os.mkfifo(fifo)
    cases["fifo.toml: not a regular file"] = fifo
    for reason, path in cases.items():
        with pytest.raises(RuleError, match=reason):
            rulebook.load_rule(path)
    with pytest.raises(RuleError, match="fifo.toml: not a regular file"):
        rulebook.load_rules([tmp_path / "pipes"])


def test_a_user_rule_replaces_a_shipped_rule_of_the_same_id(tmp_path: Path) -> None:
    write_rule(tmp_path, rule_id="data-stall", condition="data_wait_pct > 50", message="mine")
    rules = rulebook.load_rules([rules_dir(), tmp_path])
    assert [r.id for r in rules] == SHIPPED
    rule = next(r for r in rules if r.id == "data-stall")
    assert rule.path.parent == tmp_path
    assert rulebook.evaluate(rules, {"data_wait_pct": 30.0}) == []


def test_findings_are_ordered_by_severity(tmp_path: Path) -> None:
    write_rule(tmp_path, rule_id="a-medium", condition="steps > 1")
    (tmp_path / "b-high.toml").write_text(
        RULE.format(id="b-high", condition="steps > 1", message="m").replace('"medium"', '"high"')
    )
    findings = rulebook.evaluate(rulebook.load_rules([tmp_path]), {"steps": 2})
    assert [f.rule for f in findings] == ["b-high", "a-medium"]


UNITS = {
    "%",
    "ms",
    "us",
    "s",
    "bytes",
    "count",
    "steps/s",
    "samples/s",
    "FLOP",
    "TFLOP/s",
    "MiB",
    "bool",
    "text",
    "list",
}


def test_every_measurement_a_fix_or_stage_reads_is_declared_with_its_unit() -> None:
    """The catalogue (records/measurements.py) declares every name the package reads from the
    measurement table (`values.get("...")`, `values["..."]`); each has a unit, a meaning and a
    producer. (Every name a run makes is checked as the suite runs: `rulebook.CHECK_ENV`.)"""
    import re

    from trainadvisor.records.measurements import CATALOGUE

    read = re.compile(r'values\.get\(\s*"([a-z0-9_]+)"|values\[\s*"([a-z0-9_]+)"\]')
    package = Path(rulebook.__file__).parent
    names = {
        next(group for group in found.groups() if group)
        for path in package.rglob("*.py")
        for found in read.finditer(path.read_text())
    }
    assert len(names) >= 30 and names <= CATALOGUE.keys(), sorted(names - CATALOGUE.keys())
    for name, measurement in CATALOGUE.items():
        assert measurement.unit in UNITS and measurement.meaning and measurement.producer, name
