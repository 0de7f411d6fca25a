"""`trainadvisor analyze` through the real CLI, on real traces."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import load_report, run_cli, shared_trace


def test_data_stall_fires_on_num_workers_0_and_not_on_its_fix(tmp_path: Path) -> None:
    for folder, fires in (("resnet50_num_workers_0", True), ("resnet50_num_workers_4", False)):
        out = tmp_path / folder
        result = run_cli("analyze", "--out", out, shared_trace(f"tb_plugin/{folder}"), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        report = load_report(out)
        stalls = [f for f in report["findings"] if f["rule"] == "data-stall"]
        assert len(stalls) == (1 if fires else 0)  # one per rule, naming the spans (files)
        assert report["kind"] == "analyze" and "after" not in report and "speedup" not in report
        assert len(report["traces"]) == 2
    stall = load_report(tmp_path / "resnet50_num_workers_0")["findings"][0]
    assert stall["message"] == (
        "On 2 of 2 traces; worst, worker0.1623143089861.pt.trace.json.gz: The loop waited for its "
        "next batch for 33% of each step (59.3 ms per step on average)."
    )
    assert {e["measurement"]: e["value"] for e in stall["evidence"]}[
        "num_workers"
    ] == 0  # from the iterator's name


def test_json_output_and_ranks(tmp_path: Path) -> None:
    result = run_cli(
        "analyze",
        "--json",
        "--out",
        tmp_path / "r",
        shared_trace("hta/trace_filter/sampled_rank-0.json.gz"),
        shared_trace("hta/trace_filter/sampled_rank-1.json.gz"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["schema_version"], report["kind"]) == (2, "analyze") and "after" not in report
    assert {"steps", "step_time_ms", "steps_per_s", "samples_per_s", "breakdown_pct"} <= set(
        report["baseline"]
    )
    ranks = report["ranks"]
    assert [row["rank"] for row in ranks["rows"]] == [0, 1]
    # Rank 1 spends less time in NCCL kernels per step (149.7 ms against 168.0 ms): rank 0 waits
    # for it there; 18.3 ms is 3.0% of the mean step, under the straggler rule's 10%.
    assert [round(row["communication_ms"], 1) for row in ranks["rows"]] == [168.0, 149.7]
    assert ranks["straggler"] == 1 and ranks["straggler_by"] == "communication"
    assert round(ranks["skew_pct"], 1) == 3.0
    assert not [f for f in report["findings"] if f["rule"] == "straggler"]
    # One finding per rule over both ranks, naming them and the worst (rank 0: 27% of its step,
    # 15% overlapped; rank 1: 24%, 20%).
    comm = [f["message"] for f in report["findings"] if f["rule"] == "comm-bound"]
    assert comm == [
        "On ranks 0-1 (2 of 2); worst, rank 0: Collectives take 27% of each step and only "
        "15% of that time overlaps computation."
    ]
    assert (tmp_path / "r" / "report.html").is_file()


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [{"ph": "X"')
    for path, message in (
        (tmp_path / "missing.json", "no such file or folder"),
        (empty, "no trace files"),
        (broken, "cut off or malformed"),
    ):
        result = run_cli("analyze", "--out", tmp_path / "r", path, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("trainadvisor: error:") and message in result.stderr
        assert "Traceback" not in result.stderr


def test_an_archive_of_rank_traces(tmp_path: Path) -> None:
    """A set of ranks shipped as one .tar.gz: its traces are analysed as if unpacked; a member's
    path never decides where it is written."""
    import tarfile

    archive = tmp_path / "ranks.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for rank in (0, 1):
            source = shared_trace(f"hta/trace_filter/sampled_rank-{rank}.json.gz")
            tar.add(source, arcname=f"job/sampled_rank-{rank}.json.gz")
        tar.add(shared_trace("hta/trace_filter/sampled_rank-0.json.gz"), arcname="../outside.json.gz")
    result = run_cli("analyze", "--json", "--out", tmp_path / "r", archive, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [t["path"] for t in report["traces"]] == [
        "ranks.tar.gz:../outside.json.gz",
        "ranks.tar.gz:job/sampled_rank-0.json.gz",
        "ranks.tar.gz:job/sampled_rank-1.json.gz",
    ]
    assert not (tmp_path.parent / "outside.json.gz").exists()
    assert [row["rank"] for row in report["ranks"]["rows"]] == [0, 1]
    assert [row["traces"] for row in report["ranks"]["rows"]] == [2, 1]


def test_an_archive_without_traces_is_a_usage_error(tmp_path: Path) -> None:
    import tarfile

    archive = tmp_path / "empty.tar"
    (tmp_path / "notes.txt").write_text("no traces here")
    with tarfile.open(archive, "w") as tar:
        tar.add(tmp_path / "notes.txt", arcname="notes.txt")
    result = run_cli("analyze", "--out", tmp_path / "r", archive, cwd=tmp_path)
    assert result.returncode == 2 and "no trace files (*.json, *.json.gz) in this archive" in result.stderr
