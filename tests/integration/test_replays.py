"""Recorded real runs replayed through the pure stages, in milliseconds and without a script:
the baseline's measurements -> the rules' findings -> the plan -> each fix's choice among its
measured trials -> the confirmation's loss check and verdict, each against what the run itself
decided. The recordings (tests/data/replays, made by scripts/record_replays.py with this
version's code: the first H100 runs in ../shared were decided by an earlier one) are mostly the
e2e tests' own commands, so the decisions the e2e tests reach are checked here too, and a change
to a pure stage that would decide otherwise on a real run fails here at once."""

from __future__ import annotations

import gzip
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA

from trainadvisor import fixes, rulebook
from trainadvisor.analyze.run.headline import headline_figures
from trainadvisor.analyze.run.summary import named_measurements
from trainadvisor.profile.judge import loss_check, verdict
from trainadvisor.profile.trials import decide, tolerance
from trainadvisor.records import FixOutcome, PlannedFix, ProfileReport
from trainadvisor.report.render import load_report
from trainadvisor.trackers.figures import figures

RECORDED = sorted((DATA / "replays").glob("*.json.gz"))
# statuses whose settings are the chosen trial's
CHOSEN = ("kept", "unconfirmed", "recommended", "opportunity")


def _recorded(name: str, tmp_path: Path) -> ProfileReport:
    folder = tmp_path / name
    folder.mkdir()
    packed = (DATA / "replays" / f"{name}.json.gz").read_bytes()
    (folder / "report.json").write_bytes(gzip.decompress(packed))
    report = load_report(folder)
    assert isinstance(report, ProfileReport)
    return report


NAMES = [p.name.removesuffix(".json.gz") for p in RECORDED]


def _only_fixes(command: list[str]) -> list[str]:
    return [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == "--fix"]


def _plan(report: ProfileReport, values: dict[str, Any], findings: list[Any]) -> list[PlannedFix]:
    """The plan as `profile` makes it: the rules' fixes, narrowed to those --fix names."""
    plan = fixes.plan(findings, values)
    only = _only_fixes(report.command)
    return [
        p
        if not only or p.fix in only or not p.applicable
        else PlannedFix(p.fix, p.rule, False, f"not measured in this run: --fix named only {', '.join(only)}")
        for p in plan
    ]


def test_the_recordings_hold_each_kind_of_decision(tmp_path: Path) -> None:
    """Every kind of outcome a fix's trials reach, and confirmations, so that each replay below
    checks something on some recording (run scripts/record_replays.py to record them again)."""
    reports = [_recorded(name, tmp_path) for name in NAMES]
    statuses = {o.status for report in reports for o in report.fix_outcomes}
    assert {"kept", "no_gain", "changed_training", "recommended", "not_applicable"} <= statuses
    assert sum(report.comparison is not None for report in reports) >= 4
    assert any(not report.fix_outcomes for report in reports)  # diagnosis only


@pytest.mark.parametrize("name", NAMES)
def test_a_recorded_run_replays_to_its_findings_and_plan(name: str, tmp_path: Path) -> None:
    report = _recorded(name, tmp_path)
    diagnosis = rulebook.diagnose(named_measurements(report.baseline), rulebook.rules_for([]))
    assert [(f.rule, f.severity, f.message) for f in diagnosis.findings] == [
        (f.rule, f.severity, f.message) for f in report.findings
    ]
    assert _plan(report, diagnosis.values, diagnosis.findings) == report.plan


def _choice(outcome: FixOutcome, values: dict[str, Any]) -> tuple[str, Any] | None:
    fix = fixes.REGISTRY[outcome.fix]
    chosen = fix.choose(outcome.trials, values)
    return None if chosen is None else (fix.describe(chosen, values), chosen.overrides)


