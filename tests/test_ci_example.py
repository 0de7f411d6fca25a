"""examples/ci/trainadvisor.yml: a valid workflow whose trainadvisor commands exist as written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import EXAMPLES, ROOT, run_cli

WORKFLOW = ROOT / "examples" / "ci" / "trainadvisor.yml"
SCRIPT = ROOT / "examples" / "ci" / "trainadvisor-ci.sh"
GITLAB = ROOT / "examples" / "ci" / "gitlab-ci.yml"


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


def test_every_trainadvisor_option_the_ci_script_uses_exists(tmp_path) -> None:  # type: ignore[no-untyped-def]
    text = SCRIPT.read_text()
    commands = re.findall(r'"\$\{ta\[@\]\}" (profile|compare|baseline save|baseline list)([^\n>|]*)', text)
    assert {c for c, _ in commands} == {"profile", "compare", "baseline save", "baseline list"}
    for command, rest in commands:
        help_text = run_cli(*command.split(), "--help", cwd=tmp_path).stdout
        for option in (word for word in rest.split() if word.startswith("--")):
            assert option in help_text, (command, option)
    gitlab = yaml.safe_load(GITLAB.read_text())
    assert "bash ci/trainadvisor-ci.sh main" in gitlab["trainadvisor-baseline"]["script"]
    assert any("trainadvisor-ci.sh pr" in line for line in gitlab["trainadvisor-merge-request"]["script"])


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


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.com", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_ci_script_gates_a_slower_commit_against_baseline_main(tmp_path: Path) -> None:
    """The recipe end to end without GitHub: a throwaway repository whose second commit makes
    each sample wait 2 ms longer. `main` on the first commit saves baseline:main; `pr` on the
    second profiles it, compares, writes comment.md and trainadvisor.sarif, and exits 1
    (regression_likely). Before any baseline, `pr` profiles BASE_SHA in a worktree instead."""
    repo = tmp_path / "project"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shutil.copy(EXAMPLES / "slow_input_mnist.py", repo / "train.py")
    (repo / ".gitignore").write_text("*-report/\nbase-checkout/\ncomment.md\ntrainadvisor.sarif\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "train")
    base_sha = _git(repo, "rev-parse", "HEAD")
    slower = (
        (repo / "train.py")
        .read_text()
        .replace('"--latency-ms", type=float, default=1.0', '"--latency-ms", type=float, default=3.0')
    )
    assert slower != (repo / "train.py").read_text()
    (repo / "train.py").write_text(slower)
    _git(repo, "commit", "-q", "-am", "slower input")
    env = {
        **os.environ,
        "TRAIN_SCRIPT": "train.py",
        "TRAIN_ARGS": "--samples 6400",
        "TRAINADVISOR": f"{sys.executable} -m trainadvisor",
        "TRAINADVISOR_BASELINES": str(tmp_path / "baselines"),
        "BASE_SHA": base_sha,
        "PYTHONPATH": str(ROOT),
    }
    first = subprocess.run(["bash", str(SCRIPT), "pr"], cwd=repo, env=env, capture_output=True, text=True)
    assert first.returncode == 1, first.stderr[-3000:]
    assert (repo / "base-report" / "report.json").is_file()  # no baseline yet: the base, profiled
    _git(repo, "worktree", "remove", "--force", "base-checkout")
    _git(repo, "checkout", "-q", base_sha)
    saved = subprocess.run(["bash", str(SCRIPT), "main"], cwd=repo, env=env, capture_output=True, text=True)
    assert saved.returncode == 0, saved.stderr[-3000:]
    _git(repo, "checkout", "-q", "main")
    second = subprocess.run(["bash", str(SCRIPT), "pr"], cwd=repo, env=env, capture_output=True, text=True)
    assert second.returncode == 1, second.stderr[-3000:]
    comment = (repo / "comment.md").read_text()
    assert comment.startswith("### ❌ trainadvisor compare: regression_likely")
    assert "comparable on 6 of 7 facts; differs: script:" in comment and "(one workload, train)" in comment
    log = json.loads((repo / "trainadvisor.sarif").read_text())
    assert log["version"] == "2.1.0" and str(repo) not in (repo / "trainadvisor.sarif").read_text()
