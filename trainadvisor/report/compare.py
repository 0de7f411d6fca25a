"""`trainadvisor compare BASE HEAD`: two saved reports, metric by metric, with run-to-run noise
taken into account, and a verdict a CI job can gate on. Pure: reads reports, returns data."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainadvisor._serial import to_plain
from trainadvisor.analyze.run.shapes import usable
from trainadvisor.analyze.run.summary import named_measurements, percentile
from trainadvisor.records import ProfileReport, Report, Run
from trainadvisor.report import mdtext


@dataclass
class MetricChange:
    name: str
    label: str
    unit: str
    better: str  # "higher" | "lower"
    base: float
    head: float
    change_pct: float  # (head - base) / base
    noise_pct: float | None  # the runs' own window-to-window spread, where measured
    verdict: str  # better | worse | within noise | unchanged


@dataclass
class ReportComparison:
    base: str
    head: str
    run: str  # which run of each report: baseline | after
    max_regression_pct: float
    throughput_change_pct: float | None
    throughput_range_pct: tuple[float, float] | None  # slow/fast windows of head vs base
    regressed: bool
    verdict: str
    metrics: list[MetricChange] = field(default_factory=list)


# (measurement, label, unit, better)
METRICS = (
    ("steps_per_s", "Throughput", "steps/s", "higher"),
    ("samples_per_s", "Throughput", "samples/s", "higher"),
    ("step_time_ms_median", "Step time (median)", "ms", "lower"),
    ("step_time_ms_p90", "Step time (p90)", "ms", "lower"),
    ("data_wait_pct", "Data wait", "% of step", "lower"),
    ("gpu_busy_pct", "GPU busy", "% of step", "higher"),
    ("peak_reserved_bytes", "Peak reserved GPU memory", "bytes", "lower"),
)
UNCHANGED_PCT = 0.5  # a change smaller than this is "unchanged" whatever the noise


def pick_run(report: Report, which: str) -> Run:
    if which == "after":
        run = report.after if isinstance(report, ProfileReport) else None
    else:
        run = report.baseline
    if run is None:
        raise ValueError(f"the report of {report.script} has no '{which}' run")
    return run


def _spread_pct(run: Run) -> float | None:
    """Half the distance between the slow (10th percentile) and fast (90th) windows, as a share
    of the median window: the run's own noise."""
    windows = run.window_steps_per_s
    if len(windows) < 2:
        return None
    low, mid, high = (percentile(windows, p) or 0.0 for p in (10, 50, 90))
    return 100.0 * (high - low) / 2 / mid if mid else None


def _metric_changes(
    base_values: dict[str, Any], head_values: dict[str, Any], noise: float | None
) -> list[MetricChange]:
    """Each metric both runs measured: its change, and whether it is better, worse, unchanged
    or (for timings) within the runs' own noise."""
    metrics = []
    for name, label, unit, better in METRICS:
        b, h = base_values.get(name), head_values.get(name)
        if not isinstance(b, (int, float)) or not isinstance(h, (int, float)) or isinstance(b, bool) or not b:
            continue
        change = 100.0 * (h - b) / b
        improved = change > 0 if better == "higher" else change < 0
        timing = name in ("steps_per_s", "samples_per_s", "step_time_ms_median", "step_time_ms_p90")
        if abs(change) < UNCHANGED_PCT:
            verdict = "unchanged"
        elif timing and noise is not None and abs(change) <= noise:
            verdict = "within noise"
        else:
            verdict = "better" if improved else "worse"
        metrics.append(
            MetricChange(
                name, label, unit, better, float(b), float(h), change, noise if timing else None, verdict
            )
        )
    return metrics