@pytest.mark.parametrize("name", NAMES)
def test_each_fix_replays_to_the_setting_its_trials_chose(name: str, tmp_path: Path) -> None:
    """A fix with a setting chosen gets it again from its trials; a fix whose trials gained
    nothing has none chosen again, or the one chosen within the windows' spread; a fix whose
    trials were all refused or changed training is decided the same way, for the same reason."""
    report = _recorded(name, tmp_path)
    values = dict(rulebook.diagnose(named_measurements(report.baseline), rulebook.rules_for([])).values)
    if "--max-workers" in report.command:
        values["worker_cap"] = int(report.command[report.command.index("--max-workers") + 1])
    values["memory_available_bytes"] = 1 << 40  # the machine's free memory is not recorded
    for outcome in (o for o in report.fix_outcomes if o.trials):
        fix = fixes.REGISTRY[outcome.fix]
        if outcome.status in CHOSEN:
            recorded = (outcome.chosen or outcome.trials[0].label, outcome.settings)
            assert _choice(outcome, values) == recorded, outcome.fix
        elif outcome.status == "no_gain" and outcome.reason.startswith(
            fix.no_gain
        ):  # and its input's ceiling
            assert _choice(outcome, values) is None, outcome.fix
        elif outcome.status == "no_gain":  # chosen, but within the spread of the windows
            assert (_choice(outcome, values) or ("",))[0] == outcome.reason.split(" measured ")[0]
        elif not any(t.status == "measured" for t in outcome.trials):  # refused, failed, changed
            planned = next(p for p in report.plan if p.fix == outcome.fix)
            decided = decide(planned, outcome.trials, values, [report.baseline])
            assert (decided.status, decided.reason) == (outcome.status, outcome.reason)


@pytest.mark.parametrize("name", NAMES)
def test_the_confirmation_replays_to_its_loss_check_and_verdict(name: str, tmp_path: Path) -> None:
    report = _recorded(name, tmp_path)
    comparison, after = report.comparison, report.after
    if comparison is None or after is None:
        assert not report.applied_fixes and report.speedup is None
        return
    confirmed = [fixes.REGISTRY[fix.split(":")[0]] for fix in comparison.contains]
    tolerance_rel = max(tolerance(fix, report.loss_noise_rel) for fix in confirmed)
    assert loss_check(report.baseline.raw, after.raw, tolerance_rel) == comparison.loss_check
    status, reason = verdict(comparison)
    contained = {fix.split(":")[0] for fix in comparison.contains}
    statuses = {o.status for o in report.fix_outcomes if o.fix in contained}
    if status == "kept":  # kept, or inconclusive where the machine's speed changed between runs
        assert statuses <= {"kept", "inconclusive", "unconfirmed"}
        kept = [o for o in report.fix_outcomes if o.fix in contained and o.status == "kept"]
        assert all(o.reason.startswith(reason) for o in kept), reason  # the verdict's own words
        assert report.applied_fixes == [o.fix for o in report.fix_outcomes if o.status == "kept"]
        assert (report.speedup is None) == (not report.applied_fixes)
    else:
        assert not report.applied_fixes and report.speedup is None
        assert statuses <= {status, "unconfirmed"}, (statuses, shlex.quote(reason))


@pytest.mark.parametrize("name", NAMES)
def test_the_trackers_get_the_recorded_runs_own_figures(name: str, tmp_path: Path) -> None:
    """What a tracker logs for a recorded run (`trackers.figures`): its measured figures by their
    stable names, the speedup only where a fix was kept, each fix's gain where it had one."""
    report = _recorded(name, tmp_path)
    logged = figures(report)
    base = report.baseline
    assert logged["trainadvisor/steps_per_s"] == base.steps_per_s
    assert logged["trainadvisor/step_time_ms"] == base.step_time_ms.median
    assert logged["trainadvisor/findings"] == len(report.findings)
    assert logged.get("trainadvisor/speedup") == report.speedup
    gains = {k.split("/")[2]: v for k, v in logged.items() if k.startswith("trainadvisor/fix/")}
    assert gains == {o.fix: o.gain for o in report.fix_outcomes if o.gain is not None}
    after = {k.removeprefix("trainadvisor/after/"): v for k, v in logged.items() if "/after/" in k}
    assert after == (headline_figures(report.after) if report.after is not None else {})
