"""`trainadvisor analyze`: the measurements and rules of `profile`, on existing Kineto traces
(one file per rank, or tensorboard_trace_handler folders with several spans). Pure apart from
reading the files."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from trainadvisor import engine
from trainadvisor._serial import to_plain
from trainadvisor.analyze import archives
from trainadvisor.analyze.bounds import refuse_special, regular_file
from trainadvisor.analyze.kineto import TraceAnalysis, analyze_trace
from trainadvisor.analyze.measures import trace_measurements
from trainadvisor.analyze.rank_table import rank_table, rank_values
from trainadvisor.analyze.reading import cores, on_workers
from trainadvisor.analyze.summary import stats, window_throughputs
from trainadvisor.errors import UsageError
from trainadvisor.records import SCHEMA_VERSION, DeviceInfo, Finding, RawRun, Report, Run, StepRecord

TRACE_SUFFIXES = (".json", ".json.gz")


def find_traces(paths: list[Path], unpack_into: Path | None = None) -> list[tuple[Path, str]]:
    """(file, name to show) of the trace files named, those inside the folders named
    (recursively), and those inside the archives named (unpacked into `unpack_into`)."""
    found: list[tuple[Path, str]] = []
    for i, path in enumerate(paths):
        if not path.exists():
            raise UsageError(f"{path}: no such file or folder")
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.name.endswith(TRACE_SUFFIXES) and regular_file(p))
            if not inside:
                raise UsageError(f"{path}: no trace files (*.json, *.json.gz) in this folder")
            found += [(p, str(p)) for p in inside]
        elif archives.is_archive(path) and unpack_into is not None:
            found += archives.unpack(path, unpack_into / str(i))
        else:
            refuse_special(path)  # before any trace is read
            found.append((path, str(path)))
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
        utilization=analysis.utilization,
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


def _analyze_all(paths: list[Path]) -> list[TraceAnalysis]:
    """Each trace, on as many worker processes as there are cores when there are several
    (each worker reads its files one by one, in bounded memory); one large file alone is read
    in parts on those cores instead (`analyze.reading`)."""
    workers = min(cores(), len(paths), 8)
    if workers < 2:
        return [analyze_trace(path) for path in paths]
    analysed = on_workers(workers, _analyze_one, paths)
    return analysed if analysed is not None else [analyze_trace(path) for path in paths]


def _analyze_one(path: Path) -> TraceAnalysis:
    return analyze_trace(path, workers=1)


def _unit(analysis: TraceAnalysis, label: str, several: bool) -> str:
    return f"rank {analysis.rank}" if analysis.rank is not None and several else label


def _ranges(numbers: list[int]) -> str:
    """0, 2-5, 7"""
    parts: list[str] = []
    for n in sorted(set(numbers)):
        if parts and n == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


def _worst(found: list[tuple[str, TraceAnalysis, Finding]]) -> tuple[str, TraceAnalysis, Finding]:
    """The most severe, then the one whose first measured evidence is largest."""

    def key(item: tuple[str, TraceAnalysis, Finding]) -> tuple[int, float]:
        first = next((e.value for e in item[2].evidence if isinstance(e.value, (int, float))), 0.0)
        return engine.SEVERITIES.index(item[2].severity), -float(first)

    return min(found, key=key)


def merged_findings(per_trace: list[tuple[str, TraceAnalysis, list[Finding]]]) -> list[Finding]:
    """One finding per rule over all traces, naming where it holds and the worst trace."""
    by_rule: dict[str, list[tuple[str, TraceAnalysis, Finding]]] = {}
    for label, analysis, findings in per_trace:
        for finding in findings:
            by_rule.setdefault(finding.rule, []).append((label, analysis, finding))
    ranked = {a.rank for _, a, _ in per_trace if a.rank is not None}
    merged = []
    for found in by_rule.values():
        label, _, worst = _worst(found)
        finding = dataclasses.replace(worst)
        if len(per_trace) > 1:
            ranks = [a.rank for _, a, _ in found if a.rank is not None]
            if len(ranked) > 1 and len(ranks) == len(found):
                where = f"ranks {_ranges(ranks)} ({len(set(ranks))} of {len(ranked)})"
            else:
                where = f"{len(found)} of {len(per_trace)} traces"
            finding.message = (
                f"{label}: {worst.message}"
                if len(found) == 1
                else f"On {where}; worst, {label}: {worst.message}"
            )
        merged.append(finding)
    return sorted(merged, key=lambda f: engine.SEVERITIES.index(f.severity))


def _notes(analyses: list[TraceAnalysis], labels: list[str]) -> list[str]:
    """How each trace's steps were found, and what kind of loop it shows."""
    notes = []
    methods: dict[str, list[str]] = {}
    for analysis, label in zip(analyses, labels):
        methods.setdefault(analysis.step_method, []).append(label)
    for method, where in methods.items():
        names = where[0] if len(where) == 1 else f"{len(where)} traces"
        notes.append(f"Steps of {names}: {method}.")
    inference = [label for a, label in zip(analyses, labels) if a.loop == "inference"]
    if inference:
        names = (
            f"{inference[0]} is not a training loop"
            if len(inference) == 1
            else (f"{len(inference)} traces are not training loops")
        )
        notes.append(
            f"{names} (no backward pass and no optimizer step): training "
            "advice (input-pipeline workers, mixed precision for training, ranks) is not given."
        )
    for analysis, label in zip(analyses, labels):
        if not analysis.host_events:
            notes.append(f"{label} holds no host (CPU) events: its figures are the device's alone.")
    return notes


