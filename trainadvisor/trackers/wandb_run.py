"""Weights & Biases: the report into the active run (`wandb.run`: the script's own, under
`@advise`), into the run WANDB_RUN_ID names (with WANDB_RESUME=allow, the training job's), or
into a run of its own in WANDB_PROJECT (default `trainadvisor`). WANDB_MODE=offline works as
W&B's own runs do. Summary metrics (`figures`), the findings and fixes as tables, and
report.html and report.json as an artifact of type `trainadvisor-report`."""

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


def log(report: Report, files: Path, folder: Path) -> str:
    """`files`: the report's report.json and report.html as published; `folder`: where it is kept."""
    import wandb

    run = wandb.run
    own = run is None
    if run is None:
        run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "trainadvisor",
            name=run_name(report),
            job_type="trainadvisor",
            config={"trainadvisor/run_id": report.run_id, "trainadvisor/kind": report.kind},
            # W&B records the calling process's command line and code: trainadvisor's own, which
            # holds the script's arguments unmasked (credentials among them)
            settings=wandb.Settings(
                x_disable_meta=True, disable_code=True, disable_git=True, save_code=False
            ),
        )
    try:
        run.summary.update(figures(report))
        tables = {
            "trainadvisor/findings": wandb.Table(
                columns=list[str | int](FINDING_COLUMNS), data=finding_rows(report)
            )
        }
        if fix_rows(report):
            tables["trainadvisor/fixes"] = wandb.Table(
                columns=list[str | int](FIX_COLUMNS), data=fix_rows(report)
            )
        run.log(tables)
        artifact = wandb.Artifact(f"trainadvisor-report-{run.id}", type="trainadvisor-report")
        for name in ("report.html", "report.json"):
            artifact.add_file(str(files / name), name=name)
        run.log_artifact(artifact)
        where = run.url or f"the offline run in {run.dir}"
    finally:
        if own:
            run.finish()
    return str(where)
