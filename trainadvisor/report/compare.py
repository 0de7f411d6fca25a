"""`trainadvisor compare BASE HEAD`: two saved reports, first checked for being comparable, then
gated on one metric with the runs' own noise, and every metric both measured shown beside it.
Pure: reads reports, returns data (`report.compare_text` renders it).

The verdict is one of `regression_likely`, `improvement_likely`, `neutral` or `inconclusive`,
never read from medians alone: each run's timed windows give its spread, and the change comes
with an interval (about 95%: twice the standard error of the ratio of the runs' mean window
throughputs). A change beyond `--gate` whose whole interval is on one side of zero is likely;
one whose whole interval lies within the gate is neutral; anything else (an interval wider than
the gate, fewer than two windows in a run, runs that are not comparable) is inconclusive. The
interval is never narrower than the noise floor (2%: what a quiet machine's runs of the same
code differ by, `tests/scripts/settling.py`), and the report states the floor it used."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from trainadvisor.analyze.run.headline import headline_figures
from trainadvisor.analyze.run.shapes import usable
from trainadvisor.analyze.run.summary import named_measurements
from trainadvisor.records import ProfileReport, Report, Run, after_of

NOISE_FLOOR_PCT = 2.0
MEMORY_FLOOR_PCT = 1.0  # a peak of memory varies little between runs of the same code
UNCHANGED_PCT = 0.5  # a change smaller than this is "unchanged" whatever the noise
Verdict = str  # regression_likely | improvement_likely | neutral | inconclusive


@dataclass
class MetricChange:
    name: str
    label: str
    unit: str
    better: str  # "higher" | "lower"
    base: float
    head: float
    change_pct: float  # (head - base) / base
    verdict: str  # better | worse | within noise | unchanged


@dataclass
class Comparability:
    """How alike the two runs are: each fact both reports know, matched or not."""

    matched: int
    known: int
    differs: list[str] = field(default_factory=list)  # "device: NVIDIA H100 vs NVIDIA A100"
    blocking: list[str] = field(default_factory=list)  # the differences no gate can see past


@dataclass
class Gate:
    metric: str  # the --metric asked for
    label: str
    unit: str
    better: str
    base: float | None
    head: float | None
    change_pct: float | None  # + is head larger
    interval_pct: tuple[float, float] | None  # of change_pct
    noise_floor_pct: float
    gate_pct: float
    verdict: Verdict
    reason: str


@dataclass
class ReportComparison:
    base: str
    head: str
    run: str  # which run of each report: baseline | after
    comparability: Comparability
    gate: Gate
    metrics: list[MetricChange] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return self.gate.verdict


# (measurement, label, unit, better): every metric shown when both runs measured it
METRICS = (
    ("steps_per_s", "Throughput", "steps/s", "higher"),
    ("samples_per_s", "Throughput", "samples/s", "higher"),
    ("step_time_ms_median", "Step time (median)", "ms", "lower"),
    ("step_time_ms_p90", "Step time (p90)", "ms", "lower"),
    ("data_wait_pct", "Data wait", "% of step", "lower"),
    ("gpu_busy_pct", "GPU busy", "% of step", "higher"),
    ("mfu_pct", "MFU", "%", "higher"),
    ("peak_reserved_bytes", "Peak reserved GPU memory", "bytes", "lower"),
    ("step_peak_bytes", "Peak memory of a step", "bytes", "lower"),
)
# --metric: (label, unit, better, how its noise is known, its headline figure)
GATED = {
    "step_time": ("Step time (median)", "ms", "lower", "windows", "step_time_ms"),
    "samples_per_s": ("Throughput", "samples/s", "higher", "windows", "samples_per_s"),
    "peak_memory": ("Peak memory", "bytes", "lower", "floor", "peak_memory_bytes"),
    "mfu": ("MFU", "%", "higher", "windows", "mfu_pct"),
    "energy_per_sample": ("Energy per sample", "J", "lower", "windows", "energy_j_per_sample"),
}


def pick_run(report: Report, which: str) -> Run:
    run = after_of(report) if which == "after" else report.baseline
    if run is None:
        raise ValueError(f"the report of {report.script} has no '{which}' run")
    return run


def _device(report: Report) -> str | None:
    env = report.environment
    if env is None:
        return None
    return (env.gpu_name or "a GPU") if env.cuda_used else f"CPU ({env.cpu_count} cores)"


def _facts(report: Report, run: Run, which: str) -> dict[str, tuple[Any, bool]]:
    """name -> (value, whether a difference blocks the gate); None values are unknown."""
    values = named_measurements(run)
    applied = sorted(report.applied_fixes) if isinstance(report, ProfileReport) else []
    return {
        "workload": (report.workload, True),
        "script": (report.content_digest, False),  # a pull request changes it: that is the point
        "device": (_device(report), True),
        "torch": (report.environment.torch_version if report.environment else None, False),
        "world size": (max(1, len(run.ranks)), True),
        "batch size": (values.get("batch_size"), True),
        "fixes applied": (", ".join(applied) or "none", which == "after"),
    }


def comparability(base: Report, head: Report, base_run: Run, head_run: Run, which: str) -> Comparability:
    """Each fact both reports know, compared; a declared workload that matches stands for the
    script (two commits of one training job). Differences in the device, the ranks, the batch
    size, a declared workload, or (comparing `after` runs) the fixes applied block the gate."""
    ours, theirs = _facts(base, base_run, which), _facts(head, head_run, which)
    result = Comparability(0, 0)
    for name, (value, blocks) in ours.items():
        other = theirs[name][0]
        if value is None or other is None:
            continue
        result.known += 1
        if value == other:
            result.matched += 1
            continue
        shown = (value[:12], other[:12]) if name == "script" else (value, other)
        note = f"{name}: {shown[0]} vs {shown[1]}"
        if name == "script" and base.workload is not None and base.workload == head.workload:
            note += f" (one workload, {base.workload})"
        result.differs.append(note)
        if blocks:
            result.blocking.append(note)
    return result


def _point(figure: str, run: Run) -> float | None:
    """The run's headline figure, where it measured one above zero."""
    found = headline_figures(run).get(figure)
    return found if found is not None and found > 0 else None


