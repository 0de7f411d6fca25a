"""The rule engine: loads declarative rule files (TOML, one rule per file) and evaluates them
against a run's named measurements. Rules only propose fixes; `fixes` applies them.

A rule's conditions are small expressions over measurement names, e.g. `data_wait_pct >= 20`,
evaluated by a whitelist interpreter (comparisons, and/or/not, arithmetic): no Python `eval`.

May import: records, errors, resources."""

from __future__ import annotations

import ast
import difflib
import operator
import os
import re
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, get_args

from trainadvisor.errors import RuleError
from trainadvisor.records import Evidence, Finding, Severity
from trainadvisor.records.measurements import CATALOGUE
from trainadvisor.resources import rules_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SEVERITIES: tuple[str, ...] = get_args(Severity)  # most severe first, as the records spell them
# What a rule file may hold: a user's --rules folder is read like any input, so that a file of
# gigabytes, a condition of thousands of terms (nested thousands deep: the parser and the
# interpreter recurse) or a message whose format asks for a field a gigabyte wide is refused
# with its reason, not read, evaluated or written. The shipped rules use a tenth of each.
MAX_RULE_FILE_BYTES = 256 * 1024
MAX_CONDITION_CHARS = 2000
MAX_CONDITION_NODES = 400
MAX_FORMAT_WIDTH = 64  # a message field's width or precision
LOOPS = ("training", "inference")
# the frameworks a rule's advice may be written for (`[recommendation.<framework>]`), as the
# `framework` measurement names the one that built the loop
FRAMEWORKS = ("transformers", "lightning", "accelerate")


@dataclass
class Level:
    severity: str
    condition: str
    tree: ast.Expression
    names: set[str]  # measurements the condition reads; without them the level does not hold


@dataclass
class EvidenceSpec:
    measurement: str
    label: str
    unit: str


@dataclass
class Rule:
    id: str
    title: str
    path: Path
    requires: list[str]  # measurements the message needs: without them the rule stays quiet
    levels: list[Level]  # checked in order; the first that holds gives the severity
    message: str
    evidence: list[EvidenceSpec]
    fixes: list[str]
    recommendation: str
    anti_pattern: str
    best_practice: str
    threshold_source: str
    # the loops its advice is for: a training-only rule stays quiet on a trace that shows
    # inference (no backward pass, no optimizer step)
    loops: tuple[str, ...] = LOOPS
    # the advice in a framework's terms, by framework: text, anti_pattern and best_practice
    # (each optional; the generic one stands in for a missing key)
    frameworks: dict[str, dict[str, str]] = field(default_factory=dict)
    # rules whose finding this one's replaces: a narrower diagnosis of the same symptom (an
    # oversubscribed machine is what makes its loop wait on data, not the input pipeline)
    supersedes: tuple[str, ...] = ()


# ---- conditions ----

_COMPARE = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_ARITH = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _parse_condition(condition: str, where: str) -> ast.Expression:
    if len(condition) > MAX_CONDITION_CHARS:
        raise RuleError(
            f"{where}: a condition of {len(condition):,} characters (at most {MAX_CONDITION_CHARS:,})"
        )
    try:
        tree = ast.parse(condition, mode="eval")
    except SyntaxError as exc:
        raise RuleError(f"{where}: condition '{condition}' is not an expression ({exc.msg})") from None
    except (RecursionError, MemoryError):
        raise RuleError(f"{where}: condition nested too deep to read") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_CONDITION_NODES:
        raise RuleError(f"{where}: a condition of {nodes:,} terms (at most {MAX_CONDITION_NODES})")
    _check(tree, f"{where}: condition '{condition}'")
    return tree


def _check(tree: ast.AST, where: str) -> None:
    allowed = (
        ast.Expression, ast.Compare, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not,
        ast.USub, ast.BinOp, ast.Name, ast.Load, ast.Constant, *_COMPARE, *_ARITH,
    )  # fmt: skip
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise RuleError(f"{where}: '{type(node).__name__}' is not allowed in a condition")


def _eval(node: ast.AST, values: dict[str, Any]) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, values)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.BoolOp):
        results = (_eval(v, values) for v in node.values)
        return all(results) if isinstance(node.op, ast.And) else any(results)
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, values)
        return (not value) if isinstance(node.op, ast.Not) else -value
    if isinstance(node, ast.BinOp):
        return _ARITH[type(node.op)](_eval(node.left, values), _eval(node.right, values))
    # `_check` admitted nothing else: what is left is a comparison chain
    compare: ast.Compare = node  # type: ignore[assignment]
    left = _eval(compare.left, values)
    for op, right_node in zip(compare.ops, compare.comparators):
        right = _eval(right_node, values)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True


