"""examples/ci/trainadvisor.yml: a valid workflow whose trainadvisor commands exist as written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, ROOT, run_cli

SCRIPT = ROOT / "examples" / "ci" / "trainadvisor-ci.sh"


GITLAB = ROOT / "examples" / "ci" / "gitlab-ci.yml"


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
        "TRAIN_ARGS": "--samples 6400 --batch-size 16",  # steps of 20-50 ms: 4 profiles run
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