def ratio_interval(base: list[float], head: list[float]) -> tuple[float, float] | None:
    """About 95% for mean(head) / mean(base) from each run's windows; None under two windows."""
    if len(base) < 2 or len(head) < 2 or min(base) <= 0 or min(head) <= 0:
        return None
    mb, mh = statistics.fmean(base), statistics.fmean(head)
    rel_se = math.sqrt(
        statistics.variance(base) / (len(base) * mb**2) + statistics.variance(head) / (len(head) * mh**2)
    )
    ratio = mh / mb
    return ratio * (1 - 2 * rel_se), ratio * (1 + 2 * rel_se)


def _change_interval(
    noise: str, base_run: Run, head_run: Run, change_pct: float
) -> tuple[float, float] | None:
    """The interval of `change_pct`: the metric's ratio head/base, give or take the relative
    half-width the windows show for the throughput's ratio (at least the noise floor), as a
    change in percent."""
    if noise == "floor":
        relative = MEMORY_FLOOR_PCT / 100
    else:
        ratios = ratio_interval(base_run.window_steps_per_s, head_run.window_steps_per_s)
        if ratios is None:
            return None
        low, high = ratios
        relative = max(NOISE_FLOOR_PCT / 100, (high - low) / (high + low))
    ratio = 1 + change_pct / 100
    return 100 * (ratio * (1 - relative) - 1), 100 * (ratio * (1 + relative) - 1)