def analyze(
    paths: list[Path], rule_dirs: list[Path], command: list[str]
) -> tuple[Report, list[TraceAnalysis]]:
    rules = engine.rules_for(rule_dirs)
    with tempfile.TemporaryDirectory(prefix="trainadvisor-traces-") as unpacked:
        traces = find_traces(paths, Path(unpacked))
        analyses = _analyze_all([path for path, _ in traces])
    for analysis, (_, shown) in zip(analyses, traces):
        analysis.path = shown
    runs = [to_run(a) for a in analyses]
    several_ranks = len({a.rank for a in analyses if a.rank is not None}) > 1
    labels = [_unit(a, run.label, several_ranks) for a, run in zip(analyses, runs)]
    for label in {x for x in labels if labels.count(x) > 1}:  # a rank's spans, or same-named files
        for i in [i for i, x in enumerate(labels) if x == label]:
            shown = analyses[i].path if label == runs[i].label else runs[i].label
            labels[i] = shown if label == runs[i].label else f"{label} ({shown})"
    per_trace = [
        (label, a, engine.diagnose(measurements(a, run), rules).findings)
        for label, a, run in zip(labels, analyses, runs)
    ]
    findings = merged_findings(per_trace)
    notes = _notes(analyses, labels)
    table = rank_table(analyses)
    if table is not None:
        values = rank_values(table)
        values["inference_loop"] = all(a.loop == "inference" for a in analyses)
        straggler = [r for r in rules if r.id == "straggler"]
        findings = [f for f in findings if f.rule != "straggler"] + engine.diagnose(
            values, straggler
        ).findings
        findings.sort(key=lambda f: engine.SEVERITIES.index(f.severity))
        notes.append(
            f"{len(table.rows)} ranks: step time {min(r.step_ms for r in table.rows):.1f}-"
            f"{max(r.step_ms for r in table.rows):.1f} ms; rank {table.straggler} has the "
            f"{'least time in collectives' if table.straggler_by == 'communication' else 'longest steps'}: "
            f"the others lose {table.skew_pct:.1f}% of the step waiting for it."
        )
    report = Report(
        schema_version=SCHEMA_VERSION,
        command=command,
        script=", ".join(a.path for a in analyses),
        environment=runs[0].raw.device,
        baseline=runs[0],
        findings=findings,
        notes=notes,
        traces=[to_plain(a) for a in analyses],
        ranks=to_plain(table),
    )
    return report, analyses
