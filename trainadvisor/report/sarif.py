"""A report's findings as SARIF 2.1.0, for code scanning on a pull request's diff: every finding
whose evidence names a line of the user's code (a host sync, a CPU-made tensor, the
DataLoader's or DDP's construction, a graph break, an out-of-memory allocation) is a result on
that line. Rule ids are the rules' own; severities map high -> error, medium -> warning, low ->
note; each rule carries its help (the recommendation and the source of its threshold) and each
result the measured figures as properties. A result's fingerprint is its rule, its file and the
text of its line (and which of equal lines it is), so it stays the same across runs of the same
code, and when lines above it move. Paths are relative to the repository root; a line outside
it (a library's) is counted, not listed. Pure: a report and the root in, SARIF out."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from trainadvisor._version import __version__
from trainadvisor.records import Finding, Report

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"high": "error", "medium": "warning", "low": "note"}
# A line of Python code as evidence gives it: "train.py:56", "/home/u/repo/train.py:56 (12x)"
SITE = re.compile(r"(?P<path>[\w.~/\\-]+\.py):(?P<line>\d+)")
FINGERPRINT = "trainadvisor/v1"


def sites(finding: Finding) -> list[tuple[str, int]]:
    """Every (path, line) the finding's evidence names, in order, each once."""
    found: dict[tuple[str, int], None] = {}
    for evidence in finding.evidence:
        if not evidence.measurement.endswith(("_site", "_sites")) or evidence.value is None:
            continue
        for match in SITE.finditer(str(evidence.value)):
            found[(match["path"], int(match["line"]))] = None
    return list(found)


def in_repository(path: str, root: Path) -> str | None:
    """`path` relative to `root`, POSIX-style; None where it lies outside (a library's file)."""
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        relative = candidate.resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return None
    return str(PurePosixPath(*relative.parts))


def _line_text(root: Path, relative: str, line: int) -> str | None:
    try:
        with (root / relative).open(encoding="utf-8", errors="replace") as handle:
            for number, text in enumerate(handle, 1):
                if number == line:
                    return text.strip()
    except OSError:
        return None
    return None


def _rule(finding: Finding) -> dict[str, Any]:
    help_text = f"{finding.recommendation}\n\nThreshold: {finding.threshold_source}"
    markdown = (
        f"{finding.recommendation}\n\n**Threshold:** {finding.threshold_source}\n\n"
        f"Instead of:\n\n```python\n{finding.anti_pattern}\n```\n\n"
        f"Write:\n\n```python\n{finding.best_practice}\n```"
    )
    return {
        "id": finding.rule,
        "name": "".join(part.title() for part in re.split(r"[^A-Za-z0-9]+", finding.rule)),
        "shortDescription": {"text": finding.title},
        "help": {"text": help_text, "markdown": markdown},
        "defaultConfiguration": {"level": LEVELS[finding.severity]},
        "properties": {"threshold_source": finding.threshold_source, "fixes": list(finding.fixes)},
    }


def _figures(finding: Finding) -> dict[str, Any]:
    """The measured figures behind a finding, by measurement name (with their units)."""
    return {
        e.measurement: {"value": e.value, "unit": e.unit, "label": e.label}
        for e in finding.evidence
        if isinstance(e.value, (int, float, str)) or e.value is None
    }


def sarif_log(report: Report, root: Path) -> dict[str, Any]:
    rules: dict[str, int] = {}
    descriptors: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    outside = 0
    for finding in report.findings:
        for path, line in sites(finding):
            relative = in_repository(path, root)
            if relative is None:
                outside += 1
                continue
            if finding.rule not in rules:
                rules[finding.rule] = len(descriptors)
                descriptors.append(_rule(finding))
            text = _line_text(root, relative, line)
            key = f"{finding.rule}|{relative}|{text if text is not None else line}"
            seen[key] = seen.get(key, -1) + 1
            digest = hashlib.sha256(f"{key}|{seen[key]}".encode()).hexdigest()[:32]
            results.append(
                {
                    "ruleId": finding.rule,
                    "ruleIndex": rules[finding.rule],
                    "level": LEVELS[finding.severity],
                    "message": {"text": f"{finding.title}: {finding.message}"},
                    "locations": [
                        {
                            "physicalLocation": {
                                "artifactLocation": {"uri": relative, "uriBaseId": "%SRCROOT%"},
                                "region": {"startLine": line},
                            }
                        }
                    ],
                    "partialFingerprints": {FINGERPRINT: digest},
                    "properties": {"measurements": _figures(finding)},
                }
            )
    run = {
        "tool": {"driver": {"name": "trainadvisor", "version": __version__, "rules": descriptors}},
        "automationDetails": {"id": f"trainadvisor/{report.kind}/"},
        "results": results,
        "properties": {
            "schema_version": report.schema_version,
            "run_id": report.run_id,
            "findings": len(report.findings),
            "lines_outside_the_repository": outside,
        },
    }
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}


def sarif_json(report: Report, root: Path) -> str:
    return json.dumps(sarif_log(report, root), indent=1, allow_nan=False) + "\n"
