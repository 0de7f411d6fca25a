"""MLflow: the report into the active run (`mlflow.active_run()`: the script's own, under
`@advise`), into the run MLFLOW_RUN_ID names, or into a run of its own in the experiment
MLFLOW_EXPERIMENT_NAME (MLflow's default otherwise), at MLFLOW_TRACKING_URI. Summary metrics
(`figures`), one tag a finding (`trainadvisor.finding.<rule>`: its severity), the findings and
fixes as JSON, and report.html and report.json as artifacts under `trainadvisor/`.

A server that does not answer is given up on after a few seconds, not MLflow's minutes of
retries: where the user has not set them, MLFLOW_HTTP_REQUEST_MAX_RETRIES and
MLFLOW_HTTP_REQUEST_TIMEOUT are set for trainadvisor's own command (never inside the user's
process)."""

from __future__ import annotations

import os
from pathlib import Path

from trainadvisor.records import Report
from trainadvisor.trackers.figures import (
    FINDING_COLUMNS,
    FIX_COLUMNS,
    figures,
    finding_rows,
    fix_rows,
    run_name,
)

QUICK = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def quick_failures() -> None:
    """For trainadvisor's own processes: a tracking server that is down fails in seconds."""
    for name, value in QUICK.items():
        os.environ.setdefault(name, value)


def log(report: Report, files: Path, folder: Path, run_id: str | None = None) -> str:
    """`files`: the report's report.json and report.html as published; `folder`: where it is kept."""
    import mlflow

    active = mlflow.active_run()
    if active is None and run_id is not None:  # a framework's logger's run, not the active one
        run = mlflow.start_run(run_id=run_id)
    else:
        tags = {"trainadvisor.run_id": str(report.run_id)}
        run = active or mlflow.start_run(run_name=run_name(report), tags=tags)
    try:
        mlflow.log_metrics(figures(report))
        mlflow.set_tags({f"trainadvisor.finding.{f.rule}": f.severity for f in report.findings})
        mlflow.log_dict(
            {"findings": [dict(zip(FINDING_COLUMNS, row)) for row in finding_rows(report)],
             "fixes": [dict(zip(FIX_COLUMNS, row)) for row in fix_rows(report)]},
            "trainadvisor/findings.json",
        )  # fmt: skip
        for name in ("report.html", "report.json"):
            mlflow.log_artifact(str(files / name), artifact_path="trainadvisor")
    finally:
        if active is None:
            mlflow.end_run()
    return f"{mlflow.get_tracking_uri()} (run {run.info.run_id})"
