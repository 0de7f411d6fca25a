"""report.json's version 2: one header and two results (`profile`, `analyze`), the upgrade of
version 1 (reports saved by earlier versions render and compare), and the run's content id."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DATA, gpu_run

from trainadvisor import __version__
from trainadvisor.cli import main
from trainadvisor.records import SCHEMA_VERSION, AnalyzeReport, DeviceInfo, ProfileReport, schema
from trainadvisor.records.identity import file_digest, run_id
from trainadvisor.records.upgrade import ANALYZE_ONLY, PROFILE_ONLY, UnreadableVersion, from_v1, upgraded
from trainadvisor.report.render import load_report, render_html, render_markdown, report_json, write_report
from trainadvisor.resources import templates_dir

V1_PROFILE = DATA / "report"  # saved by version 1 (its SOURCE.md)
V1_ANALYZE = DATA / "report-v1-analyze"
TRACES = [
    DATA / "own" / "small_batch_cpu.pt.trace.json.gz",
    DATA / "own" / "host_tensors_cpu.pt.trace.json.gz",
]
CPU = DeviceInfo("2.13.0+cpu", "3.11.9", 2, False)


def _cli(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def test_a_version_1_profile_report_is_read_as_version_2_with_everything_it_measured() -> None:
    original = json.loads((V1_PROFILE / "report.json").read_text())
    assert original["schema_version"] == 1 and original["traces"] == [] and original["ranks"] is None
    report = load_report(V1_PROFILE)
    assert isinstance(report, ProfileReport)
    assert (report.schema_version, report.kind, report.producer) == (2, "profile", "trainadvisor")
    assert report.producer_version is None and report.run_id is None  # version 1 recorded neither
    written = json.loads(report_json(report))
    for key in PROFILE_ONLY:
        assert written[key] == original[key], key
    assert not set(ANALYZE_ONLY) & set(written)
    assert written == from_v1(original)


def test_a_version_1_analyze_report_is_read_as_version_2_with_its_traces() -> None:
    original = json.loads((V1_ANALYZE / "report.json").read_text())
    assert original["schema_version"] == 1 and original["command"][1] == "analyze"
    # the profile-only fields version 1 wrote for analyze were empty: dropping them loses nothing
    assert [original[k] for k in PROFILE_ONLY] == [None, [], [], [], None, None, None, []]
    report = load_report(V1_ANALYZE)
    assert isinstance(report, AnalyzeReport) and report.kind == "analyze"
    assert len(report.traces) == 2 and report.traces == original["traces"]
    assert not set(PROFILE_ONLY) & set(json.loads(report_json(report)))


@pytest.mark.parametrize("saved", [V1_PROFILE, V1_ANALYZE], ids=["profile", "analyze"])
def test_a_version_1_report_re_renders_with_the_report_command(saved: Path, tmp_path: Path) -> None:
    folder = tmp_path / "saved"
    shutil.copytree(saved, folder)
    code, output = _cli("report", folder)
    assert code == 0, output
    assert json.loads((folder / "report.json").read_text())["schema_version"] == 1  # left as saved
    html = (folder / "report.html").read_text()
    assert "Findings" in html and ("Before and after" in html) == (saved == V1_PROFILE)


def test_version_1_and_version_2_of_the_same_traces_compare_as_unchanged(tmp_path: Path) -> None:
    """The same two traces read by version 1 (saved) and by this version: compare reads both,
    and every figure is the same."""
    code, output = _cli("analyze", "--out", tmp_path / "v2", *TRACES)
    assert code == 0, output
    v2 = json.loads((tmp_path / "v2" / "report.json").read_text())
    assert (v2["schema_version"], v2["kind"], v2["producer_version"]) == (2, "analyze", __version__)
    code, output = _cli("compare", "--format", "json", V1_ANALYZE, tmp_path / "v2")
    assert code == 0, output
    metrics = json.loads(output)["metrics"]
    assert metrics and all(m["change_pct"] in (0.0, None) for m in metrics), metrics


def test_the_gpu_runs_saved_by_version_1_render_and_compare(tmp_path: Path) -> None:
    """The first H100 runs' reports (../shared/gpu-runs), written by version 1."""
    runs = sorted(gpu_run(".").rglob("report.json"))
    assert len(runs) >= 7, runs
    for path in runs:
        report = load_report(path.parent)
        assert isinstance(report, ProfileReport) and report.baseline is not None, path
        assert "<html" in render_html(report, templates_dir()) and render_markdown(report, templates_dir())
    code, output = _cli("compare", "--format", "json", runs[0].parent, runs[-1].parent)
    assert code in (0, 1), output  # a verdict, not a refusal
    assert json.loads(output)["metrics"]


