"""`analyze --engine ray` (issue 27, part 2): the same report as the local engine, a cluster
joined by --address or RAY_ADDRESS, and the local engine's messages for what goes wrong. One
local Ray for the module, started by the engine itself; the CLI's runs join it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, load_report, run_cli, shared_trace

from trainadvisor.analyze.command import analyze
from trainadvisor.analyze.engines import LocalEngine, RayEngine
from trainadvisor.errors import UsageError
from trainadvisor.report.render import report_json

sys.path.insert(0, str(ROOT / "benchmarks"))


from analyze_cluster import straggler_of, write_rank_traces  # noqa: E402

pytestmark = pytest.mark.xdist_group("ray")  # one local Ray for the module, on one worker


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local Ray started the way `--engine ray` starts one without an address."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'trainadvisor[ray]'")
    from trainadvisor.analyze.engines import connect

    assert connect(ray, None, 2)  # started here
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def twenty_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 small synthetic rank traces (past the 16 a report shows row by row), rank 6 slow."""
    folder = tmp_path_factory.mktemp("ranks") / "traces"
    write_rank_traces(folder, 20, steps=3, layers=8)
    return folder


def _both(paths: list[Path]) -> tuple[str, str]:
    command = ["trainadvisor", "analyze", *map(str, paths)]
    local, _ = analyze(paths, [], command, LocalEngine())
    ray, _ = analyze(paths, [], command, RayEngine())
    return report_json(local), report_json(ray)


def test_ray_gives_the_local_engines_report(ray_address: str, twenty_ranks: Path) -> None:
    """Two real ranks of a 128-GPU job, and 20 synthetic ranks: report.json is the same to the
    byte (it holds no timings of the analysis itself)."""
    real = [shared_trace(f"hta/trace_filter/sampled_rank-{rank}.json.gz") for rank in (0, 1)]
    local, ray = _both(real)
    assert local == ray
    assert [row["rank"] for row in json.loads(ray)["ranks"]["rows"]] == [0, 1]
    local, ray = _both([twenty_ranks])
    assert local == ray
    ranks = json.loads(ray)["ranks"]
    assert len(ranks["rows"]) == 20 and ranks["straggler"] == straggler_of(20) == 6
    assert ranks["overview"]["worst"][0] == 6


def test_a_damaged_trace_gives_the_local_engines_message(ray_address: str, tmp_path: Path) -> None:
    good = shared_trace("hta/trace_filter/sampled_rank-0.json.gz")
    broken = tmp_path / "rank1.json"
    broken.write_text('{"traceEvents": [{"ph": "X"')
    messages = []
    for runner in (LocalEngine(), RayEngine()):
        with pytest.raises(UsageError) as raised:
            analyze([good, broken], [], ["trainadvisor", "analyze"], runner)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert str(broken) in messages[1] and "cut off or malformed" in messages[1]


def _report_of(result: subprocess.CompletedProcess[str], out: Path) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    return load_report(out)


def test_the_cli_joins_a_cluster_by_address_or_ray_address(
    ray_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = [shared_trace(f"hta/trace_filter/sampled_rank-{rank}.json.gz") for rank in (0, 1)]
    expected = _report_of(run_cli("analyze", "--out", tmp_path / "l", *traces, cwd=tmp_path), tmp_path / "l")
    by_option = run_cli(
        "analyze", "--engine", "ray", "--address", ray_address, "--out", tmp_path / "a", *traces, cwd=tmp_path
    )
    assert _report_of(by_option, tmp_path / "a") == expected
    assert "2 ranks, per step in ms:" in by_option.stdout and not by_option.stderr
    monkeypatch.setenv("RAY_ADDRESS", ray_address)  # the child inherits it
    by_environment = run_cli("analyze", "--engine", "ray", "--out", tmp_path / "e", *traces, cwd=tmp_path)
    assert _report_of(by_environment, tmp_path / "e") == expected


def test_an_unreachable_address_is_one_line_at_once(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'trainadvisor[ray]'")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    trace = shared_trace("hta/trace_filter/sampled_rank-0.json.gz")
    result = run_cli(
        "analyze", "--engine", "ray", "--address", f"127.0.0.1:{port}", "--out", tmp_path / "r", trace,
        cwd=tmp_path, timeout_s=60,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == (
        f"trainadvisor: error: cannot reach the Ray cluster at 127.0.0.1:{port} (Connection refused): check "
        "--address or RAY_ADDRESS, that the head node runs (`ray start --head`), or leave both out to start "
        "a local Ray\n"
    )


def test_an_address_where_something_else_listens_is_one_line_at_once(tmp_path: Path) -> None:
    """A reachable port that is not Ray (a server that accepts and says nothing): ray.init waited
    there for minutes (over 200 s); the probe asks for gRPC's answer and says so in seconds."""
    import time

    from conftest import silent_server

    pytest.importorskip("ray", reason="Ray is not installed: pip install 'trainadvisor[ray]'")
    trace = shared_trace("hta/trace_filter/sampled_rank-0.json.gz")
    started = time.monotonic()
    with silent_server() as port:
        result = run_cli(
            "analyze", "--engine", "ray", "--address", f"127.0.0.1:{port}", "--out", tmp_path / "r", trace,
            cwd=tmp_path, timeout_s=120,
        )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(
        f"trainadvisor: error: --address 127.0.0.1:{port}: something listens there, but not Ray"
    ), result.stderr
    assert time.monotonic() - started < 60
