"""`--format terminal|markdown|json|sarif` on profile, analyze and report; SARIF 2.1.0 checked
against the official schema (tests/data/sarif/SOURCE.md); paths relative to the repository root
in every format and every file of a published report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import EXAMPLES, ROOT, run_cli
from support.formats import _sarif_problems


def test_profile_sarif_on_a_real_run_puts_each_sync_on_its_line(tmp_path: Path) -> None:
    """A real run in a repository (a CPU's .item() waits for nothing, so a rule of the same id that
    holds on any step makes host-sync fire): stdout holds the SARIF log alone, though the script
    prints every epoch; the report folder names no path of this machine."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    shutil.copy(EXAMPLES / "host_tensors.py", repo / "train.py")
    rules = repo / "rules"
    rules.mkdir()
    shipped = (ROOT / "rules" / "host-sync.toml").read_text()
    (rules / "host-sync.toml").write_text(
        shipped.replace("cuda_used and syncs_per_step >= 1", "sync_pct >= 0")
    )
    result = run_cli(
        "profile", "--no-fix", "--format", "sarif", "--rules", rules, "--warmup", "3", "--steps", "6",
        "--out", "report", "train.py", "--epochs", "100", cwd=repo,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    log = json.loads(result.stdout)
    assert _sarif_problems(log) == []
    lines = {
        (r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
         r["locations"][0]["physicalLocation"]["region"]["startLine"])
        for r in log["runs"][0]["results"]
    }  # fmt: skip
    assert ("host-sync", "train.py", 61) in lines
    for name in ("report.json", "report.md", "report.html"):
        assert str(repo) not in (repo / "report" / name).read_text(), name