class _Formatter(string.Formatter):
    """str.format over measurements, without attribute or index access."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        if not field_name.isidentifier():
            raise RuleError(f"'{{{field_name}}}': a message may only name measurements")
        return kwargs[field_name], field_name


def render_message(template: str, values: dict[str, Any]) -> str:
    # `step_unit`: "window" where a trace marks no iterations and counts are per window
    return _Formatter().format(template, **{"step_unit": "step", **values})


# ---- loading ----


def _text(data: dict[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise RuleError(f"{where}: '{key}' must be a non-empty string")
    return value


def load_rule(path: Path) -> Rule:
    where = str(path)
    if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
        raise RuleError(f"{where}: not a regular file; a rule is a TOML file")
    try:
        with path.open("rb") as file:  # never more than the limit read, whatever the file is
            raw = file.read(MAX_RULE_FILE_BYTES + 1)
        if len(raw) > MAX_RULE_FILE_BYTES:
            limit_kib = MAX_RULE_FILE_BYTES // 1024
            raise RuleError(f"{where}: a rule file of more than {limit_kib} KiB; a rule is a few")
        text = raw.decode()
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RuleError(f"{where}: not a readable TOML rule file ({exc})") from None
    except (RecursionError, MemoryError):
        raise RuleError(f"{where}: not a readable TOML rule file (nested too deep)") from None
    rule_id = _text(data, "id", where)
    if rule_id != path.stem:
        raise RuleError(f"{where}: the file must be named after the rule id ({rule_id}.toml)")
    levels = []
    for i, level in enumerate(data.get("when") or []):
        severity = _text(level, "severity", f"{where} [[when]] #{i + 1}")
        if severity not in SEVERITIES:
            raise RuleError(f"{where}: severity '{severity}' is not one of {', '.join(SEVERITIES)}")
        condition = _text(level, "condition", f"{where} [[when]] #{i + 1}")
        tree = _parse_condition(condition, where)
        levels.append(Level(severity, condition, tree, _names(tree)))
    if not levels:
        raise RuleError(f"{where}: a rule needs at least one [[when]] with severity and condition")
    recommendation = data.get("recommendation") or {}
    evidence = [
        EvidenceSpec(_text(e, "measurement", where), _text(e, "label", where), e.get("unit", ""))
        for e in data.get("evidence") or []
    ]
    message = _text(data, "message", where)
    in_message = _message_fields(message, where)
    requires = sorted(in_message - {"step_unit"})  # step_unit has a default: "step"
    read = {
        *requires,
        *(name for level in levels for name in level.names),
        *(e.measurement for e in evidence),
    }
    _known(read, text, where)
    loops = tuple(data.get("loops") or LOOPS)
    if not set(loops) <= set(LOOPS):
        raise RuleError(f"{where}: loops must name some of {', '.join(LOOPS)}, not {list(loops)}")
    return Rule(
        id=rule_id,
        title=_text(data, "title", where),
        path=path,
        requires=requires,
        levels=levels,
        message=message,
        evidence=evidence,
        fixes=list(data.get("fixes") or []),
        recommendation=_text(recommendation, "text", f"{where} [recommendation]"),
        anti_pattern=_text(recommendation, "anti_pattern", f"{where} [recommendation]"),
        best_practice=_text(recommendation, "best_practice", f"{where} [recommendation]"),
        threshold_source=_text(data, "threshold_source", where),
        loops=loops,
        frameworks=_framework_advice(recommendation, where),
        supersedes=tuple(_names_list(data, "supersedes", where)),
    )


def _known(names: set[str], text: str, where: str) -> None:
    """Every measurement a rule reads is one the catalogue declares (`records.measurements`):
    a misspelt name would silence the rule without a word. The first unknown one, by the line
    it is on, is refused with the closest known name."""
    unknown = sorted(names - CATALOGUE.keys())
    if not unknown:
        return
    lines = text.splitlines()

    def line_of(name: str) -> int:
        pattern = re.compile(rf"\b{re.escape(name)}\b")
        return next((i for i, line in enumerate(lines, 1) if pattern.search(line)), 0)

    name = min(unknown, key=line_of)
    close = difflib.get_close_matches(name, CATALOGUE.keys(), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise RuleError(
        f"{where}:{line_of(name)}: '{name}' is not a measurement trainadvisor makes{hint} (every "
        "measurement, with its unit and meaning, is listed in trainadvisor/records/measurements.py)"
    )


_WIDTHS = re.compile(r"\d+")


def _message_fields(message: str, where: str) -> set[str]:
    """The measurements a message names; each field a name, with a format of modest width and
    precision and no field nested in it."""
    try:
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(message) if name is not None]
    except ValueError as exc:
        raise RuleError(f"{where}: its message is not a format string ({exc})") from None
    for name, spec in fields:
        if not name.isidentifier():
            raise RuleError(f"{where}: message field '{{{name}}}' may only name measurements")
        if "{" in (spec or "") or any(int(n) > MAX_FORMAT_WIDTH for n in _WIDTHS.findall(spec or "")):
            raise RuleError(
                f"{where}: message field '{{{name}:{spec}}}': a format's width and precision are "
                f"at most {MAX_FORMAT_WIDTH}, with no field inside"
            )
    return {name for name, _ in fields}


def _names_list(data: dict[str, Any], key: str, where: str) -> list[str]:
    value = data.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RuleError(f"{where}: '{key}' must be a list of rule ids")
    return value


def _framework_advice(recommendation: dict[str, Any], where: str) -> dict[str, dict[str, str]]:
    """`[recommendation.transformers]` and the like: the advice in that framework's terms."""
    advice = {}
    for name, table in recommendation.items():
        if not isinstance(table, dict):
            continue
        if name not in FRAMEWORKS:
            raise RuleError(f"{where}: [recommendation.{name}]: advice is for one of {', '.join(FRAMEWORKS)}")
        keys = ("text", "anti_pattern", "best_practice")
        if not set(table) <= set(keys) or not table:
            raise RuleError(f"{where}: [recommendation.{name}] takes some of {', '.join(keys)}")
        advice[name] = {key: _text(table, key, f"{where} [recommendation.{name}]") for key in table}
    return advice


