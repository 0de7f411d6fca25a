"""examples/ci/trainadvisor.yml: a valid workflow whose trainadvisor commands exist as written."""

from __future__ import annotations

from types import SimpleNamespace

import yaml
from conftest import ROOT

WORKFLOW = ROOT / "examples" / "ci" / "trainadvisor.yml"


def test_the_workflow_saves_main_and_compares_each_pull_request_with_it() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert set(workflow[True]) == {"pull_request", "push"}  # `on:` reads as True in YAML 1.1
    baseline, job = workflow["jobs"]["baseline"], workflow["jobs"]["profile"]
    assert "gpu" in job["runs-on"] and "gpu" in baseline["runs-on"]
    assert 'bash "$TRAINADVISOR_CI" main' in "\n".join(s.get("run", "") for s in baseline["steps"])
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    uses = [step.get("uses", "") for step in job["steps"]]
    assert 'bash "$TRAINADVISOR_CI" pr' in runs and "gh pr comment" in runs
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    assert any(u.startswith("github/codeql-action/upload-sarif@") for u in uses)


def test_the_workflow_can_run_the_gpu_check_on_its_runner() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    [step] = [s for s in workflow["jobs"]["profile"]["steps"] if "gpu_check.sh" in s.get("run", "")]
    assert "TRAINADVISOR_GPU_CHECK" in step["if"] and (ROOT / "scripts" / "gpu_check.sh").is_file()


def _ns(**fields: object) -> SimpleNamespace:
    return SimpleNamespace(**{k: _ns(**v) if isinstance(v, dict) else v for k, v in fields.items()})


def _job_runs(condition: str, action: str, head_repo: str, label: str | None = None) -> bool:
    """The job's `if:` evaluated for one pull_request event (the expression uses only ==, !=,
    && and ||, which read the same in Python once spelled `and`/`or`)."""
    github = _ns(
        repository="owner/project",
        event_name="pull_request",
        event={
            "action": action,
            "label": {"name": label},
            "pull_request": {"head": {"repo": {"full_name": head_repo}}},
        },
    )
    python = condition.replace("&&", " and ").replace("||", " or ").replace("\n", " ")
    return bool(eval(python, {"__builtins__": {}}, {"github": github}))  # noqa: S307 - our own file


def test_a_forks_pull_request_runs_on_the_gpu_runner_only_when_a_maintainer_labels_it() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert set(workflow[True]) == {"pull_request", "push"}  # never pull_request_target
    assert workflow["permissions"] == {
        "contents": "read",
        "pull-requests": "write",
        "security-events": "write",
    }
    job = workflow["jobs"]["profile"]
    cases = [
        ("opened", "owner/project", None, True),
        ("synchronize", "owner/project", None, True),
        ("opened", "stranger/project", None, False),
        ("synchronize", "stranger/project", None, False),  # a push after the label: not again
        ("labeled", "stranger/project", "run-trainadvisor", True),
        ("labeled", "stranger/project", "bug", False),
        ("labeled", "owner/project", "bug", False),  # no second run for any other label
    ]
    for action, head, label, expected in cases:
        assert _job_runs(job["if"], action, head, label) is expected, (action, head, label)
    [checkout] = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"]["persist-credentials"] is False
    [comment] = [s for s in job["steps"] if "gh pr comment" in s.get("run", "")]
    assert _job_runs(comment["if"], "labeled", "stranger/project", "run-trainadvisor") is False
    assert "pull_request_target" in (ROOT / "examples" / "ci" / "README.md").read_text()
