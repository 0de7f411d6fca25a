"""Recorded real runs replayed through the pure stages, in milliseconds and without a script:
the baseline's measurements -> the rules' findings -> the plan -> each fix's choice among its
measured trials -> the confirmation's loss check and verdict, each against what the run itself
decided. The recordings are the e2e tests' own commands (tests/data/replays, made by
scripts/record_replays.py with this version's code: the first H100 runs in ../shared were
decided by an earlier one), so the decisions the e2e tests reach are checked here too, and a
change to a pure stage that would decide otherwise on a real run fails here at once."""

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
from trainadvisor.profile.trials import tolerance
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


def test_there_are_recordings_of_each_kind_of_verdict() -> None:
    assert len(RECORDED) >= 8, "run scripts/record_replays.py"


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
    report = _recorded(name, tmp_path)
    values = dict(rulebook.diagnose(named_measurements(report.baseline), rulebook.rules_for([])).values)
    if "--max-workers" in report.command:
        values["worker_cap"] = int(report.command[report.command.index("--max-workers") + 1])
    values["memory_available_bytes"] = 1 << 40  # the machine's free memory is not recorded
    measured = [o for o in report.fix_outcomes if any(t.status == "measured" for t in o.trials)]
    for outcome in measured:
        if outcome.status in CHOSEN and fixes.REGISTRY[outcome.fix].goal != "memory":
            assert _choice(outcome, values) == (
                outcome.chosen or outcome.trials[0].label,
                outcome.settings,
            ), outcome.fix
        elif outcome.status == "no_gain" and not outcome.settings.runtime:
            assert outcome.settings == type(outcome.settings)()


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