def test_a_version_2_report_round_trips(tmp_path: Path) -> None:
    code, output = _cli("analyze", "--out", tmp_path / "r", *TRACES)
    assert code == 0, output
    text = (tmp_path / "r" / "report.json").read_text()
    assert report_json(load_report(tmp_path / "r")) == text


def test_a_version_or_kind_this_version_does_not_know_is_refused(tmp_path: Path) -> None:
    plain = json.loads((V1_PROFILE / "report.json").read_text())
    for version in (SCHEMA_VERSION + 1, 0, "2", None):
        with pytest.raises(
            UnreadableVersion, match=rf"is not one this version reads \(1 to {SCHEMA_VERSION}\)"
        ):
            upgraded({**plain, "schema_version": version}, SCHEMA_VERSION)
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps({**from_v1(plain), "kind": "<b>train</b>"}))
    code, output = _cli("report", folder)
    assert code == 2 and "kind '<b>train</b>' is neither 'profile' nor 'analyze'" in output


def test_the_run_id_is_the_content_not_the_path_or_the_time(tmp_path: Path) -> None:
    script = tmp_path / "a" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    moved = tmp_path / "b" / "train.py"
    moved.parent.mkdir()
    shutil.copy(script, moved)
    same = run_id(file_digest(script), ["--lr", "0.1"], CPU, 1)
    assert same == run_id(file_digest(moved), ["--lr", "0.1"], CPU, 1) and same.startswith("sha256:")
    assert same != run_id(file_digest(script), ["--lr", "0.2"], CPU, 1)  # other arguments
    assert same != run_id(file_digest(script), ["--lr", "0.1"], CPU, 2)  # other ranks
    assert same != run_id(file_digest(script), ["--lr", "0.1"], DeviceInfo("2.12.0", "3.11.9", 2, False), 1)
    assert same == run_id(
        file_digest(script), ["--lr", "0.1"], DeviceInfo("2.13.0+cpu", "3.12.1", 2, False), 1
    )
    moved.write_text("print('train!')\n")
    assert same != run_id(file_digest(moved), ["--lr", "0.1"], CPU, 1)  # other code


def test_the_same_traces_in_another_folder_are_the_same_run(tmp_path: Path) -> None:
    elsewhere = tmp_path / "copied"
    elsewhere.mkdir()
    for trace in TRACES:
        shutil.copy(trace, elsewhere / trace.name)
    ids = []
    for out, traces in (("one", TRACES), ("two", sorted(elsewhere.iterdir()))):
        code, output = _cli("analyze", "--out", tmp_path / out, *traces)
        assert code == 0, output
        ids.append(json.loads((tmp_path / out / "report.json").read_text())["run_id"])
    assert ids[0] == ids[1] and ids[0].startswith("sha256:")
    code, output = _cli("analyze", "--out", tmp_path / "three", TRACES[0])
    assert json.loads((tmp_path / "three" / "report.json").read_text())["run_id"] != ids[0]


def test_every_report_written_holds_to_the_shipped_schema_and_a_departure_is_named(tmp_path: Path) -> None:
    """The suite checks every report.json it writes (`TRAINADVISOR_CHECK_REPORTS`, set in
    conftest); the check names where a report departs: a string for a number, a field the schema
    does not know, a profile's field in an analyze report."""
    good = json.loads(report_json(load_report(V1_PROFILE)))
    assert schema.problems(good) == []
    assert schema.problems(json.loads(report_json(load_report(V1_ANALYZE)))) == []
    bad = {**good, "elapsed_s": "12", "surprise": 1}
    found = schema.problems(bad)
    assert any(line.strip().startswith("elapsed_s: '12' is not of type 'number'") for line in found), found
    assert any("'surprise' was unexpected" in line for line in found), found
    mixed = {**json.loads(report_json(load_report(V1_ANALYZE))), "after": None}
    assert any("'after' was unexpected" in line for line in schema.problems(mixed))
    report = load_report(V1_PROFILE)
    report.elapsed_s = "soon"  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="departs from its schema: .*elapsed_s"):
        write_report(report, tmp_path / "out", templates_dir())
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_shipped_schema_is_the_records_own() -> None:
    assert schema.SCHEMA_FILE.read_text() == schema.schema_text()  # scripts/gen_docs.py writes it
    shipped = json.loads(schema.SCHEMA_FILE.read_text())
    assert shipped["$defs"]["ProfileReport"]["properties"]["kind"] == {"const": "profile"}
    assert set(shipped["$defs"]["AnalyzeReport"]["required"]) >= {"producer", "producer_version", "run_id"}
