"""Each tracker backend's `log` on a report built here: the exact metrics, tags, tables, texts and
files it hands MLflow, W&B and TensorBoard, and which run it logs into (the active one, the one
named, or its own, ended). MLflow and W&B are stand-in modules in sys.modules recording the calls
by their real API names (real MLflow runs `git` and `uname` to describe a run, and W&B starts a
service process); TensorBoard's event files are written for real and read back with its reader."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from support.runs import raw

from trainadvisor.analyze.run.summary import summarize
from trainadvisor.records import Evidence, Finding, FixOutcome, FixStatus, Overrides, ProfileReport, Severity
from trainadvisor.trackers import mlflow_run, tensorboard_run, wandb_run

HTML, JSON = "<html>the report</html>", '{"the": "report"}'


def _finding(rule: str, severity: Severity, message: str) -> Finding:
    return Finding(rule, f"title of {rule}", severity, message, [Evidence("m", "M", 1.0)], [], "", "", "", "")


def _outcome(fix: str, status: FixStatus, gain: float | None, chosen: str, reason: str) -> FixOutcome:
    return FixOutcome(fix, "data-stall", status, reason, Overrides(), [], chosen=chosen, gain=gain)


def _report(outcomes: bool = True) -> ProfileReport:
    """Before: 4 steps of 10 ms, each waiting 4 ms on data, of 32 samples (100 steps/s, 3,200
    samples/s, 40% data wait); after: 4 steps of 5 ms (200 steps/s); a confirmed 2x."""
    findings = [
        _finding("data-stall", "high", "waits | on data\nevery step"),
        _finding("small-batch", "low", "batches of 32"),
    ]
    fixes = [
        _outcome("dataloader-workers", "kept", 2.0, "num_workers=4", "measured 2.00x"),
        _outcome("pin-memory", "no_gain", None, "", "no faster"),
    ]
    return ProfileReport(
        1, ["trainadvisor", "profile", "train.py"], "/src/train.py", None,
        summarize(raw([10.0] * 4, [4.0] * 4)), findings, run_id="run-7", workload="mnist",
        after=summarize(raw([5.0] * 4)), speedup=2.0, fix_outcomes=fixes if outcomes else [],
    )  # fmt: skip


FIGURES = {
    "trainadvisor/step_time_ms": 10.0,
    "trainadvisor/steps_per_s": 100.0,
    "trainadvisor/samples_per_s": 3200.0,
    "trainadvisor/data_wait_pct": 40.0,
    "trainadvisor/findings": 2.0,
    "trainadvisor/after/step_time_ms": 5.0,
    "trainadvisor/after/steps_per_s": 200.0,
    "trainadvisor/after/samples_per_s": 6400.0,
    "trainadvisor/after/data_wait_pct": 0.0,
    "trainadvisor/speedup": 2.0,
    "trainadvisor/fix/dataloader-workers/gain": 2.0,  # pin-memory measured no gain: none logged
}
FINDING_NAMES = ["rule", "severity", "title", "message"]
FIX_NAMES = ["fix", "status", "chosen", "gain", "reason"]
FINDING_ROWS: list[list[Any]] = [
    ["data-stall", "high", "title of data-stall", "waits | on data\nevery step"],
    ["small-batch", "low", "title of small-batch", "batches of 32"],
]
FIX_ROWS: list[list[Any]] = [
    ["dataloader-workers", "kept", "num_workers=4", 2.0, "measured 2.00x"],
    ["pin-memory", "no_gain", "", None, "no faster"],
]


def _files(tmp_path: Path) -> Path:
    files = tmp_path / "published"
    files.mkdir()
    (files / "report.html").write_text(HTML)
    (files / "report.json").write_text(JSON)
    return files


# ---- MLflow ----


class _Info:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id


class _MlflowRun:
    def __init__(self, run_id: str) -> None:
        self.info = _Info(run_id)


class _Mlflow(types.ModuleType):
    """A stand-in `mlflow`: the fluent API's functions mlflow_run calls, by their real names and
    parameters, each call recorded as (name, arguments); a file is recorded with its text, read as
    it is logged. `fail_on`: the call that raises."""

    def __init__(self, active: str = "", fail_on: str = "") -> None:
        super().__init__("mlflow")
        self.calls: list[tuple[str, Any]] = []
        self.active = _MlflowRun(active) if active else None
        self.fail_on = fail_on

    def _record(self, name: str, value: Any) -> None:
        self.calls.append((name, value))
        if name == self.fail_on:
            raise RuntimeError(f"{name} refused")

    def active_run(self) -> _MlflowRun | None:
        return self.active

    def start_run(
        self, run_id: str | None = None, experiment_id: str | None = None, run_name: str | None = None,
        nested: bool = False, parent_run_id: str | None = None, tags: dict[str, Any] | None = None,
    ) -> _MlflowRun:  # fmt: skip
        self._record("start_run", {"run_id": run_id, "run_name": run_name, "tags": tags})
        self.active = _MlflowRun(run_id or "new-run")
        return self.active

    def end_run(self, status: str = "FINISHED") -> None:
        self._record("end_run", status)
        self.active = None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self._record("log_metrics", dict(metrics))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._record("set_tags", dict(tags))

    def log_dict(self, dictionary: dict[str, Any], artifact_file: str, run_id: str | None = None) -> None:
        self._record("log_dict", (artifact_file, dictionary))

    def log_artifact(
        self, local_path: str, artifact_path: str | None = None, run_id: str | None = None
    ) -> None:
        self._record("log_artifact", (Path(local_path).name, Path(local_path).read_text(), artifact_path))

    def get_tracking_uri(self) -> str:
        return "file:///tracked"


def _mlflow(monkeypatch: pytest.MonkeyPatch, active: str = "", fail_on: str = "") -> _Mlflow:
    module = _Mlflow(active, fail_on)
    monkeypatch.setitem(sys.modules, "mlflow", module)
    return module


LOGGED = [
    ("log_metrics", FIGURES),
    ("set_tags", {"trainadvisor.finding.data-stall": "high", "trainadvisor.finding.small-batch": "low"}),
    (
        "log_dict",
        (
            "trainadvisor/findings.json",
            {
                "findings": [dict(zip(FINDING_NAMES, row)) for row in FINDING_ROWS],
                "fixes": [dict(zip(FIX_NAMES, row)) for row in FIX_ROWS],
            },
        ),
    ),
    ("log_artifact", ("report.html", HTML, "trainadvisor")),
    ("log_artifact", ("report.json", JSON, "trainadvisor")),
]


def test_mlflow_without_an_active_run_logs_into_a_run_of_its_own_and_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = _mlflow(monkeypatch)
    where = mlflow_run.log(_report(), _files(tmp_path), tmp_path / "r")
    assert where == "file:///tracked (run new-run)"
    tags = {"trainadvisor.run_id": "run-7"}
    started = ("start_run", {"run_id": None, "run_name": "trainadvisor mnist", "tags": tags})
    assert mlflow.calls == [started, *LOGGED, ("end_run", "FINISHED")]


def test_mlflow_logs_into_the_active_run_and_leaves_it_open_even_when_a_run_id_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = _mlflow(monkeypatch, active="the-scripts-run")
    where = mlflow_run.log(_report(), _files(tmp_path), tmp_path / "r", run_id="a-loggers-run")
    assert where == "file:///tracked (run the-scripts-run)"
    assert mlflow.calls == LOGGED


def test_mlflow_without_an_active_run_joins_the_run_named_by_its_id_and_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = _mlflow(monkeypatch)
    where = mlflow_run.log(_report(), _files(tmp_path), tmp_path / "r", run_id="a-loggers-run")
    assert where == "file:///tracked (run a-loggers-run)"
    joined = ("start_run", {"run_id": "a-loggers-run", "run_name": None, "tags": None})
    assert mlflow.calls == [joined, *LOGGED, ("end_run", "FINISHED")]


def test_mlflow_ends_its_own_run_when_logging_fails_and_lets_the_failure_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = _mlflow(monkeypatch, fail_on="set_tags")
    with pytest.raises(RuntimeError, match="set_tags refused"):
        mlflow_run.log(_report(), _files(tmp_path), tmp_path / "r")
    assert [name for name, _ in mlflow.calls] == ["start_run", "log_metrics", "set_tags", "end_run"]


def test_quick_failures_sets_mlflows_retries_and_timeout_only_where_the_user_has_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    mlflow_run.quick_failures()
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "30"


# ---- Weights & Biases ----


class _Table:
    def __init__(self, columns: list[Any] | None = None, data: list[list[Any]] | None = None) -> None:
        self.columns, self.data = columns, data


class _Artifact:
    def __init__(self, name: str, type: str, description: str | None = None) -> None:
        self.name, self.type, self.files = name, type, list[tuple[str, str, str | None]]()

    def add_file(self, local_path: str, name: str | None = None) -> None:
        self.files.append((Path(local_path).name, Path(local_path).read_text(), name))


class _Settings:
    def __init__(self, **settings: Any) -> None:
        self.settings = settings


class _WandbRun:
    def __init__(self, url: str | None, directory: str) -> None:
        self.id, self.url, self.dir = "wb42", url, directory
        self.summary: dict[str, Any] = {}  # W&B's summary is updated as a dict is
        self.logged: list[dict[str, Any]] = []
        self.artifacts: list[_Artifact] = []
        self.finished = 0

    def log(self, data: dict[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        self.logged.append(data)

    def log_artifact(self, artifact_or_path: _Artifact, name: str | None = None, type: str = "") -> None:
        self.artifacts.append(artifact_or_path)

    def finish(self, exit_code: int | None = None) -> None:
        self.finished += 1


class _Wandb(types.ModuleType):
    """A stand-in `wandb`: `wandb.run` the active run (None: none); `init` makes one, its
    arguments recorded; Settings, Table and Artifact as above."""

    Settings, Table, Artifact = _Settings, _Table, _Artifact

    def __init__(self, active: _WandbRun | None) -> None:
        super().__init__("wandb")
        self.run = active
        self.inits: list[dict[str, Any]] = []
        self.made = _WandbRun("https://wandb.ai/me/p/runs/wb42", "/wandb/run-wb42")

    def init(
        self, project: str | None = None, name: str | None = None, job_type: str | None = None,
        config: dict[str, Any] | None = None, settings: _Settings | None = None,
    ) -> _WandbRun:  # fmt: skip
        given = settings.settings if settings is not None else None
        self.inits.append(
            {"project": project, "name": name, "job_type": job_type, "config": config, "settings": given}
        )
        return self.made


def _wandb(monkeypatch: pytest.MonkeyPatch, active: _WandbRun | None) -> _Wandb:
    module = _Wandb(active)
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_wandb_without_an_active_run_starts_one_in_wandb_project_logs_the_report_and_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_PROJECT", "vision")
    wandb = _wandb(monkeypatch, active=None)
    where = wandb_run.log(_report(), _files(tmp_path), tmp_path / "r")
    assert where == "https://wandb.ai/me/p/runs/wb42"
    assert wandb.inits == [
        {
            "project": "vision", "name": "trainadvisor mnist", "job_type": "trainadvisor",
            "config": {"trainadvisor/run_id": "run-7", "trainadvisor/kind": "profile"},
            # the command line and code W&B would record are trainadvisor's (the script's arguments)
            "settings": {
                "x_disable_meta": True, "disable_code": True, "disable_git": True, "save_code": False
            },
        }
    ]  # fmt: skip
    run = wandb.made
    assert run.summary == FIGURES
    [tables] = run.logged
    assert sorted(tables) == ["trainadvisor/findings", "trainadvisor/fixes"]
    findings, fixes = tables["trainadvisor/findings"], tables["trainadvisor/fixes"]
    assert (findings.columns, findings.data) == (FINDING_NAMES, FINDING_ROWS)
    assert (fixes.columns, fixes.data) == (FIX_NAMES, FIX_ROWS)
    [artifact] = run.artifacts
    assert (artifact.name, artifact.type) == ("trainadvisor-report-wb42", "trainadvisor-report")
    assert artifact.files == [("report.html", HTML, "report.html"), ("report.json", JSON, "report.json")]
    assert run.finished == 1


def test_wandb_logs_into_the_active_run_without_finishing_it_and_a_report_without_fixes_has_no_fixes_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    scripts = _WandbRun(None, "/train/wandb/offline-run-1")  # offline: no URL
    wandb = _wandb(monkeypatch, active=scripts)
    where = wandb_run.log(_report(outcomes=False), _files(tmp_path), tmp_path / "r")
    assert where == "the offline run in /train/wandb/offline-run-1"
    assert wandb.inits == [] and scripts.finished == 0
    assert scripts.summary == {k: v for k, v in FIGURES.items() if "/fix/" not in k}
    [tables] = scripts.logged
    assert list(tables) == ["trainadvisor/findings"]
    assert [a.name for a in scripts.artifacts] == ["trainadvisor-report-wb42"]


def test_wandb_without_wandb_project_uses_the_trainadvisor_project_and_finishes_after_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    wandb = _wandb(monkeypatch, active=None)
    run = wandb.made

    def refuse(artifact_or_path: _Artifact, name: str | None = None, type: str | None = None) -> None:
        raise OSError("upload refused")

    monkeypatch.setattr(run, "log_artifact", refuse)
    with pytest.raises(OSError, match="upload refused"):
        wandb_run.log(_report(), _files(tmp_path), tmp_path / "r")
    assert [i["project"] for i in wandb.inits] == ["trainadvisor"] and run.finished == 1


# ---- TensorBoard ----


def _read(logdir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    return events


def _text(events: Any, tag: str) -> str:
    [event] = events.Tensors(tag)
    assert (event.step, event.wall_time) == (0, 1_700_000_000.5)
    return str(event.tensor_proto.string_val[0].decode())


def test_tensorboard_writes_the_figures_at_step_0_and_the_findings_and_fixes_as_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard", reason="the tracker tests need tensorboard: pip install -e '.[dev]'")
    monkeypatch.setattr(tensorboard_run, "time", types.SimpleNamespace(time=lambda: 1_700_000_000.5))
    logdir = tmp_path / "runs"
    folder = tmp_path / "r"
    assert tensorboard_run.log(_report(), _files(tmp_path), folder, logdir=str(logdir)) == str(logdir)
    [written] = logdir.iterdir()
    assert written.name.startswith("events.out.tfevents.") and written.name.endswith(".trainadvisor")
    events = _read(logdir)
    assert sorted(events.Tags()["scalars"]) == sorted(FIGURES)
    for name, value in FIGURES.items():
        [scalar] = events.Scalars(name)
        assert (scalar.step, scalar.wall_time, scalar.value) == (0, 1_700_000_000.5, pytest.approx(value))
    assert _text(events, "trainadvisor/findings") == (
        "| rule | severity | title | message |\n"
        "|---|---|---|---|\n"
        "| data-stall | high | title of data-stall | waits \\| on data every step |\n"
        "| small-batch | low | title of small-batch | batches of 32 |"
    )
    assert _text(events, "trainadvisor/fixes") == (
        "| fix | status | chosen | gain | reason |\n"
        "|---|---|---|---|---|\n"
        "| dataloader-workers | kept | num_workers=4 | 2.0 | measured 2.00x |\n"
        "| pin-memory | no_gain |  |  | no faster |"
    )
    assert _text(events, "trainadvisor/report") == f"{folder / 'report.html'} (run run-7)"


def test_tensorboard_writes_into_trainadvisor_tensorboard_dir_else_the_report_folders_tensorboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard", reason="the tracker tests need tensorboard: pip install -e '.[dev]'")
    files = _files(tmp_path)
    monkeypatch.setenv("TRAINADVISOR_TENSORBOARD_DIR", str(tmp_path / "training-logs"))
    assert tensorboard_run.log(_report(), files, tmp_path / "r1") == str(tmp_path / "training-logs")
    monkeypatch.delenv("TRAINADVISOR_TENSORBOARD_DIR")
    assert tensorboard_run.log(_report(), files, tmp_path / "r2") == str(tmp_path / "r2" / "tensorboard")
    for logdir in (tmp_path / "training-logs", tmp_path / "r2" / "tensorboard"):
        assert _read(logdir).Scalars("trainadvisor/speedup")[0].value == 2.0
    assert not (tmp_path / "r1").exists()