def load_rules(folders: list[Path]) -> list[Rule]:
    """Every `*.toml` rule in the folders, in order; a later folder's rule replaces an earlier
    one with the same id (so a user can override a built-in rule)."""
    rules: dict[str, Rule] = {}
    for folder in folders:
        if not folder.is_dir():
            raise RuleError(f"{folder}: not a folder of rule files")
        for path in sorted(folder.glob("*.toml")):
            rule = load_rule(path)
            rules[rule.id] = rule
    return list(rules.values())


# ---- evaluation ----


def _holds(rule: Rule, level: Level, values: dict[str, Any]) -> bool:
    """Whether a level's condition holds; one that cannot be computed over the measurements
    (a number compared with text, a division by zero) is the rule file's error, named as such."""
    if not level.names <= values.keys():
        return False
    try:
        return bool(_eval(level.tree, values))
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise RuleError(
            f"{rule.path}: condition {level.condition!r} cannot be evaluated ({exc}); fix or remove the rule"
        ) from None


def evaluate_rule(rule: Rule, values: dict[str, Any]) -> Finding | None:
    if any(name not in values for name in rule.requires):
        return None
    if values.get("inference_loop") and "inference" not in rule.loops:
        return None
    level = next((lv for lv in rule.levels if _holds(rule, lv, values)), None)
    if level is None:
        return None
    try:
        message = render_message(rule.message, values)
    except (TypeError, ValueError) as exc:
        raise RuleError(
            f"{rule.path}: its message cannot be written ({exc}); fix the rule's message"
        ) from None
    advice = rule.frameworks.get(str(values.get("framework", "")), {})
    return Finding(
        rule=rule.id,
        title=rule.title,
        severity=cast(Severity, level.severity),
        message=message,
        evidence=[Evidence(e.measurement, e.label, values.get(e.measurement), e.unit) for e in rule.evidence],
        fixes=list(rule.fixes),
        recommendation=advice.get("text", rule.recommendation),
        anti_pattern=advice.get("anti_pattern", rule.anti_pattern),
        best_practice=advice.get("best_practice", rule.best_practice),
        threshold_source=rule.threshold_source,
    )


def evaluate(rules: list[Rule], values: dict[str, Any]) -> list[Finding]:
    """Findings, most severe first; a finding another one supersedes is left out."""
    fired = [(rule, f) for rule in rules if (f := evaluate_rule(rule, values)) is not None]
    replaced = {rule_id for rule, _ in fired for rule_id in rule.supersedes}
    findings = [f for _, f in fired if f.rule not in replaced]
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


@dataclass(frozen=True)
class Diagnosis:
    """What the rules found in one set of named measurements (a run, a trace, merged ranks)."""

    values: dict[str, Any]
    findings: list[Finding]


def rules_for(user_dirs: list[Path]) -> list[Rule]:
    """The shipped rules, then the user's folders (a user rule replaces the shipped one of its id)."""
    return load_rules([rules_dir(), *user_dirs])


# Set (by the test suite, for its own processes and the scripts' it starts): every measurement
# made must be one the catalogue declares, or the diagnosis fails naming the undeclared ones.
CHECK_ENV = "TRAINADVISOR_CHECK_MEASUREMENTS"


def diagnose(values: dict[str, Any], rules: list[Rule]) -> Diagnosis:
    """The diagnosis stage of every command: profile, @advise, analyze and the multi-node merge."""
    if os.environ.get(CHECK_ENV):
        undeclared = sorted(values.keys() - CATALOGUE.keys())
        if undeclared:
            raise AssertionError(f"measurements not in records/measurements.py: {', '.join(undeclared)}")
    return Diagnosis(values, evaluate(rules, values))
