"""`trainadvisor baseline save|list|delete` in-process through click's CliRunner on a store in a
temporary folder, and `load_named` (what `compare --against baseline:NAME` reads): what each
command writes and prints, and the one-line errors with exit code 2 for a bad or unknown name."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from support.runs import raw

from trainadvisor.analyze.run.summary import summarize
from trainadvisor.cli.baseline_commands import baseline, load_named
from trainadvisor.errors import UsageError
from trainadvisor.records import SCHEMA_VERSION, ProfileReport
from trainadvisor.report.render import load_report, report_json


def _invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(baseline, [str(a) for a in args])


def _report(folder: Path, script: str, workload: str, step_ms: float) -> Path:
    """A report folder of a run of `script` whose 8 steps took `step_ms` each."""
    run = summarize(raw([step_ms] * 8))
    command = ["trainadvisor", "profile", script]
    report = ProfileReport(SCHEMA_VERSION, command, script, None, run, [], workload=workload)
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(report_json(report))
    return folder


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository (its .git) that is the working directory: saved reports name its files
    relative to it, as published reports do."""
    root = tmp_path.resolve() / "repo"
    (root / ".git").mkdir(parents=True)
    monkeypatch.chdir(root)
    return root


def test_save_writes_the_published_report_under_its_name_and_says_where(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    report = _report(tmp_path / "r", f"{repo}/train.py", "mnist", 10.0)
    result = _invoke("save", "--store", store, "main", report)
    where = store / "main" / "report.json"
    assert (result.exit_code, result.stdout, result.stderr) == (
        0, f"trainadvisor: saved {report} as baseline:main ({where})\n", ""
    )  # fmt: skip
    saved = load_report(where.parent)
    assert saved.script == "train.py" and saved.command == ["trainadvisor", "profile", "train.py"]
    assert saved.workload == "mnist" and saved.baseline is not None and saved.baseline.steps_per_s == 100.0


def test_save_takes_the_report_json_itself_and_replaces_a_baseline_of_the_same_name(
    repo: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    old = _report(tmp_path / "old", "a.py", "old", 10.0)
    new = _report(tmp_path / "new", "a.py", "new", 4.0)
    assert _invoke("save", "--store", store, "main", old).exit_code == 0
    assert _invoke("save", "--store", store, "main", new / "report.json").exit_code == 0
    report = load_named("baseline:main", str(store))
    assert report.workload == "new" and report.baseline is not None and report.baseline.steps_per_s == 250.0
    assert [p.name for p in store.iterdir()] == ["main"]


def test_list_gives_each_baseline_by_name_with_its_size_in_kib_and_skips_folders_that_are_no_name(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    for name, size in (("release-2.1", 10 * 1024), ("main", 3 * 1024), ("-scratch", 1024), ("tiny", 300)):
        (store / name).mkdir(parents=True)
        (store / name / "report.json").write_bytes(b"x" * size)
    (store / "empty").mkdir()  # no report.json: not a baseline
    result = _invoke("list", "--store", store)
    listed = "baseline:main\t3 KiB\nbaseline:release-2.1\t10 KiB\nbaseline:tiny\t300 B\n"  # not "0 KiB"
    assert (result.exit_code, result.stdout) == (0, listed)


def test_list_of_an_empty_store_says_so(tmp_path: Path) -> None:
    result = _invoke("list", "--store", tmp_path / "nothing-here")
    assert (result.exit_code, result.stdout) == (
        0,
        f"trainadvisor: no baselines in {tmp_path / 'nothing-here'}\n",
    )


def test_delete_removes_the_baseline_and_its_folder(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert (
        _invoke("save", "--store", store, "main", _report(tmp_path / "r", "a.py", "m", 10.0)).exit_code == 0
    )
    result = _invoke("delete", "--store", store, "main")
    assert (result.exit_code, result.stdout) == (0, "trainadvisor: deleted baseline:main\n")
    assert list(store.iterdir()) == []
    assert _invoke("list", "--store", store).stdout == f"trainadvisor: no baselines in {store}\n"


def test_deleting_an_unknown_baseline_is_a_usage_error_of_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = _invoke("delete", "--store", store, "release")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"trainadvisor: error: no baseline 'release' in {store}\n"


def test_a_name_that_is_no_baseline_name_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = _invoke("save", "--store", store, "../up", _report(tmp_path / "r", "a.py", "m", 10.0))
    assert result.exit_code == 2
    assert result.stderr == (
        "trainadvisor: error: '../up' is not a baseline name: letters, digits, '.', '_' and '-', starting "
        "with a letter or digit, at most 100 (main, release-2.1)\n"
    )
    assert not store.exists() and not (tmp_path / "up").exists()


def test_saving_a_folder_without_a_report_is_a_usage_error(tmp_path: Path) -> None:
    result = _invoke("save", "--store", tmp_path / "store", "main", tmp_path)
    assert result.exit_code == 2
    assert result.stderr == (
        f"trainadvisor: error: {tmp_path}: no report.json here; give a report folder written by "
        "trainadvisor\n"
    )
    assert not (tmp_path / "store").exists()


def test_load_named_reads_the_store_trainadvisor_baselines_names_when_none_is_given(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "from-env"
    monkeypatch.setenv("TRAINADVISOR_BASELINES", str(store))
    assert _invoke("save", "main", _report(tmp_path / "r", "b.py", "resnet", 20.0)).exit_code == 0
    assert (store / "main" / "report.json").is_file()
    report = load_named("baseline:main")
    assert isinstance(report, ProfileReport) and report.workload == "resnet" and report.script == "b.py"
    assert report.baseline is not None and report.baseline.steps_per_s == 50.0


def test_load_named_of_an_unknown_name_names_the_baselines_saved(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert (
        _invoke("save", "--store", store, "main", _report(tmp_path / "r", "a.py", "m", 10.0)).exit_code == 0
    )
    with pytest.raises(UsageError) as raised:
        load_named("baseline:release", str(store))
    assert str(raised.value) == (
        f"no baseline 'release' in {store} (saved: main); save one with "
        "`trainadvisor baseline save release REPORT`"
    )
    with pytest.raises(UsageError) as raised:
        load_named("baseline:nothing", str(tmp_path / "empty"))
    assert "(saved: none yet)" in str(raised.value)


def test_load_named_refuses_a_spec_without_the_baseline_prefix(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        load_named("main", str(tmp_path))
    assert str(raised.value) == (
        "--against 'main': give baseline:NAME (a name saved with `trainadvisor baseline save`)"
    )
