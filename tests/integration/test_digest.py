"""The agent's digest of a report (`agents.digest`): `summary` of the saved reports (tests/data/report, a
profile; tests/data/report-v1-analyze, an analysis), field by field against what the reports hold, and
`fitted`: what is cut, in which order, to bring a digest under SUMMARY_MAX_BYTES of JSON."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from conftest import DATA

from trainadvisor.agents.digest import DIFF_MAX_CHARS, SUMMARY_MAX_BYTES, fitted, summary
from trainadvisor.records import ProfileReport
from trainadvisor.report.render import headline, load_report

FOLDER = Path("/runs/out")
CUT = "\n... (cut: the whole diff is in report.md)"


def _profile() -> ProfileReport:
    report = load_report(DATA / "report")
    assert isinstance(report, ProfileReport)
    return report


def _size(data: dict[str, Any]) -> int:
    return len(json.dumps(data).encode())


def _with_findings(report: ProfileReport, count: int, title: str, message: str) -> ProfileReport:
    """The report with `count` copies of its one finding, worded as given and titled so but the
    first (the headline names the first's title, and a headline is never cut); the rule names
    them apart: rule-0, rule-1, ..."""
    template = report.findings[0]
    report.findings = []
    for i in range(count):
        finding = copy.deepcopy(template)
        finding.rule, finding.message = f"rule-{i}", message
        finding.title = title if i else template.title
        report.findings.append(finding)
    return report


def test_the_summary_of_a_saved_profile_holds_its_figures_findings_and_fix() -> None:
    report = _profile()
    data = summary(report, FOLDER)
    assert data["report"] == "/runs/out/report.html"
    assert data["report_json"] == "/runs/out/report.json"
    assert (data["kind"], data["run_id"]) == ("profile", None)
    assert data["headline"] == headline(report)
    assert data["headline"].startswith("6.70x faster in steps/s (range 5.96-7.41x across windows) after")
    # the recorded baseline's figures, rounded to 3 places; a CPU run has no gpu_busy_pct
    assert data["baseline"] == {
        "steps_per_s": 20.8,
        "samples_per_s": 1331.219,
        "step_time_ms_median": 46.898,
        "data_wait_pct": 86.605,
        "mfu_pct": 1.66,
    }
    assert report.after is not None
    assert data["after"]["steps_per_s"] == round(report.after.steps_per_s or 0.0, 3) == 139.266
    assert "gpu_busy_pct" not in data["after"]
    assert data["findings"] == [
        {
            "rule": "data-stall",
            "severity": "high",
            "title": "The training loop waits on the input pipeline",
            "message": report.findings[0].message,
        }
    ]
    outcome = report.fix_outcomes[0]
    assert data["fixes"] == [
        {
            "fix": "dataloader-workers",
            "status": "kept",
            "chosen": "num_workers=8, persistent_workers=True",
            "gain": outcome.gain,
            "gain_low": outcome.gain_low,
            "unit": "steps/s",
            "reason": "measured 6.70x steps/s (range 5.96-7.41x)",
            "diff": outcome.diff,  # shorter than DIFF_MAX_CHARS: whole
        }
    ]
    assert "+        num_workers=8,\n" in data["fixes"][0]["diff"]
    assert data["training"] == "training unchanged: the loss of 65 seeded steps is identical"
    assert data["truncated"] is False
    assert _size(data) <= SUMMARY_MAX_BYTES


def test_the_summary_of_an_analysis_has_no_after_run_no_fixes_and_no_training_sentence() -> None:
    data = summary(load_report(DATA / "report-v1-analyze"), FOLDER)
    assert data["kind"] == "analyze"
    assert data["headline"] == "The training loop waits on the input pipeline (high)"
    assert data["baseline"] == {"steps_per_s": 290.251, "step_time_ms_median": 3.568, "data_wait_pct": 4.209}
    assert data["after"] is None
    assert data["fixes"] == []
    assert data["training"] is None
    assert [f["rule"] for f in data["findings"]] == ["data-stall"]
    assert data["findings"][0]["message"].startswith("host_tensors_cpu.pt.trace.json.gz: The loop waited")
    assert data["truncated"] is False


def test_a_long_diff_is_cut_with_a_pointer_to_report_md_even_when_the_summary_fits() -> None:
    report = _profile()
    report.fix_outcomes[0].diff = "+" * 6000
    data = summary(report, FOLDER)
    assert data["fixes"][0]["diff"] == "+" * DIFF_MAX_CHARS + CUT
    assert data["truncated"] is False  # cut to its own bound, not to fit


def test_a_summary_that_fits_goes_through_fitted_unchanged() -> None:
    report = _profile()
    data = summary(report, FOLDER)
    before = copy.deepcopy(data)
    assert fitted(data, report) == before


def test_long_findings_are_cut_to_eight_of_120_characters_with_the_diff_reduced_to_its_pointer() -> None:
    """Titles of 200 characters (as far as a title goes): 20 findings (the second step) are still
    over the bound, 8 with messages of 120 characters (the third) fit."""
    report = _with_findings(_profile(), 60, "T" * 300, "m" * 1000)
    report.fix_outcomes[0].diff = "d" * 3000
    report.fix_outcomes[0].reason = "r" * 1000
    data = summary(report, FOLDER)
    assert data["truncated"] is True
    assert [f["rule"] for f in data["findings"]] == [f"rule-{i}" for i in range(8)]
    assert {f["message"] for f in data["findings"]} == {"m" * 120}
    assert {f["title"] for f in data["findings"][1:]} == {"T" * 200}
    assert data["fixes"][0]["diff"] == CUT  # no diff left, only where it is
    assert data["fixes"][0]["reason"] == "r" * 120
    assert data["baseline"]["steps_per_s"] == 20.8  # the figures are never cut
    assert _size(data) <= SUMMARY_MAX_BYTES


def _with_fixes(report: ProfileReport, count: int, chosen: str, reason: str) -> ProfileReport:
    """The report with `count` copies of its one fix outcome, named fix-0, fix-1, ..."""
    template = report.fix_outcomes[0]
    report.fix_outcomes = []
    for i in range(count):
        outcome = copy.deepcopy(template)
        outcome.fix, outcome.chosen, outcome.reason = f"fix-{i}", chosen, reason
        report.fix_outcomes.append(outcome)
    return report


def test_the_last_step_keeps_three_findings_without_messages_and_reasons_of_80_characters() -> None:
    """Eight fixes whose chosen settings take 400 characters each and ten findings: 8 findings
    and reasons of 120 characters (the third step) are over the bound; 3 findings without their
    messages and reasons of 80 fit, every fix kept."""
    report = _with_fixes(_with_findings(_profile(), 10, "T" * 200, "m" * 500), 8, "c" * 400, "r" * 1000)
    data = summary(report, FOLDER)
    assert data["truncated"] is True
    assert [f["rule"] for f in data["findings"]] == ["rule-0", "rule-1", "rule-2"]
    assert {f["message"] for f in data["findings"]} == {""}
    assert [f["reason"] for f in data["fixes"]] == ["r" * 80] * 8
    assert _size(data) <= SUMMARY_MAX_BYTES


def test_findings_then_fixes_that_still_do_not_fit_are_dropped_from_the_last_one_by_one() -> None:
    """Fourteen fixes of 400-character settings are over the bound even at the last step: the
    findings go first, then the last fixes, one at a time: one more would not fit."""
    report = _with_fixes(_with_findings(_profile(), 5, "T" * 200, "m"), 14, "c" * 400, "r" * 1000)
    data = summary(report, FOLDER)
    kept = len(data["fixes"])
    assert data["truncated"] is True and data["findings"] == [] and 0 < kept < 14
    assert [f["fix"] for f in data["fixes"]] == [f"fix-{i}" for i in range(kept)]
    assert _size(data) <= SUMMARY_MAX_BYTES
    one_more = {**data, "fixes": [*data["fixes"], {**data["fixes"][-1], "fix": f"fix-{kept}"}]}
    assert _size(one_more) > SUMMARY_MAX_BYTES


def test_a_fixs_chosen_setting_and_a_rules_title_are_cut_so_that_the_summary_fits() -> None:
    """A user's rule may have any title, and the headline names the top finding's: a title of
    9000 characters is cut to 200 in the findings and the headline to 400; a fix's `chosen` of
    9000 to 400. The summary then fits with the finding and the fix kept."""
    report = _profile()
    report.fix_outcomes[0].chosen = "c" * 9000
    report.findings[0].title = "T" * 9000
    data = summary(report, FOLDER)
    assert len(data["headline"]) == 400 and data["headline"] == headline(report)[:400]
    assert [len(f["title"]) for f in data["findings"]] == [200] * len(report.findings)
    assert [f["chosen"] for f in data["fixes"]] == ["c" * 400]
    assert _size(data) <= SUMMARY_MAX_BYTES
