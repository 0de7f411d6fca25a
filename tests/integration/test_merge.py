"""Merging the reports of a multi-node torchrun job (`report.merge.merge_reports`): two saved reports
(tests/data/report, slow_input_mnist.py; the host-tensors replay, host_tensors.py) given the ranks of one
node each, merged into the rank-0 node's report with every rank, the rules re-evaluated over all of
them, and nothing of one node's fixes kept; reports that are not torchrun runs are refused."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from conftest import DATA

from trainadvisor.errors import UsageError
from trainadvisor.records import ProfileReport, RankStats
from trainadvisor.report.merge import merge_reports
from trainadvisor.report.render import load_report, write_report
from trainadvisor.resources import templates_dir


def _rank(rank: int, pre_backward_ms: float) -> RankStats:
    """A rank of 10 timed steps of 100 ms, `pre_backward_ms` of each before its backward()."""
    return RankStats(
        rank=rank,
        status="window_complete",
        error=None,
        steps=10,
        step_time_ms_mean=100.0,
        pre_backward_ms_mean=pre_backward_ms,
        data_wait_ms_mean=5.0,
    )


def _saved(name: str, tmp_path: Path) -> ProfileReport:
    """A saved report: "report" (tests/data/report) or a replay's name (tests/data/replays)."""
    if name == "report":
        report = load_report(DATA / "report")
    else:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "report.json").write_bytes(
            gzip.decompress((DATA / "replays" / f"{name}.json.gz").read_bytes())
        )
        report = load_report(folder)
    assert isinstance(report, ProfileReport) and report.baseline is not None
    return report


def _nodes(
    tmp_path: Path, node0: list[RankStats], node1: list[RankStats]
) -> tuple[ProfileReport, ProfileReport]:
    """Node 0's report (host-tensors) and node 1's (tests/data/report), with these ranks."""
    first, second = _saved("host-tensors", tmp_path), _saved("report", tmp_path)
    assert first.baseline is not None and second.baseline is not None
    first.baseline.ranks, second.baseline.ranks = node0, node1
    return first, second


def test_the_merged_report_is_the_rank_0_node_s_with_every_rank_in_order(tmp_path: Path) -> None:
    node0, node1 = _nodes(tmp_path, [_rank(0, 10.0), _rank(1, 10.0)], [_rank(2, 10.0), _rank(3, 10.0)])
    merged = merge_reports([node1, node0], [])  # node 1's given first: rank 0's is still the one kept
    assert merged.script == node0.script
    assert merged.script.endswith("examples/host_tensors.py")
    assert merged.baseline is not None and node0.baseline is not None
    assert merged.baseline.steps_per_s == node0.baseline.steps_per_s
    assert [s.rank for s in merged.baseline.ranks] == [0, 1, 2, 3]
    assert merged.notes[-1] == (
        "Merged from 2 reports (one per node): ranks 0, 1, 2, 3. The step timings and traces shown are "
        "rank 0's; the rank table and the findings cover every rank."
    )


def test_nothing_of_a_node_s_fixes_is_merged(tmp_path: Path) -> None:
    node0, node1 = _nodes(tmp_path, [_rank(0, 10.0), _rank(1, 10.0)], [_rank(2, 10.0), _rank(3, 10.0)])
    assert node0.plan and node0.fix_outcomes  # host-tensors measured dataloader-workers
    merged = merge_reports([node0, node1], [])
    assert (merged.plan, merged.fix_outcomes, merged.applied_fixes) == ([], [], [])
    assert (merged.after, merged.comparison, merged.speedup) == (None, None, None)


def test_the_inputs_are_left_as_they_were(tmp_path: Path) -> None:
    node0, node1 = _nodes(tmp_path, [_rank(0, 10.0), _rank(1, 10.0)], [_rank(2, 10.0), _rank(3, 40.0)])
    notes, plan = list(node0.notes), list(node0.plan)
    merge_reports([node0, node1], [])
    assert node0.notes == notes and node0.plan == plan
    assert node0.baseline is not None and node1.baseline is not None
    assert [s.rank for s in node0.baseline.ranks] == [0, 1]
    assert [s.rank for s in node1.baseline.ranks] == [2, 3]
    assert [f.rule for f in node0.findings] == ["data-stall"]


