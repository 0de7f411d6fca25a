"""A report in a few kilobytes, for an agent's context: the headline, the run's main figures,
each finding in a line, each fix's outcome with its measured gain and its code change as a
unified diff. At most SUMMARY_MAX_BYTES of JSON: what does not fit is cut (diffs first, then the
findings' text), `truncated` says so, and `report` names the folder holding everything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainadvisor.analyze.run.summary import named_measurements
from trainadvisor.records import ProfileReport, Report, after_of, fix_outcomes_of
from trainadvisor.report.render import headline, loss_sentence

SUMMARY_MAX_BYTES = 8192
FIGURES = ("steps_per_s", "samples_per_s", "step_time_ms_median", "data_wait_pct", "gpu_busy_pct", "mfu_pct")
DIFF_MAX_CHARS = 2500
HEADLINE_MAX_CHARS = 400


def _figures(report: Report, which: str) -> dict[str, Any] | None:
    run = report.baseline if which == "baseline" else after_of(report)
    if run is None:
        return None
    values = named_measurements(run)
    return {
        name: round(float(values[name]), 3) for name in FIGURES if isinstance(values.get(name), (int, float))
    }


def _fixes(report: Report, diff_chars: int) -> list[dict[str, Any]]:
    return [
        {
            "fix": o.fix,
            "status": o.status,
            "chosen": o.chosen[:400] if o.chosen else o.chosen,
            "gain": o.gain,
            "gain_low": o.gain_low,
            "unit": o.unit,
            "reason": o.reason[:400],
            "diff": o.diff[:diff_chars]
            + ("\n... (cut: the whole diff is in report.md)" if len(o.diff) > diff_chars else ""),
        }
        for o in fix_outcomes_of(report)
    ]


def summary(report: Report, folder: Path) -> dict[str, Any]:
    """The report's summary, at most SUMMARY_MAX_BYTES once written as JSON."""
    data: dict[str, Any] = {
        "report": str(folder / "report.html"),
        "report_json": str(folder / "report.json"),
        "kind": report.kind,
        "run_id": report.run_id,
        "headline": headline(report)[:HEADLINE_MAX_CHARS],  # a rule's title is in it, and a user's rule
        # may have any title
        "baseline": _figures(report, "baseline"),
        "after": _figures(report, "after"),
        "findings": [
            {"rule": f.rule, "severity": f.severity, "title": f.title[:200], "message": f.message[:400]}
            for f in report.findings
        ],
        "fixes": _fixes(report, DIFF_MAX_CHARS),
        "training": None,
        "truncated": False,
    }
    if isinstance(report, ProfileReport) and report.comparison is not None:
        data["training"] = loss_sentence(report.comparison.loss_check)
    return fitted(data, report)


def fitted(data: dict[str, Any], report: Report) -> dict[str, Any]:
    """`data` cut until it fits: shorter diffs, then shorter messages, then fewer findings."""
    for diff_chars, message_chars, findings in (
        (DIFF_MAX_CHARS, 400, 50),
        (800, 200, 20),
        (0, 120, 8),
        (0, 0, 3),
    ):
        if _size(data) <= SUMMARY_MAX_BYTES:
            return data
        data["truncated"] = True
        data["fixes"] = _fixes(report, diff_chars)
        for fix in data["fixes"]:
            fix["reason"] = fix["reason"][: max(message_chars, 80)]
        data["findings"] = [
            {**f, "message": f["message"][:message_chars]} for f in data["findings"][:findings]
        ]
    while _size(data) > SUMMARY_MAX_BYTES and (data["findings"] or data["fixes"]):
        (data["findings"] or data["fixes"]).pop()
    return data


def _size(data: dict[str, Any]) -> int:
    return len(json.dumps(data).encode())
