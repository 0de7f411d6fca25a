"""Faults and untrusted input (issue 16, in part): credentials kept out of reports, one run at a
time per report folder."""

from __future__ import annotations

import gzip
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, SCRIPTS, load_report, processes_running, run_cli
from support.hostile import KEY, TOKEN


def _every_file_text(folder: Path) -> str:
    texts = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            texts.append((gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", "replace"))
    return "\n".join(texts)


def test_a_token_on_the_command_line_appears_in_no_output_file(tmp_path: Path) -> None:
    out = tmp_path / "r"
    # windows of exactly --warmup and --steps steps (no steadiness test, no time floor): what is
    # tested is what the files of every run (baseline, trials, confirmation) hold, not their timing
    result = run_cli(
        "profile", "--warmup", "2", "--steps", "6", "--max-warmup", "0", "--min-time", "0", "--out", out,
        SCRIPTS / "with_token.py", "--hf-token", TOKEN, "--wandb-key", KEY, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = load_report(out)
    assert report["command"][-4:] == ["--hf-token", "***", "--wandb-key", "***"]
    assert any(
        n.startswith("The values of --hf-token, --wandb-key look like credentials") for n in report["notes"]
    )
    assert {p.name for p in out.iterdir()} >= {"report.html", "report.md", "report.json", "traces", "logs"}
    everything = _every_file_text(out)
    assert TOKEN not in everything and KEY not in everything
    assert TOKEN not in result.stdout + result.stderr


def test_a_second_run_into_the_same_report_folder_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r"
    first = subprocess.Popen(
        [sys.executable, "-m", "trainadvisor", "profile", "--out", str(out),
         str(EXAMPLES / "slow_input_mnist.py"), "--samples", "20000"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (out / ".lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = run_cli("profile", "--out", out, EXAMPLES / "slow_input_mnist.py", cwd=tmp_path)
        assert second.returncode == 2
        assert (
            f"--out {out}: another trainadvisor run is writing this report (process {first.pid})"
            in second.stderr
        )
    finally:
        first.terminate()
        first.wait(timeout=60)
    assert not processes_running(out, out)  # the first run's child went with it
    assert not (out / ".lock").exists()


@pytest.mark.parametrize("value", ["5", "true", "warmup"])
def test_a_profile_with_a_short_credential_writes_its_report(tmp_path: Path, value: str) -> None:
    out = tmp_path / "r"
    result = run_cli(
        "profile", "--no-fix", "--warmup", "2", "--steps", "6", "--max-warmup", "0", "--min-time", "0",
        "--out", out, SCRIPTS / "with_token.py", "--hf-token", TOKEN, "--wandb-key", value, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert load_report(out)["command"][-4:] == ["--hf-token", "***", "--wandb-key", "***"]