def test_a_straggler_on_the_other_node_is_found_over_all_ranks(tmp_path: Path) -> None:
    """Rank 3 spends 40 ms before its backward pass against the others' 10 ms, in steps of 100 ms:
    30% of the step, above the straggler rule's 25% for high."""
    node0, node1 = _nodes(tmp_path, [_rank(0, 10.0), _rank(1, 10.0)], [_rank(2, 10.0), _rank(3, 40.0)])
    assert [f.rule for f in node0.findings] == [f.rule for f in node1.findings] == ["data-stall"]
    merged = merge_reports([node0, node1], [])
    assert [(f.rule, f.severity) for f in merged.findings] == [("data-stall", "high"), ("straggler", "high")]
    assert merged.findings[1].message == (
        "Rank 3 holds the others back: it spends 40.0 ms per step before its backward pass against 10.0 ms "
        "on the other ranks, which wait for it in the gradient all-reduce (30% of every step)."
    )


def test_a_straggler_of_15_percent_is_medium(tmp_path: Path) -> None:
    node0, node1 = _nodes(tmp_path, [_rank(0, 10.0), _rank(1, 10.0)], [_rank(2, 10.0), _rank(3, 25.0)])
    merged = merge_reports([node0, node1], [])
    assert [(f.rule, f.severity) for f in merged.findings] == [
        ("data-stall", "high"),
        ("straggler", "medium"),
    ]


def test_ranks_alike_add_no_finding(tmp_path: Path) -> None:
    node0, node1 = _nodes(tmp_path, [_rank(0, 10.0), _rank(1, 10.0)], [_rank(2, 10.0), _rank(3, 10.0)])
    merged = merge_reports([node0, node1], [])
    assert [f.rule for f in merged.findings] == ["data-stall"]


def test_a_rank_in_two_reports_is_taken_from_the_first_given(tmp_path: Path) -> None:
    """Rank 1 is in both: 40 ms before backward in node 1's report, 10 ms in node 0's."""
    node0, node1 = _nodes(tmp_path, [_rank(0, 10.0), _rank(1, 10.0)], [_rank(1, 40.0), _rank(2, 10.0)])
    merged = merge_reports([node1, node0], [])
    assert merged.baseline is not None
    assert [(s.rank, s.pre_backward_ms_mean) for s in merged.baseline.ranks] == [
        (0, 10.0),
        (1, 40.0),
        (2, 10.0),
    ]
    assert "ranks 0, 1, 2." in merged.notes[-1]
    assert [f.rule for f in merged.findings] == ["data-stall", "straggler"]
    again = merge_reports([node0, node1], [])
    assert again.baseline is not None
    assert [(s.rank, s.pre_backward_ms_mean) for s in again.baseline.ranks] == [
        (0, 10.0),
        (1, 10.0),
        (2, 10.0),
    ]
    assert [f.rule for f in again.findings] == ["data-stall"]


def test_a_report_without_ranks_is_refused(tmp_path: Path) -> None:
    node0 = _saved("host-tensors", tmp_path)
    assert node0.baseline is not None
    node0.baseline.ranks = [_rank(0, 10.0), _rank(1, 10.0)]
    single = _saved("report", tmp_path)  # a run without torchrun: no ranks
    with pytest.raises(UsageError) as raised:
        merge_reports([node0, single], [])
    assert str(raised.value) == "only reports of torchrun runs (profile --nproc-per-node ...) can be merged"
    assert raised.value.exit_code == 2


def test_an_analysis_is_refused(tmp_path: Path) -> None:
    node0 = _saved("host-tensors", tmp_path)
    assert node0.baseline is not None
    node0.baseline.ranks = [_rank(0, 10.0)]
    with pytest.raises(UsageError, match="only reports of torchrun runs"):
        merge_reports([node0, load_report(DATA / "report-v1-analyze")], [])


def test_the_merged_report_is_written_and_read_back_with_its_ranks(tmp_path: Path) -> None:
    """Written with the schema check on (conftest), read back as it was merged."""
    node0, node1 = _nodes(tmp_path, [_rank(0, 10.0), _rank(1, 10.0)], [_rank(2, 10.0), _rank(3, 40.0)])
    out = tmp_path / "job"
    write_report(merge_reports([node0, node1], []), out, templates_dir())
    back = load_report(out)
    assert isinstance(back, ProfileReport) and back.baseline is not None
    assert [(s.rank, s.pre_backward_ms_mean) for s in back.baseline.ranks] == [
        (0, 10.0),
        (1, 10.0),
        (2, 10.0),
        (3, 40.0),
    ]
    assert [f.rule for f in back.findings] == ["data-stall", "straggler"]
    assert back.fix_outcomes == []