def compare_reports(
    base: Report, head: Report, max_regression_pct: float = 5.0, which: str = "baseline"
) -> ReportComparison:
    base_run, head_run = pick_run(base, which), pick_run(head, which)
    base_values, head_values = named_measurements(base_run), named_measurements(head_run)
    spreads = [s for s in (_spread_pct(base_run), _spread_pct(head_run)) if s is not None]
    noise = max(spreads) if spreads else None
    metrics = _metric_changes(base_values, head_values, noise)
    throughput = next((m for m in metrics if m.name == "steps_per_s"), None)
    window_range = None
    if base_run.window_steps_per_s and head_run.window_steps_per_s:
        bw, hw = base_run.window_steps_per_s, head_run.window_steps_per_s
        low = 100.0 * ((percentile(hw, 10) or 0.0) / (percentile(bw, 90) or 1.0) - 1)
        high = 100.0 * ((percentile(hw, 90) or 0.0) / (percentile(bw, 10) or 1.0) - 1)
        change = throughput.change_pct if throughput is not None else None
        # never outside its own range (the change is the whole runs', the range their windows')
        window_range = (low, high) if change is None else (min(low, change), max(high, change))
    regressed = False
    if not usable(head_run.raw):
        # A head that no longer runs its window is the worst regression of all (one the script's
        # own end cut short after enough timed steps still counts, as it did in its report).
        regressed = True
        verdict = (
            f"the head's run did not complete ({head_run.raw.status.replace('_', ' ')}: {head_run.raw.error})"
        )
    elif throughput is None:
        verdict = "no throughput in one of the reports: nothing to gate on"
    elif throughput.change_pct < -max_regression_pct and throughput.verdict == "worse":
        regressed = True
        verdict = (
            f"regression: throughput {throughput.change_pct:+.1f}% (more than the allowed "
            f"-{max_regression_pct:g}%, beyond the runs' noise of ±{noise or 0:.1f}%)"
        )
    elif throughput.change_pct < -max_regression_pct:
        verdict = (
            f"throughput {throughput.change_pct:+.1f}%, but within the runs' noise "
            f"(±{noise or 0:.1f}%): not counted as a regression; rerun with more --steps"
        )
    else:
        verdict = f"no regression: throughput {throughput.change_pct:+.1f}% ({throughput.verdict})"
    return ReportComparison(
        base=base.script, head=head.script, run=which, max_regression_pct=max_regression_pct,
        throughput_change_pct=throughput.change_pct if throughput else None,
        throughput_range_pct=window_range, regressed=regressed, verdict=verdict, metrics=metrics,
    )  # fmt: skip


def _value(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 1e9:.2f} GB"
    return f"{value:,.1f}"


def comparison_markdown(c: ReportComparison) -> str:
    """The PR comment: the verdict (which may quote the head's exception) and the scripts'
    names are shown as text (`mdtext`)."""
    mark = "❌" if c.regressed else "✅"
    lines = [
        f"### {mark} trainadvisor compare: {mdtext.inline(c.verdict)}",
        "",
        f"Base {mdtext.code(c.base)} vs head {mdtext.code(c.head)} ({c.run} runs; regression gate: "
        f"throughput more than {c.max_regression_pct:g}% lower, beyond noise).",
        "",
        "| metric | base | head | change | noise | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for m in c.metrics:
        unit = "" if m.unit == "bytes" else f" {m.unit}"
        noise = f"±{m.noise_pct:.1f}%" if m.noise_pct is not None else ""
        lines.append(
            f"| {m.label}{unit} | {_value(m.base, m.unit)} | {_value(m.head, m.unit)} | "
            f"{m.change_pct:+.1f}% | {noise} | {m.verdict} |"
        )
    if c.throughput_range_pct is not None:
        low, high = c.throughput_range_pct
        widened = low < high and c.throughput_change_pct in (low, high)
        lines += [
            "",
            f"Throughput window range: {low:+.1f}% to {high:+.1f}% "
            "(head's slow/fast windows against base's fast/slow"
            + ("; widened to include the change of all timed steps" if widened else "")
            + ").",
        ]
    return "\n".join(lines) + "\n"


def comparison_json(c: ReportComparison) -> str:
    data: dict[str, Any] = to_plain(c)
    return json.dumps(data, indent=1) + "\n"
