"""Rendering a saved report: golden files, escaping, self-containment, re-rendering."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from conftest import DATA, ROOT

from trainadvisor.records.upgrade import from_v1
from trainadvisor.report.render import load_report, render_html, report_json, write_report
from trainadvisor.resources import templates_dir

sys.path.insert(0, str(ROOT / "scripts"))


import regen_golden  # noqa: E402


def test_renderings_match_the_golden_files() -> None:
    for name, text in regen_golden.renderings().items():
        golden = (ROOT / "tests" / "golden" / name).read_text()
        assert golden == regen_golden.HEADER + text, (
            f"{name} changed: run scripts/regen_golden.py if intended"
        )


def test_terminal_summary_fits_in_80_columns() -> None:
    """One finding and one fix fit a 24-line terminal: how the run was measured (warm-up, the
    bracket) is left to the report files; the caveats stay."""
    summary = (ROOT / "tests" / "golden" / "summary.txt").read_text().splitlines()[1:]
    assert 5 <= len(summary) <= 20
    assert max(len(line) for line in summary) <= 80
    assert not any("Warm-up:" in line for line in summary)


def test_report_json_round_trips() -> None:
    """The saved report is of version 1: read, it is written back as its upgrade
    (tests/integration/test_schema.py has the rest)."""
    original = json.loads((DATA / "report" / "report.json").read_text())
    assert json.loads(report_json(load_report(DATA / "report"))) == from_v1(original)


def test_saved_report_re_renders_without_rerunning(tmp_path: Path) -> None:
    write_report(load_report(DATA / "report"), tmp_path, templates_dir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json", "report.md"]


def test_user_supplied_text_is_escaped() -> None:
    report = load_report(DATA / "report")
    evil = '<img src=x onerror="alert(1)">'
    report.script = evil
    report.command = ["trainadvisor", "profile", evil]
    report.findings[0].message = f"message {evil}"
    report.findings[0].evidence[-1].value = evil
    report.baseline.raw.loaders[0].created_at = evil
    html = render_html(report, templates_dir())
    assert evil not in html
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in html


def test_html_is_self_contained() -> None:
    html = render_html(load_report(DATA / "report"), templates_dir())
    assert not re.search(r"<(script|link|img|iframe)\b", html)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "url(" not in html and "@import" not in html
    assert html.count("<svg") == 7  # breakdown, two timelines, two CPU and two memory plots


def test_the_loss_sentence_states_the_tolerance_it_was_held_to() -> None:
    from trainadvisor.records import LossCheck
    from trainadvisor.report.render import loss_sentence

    amp = LossCheck(25, 0.031, 0.0129, 0.05, True, same_batches=True)
    assert loss_sentence(amp) == (
        "training unchanged: the loss of 25 seeded steps differs by at most 0.031 (1.3%, tolerance 5%)"
    )
    bigger_batch = LossCheck(25, 0.4, 0.2, 0.1, False, same_batches=False, mean_rel_diff=0.12)
    assert loss_sentence(bigger_batch) == (
        "training CHANGED: the mean loss of 25 seeded steps differs by 12% (tolerance 10%; the "
        "batches differ between runs)"
    )
