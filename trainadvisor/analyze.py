"""`trainadvisor analyze`: the measurements and rules of `profile`, on existing Kineto traces
(one file per rank, or tensorboard_trace_handler folders with several spans). Pure apart from
reading the files."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainadvisor import engine
from trainadvisor._serial import to_plain
from trainadvisor.analysis.kineto import TraceAnalysis, analyze_trace
from trainadvisor.analysis.measures import trace_measurements
from trainadvisor.analysis.summary import stats, window_throughputs
from trainadvisor.errors import UsageError
from trainadvisor.records import SCHEMA_VERSION, DeviceInfo, Finding, RawRun, Report, Run, StepRecord

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class RankComparison:
    ranks: list[int | None]
    step_time_ms: list[float]
    communication_pct: list[float]
    slowest_rank: int | None
    skew_pct: float  # (slowest - fastest) / mean step time


def find_traces(paths: list[Path]) -> list[Path]:
    """The trace files named, and those inside the folders named (recursively)."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such file or folder")
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            if not inside:
                raise UsageError(f"{path}: no trace files (*.json, *.json.gz) in this folder")
            found += inside
        else:
            found.append(path)
    return found


def to_run(analysis: TraceAnalysis) -> Run:
    """A trace's steps as the run that reports, rules and comparisons read."""
    first = analysis.steps[0].start_us if analysis.steps else 0.0
    records = [
        StepRecord(
            index=step.number,
            start_ms=(step.start_us - first) / 1e3,
            step_ms=step.dur_us / 1e3,
            data_wait_ms=step.ms["data_wait"],
            h2d_copy_ms=step.h2d_ms,
        )
        for step in analysis.steps
    ]
    raw = RawRun(
        label=Path(analysis.path).name,
        status="window_complete",
        exit_code=None,
        error=None,
        warmup_steps=0,
        window_steps=len(records),
        profile_steps=len(records),
        steps_seen=len(records),
        steps=records,
        loaders=[],
        device=DeviceInfo("unknown", "unknown", 0, analysis.gpu_name is not None, None, analysis.gpu_name),
        trace_file=analysis.path,
    )
    count = len(records) or 1
    total_ms = sum(r.step_ms for r in records)
    return Run(
        label=raw.label,
        steps=len(records),
        step_time_ms=stats([r.step_ms for r in records]),
        steps_per_s=len(records) / (total_ms / 1e3) if total_ms else None,
        samples_per_s=None,
        breakdown_pct=dict(analysis.breakdown_pct),
        breakdown_ms_per_step={
            k: sum(s.ms[k] for s in analysis.steps) / count for k in analysis.breakdown_pct
        },
        window_steps_per_s=window_throughputs(raw),
        raw=raw,
    )


def measurements(analysis: TraceAnalysis, run: Run) -> dict[str, Any]:
    """The named measurements rules read, as far as a trace tells them."""
    values: dict[str, Any] = trace_measurements(analysis)
    values.update({
        "steps": run.steps,
        "step_time_ms_median": run.step_time_ms.median,
        "step_time_ms_mean": run.step_time_ms.mean,
        "steps_per_s": run.steps_per_s,
        "data_wait_ms_per_step": run.breakdown_ms_per_step.get("data_wait"),
        "cuda_used": analysis.gpu_name is not None or bool(analysis.kernels),
        "h2d_pageable": analysis.h2d_pageable,
        "h2d_pinned": analysis.h2d_pinned,
    })  # fmt: skip
    for key, pct in analysis.breakdown_pct.items():
        values[f"{key}_pct"] = pct
    # A measurement is a number or absent: the iterator's class tells 0 workers apart from some,
    # not how many (a multi-process loader is its own measurement).
    iterators = analysis.loader_iterators
    if iterators == ["_SingleProcessDataLoaderIter"]:
        values["num_workers"] = 0
    elif iterators:
        values["multiprocess_loader"] = True
    return {k: v for k, v in values.items() if v is not None}


def compare_ranks(analyses: list[TraceAnalysis]) -> RankComparison | None:
    """Per distinct rank (the spans of one rank averaged), when there are several ranks."""
    by_rank: dict[int, list[TraceAnalysis]] = {}
    for a in analyses:
        if a.rank is not None and a.step_time_ms_mean:
            by_rank.setdefault(a.rank, []).append(a)
    if len(by_rank) < 2:
        return None
    ranks = sorted(by_rank)
    times = [statistics.mean(a.step_time_ms_mean or 0.0 for a in by_rank[r]) for r in ranks]
    comm = [statistics.mean(a.breakdown_pct.get("communication", 0.0) for a in by_rank[r]) for r in ranks]
    return RankComparison(
        ranks=list(ranks),
        step_time_ms=times,
        communication_pct=comm,
        slowest_rank=ranks[max(range(len(ranks)), key=lambda i: times[i])],
        skew_pct=100.0 * (max(times) - min(times)) / statistics.mean(times),
    )


def analyze(
    paths: list[Path], rule_dirs: list[Path], command: list[str]
) -> tuple[Report, list[TraceAnalysis]]:
    rules = engine.rules_for(rule_dirs)
    analyses = [analyze_trace(path) for path in find_traces(paths)]
    runs = [to_run(a) for a in analyses]
    findings: list[Finding] = []
    notes: list[str] = []
    for analysis, run in zip(analyses, runs):
        for finding in engine.diagnose(measurements(analysis, run), rules).findings:
            if len(analyses) > 1:
                finding.message = f"{run.label}: {finding.message}"
            findings.append(finding)
        if not analysis.steps_marked:
            notes.append(f"{run.label} has no ProfilerStep#N markers: it was analysed as one window.")
    ranks = compare_ranks(analyses)
    if ranks is not None:
        notes.append(
            f"{len(ranks.ranks)} ranks: step time {min(ranks.step_time_ms):.1f}-"
            f"{max(ranks.step_time_ms):.1f} ms, "
            f"skew {ranks.skew_pct:.1f}%, slowest rank {ranks.slowest_rank}."
        )
    report = Report(
        schema_version=SCHEMA_VERSION,
        command=command,
        script=", ".join(a.path for a in analyses),
        environment=runs[0].raw.device,
        baseline=runs[0],
        findings=sorted(findings, key=lambda f: engine.SEVERITIES.index(f.severity)),
        notes=notes,
        traces=[to_plain(a) for a in analyses],
        ranks=to_plain(ranks),
    )
    return report, analyses
