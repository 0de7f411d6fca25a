"""The cross-rank analysis at 1,024 ranks (issue 27, part 4), on per-rank summaries built by
hand: the report shows the distribution over the ranks, the worst and the best ranks, the wait
in collectives and groups of alike ranks, not a row per rank; every row stays in report.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainadvisor import rulebook
from trainadvisor.analyze.command import report_of
from trainadvisor.analyze.rank_overview import ranges, rank_overview
from trainadvisor.analyze.rank_table import RankRow
from trainadvisor.analyze.trace.trace_records import StepBreakdown, TraceAnalysis
from trainadvisor.records import Report
from trainadvisor.report.analyze import analysis_summary
from trainadvisor.report.render import render_html, render_markdown, report_json
from trainadvisor.resources import templates_dir

SLOW_NODE = range(512, 520)  # a node whose 8 GPUs compute slower: the others wait for them
STALLED = (7, 300)  # two ranks whose DataLoader keeps them waiting


def _summary(rank: int, communication_ms: float, data_ms: float) -> TraceAnalysis:
    """A rank's summary as a Ray task or a local worker returns it: 4 steps of 60 ms kernels,
    1 ms runtime, 19 ms other host work (the DataLoader's wait replacing it), 20 ms idle, and
    its time in collectives (waits included)."""
    ms = {"kernel": 60.0, "memcpy": 0.0, "memset": 0.0, "communication": communication_ms, "runtime": 1.0,
          "data_wait": data_ms, "other_host": max(19.0 - data_ms, 0.0), "idle": 20.0}  # fmt: skip
    steps = [StepBreakdown(n, n * 200_000.0, sum(ms.values()) * 1e3, dict(ms)) for n in range(4)]
    step_ms = sum(ms.values())
    return TraceAnalysis(
        path=f"/traces/rank{rank}.pt.trace.json.gz", events=20_000, rank=rank, world_size=1024,
        gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_bytes=80 << 30, steps_marked=True, steps=steps,
        breakdown_pct={k: 100.0 * v / step_ms for k, v in ms.items()}, step_time_ms_mean=step_ms,
        gpu_busy_pct=70.0, tensor_core_pct=90.0, kernels=400, short_kernels=10, kernel_us_median=50.0,
        launch_delay_us_median=5.0, h2d_pageable=0, h2d_pinned=4, h2d_unknown=0, h2d_pageable_bytes=0,
        syncs={}, peak_allocated_bytes=None, peak_reserved_bytes=None, communication_overlap_pct=30.0,
        steps_found=True, step_method="ProfilerStep#N markers", loop="training",
    )  # fmt: skip


def _job() -> list[TraceAnalysis]:
    """1,024 ranks in collectives 50-57.5 ms per step (rank % 16 x 0.5 ms), the slow node's
    10-11.75 ms (it arrives last: the others wait for it), two ranks with a 30 ms data wait."""
    ranks = []
    for rank in range(1024):
        communication_ms = 50.0 + (rank % 16) * 0.5
        if rank in SLOW_NODE:
            communication_ms = 10.0 + (rank - SLOW_NODE[0]) * 0.25
        ranks.append(_summary(rank, communication_ms, 30.0 if rank in STALLED else 0.0))
    return ranks


@pytest.fixture(scope="module")
def report_1024() -> Report:
    return report_of(_job(), rulebook.rules_for([]), ["trainadvisor", "analyze", "/traces"])


def test_1024_ranks_give_a_distribution_the_worst_and_best_and_groups(report_1024: Report) -> None:
    ranks = report_1024.ranks
    assert len(ranks["rows"]) == 1024 and ranks["straggler"] == 512
    overview = ranks["overview"]
    assert overview["key"] == "communication"
    # each column's percentiles on their own: step = 100 ms + communication (+ 11 ms for a stalled
    # rank); of 1,016 ranks at 50 + k x 0.5 ms, k 0-7 have 63 ranks each (the slow node took one)
    spread = {
        d["label"]: (d["step_ms"], d["communication_ms"], d["data_ms"]) for d in overview["distribution"]
    }
    assert spread == {
        "min": (110.0, 10.0, 0.0),
        "p10": (150.5, 50.5, 0.0),
        "median": (154.0, 53.75, 0.0),
        "p90": (157.0, 57.0, 0.0),
        "p99": (157.5, 57.5, 0.0),
        "max": (167.0, 57.5, 30.0),
    }
    assert overview["worst"] == [512, 513, 514] and overview["best"] == [15, 31, 47]
    assert overview["collective_wait_ms"] == {"median": 43.75, "p90": 47.0, "max": 47.5}
    groups = [
        (g["label"], len(g["ranks"]), g["key_ms_min"], g["key_ms_max"], g["findings"])
        for g in overview["groups"]
    ]
    assert groups == [
        ("ranks 512-519", 8, 10.0, 11.75, []),
        ("ranks 0-6, 8-299, 301-511, 520-1023", 1014, 50.0, 57.5, ["comm-bound"]),
        ("ranks 7, 300", 2, 53.5, 56.0, ["comm-bound", "data-stall"]),
    ]
    assert overview["groups_left"] == 0
    assert [f.rule for f in report_1024.findings][:1] == ["straggler"]
    assert json.loads(report_json(report_1024))["ranks"]["overview"] == overview


def test_the_terminal_shows_the_overview_not_a_row_per_rank(report_1024: Report) -> None:
    lines = analysis_summary(report_1024, _job(), Path("out")).splitlines()
    start = lines.index("1024 ranks, per step in ms (every rank's row is in report.json):")
    assert lines[start + 1 : start + 26] == [
        "            step  compute  comm.   wait   data  overlap",
        "     min   110.0     60.0   10.0   20.0    0.0      30%",
        "     p10   150.5     60.0   50.5   20.0    0.0      30%",
        "  median   154.0     60.0   53.8   20.0    0.0      30%",
        "     p90   157.0     60.0   57.0   20.0    0.0      30%",
        "     p99   157.5     60.0   57.5   20.0    0.0      30%",
        "     max   167.0     60.0   57.5   20.0   30.0      30%",
        "  worst: the others wait for them (least time in collectives)",
        "  rank   step  compute  comm.   wait   data",
        "   512  110.0     60.0   10.0   20.0    0.0  <- straggler",
        "   513  110.2     60.0   10.2   20.0    0.0",
        "   514  110.5     60.0   10.5   20.0    0.0",
        "  best: the most time waiting in collectives",
        "  rank   step  compute  comm.   wait   data",
        "    15  157.5     60.0   57.5   20.0    0.0",
        "    31  157.5     60.0   57.5   20.0    0.0",
        "    47  157.5     60.0   57.5   20.0    0.0",
        "  collectives: the ranks wait 43.8 ms per step for the last to arrive at the",
        "      median, 47.0 ms at p90, 47.5 ms at most",
        "  groups of alike ranks (time in collectives and findings):",
        "    ranks 512-519 (8): comm. 10.0-11.8 ms, step 110.0-111.8 ms",
        "    ranks 0-6, 8-299, 301-511, 520-1023 (1014): comm. 50.0-57.5 ms, step",
        "        150.0-157.5 ms; comm-bound",
        "    ranks 7, 300 (2): comm. 53.5-56.0 ms, step 164.5-167.0 ms; comm-bound,",
        "        data-stall",
    ]
    assert len(lines) < 60


def test_markdown_and_html_show_the_overview(report_1024: Report) -> None:
    markdown = render_markdown(report_1024, templates_dir())
    assert "| median | 154.0 | 60.0 | 53.8 | 20.0 | 0.0 | 30% |" in markdown
    assert "| 512 **(straggler)** | 1 | 4 | 110.0 | 60.0 | 10.0 | 20.0 | 0.0 |" in markdown
    assert "| ranks 7, 300 | 2 | 53.5-56.0 | 164.5-167.0 | comm-bound, data-stall |" in markdown
    assert "43.8 ms per step at the median, 47.0 ms at p90, 47.5 ms at most" in markdown
    assert markdown.count("| 1 | 4 |") == 6  # the worst and best ranks' rows only
    assert len(markdown) < 8_000  # a pull-request comment, not a 1,024-row table
    html = render_html(report_1024, templates_dir())
    assert "<td>ranks 512-519</td>" in html and "<summary>Every rank</summary>" in html
    visible = html.split("<summary>Every rank</summary>")[0]
    assert visible.count('<td class="num">1</td><td class="num">4</td>') == 6


def test_without_collectives_the_longest_steps_are_the_worst() -> None:
    rows = [RankRow(rank, 1, 5, 100.0 + (rank % 4), 60.0, 0.0, 2.0, 1.0) for rank in range(20)]
    rows[13].step_ms = 140.0
    overview = rank_overview(rows, "step time")
    assert overview.worst == [13, 3, 7] and overview.best == [0, 4, 8]
    assert overview.collective_wait_ms is None
    # 2% of the mean step (103.4 ms) is 2.07 ms: 100-103 ms is one band, 140 ms another
    assert [(g.label, g.key_ms_min, g.key_ms_max) for g in overview.groups] == [
        ("rank 13", 140.0, 140.0),
        ("ranks 0-12, 14-19", 100.0, 103.0),
    ]


def test_many_groups_are_counted_past_eight_and_long_rank_lists_cut() -> None:
    rows = [RankRow(rank, 1, 5, 100.0 + 10 * (rank % 10), 60.0, 0.0, 2.0, 1.0) for rank in range(40)]
    overview = rank_overview(rows, "step time")
    assert len(overview.groups) == 8 and (overview.groups_left, overview.ranks_left) == (2, 8)
    assert overview.groups[0].label == "ranks 9, 19, 29, 39"
    assert ranges(list(range(0, 40, 2)), up_to=6) == "0, 2, 4, 6, 8, 10, ..."
