"""examples/ci/trainadvisor.yml: a valid workflow whose trainadvisor commands exist as written."""

from __future__ import annotations

import re
import shlex

import yaml
from conftest import ROOT, run_cli

WORKFLOW = ROOT / "examples" / "ci" / "trainadvisor.yml"


def test_the_workflow_profiles_base_and_head_compares_uploads_and_comments() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job = workflow["jobs"]["profile"]
    assert "gpu" in job["runs-on"] and True in workflow  # `on:` reads as True in YAML 1.1
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    uses = [step.get("uses", "") for step in job["steps"]]
    assert "--out ../base-report" in runs and "--out head-report" in runs
    assert "trainadvisor compare --max-regression" in runs and "gh pr comment" in runs
    assert any(u.startswith("actions/upload-artifact@") for u in uses)


def test_every_trainadvisor_option_in_the_workflow_exists(tmp_path) -> None:  # type: ignore[no-untyped-def]
    commands = re.findall(r"trainadvisor (profile|compare) ([^\n>]*)", WORKFLOW.read_text())
    assert {c for c, _ in commands} == {"profile", "compare"}
    for command, rest in commands:
        help_text = run_cli(command, "--help", cwd=tmp_path).stdout
        for option in (word for word in shlex.split(rest.replace("$", "")) if word.startswith("--")):
            assert option in help_text, (command, option)


def test_the_workflow_can_run_the_gpu_check_on_its_runner() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    [step] = [s for s in workflow["jobs"]["profile"]["steps"] if "gpu_check.sh" in s.get("run", "")]
    assert "TRAINADVISOR_GPU_CHECK" in step["if"] and (ROOT / "scripts" / "gpu_check.sh").is_file()
