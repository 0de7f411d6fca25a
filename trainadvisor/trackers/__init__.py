"""A report's verdict in the experiment trackers users already look at: Weights & Biases,
MLflow and TensorBoard (optional extras: `pip install 'trainadvisor[wandb]'`, `[mlflow]`,
`[tensorboard]`). `figures` names the summary metrics once (stable, documented names); each
backend module logs them, the findings and the report's files into the user's active run where
there is one, else a run of its own. A tracker that is missing, misconfigured or unreachable
never fails a profile or loses a report: `export` says so in one line and goes on.

May import: records, report (the report's figures and files), analyze (the measurement table),
resources (the templates report.html is rendered with), options (the trackers' names), errors."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from pathlib import Path

from trainadvisor.options.table import TRACKERS
from trainadvisor.records import Report
from trainadvisor.report.render import render_html, report_json
from trainadvisor.resources import templates_dir

BACKENDS = TRACKERS  # as the command line spells them (`--log-to`, `export --to`)


def export(
    report: Report,
    folder: Path,
    backends: list[str],
    echo: Callable[[str], None],
    joined: dict[str, str] | None = None,
) -> list[str]:
    """Log the report into each backend; the backends it reached. Never raises for a tracker's
    failure (a missing package, a server that does not answer, bad credentials). `joined`: what
    a framework's own logger already uses, by backend (MLflow's run id, TensorBoard's log
    folder), so that the report lands beside the training's own curves."""
    from trainadvisor.trackers import mlflow_run, tensorboard_run, wandb_run

    joined = joined or {}
    loggers: dict[str, Callable[[Report, Path, Path], str]] = {
        "wandb": wandb_run.log,
        "mlflow": functools.partial(mlflow_run.log, run_id=joined.get("mlflow")),
        "tensorboard": functools.partial(tensorboard_run.log, logdir=joined.get("tensorboard")),
    }
    reached = []
    with tempfile.TemporaryDirectory(prefix="trainadvisor-tracked-") as staged:
        files = Path(staged)  # the report's files as published, whatever the folder holds
        (files / "report.json").write_text(report_json(report))
        (files / "report.html").write_text(render_html(report, templates_dir()))
        for backend in dict.fromkeys(backends):
            if _logged(backend, loggers[backend], report, files, folder, echo):
                reached.append(backend)
    return reached


def _logged(
    backend: str,
    logger: Callable[[Report, Path, Path], str],
    report: Report,
    files: Path,
    folder: Path,
    echo: Callable[[str], None],
) -> bool:
    try:
        where = logger(report, files, folder)
    except ImportError:
        install = f"pip install 'trainadvisor[{backend}]'"
        echo(f"trainadvisor: {backend}: not logged: its package is not installed ({install})")
    except Exception as exc:  # a tracker's own failure: the report stands without it
        echo(f"trainadvisor: {backend}: not logged ({type(exc).__name__}: {str(exc)[:200]})")
    else:
        echo(f"trainadvisor: {backend}: logged to {where}")
        return True
    return False
