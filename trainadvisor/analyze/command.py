"""`trainadvisor analyze`: the measurements and rules of `profile`, on existing Kineto traces
(one file per rank, or tensorboard_trace_handler folders with several spans). Pure apart from
reading the files."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from trainadvisor import rulebook
from trainadvisor._serial import to_plain
from trainadvisor.analyze.engines import Engine, LocalEngine
from trainadvisor.analyze.rank_overview import ranges
from trainadvisor.analyze.rank_table import RankTable, rank_table, rank_values
from trainadvisor.analyze.read import archives
from trainadvisor.analyze.read.bounds import refuse_special, regular_file
from trainadvisor.analyze.read.sources import TRACE_SUFFIXES, Location, is_url, list_urls
from trainadvisor.analyze.read.sources import shown as shown_url
from trainadvisor.analyze.run.measures import trace_measurements, traced_only
from trainadvisor.analyze.run.summary import TRACED, named_measurements, stats, window_throughputs
from trainadvisor.analyze.trace.analysis import TraceAnalysis
from trainadvisor.errors import UsageError
from trainadvisor.records import SCHEMA_VERSION, AnalyzeReport, DeviceInfo, Finding, RawRun, Run, StepRecord
from trainadvisor.records.identity import content_digest, run_id
from trainadvisor.rulebook import Rule

SHOWN_UP_TO = 3  # traces a title or a note names one by one


def find_traces(paths: list[Location], unpack_into: Path | None = None) -> list[tuple[Location, str]]:
    """(file, name to show) of the trace files named, those inside the folders named
    (recursively), those inside the archives named (unpacked into `unpack_into`), and those
    under the URLs named (object storage: `sources`; shown without credentials)."""
    found: list[tuple[Location, str]] = []
    for i, location in enumerate(paths):
        if is_url(location):
            found += [(url, shown_url(url)) for url in list_urls(str(location))]
            continue
        path = Path(location)
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
        step_source=TRACED,
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
        trace=trace_measurements(analysis) | traced_only(analysis),
    )


def _unit(analysis: TraceAnalysis, label: str, several: bool) -> str:
    return f"rank {analysis.rank}" if analysis.rank is not None and several else label


def _worst(found: list[tuple[str, TraceAnalysis, Finding]]) -> tuple[str, TraceAnalysis, Finding]:
    """The most severe, then the one whose first measured evidence is largest."""

    def key(item: tuple[str, TraceAnalysis, Finding]) -> tuple[int, float]:
        first = next((e.value for e in item[2].evidence if isinstance(e.value, (int, float))), 0.0)
        return rulebook.SEVERITIES.index(item[2].severity), -float(first)

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
                where = f"ranks {ranges(ranks)} ({len(set(ranks))} of {len(ranked)})"
            else:
                where = f"{len(found)} of {len(per_trace)} traces"
            finding.message = (
                f"{label}: {worst.message}"
                if len(found) == 1
                else f"On {where}; worst, {label}: {worst.message}"
            )
        merged.append(finding)
    return sorted(merged, key=lambda f: rulebook.SEVERITIES.index(f.severity))


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
    device_only = [label for a, label in zip(analyses, labels) if not a.host_events]
    alone = "holds no host (CPU) events: its figures are the device's alone."
    if len(device_only) > SHOWN_UP_TO:  # at scale, one note rather than one a trace
        notes.append(
            f"{len(device_only)} traces hold no host (CPU) events: their figures are the devices' alone."
        )
    else:
        notes += [f"{label} {alone}" for label in device_only]
    return notes


def _labels(analyses: list[TraceAnalysis], runs: list[Run]) -> list[str]:
    """What the report calls each trace: its rank where the traces hold several, else its file
    name; made unique with the path where several share one (a rank's spans, same-named files)."""
    several_ranks = len({a.rank for a in analyses if a.rank is not None}) > 1
    labels = [_unit(a, run.label, several_ranks) for a, run in zip(analyses, runs)]
    counts = Counter(labels)
    for i, label in enumerate(list(labels)):
        if counts[label] > 1:
            shown = analyses[i].path if label == runs[i].label else runs[i].label
            labels[i] = shown if label == runs[i].label else f"{label} ({shown})"
    return labels


def _script(analyses: list[TraceAnalysis]) -> str:
    """The traces, as the report's title names them: all of a few, the ends of many."""
    if len(analyses) <= SHOWN_UP_TO:
        return ", ".join(a.path for a in analyses)
    return f"{analyses[0].path} ... {analyses[-1].path} ({len(analyses)} traces)"


def analyze(
    paths: list[Location],
    rule_dirs: list[Path],
    command: list[str],
    runner: Engine | None = None,
    workload: str | None = None,
) -> tuple[AnalyzeReport, list[TraceAnalysis]]:
    """The report of the traces named; `runner` analyses each of them (`engines`: this
    machine's cores by default, or a Ray cluster), everything after that runs here."""
    rules = rulebook.rules_for(rule_dirs)
    with tempfile.TemporaryDirectory(prefix="trainadvisor-traces-") as unpacked:
        traces = find_traces(paths, Path(unpacked))
        analyses = (runner or LocalEngine()).run([path for path, _ in traces])
    for analysis, (_, shown) in zip(analyses, traces):
        analysis.path = shown
    return report_of(analyses, rules, [shown_url(arg) for arg in command], workload), analyses


def report_of(
    analyses: list[TraceAnalysis], rules: list[Rule], command: list[str], workload: str | None = None
) -> AnalyzeReport:
    """The report of the traces' summaries: each trace's findings merged into one per rule, the
    rank table and its straggler. Linear in the traces: a second for 1,024 ranks."""
    runs = [to_run(a) for a in analyses]
    labels = _labels(analyses, runs)
    per_trace = [
        (label, a, rulebook.diagnose(named_measurements(run), rules).findings)
        for label, a, run in zip(labels, analyses, runs)
    ]
    findings = merged_findings(per_trace)
    notes = _notes(analyses, labels)
    fired: dict[int, set[str]] = {}
    for _, a, found in per_trace:
        if a.rank is not None:
            fired.setdefault(int(a.rank), set()).update(f.rule for f in found)
    table = rank_table(analyses, fired)
    if table is not None:
        values = rank_values(table)
        values["inference_loop"] = all(a.loop == "inference" for a in analyses)
        straggler = [r for r in rules if r.id == "straggler"]
        findings = [f for f in findings if f.rule != "straggler"] + rulebook.diagnose(
            values, straggler
        ).findings
        findings.sort(key=lambda f: rulebook.SEVERITIES.index(f.severity))
        notes.append(_ranks_note(table))
    identities = sorted(json.dumps(_identity(a), sort_keys=True, default=str) for a in analyses)
    content = content_digest("\n".join(identities))  # the same traces in any order
    world = max((int(a.world_size or 0) for a in analyses), default=0) or len(analyses)
    return AnalyzeReport(
        schema_version=SCHEMA_VERSION,
        run_id=run_id(content, [], runs[0].raw.device, world),
        content_digest=content,
        workload=workload,
        command=command,
        script=_script(analyses),
        environment=runs[0].raw.device,
        baseline=runs[0],
        findings=findings,
        notes=notes,
        traces=[to_plain(a) for a in analyses],
        ranks=to_plain(table),
    )


def _identity(analysis: TraceAnalysis) -> dict[str, Any]:
    """A trace's summary without where it was read from: the same traces read from another
    folder or bucket are the same run."""
    plain: dict[str, Any] = to_plain(analysis)
    plain.pop("path", None)
    return plain


def _ranks_note(table: RankTable) -> str:
    return (
        f"{len(table.rows)} ranks: step time {min(r.step_ms for r in table.rows):.1f}-"
        f"{max(r.step_ms for r in table.rows):.1f} ms; rank {table.straggler} has the "
        f"{'least time in collectives' if table.straggler_by == 'communication' else 'longest steps'}: "
        f"the others lose {table.skew_pct:.1f}% of the step waiting for it."
    )
