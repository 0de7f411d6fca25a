"""Hostile report folders (issue 28): links planted in a folder are never written or deleted
through, an earlier report stays whole until a new one replaces it, every writer respects the
folder's lock, and a report.json with keys this version does not know still renders."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import DATA, SCRIPTS
from support.hostile_folders import _earlier_report, _files, _victim

from trainadvisor.advising.advisor import Advisor
from trainadvisor.cli import main
from trainadvisor.report import render
from trainadvisor.report.folder import hold_out_dir
from trainadvisor.resources import templates_dir


def _cli(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.mark.parametrize("name", [".lock", ".work"])
def test_a_lock_or_work_folder_planted_as_a_link_is_refused_and_its_target_untouched(
    tmp_path: Path, name: str
) -> None:
    out = tmp_path / "r"
    out.mkdir()
    victim, before = _victim(tmp_path)
    (out / name).symlink_to(victim / "notes.txt" if name == ".lock" else victim)
    code, output = _cli("profile", "--out", out, SCRIPTS / "no_steps.py")  # refused before it runs
    assert code == 2
    assert output.strip().splitlines() == [
        f"trainadvisor: error: --out {out}: {out / name} is a symbolic link; trainadvisor writes "
        "nothing through a link in a report folder: remove the link or choose another --out"
    ]
    assert _files(victim) == before
    assert (out / name).is_symlink()  # left as it was, for its owner to look at


def test_a_temporary_name_planted_in_the_folder_is_neither_written_through_nor_removed(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r"
    shutil.copytree(DATA / "report", out)
    victim, before = _victim(tmp_path)
    (out / ".report.md.tmp").symlink_to(victim / "notes.txt")  # the name a writer once used
    (out / ".report.json.tmp").write_text("another writer's")
    code, output = _cli("report", out)
    assert code == 0, output
    assert _files(victim) == before
    assert (out / ".report.md.tmp").is_symlink()
    assert (out / ".report.json.tmp").read_text() == "another writer's"
    assert not (out / "report.md").is_symlink() and (out / "report.md").read_text().startswith("#")
    assert sorted(p.name for p in out.iterdir()) == [
        ".report.json.tmp", ".report.md.tmp", "SOURCE.md", "report.html", "report.json", "report.md",
    ]  # fmt: skip


def test_a_report_that_cannot_be_rendered_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "r"
    before = _earlier_report(out)

    def broken(*_: object) -> str:
        raise RuntimeError("a template broke")

    monkeypatch.setattr(render, "render_html", broken)
    with hold_out_dir(out) as folder:
        staged = folder.stage / "traces" / "baseline" / "trainadvisor.pt.trace.json.gz"
        staged.parent.mkdir(parents=True)
        staged.write_text("the new run's trace")
        with pytest.raises(RuntimeError, match="a template broke"):
            render.write_report(render.load_report(out), out, templates_dir(), folder.publish)
    assert _files(out) == before


def _busy(where: str) -> str:
    option = where.split()[0] if where.startswith(("--out", "advise")) else "--out"
    return (
        f"{where}: another trainadvisor run is writing this report (process {os.getpid()}); "
        f"wait for it to end or choose another {option}"
    )


def test_report_into_a_folder_another_run_is_writing_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r"
    shutil.copytree(DATA / "report", out)
    other = tmp_path / "other"
    with hold_out_dir(out):
        code, output = _cli("report", out)
        assert code == 2
        assert output.strip().splitlines() == [f"trainadvisor: error: {_busy(str(out))}"]
        assert sorted(p.name for p in out.iterdir()) == [".lock", "SOURCE.md", "report.json"]
        with hold_out_dir(other):
            code, output = _cli("report", "--out", other, out)
        assert code == 2
        assert output.strip().splitlines() == [f"trainadvisor: error: {_busy(f'--out {other}')}"]
    assert sorted(p.name for p in out.iterdir()) == ["SOURCE.md", "report.json"]


def test_analyze_into_a_folder_another_run_is_writing_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with hold_out_dir(out):
        code, output = _cli("analyze", "--out", out, DATA / "traces" / "profiler_steps.json.gz")
        assert code == 2
        assert output.strip().splitlines() == [f"trainadvisor: error: {_busy(f'--out {out}')}"]
        assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_advise_into_a_folder_another_run_is_writing_stands_down_and_training_goes_on(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r"
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    with hold_out_dir(out):
        advisor = Advisor(warmup=2, steps=3, out=out, min_time=0.0, max_warmup=None, echo=lambda _: None)
        advised = advisor(step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = [advised(torch.ones(2, 4)).item() for _ in range(20)]
        assert len(losses) == 20
        assert [str(w.message) for w in caught] == [
            f"trainadvisor: the advisor stopped (UsageError: {_busy(f'advise(out=...) {out}')}); "
            "training goes on unchanged. Set TRAINADVISOR_DEBUG=1 to see where."
        ]
        assert advisor.report is None and not advisor.active
        assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_a_report_with_a_breakdown_part_this_version_does_not_know_renders(tmp_path: Path) -> None:
    out = tmp_path / "r"
    shutil.copytree(DATA / "report", out)
    saved = json.loads((out / "report.json").read_text())
    saved["baseline"]["breakdown_pct"]["tensor_parallel_wait"] = 3.0
    saved["baseline"]["breakdown_ms_per_step"]["tensor_parallel_wait"] = 0.5
    saved["a_key_of_a_newer_version"] = {"x": 1}
    (out / "report.json").write_text(json.dumps(saved))
    code, output = _cli("report", out)
    assert code == 0, output
    assert "| tensor parallel wait | 3% | n/a% | " in (out / "report.md").read_text().splitlines()
    assert "tensor parallel wait: 0.5 ms (3%)" in (out / "report.html").read_text()
