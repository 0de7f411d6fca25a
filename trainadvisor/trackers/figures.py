"""The names and values a tracker receives, defined once (docs/trackers.md lists them). Every
name starts with `trainadvisor/`; a value is logged only where the run measured it.

    trainadvisor/step_time_ms          median time of a timed step (the script as it is)
    trainadvisor/steps_per_s           timed steps per second
    trainadvisor/samples_per_s         samples per second (batch sizes counted)
    trainadvisor/data_wait_pct         share of each step spent waiting for the next batch
    trainadvisor/mfu_pct               model FLOP/s utilisation (HFU where the step recomputes)
    trainadvisor/peak_memory_bytes     the step's peak: reserved GPU memory, else the counted step's
    trainadvisor/energy_j_per_sample   energy the GPUs drew per sample
    trainadvisor/after/<name>          the same, of the confirmation run with the kept fixes
    trainadvisor/speedup               the kept fixes' confirmed speedup
    trainadvisor/fix/<fix>/gain        each fix's own measured gain (its trial against the baseline)
    trainadvisor/findings              how many findings the rules made"""

from __future__ import annotations

from typing import Any

from trainadvisor.analyze.run.headline import headline_figures
from trainadvisor.records import ProfileReport, Report, fix_outcomes_of

PREFIX = "trainadvisor/"


def figures(report: Report) -> dict[str, float]:
    """Every summary metric the report has, by its tracker name."""
    out: dict[str, float] = {}
    if report.baseline is not None:
        out.update({PREFIX + k: v for k, v in headline_figures(report.baseline).items()})
    out[PREFIX + "findings"] = float(len(report.findings))
    if isinstance(report, ProfileReport):
        if report.after is not None:
            out.update({f"{PREFIX}after/{k}": v for k, v in headline_figures(report.after).items()})
        if report.speedup is not None:
            out[PREFIX + "speedup"] = float(report.speedup)
        for outcome in report.fix_outcomes:
            if outcome.gain is not None:
                out[f"{PREFIX}fix/{outcome.fix}/gain"] = float(outcome.gain)
    return out


def finding_rows(report: Report) -> list[list[Any]]:
    """One row a finding: rule, severity, title, message (masked as the report is)."""
    return [[f.rule, f.severity, f.title, f.message] for f in report.findings]


FINDING_COLUMNS = ["rule", "severity", "title", "message"]


def fix_rows(report: Report) -> list[list[Any]]:
    return [[o.fix, o.status, o.chosen, o.gain, o.reason] for o in fix_outcomes_of(report)]


FIX_COLUMNS = ["fix", "status", "chosen", "gain", "reason"]


def run_name(report: Report) -> str:
    """A run's name in a tracker: the workload, else the script's file name."""
    return f"trainadvisor {report.workload or report.script.rsplit('/', 1)[-1]}"
