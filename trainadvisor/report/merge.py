"""`trainadvisor report --out JOB NODE0 NODE1 ...`: the reports each node of a multi-node torchrun
job wrote, merged into one: every rank in one table, and the rules evaluated over all of them.
Pure: reports in, a report out."""

from __future__ import annotations

import copy
from pathlib import Path

from trainadvisor import rulebook
from trainadvisor.analyze.run.summary import named_measurements
from trainadvisor.errors import UsageError
from trainadvisor.records import ProfileReport, RankStats, Report


def merge_reports(reports: list[Report], rule_dirs: list[Path]) -> ProfileReport:
    """The first report (the node with rank 0, usually) with every node's ranks added; its
    findings re-evaluated over the merged ranks. A rank present in several reports is taken from
    the first that has it."""
    with_ranks = [
        r for r in reports if isinstance(r, ProfileReport) and r.baseline is not None and r.baseline.ranks
    ]
    if len(with_ranks) < len(reports):
        raise UsageError("only reports of torchrun runs (profile --nproc-per-node ...) can be merged")
    merged = copy.deepcopy(min(with_ranks, key=lambda r: min(s.rank for s in r.baseline.ranks)))  # type: ignore[union-attr]
    ranks: dict[int, RankStats] = {}
    for report in with_ranks:
        for stats in report.baseline.ranks:  # type: ignore[union-attr]
            ranks.setdefault(stats.rank, stats)
    baseline = merged.baseline
    assert baseline is not None  # every report here has a baseline with ranks (checked above)
    baseline.ranks = [ranks[rank] for rank in sorted(ranks)]
    merged.findings = rulebook.diagnose(named_measurements(baseline), rulebook.rules_for(rule_dirs)).findings
    # Fixes are measured on one node only (see `profile`): nothing of them is merged.
    merged.plan, merged.fix_outcomes, merged.applied_fixes = [], [], []
    merged.after, merged.comparison, merged.speedup = None, None, None
    merged.notes.append(
        f"Merged from {len(reports)} reports (one per node): ranks "
        f"{', '.join(str(rank) for rank in sorted(ranks))}. The step timings and traces shown "
        "are rank " + str(min(ranks)) + "'s; the rank table and the findings cover every rank."
    )
    return merged
