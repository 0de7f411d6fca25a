"""Experiment trackers, each for real: an MLflow tracking server started here on 127.0.0.1 and
read back through MlflowClient; W&B in offline mode, its run's files read back; TensorBoard's
event files read back with TensorBoard's own reader. A tracker that is missing or down never
fails a profile or loses its report."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA, EXAMPLES, SCRIPTS, require, run_cli

require("wandb", "the tracker tests need wandb: pip install -e '.[dev]'")
require("tensorboard", "the tracker tests need tensorboard: pip install -e '.[dev]'")

# trainadvisor's CLI in a Python where importing `package` fails, as where it is not installed
BLOCKED = "import sys; sys.modules[{package!r}] = None; from trainadvisor.cli import main; main()"


SAVED = DATA / "report"  # a real profile report: 20.8 steps/s, then 139.3 with num_workers=8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "WANDB_"))}
    return {**env, **extra}


def _cli(cwd: Path, env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root / 'runs.db'}",
         "--artifacts-destination", str(root / "artifacts"),
         "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("the MLflow tracking server did not start")
                time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.mark.xdist_group("mlflow_server")  # one server for both, on one worker
def test_export_to_mlflow_lands_metrics_tags_and_files_in_a_run(tmp_path: Path, mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient

    done = _cli(tmp_path, _env(MLFLOW_TRACKING_URI=mlflow_server), "export", SAVED, "--to", "mlflow")
    assert done.returncode == 0, done.stderr
    assert f"trainadvisor: mlflow: logged to {mlflow_server} (run " in done.stderr
    client = MlflowClient(mlflow_server)
    [run] = client.search_runs(["0"], filter_string="tags.`trainadvisor.finding.data-stall` = 'high'")
    metrics = run.data.metrics
    assert round(metrics["trainadvisor/steps_per_s"], 1) == 20.8
    assert round(metrics["trainadvisor/after/steps_per_s"], 1) == 139.3
    assert round(metrics["trainadvisor/speedup"], 2) == 6.70 and metrics["trainadvisor/findings"] == 1.0
    assert "trainadvisor/fix/dataloader-workers/gain" in metrics
    files = sorted(a.path for a in client.list_artifacts(run.info.run_id, "trainadvisor"))
    assert files == ["trainadvisor/findings.json", "trainadvisor/report.html", "trainadvisor/report.json"]


@pytest.mark.xdist_group("mlflow_server")  # one server for both, on one worker
def test_export_joins_the_mlflow_run_the_training_named(tmp_path: Path, mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    training = client.create_run("0", run_name="the training")
    env = _env(MLFLOW_TRACKING_URI=mlflow_server, MLFLOW_RUN_ID=training.info.run_id)
    assert _cli(tmp_path, env, "export", SAVED, "--to", "mlflow").returncode == 0
    assert "trainadvisor/steps_per_s" in client.get_run(training.info.run_id).data.metrics


def _wandb_records(path: Path) -> Iterator[Any]:
    """The records of an offline run's .wandb file, parsed with W&B's own protobuf definitions:
    the file is W&B's header (7 bytes: ':W&B', an id, a version) and then LevelDB's log format
    (32 KiB blocks of records, each a checksum, a length, a kind: whole, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending = 7, 32768, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header: padding
            position += block - position % block
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def test_export_to_wandb_offline_writes_the_summary_the_tables_and_the_report(tmp_path: Path) -> None:
    env = _env(WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true", WANDB_PROJECT="t")
    done = _cli(tmp_path, env, "export", SAVED, "--to", "wandb")
    assert done.returncode == 0, done.stderr
    [run_file] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    summary, artifacts = {}, {}
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "summary":
            summary.update({u.key: json.loads(u.value_json) for u in record.summary.update if u.key})
        elif kind == "artifact":
            artifacts[record.artifact.type] = sorted(m.path for m in record.artifact.manifest.contents)
    assert round(summary["trainadvisor/steps_per_s"], 1) == 20.8 and summary["trainadvisor/findings"] == 1
    assert round(summary["trainadvisor/speedup"], 2) == 6.70
    assert artifacts["trainadvisor-report"] == ["report.html", "report.json"]
    assert "run_table" in artifacts  # the findings and fixes tables


def test_export_to_tensorboard_is_read_back_by_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "runs"
    done = _cli(
        tmp_path, _env(TRAINADVISOR_TENSORBOARD_DIR=str(logdir)), "export", SAVED, "--to", "tensorboard"
    )
    assert done.returncode == 0, done.stderr
    events = EventAccumulator(str(logdir))
    events.Reload()
    assert round(events.Scalars("trainadvisor/steps_per_s")[0].value, 1) == 20.8
    text = events.Tensors("trainadvisor/findings")[0].tensor_proto.string_val[0].decode()
    assert text.startswith("| rule | severity | title | message |") and "| data-stall | high |" in text


def test_a_tracker_that_is_down_or_missing_is_one_line_and_the_profile_goes_on(tmp_path: Path) -> None:
    down = _env(
        MLFLOW_TRACKING_URI=f"http://127.0.0.1:{_free_port()}",
        TRAINADVISOR_TENSORBOARD_DIR=str(tmp_path / "tb"),
    )
    started = time.monotonic()
    done = _cli(tmp_path, down, "export", SAVED, "--to", "mlflow", "--to", "tensorboard")
    assert done.returncode == 4 and time.monotonic() - started < 90
    assert [line for line in done.stderr.splitlines() if "mlflow: not logged (" in line]
    assert "tensorboard: logged to" in done.stderr  # the others still are
    missing = subprocess.run(
        [sys.executable, "-c", BLOCKED.format(package="wandb"),
         "export", str(SAVED), "--to", "wandb"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert missing.returncode == 4
    assert (
        "wandb: not logged: its package is not installed (pip install 'trainadvisor[wandb]')"
        in missing.stderr
    )
    profiled = _cli(
        tmp_path, down, "profile", "--no-fix", "--log-to", "mlflow", "--warmup", "2", "--steps", "5",
        "--out", "r", EXAMPLES / "slow_input_mnist.py", "--samples", "3200",
    )  # fmt: skip
    assert profiled.returncode == 0, profiled.stderr
    assert "mlflow: not logged (" in profiled.stderr and (tmp_path / "r" / "report.html").is_file()


def test_a_scripts_credentials_reach_no_tracker(tmp_path: Path) -> None:
    """A script given a token (`--hf-token`): what TensorBoard and W&B (offline) receive holds
    it nowhere, as the report files do not."""
    token = "hf_trainadvisorSECRET0123456789"
    env = _env(
        TRAINADVISOR_TENSORBOARD_DIR=str(tmp_path / "tb"), WANDB_MODE="offline", WANDB_DIR=str(tmp_path),
        WANDB_SILENT="true", MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'runs.db'}",
        MLFLOW_ARTIFACTS_DESTINATION=str(tmp_path / "artifacts"),
    )  # fmt: skip
    done = _cli(
        tmp_path, env, "profile", "--no-fix", "--log-to", "tensorboard", "--log-to", "wandb",
        "--log-to", "mlflow", "--warmup", "2", "--steps", "5", "--out", "r",
        SCRIPTS / "with_token.py", "--hf-token", token,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tensorboard: logged to" in done.stderr and "wandb: logged to" in done.stderr
    assert "mlflow: logged to" in done.stderr
    stored = ("tb", "wandb", "mlruns", "artifacts")
    sent = [p for folder in stored for p in (tmp_path / folder).rglob("*") if p.is_file()]
    sent.append(tmp_path / "runs.db")  # MLflow's runs, params and tags
    assert sent and not [p for p in sent if token.encode() in p.read_bytes()]


def test_advise_logs_into_the_trainings_own_mlflow_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An e2e test though it runs no script: importing MLflow and starting its run start
    processes of their own (`uname -p`, `git version`)."""
    monkeypatch.chdir(tmp_path)  # MLflow keeps a database store's artifacts in ./mlruns
    import mlflow
    import torch
    from mlflow.tracking import MlflowClient
    from torch import nn

    from trainadvisor import advise

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs.db'}")
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with mlflow.start_run() as training:
        mlflow.log_metric("loss", 1.0)
        with advise(
            warmup=2, steps=4, out=tmp_path / "r", min_time=0.0, max_warmup=None, log_to=["mlflow"]
        ) as advisor:
            for _ in range(16):
                loss = nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,)))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                advisor.step(loss)
    metrics = MlflowClient(f"sqlite:///{tmp_path / 'runs.db'}").get_run(training.info.run_id).data.metrics
    assert "loss" in metrics and metrics["trainadvisor/steps_per_s"] > 0
