"""`trainadvisor mcp` through the MCP SDK's own client, the server in a real subprocess: the
tools it lists, a profile whose verdict is the CLI's on the same script, a summary within its
size bound, `explain` and `compare`, and a cancelled profile that leaves no process behind."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import psutil
from conftest import EXAMPLES, require, run_cli

from trainadvisor.agents.digest import SUMMARY_MAX_BYTES

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

require("mcp", "the MCP tests need the SDK: pip install -e '.[dev]'")

ARGS = ["--samples", "6400", "--latency-ms", "1"]


async def _session_run(cwd: Path, body: Any) -> Any:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "trainadvisor", "mcp"], cwd=str(cwd))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await body(session)


def _result(call: Any) -> dict[str, Any]:
    assert not call.is_error, call.content
    return json.loads(call.content[0].text)  # type: ignore[no-any-return]


def test_a_profile_through_mcp_is_the_clis_verdict_and_fits_its_bound(tmp_path: Path) -> None:
    progress: list[str] = []

    async def body(
        session: ClientSession,
    ) -> tuple[list[str], dict[str, Any], dict[str, Any], dict[str, Any]]:
        tools = sorted(t.name for t in (await session.list_tools()).tools)

        async def noted(done: float, total: float | None, message: str | None) -> None:
            progress.append(message or "")

        arguments = {
            "script": str(EXAMPLES / "slow_input_mnist.py"),
            "args": ARGS,
            "measure_fixes": False,
            "out": "mcp-report",
        }
        profiled = _result(await session.call_tool("profile", arguments, progress_callback=noted))
        explained = _result(
            await session.call_tool("explain", {"report": "mcp-report", "rule": "data-stall"})
        )
        compared = _result(await session.call_tool("compare", {"base": "mcp-report", "head": "mcp-report"}))
        return tools, profiled, explained, compared

    tools, profiled, explained, compared = anyio.run(_session_run, tmp_path, body)
    assert tools == ["analyze", "compare", "explain", "profile"]
    assert any(line.startswith("trainadvisor: running") for line in progress)
    # the CLI's verdict on the same run (a second profile would be another run, its findings free
    # to differ by chance): the report the tool wrote, as `trainadvisor report` reads it
    cli = run_cli("report", "--format", "json", "mcp-report", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    by_cli = json.loads(cli.stdout)
    assert [(f["rule"], f["severity"]) for f in profiled["findings"]] == [
        (f["rule"], f["severity"]) for f in by_cli["findings"]
    ]
    assert profiled["findings"][0]["rule"] == "data-stall" and profiled["report"] == "mcp-report/report.html"
    assert len(json.dumps(profiled).encode()) <= SUMMARY_MAX_BYTES
    assert explained["rule"] == "data-stall" and explained["threshold_source"] and explained["best_practice"]
    assert compared["verdict"] in ("neutral", "inconclusive")


def test_a_cancelled_profile_leaves_no_process(tmp_path: Path) -> None:
    """The call is cancelled once the run has started: the CLI's process, the script and its
    DataLoader workers are gone within the stop's grace, and the server answers again."""
    # a copy of its own: processes are found by the script's path, and another test may be
    # running the example itself at the same time (it was, once, under pytest -n)
    script = tmp_path / "cancelled_slow_input.py"
    shutil.copyfile(EXAMPLES / "slow_input_mnist.py", script)

    async def body(session: ClientSession) -> list[str]:
        started = anyio.Event()

        async def noted(done: float, total: float | None, message: str | None) -> None:
            if message and message.startswith("trainadvisor: running"):
                started.set()

        async with anyio.create_task_group() as group:
            arguments = {"script": str(script), "args": ["--samples", "400000", "--num-workers", "2"]}
            group.start_soon(lambda: session.call_tool("profile", arguments, progress_callback=noted))
            with anyio.fail_after(120):
                await started.wait()
            await anyio.sleep(2.0)  # the script's workers are up
            group.cancel_scope.cancel()
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and _running(script):
            await anyio.sleep(0.5)
        tools = await session.list_tools()  # the server still serves
        return [t.name for t in tools.tools]

    tools = anyio.run(_session_run, tmp_path, body)
    assert "profile" in tools
    assert _running(script) == []


def _running(script: Path) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(str(script) in part for part in process.info["cmdline"] or []):
                found.append(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found