def gate(metric: str, base_run: Run, head_run: Run, gate_pct: float, comparable: Comparability) -> Gate:
    label, unit, better, noise, figure = GATED[metric]
    base_value, head_value = _point(figure, base_run), _point(figure, head_run)
    change = interval = None
    if base_value is not None and head_value is not None:
        change = 100.0 * (head_value - base_value) / base_value
        interval = _change_interval(noise, base_run, head_run, change)
    floor = MEMORY_FLOOR_PCT if noise == "floor" else NOISE_FLOOR_PCT
    if interval is not None and change is not None:  # the half-width, relative to the ratio
        floor = (interval[1] - interval[0]) / 2 / (1 + change / 100)
    verdict, reason = _decide(head_run, comparable, change, interval, better, gate_pct, label)
    return Gate(
        metric,
        label,
        unit,
        better,
        base_value,
        head_value,
        change,
        interval,
        floor,
        gate_pct,
        verdict,
        reason,
    )


def _decide(
    head_run: Run,
    comparable: Comparability,
    change: float | None,
    interval: tuple[float, float] | None,
    better: str,
    gate_pct: float,
    label: str,
) -> tuple[Verdict, str]:
    if not usable(head_run.raw):
        # a head that no longer runs its window is the worst regression of all
        status = head_run.raw.status.replace("_", " ")
        return "regression_likely", f"the head's run did not complete ({status}: {head_run.raw.error})"
    if comparable.blocking:
        return "inconclusive", "not comparable: " + "; ".join(comparable.blocking)
    if change is None:
        return "inconclusive", f"{label}: not measured in both runs"
    if interval is None:
        return (
            "inconclusive",
            f"{label} {change:+.1f}%: a run has under two timed windows, so its noise is unknown",
        )
    sign = 1.0 if better == "higher" else -1.0  # gains are positive
    gain, (a, b) = sign * change, sorted((sign * interval[0], sign * interval[1]))
    said = f"{label} {change:+.1f}% (interval {interval[0]:+.1f}% to {interval[1]:+.1f}%)"
    if gain <= -gate_pct and b < 0:
        return "regression_likely", f"{said}: worse by more than the gate of {gate_pct:g}%"
    if gain >= gate_pct and a > 0:
        return "improvement_likely", f"{said}: better by more than the gate of {gate_pct:g}%"
    if -gate_pct <= a and b <= gate_pct:
        return "neutral", f"{said}: within the gate of ±{gate_pct:g}%"
    return "inconclusive", f"{said}: the runs' noise leaves open a change beyond the gate of {gate_pct:g}%"


def _metric_changes(
    base_values: dict[str, Any], head_values: dict[str, Any], noise: float
) -> list[MetricChange]:
    """Each metric both runs measured: its change, and whether it is better, worse, unchanged
    or (for timings) within the gate's noise floor."""
    metrics = []
    for name, label, unit, better in METRICS:
        b, h = base_values.get(name), head_values.get(name)
        if not isinstance(b, (int, float)) or not isinstance(h, (int, float)) or isinstance(b, bool) or not b:
            continue
        change = 100.0 * (h - b) / b
        improved = change > 0 if better == "higher" else change < 0
        if abs(change) < UNCHANGED_PCT:
            verdict = "unchanged"
        elif abs(change) <= noise:
            verdict = "within noise"
        else:
            verdict = "better" if improved else "worse"
        metrics.append(MetricChange(name, label, unit, better, float(b), float(h), change, verdict))
    return metrics


def compare_reports(
    base: Report, head: Report, gate_pct: float = 5.0, which: str = "baseline", metric: str = "step_time"
) -> ReportComparison:
    base_run, head_run = pick_run(base, which), pick_run(head, which)
    comparable = comparability(base, head, base_run, head_run, which)
    gated = gate(metric, base_run, head_run, gate_pct, comparable)
    metrics = _metric_changes(
        named_measurements(base_run), named_measurements(head_run), gated.noise_floor_pct
    )
    return ReportComparison(base.script, head.script, which, comparable, gated, metrics)


def exit_code(comparison: ReportComparison, strict: bool) -> int:
    """0 neutral, improvement or inconclusive; 1 regression_likely (and, --strict, inconclusive)."""
    failing = ("regression_likely", "inconclusive") if strict else ("regression_likely",)
    return 1 if comparison.verdict in failing else 0
