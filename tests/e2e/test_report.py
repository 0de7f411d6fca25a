"""Rendering a saved report: golden files, escaping, self-containment, re-rendering."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from trainadvisor import rulebook
from trainadvisor.resources import rules_dir

sys.path.insert(0, str(ROOT / "scripts"))


def test_installed_wheel_ships_rules_and_templates(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
    )
    [wheel] = wheels.glob("trainadvisor-*.whl")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
    )
    probe = (
        "import trainadvisor.resources as r, trainadvisor.rulebook as e;"
        "print(r.rules_dir()); print(r.templates_dir());"
        "print([x.id for x in e.load_rules([r.rules_dir()])])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [
        str(site / "trainadvisor" / "rules"),
        str(site / "trainadvisor" / "templates"),
        str([rule.id for rule in rulebook.load_rules([rules_dir()])]),
    ]
    assert (site / "trainadvisor" / "templates" / "report.html.j2").is_file()
