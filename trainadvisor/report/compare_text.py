"""How a comparison reads: in the terminal, as a pull request's Markdown comment, as JSON. The
scripts' names and the head's exception, which a report quotes, are shown as text (`mdtext`)."""

from __future__ import annotations

import json
from typing import Any

from trainadvisor._serial import to_plain
from trainadvisor.report import mdtext
from trainadvisor.report.compare import MetricChange, ReportComparison

MARKS = {"regression_likely": "❌", "improvement_likely": "✅", "neutral": "✅", "inconclusive": "⚠️"}


def _value(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 1e9:.2f} GB"
    return f"{value:,.1f}"


def _row(m: MetricChange) -> tuple[str, str, str, str, str]:
    unit = "" if m.unit == "bytes" else f" {m.unit}"
    return (
        f"{m.label}{unit}",
        _value(m.base, m.unit),
        _value(m.head, m.unit),
        f"{m.change_pct:+.1f}%",
        m.verdict,
    )


def _facts_line(c: ReportComparison) -> str:
    fit = c.comparability
    text = f"comparable on {fit.matched} of {fit.known} facts"
    return text + (f"; differs: {'; '.join(fit.differs)}" if fit.differs else "")


def _gate_line(c: ReportComparison) -> str:
    g = c.gate
    return (
        f"gate: {g.metric}, ±{g.gate_pct:g}%; noise floor ±{g.noise_floor_pct:.1f}% (from the runs' timed "
        f"windows{', at least 1% for memory' if g.metric == 'peak_memory' else ', at least 2%'})"
    )


def comparison_terminal(c: ReportComparison) -> str:
    lines = [
        f"trainadvisor compare: {c.verdict}: {c.gate.reason}",
        f"  base {c.base} vs head {c.head} ({c.run} runs)",
        f"  {_facts_line(c)}",
        f"  {_gate_line(c)}",
    ]
    rows = [_row(m) for m in c.metrics]
    if rows:
        width = max(len(r[0]) for r in rows)
        lines.append(f"  {'metric':<{width}}  {'base':>10}  {'head':>10}  {'change':>8}  verdict")
        lines += [f"  {r[0]:<{width}}  {r[1]:>10}  {r[2]:>10}  {r[3]:>8}  {r[4]}" for r in rows]
    return "\n".join(mdtext.terminal(line) for line in lines) + "\n"


def comparison_markdown(c: ReportComparison) -> str:
    lines = [
        f"### {MARKS[c.verdict]} trainadvisor compare: {c.verdict}",
        "",
        mdtext.inline(c.gate.reason) + ".",
        "",
        f"Base {mdtext.code(c.base)} vs head {mdtext.code(c.head)} ({c.run} runs); "
        f"{mdtext.inline(_facts_line(c))}; {mdtext.inline(_gate_line(c))}.",
        "",
        "| metric | base | head | change | verdict |",
        "|---|---:|---:|---:|---|",
    ]
    lines += ["| " + " | ".join(mdtext.cell(part) for part in _row(m)) + " |" for m in c.metrics]
    return "\n".join(lines) + "\n"


def comparison_json(c: ReportComparison) -> str:
    data: dict[str, Any] = to_plain(c)
    data["verdict"] = c.verdict
    return json.dumps(data, indent=1, allow_nan=False) + "\n"
