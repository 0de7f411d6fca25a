"""What e2e/test_formats.py and integration/test_formats.py share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
from conftest import DATA, EXAMPLES

from trainadvisor.report.render import load_report

SAVED = DATA / "report"  # a real profile report; its DataLoader line is slow_input_mnist.py:56
SITE = "/work/main/examples/slow_input_mnist.py:56"  # as that run recorded it


def _repository(tmp_path: Path, lines_above: int = 0) -> Path:
    """A repository (its .git) holding the example the saved report measured, with
    `lines_above` blank lines added at its top."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "examples").mkdir()
    text = (EXAMPLES / "slow_input_mnist.py").read_text()
    (repo / "examples" / "slow_input_mnist.py").write_text("\n" * lines_above + text)
    return repo


def _report_in(repo: Path, line: int = 56) -> Any:
    """The saved report, as if its run had been in `repo`."""
    report = load_report(SAVED)
    for finding in report.findings:
        for evidence in finding.evidence:
            if evidence.value == SITE:
                evidence.value = f"{repo}/examples/slow_input_mnist.py:{line}"
    return report


SARIF_SCHEMA = json.loads((DATA / "sarif" / "sarif-schema-2.1.0.json").read_text())


def _sarif_problems(log: dict[str, Any]) -> list[str]:
    return [e.message for e in jsonschema.Draft7Validator(SARIF_SCHEMA).iter_errors(log)]
